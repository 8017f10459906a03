"""Thread stacks in a dump: deep stacks keep the user's outermost frames, and each frame its source line."""

from __future__ import annotations

import threading
import traceback

from analyzers import stackview
from flightrec.record import stacks


def _descend(depth: int, out: list) -> None:
    if depth:
        _descend(depth - 1, out)  # recursing here
    else:
        out.extend(stacks.all_thread_stacks())


def test_a_deep_stack_keeps_its_outermost_frames_and_says_how_many_it_left_out() -> None:
    found: list = []
    _descend(150, found)
    me = next(t for t in found if t["ident"] == threading.get_ident())
    frames, code = me["stack"], me["code"]
    assert len(frames) == stacks.STACK_LIMIT == len(code)
    marker = next(i for i, f in enumerate(frames) if f.startswith("... "))
    assert marker == stacks.OUTER_FRAMES
    # every frame not kept is counted: the walk from this test's own frame down is 150 recursions deep
    assert int(frames[marker].split()[1]) > 150 - stacks.STACK_LIMIT
    assert code[marker] is None
    outermost = traceback.extract_stack()[0]
    assert frames[0] == f"{outermost.filename}:{outermost.lineno} in {outermost.name}"  # the process's entry point
    assert frames[-1].endswith(" in all_thread_stacks") or " in _descend" in frames[-2]
    assert "_descend(depth - 1, out)  # recursing here" in code
    assert "out.extend(stacks.all_thread_stacks())" in code


def test_report_excerpt_keeps_outer_user_frames_and_the_innermost() -> None:
    frames = ["/srv/train.py:300 in <module>", "/srv/train.py:240 in main"] + [
        f"/usr/lib/python3.11/site-packages/torch/nn/module.py:{i} in _call_impl" for i in range(30)] + [
        "/srv/model.py:80 in forward", "/usr/lib/python3.11/threading.py:320 in wait"]
    code = ["main()", "train(cfg)"] + [None] * 30 + ["self.layer(x)", "waiter.acquire()"]
    kept, kept_code = stackview.excerpt(frames, code, limit=8, outer=2)
    assert kept[:2] == frames[:2] and kept_code[:2] == ["main()", "train(cfg)"]
    assert kept[2] == "... 27 frames omitted ..." and kept_code[2] is None
    assert kept[-2:] == frames[-2:] and len(kept) == 8
    assert stackview.innermost_user(frames, code) == ("/srv/model.py:80 in forward", "self.layer(x)")
    assert stackview.traceback_lines(kept[-2:-1], kept_code[-2:-1]) == [
        'File "/srv/model.py", line 80, in forward', "  self.layer(x)"]
