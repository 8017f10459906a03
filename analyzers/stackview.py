"""Thread stacks as a report shows them: trimmed to what a reader acts on, and written like a traceback.

Why: a stalled rank's stack is often 60+ frames deep (torch, autograd, hooks). Its innermost frames say
where it is stuck; its outermost frames of the user's own code (the script's entry point, the training
loop) say which step of the program that is. Keeping only the innermost ones, as a plain tail would,
loses the second. Dumps store frames as `file:line in function`, with the source lines beside them
(`code`, flightrec dumps from 2026-12 on); other recorders' stacks have no source lines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from flightrec.format.libraries import LIBRARY as LIBRARY_FILES

FRAME = re.compile(r"^(?P<file>.*):(?P<line>\d+) in (?P<func>.*)$")
OMITTED = re.compile(r"^\.\.\. (\d+) frames? omitted \.\.\.$")
# frames that are not the user's code: installed packages, the standard library, frozen modules,
# known frameworks (torch, DeepSpeed, Megatron, ...) wherever they are, the recorder itself: the same
# definition the recorder places call sites by (flightrec/format/libraries.py)
LIBRARY = LIBRARY_FILES
STACK_LINES = 12  # frames a report keeps of one stack
OUTER_USER_FRAMES = 3  # of which the outermost frames of the user's code


def is_user_frame(frame: str) -> bool:
    """A frame of the job's own code (not a library, the standard library or the recorder)."""
    return not OMITTED.match(frame) and not LIBRARY.search(frame)


def excerpt(stack: Sequence[str], code: Sequence[str | None] | None = None, limit: int = STACK_LINES,
            outer: int = OUTER_USER_FRAMES, user_only: bool = False) -> tuple[list[str], list[str | None]]:
    """At most `limit` lines of `stack` (outermost first), one `... N frames omitted ...` line per gap:
    the outermost `outer` frames of user code, the innermost frame (where the thread is), then the
    innermost frames of user code, then (unless `user_only`) the innermost library frames; `code` follows."""
    frames = list(stack)
    lines = list(code) if code is not None and len(code) == len(frames) else [None] * len(frames)
    if len(frames) <= limit:
        return frames, lines
    user = [i for i, f in enumerate(frames) if is_user_frame(f)]
    library = [] if user_only else [i for i in reversed(range(len(frames))) if not is_user_frame(frames[i])]
    keep: set[int] = set()
    for i in [*user[:outer], len(frames) - 1, *reversed(user), *library]:
        trial = keep | {i}
        if len(trial) + _gaps(sorted(trial), len(frames)) > limit:
            continue
        keep = trial
    out: list[str] = []
    out_code: list[str | None] = []
    previous = -1
    for i in sorted(keep):
        if i > previous + 1:
            out.append(f"... {_count(frames[previous + 1:i])} frames omitted ...")
            out_code.append(None)
        out.append(frames[i])
        out_code.append(lines[i])
        previous = i
    return out, out_code


def _gaps(kept: list[int], total: int) -> int:
    """Omission lines a selection of frames needs (the innermost frame is always kept)."""
    previous, gaps = -1, 0
    for i in kept:
        gaps += i > previous + 1
        previous = i
    return gaps + (previous < total - 1)


def _count(frames: Sequence[str]) -> int:
    """Frames a stretch stands for: a recorder's own omission marker counts what it left out."""
    return sum(int(m.group(1)) if (m := OMITTED.match(f)) else 1 for f in frames)


def innermost_user(stack: Sequence[str], code: Sequence[str | None] | None = None) -> tuple[str, str | None] | None:
    """The innermost frame of the user's code, and its source line: where that thread's program is."""
    lines = list(code) if code is not None and len(code) == len(stack) else [None] * len(stack)
    for frame, line in zip(reversed(list(stack)), reversed(lines), strict=True):
        if is_user_frame(frame):
            return frame, line
    return None


def traceback_lines(stack: Sequence[str], code: Sequence[str | None] | None = None, indent: str = "") -> list[str]:
    """The frames as Python prints a traceback: `File "f", line n, in func` and the source line below."""
    lines = list(code) if code is not None and len(code) == len(stack) else [None] * len(stack)
    out = []
    for frame, text in zip(stack, lines, strict=True):
        m = FRAME.match(frame)
        out.append(f'{indent}File "{m.group("file")}", line {m.group("line")}, in {m.group("func")}' if m else f"{indent}{frame}")
        if text:
            out.append(f"{indent}  {text}")
    return out


def where_text(frame: str, code: str | None) -> str:
    """`file:line in func: source line` (short: the file's name only)."""
    m = FRAME.match(frame)
    place = f"{_basename(m.group('file'))}:{m.group('line')} in {m.group('func')}" if m else frame
    return f"{place}: {code}" if code else place


def _basename(path: str) -> str:
    return re.split(r"[/\\]", path)[-1]


# A thread parked waiting for work: its innermost frame is one of the standard library's waits.
IDLE_WAIT = re.compile(r"(?:^|[/\\])(?:threading|queue|selectors|socket|ssl|sched)\.py:\d+ in "
                       r"|[/\\]concurrent[/\\]futures[/\\]thread\.py:\d+ in _worker|[/\\]multiprocessing[/\\]connection\.py:")
IDLE_NAMES = re.compile(r"^(?:flightrec-|pt_autograd|pt_thread|gloo|QueueFeederThread)")
# The main thread blocked on another thread: a threading/queue wait, a future's result, or (a C lock has
# no Python frame) its own line taking a lock or joining.
MAIN_WAITS = re.compile(r"(?:^|[/\\])(?:threading\.py:\d+ in (?:wait|acquire|join|_wait_for_tstate_lock)"
                        r"|queue\.py:\d+ in (?:get|put|join)|_base\.py:\d+ in result)$")
LOCK_LINE = re.compile(r"^with\s+[\w.\[\]]*lock\b|\.acquire\(|\.join\(|\.wait\(", re.IGNORECASE)
THREAD_FRAMES = 8  # frames kept of another thread's stack


def waits_on_a_thread(stack: Sequence[str], code: Sequence[str | None] | None = None) -> bool:
    """True when a main thread's innermost frames wait on a lock, a queue, an event or a join."""
    if not stack:
        return False
    if MAIN_WAITS.search(stack[-1]):
        return True
    user = innermost_user(stack, code)
    return user is not None and user[0] == stack[-1] and bool(user[1]) and bool(LOCK_LINE.search(str(user[1])))


def busy_threads(threads: Sequence[dict]) -> list[dict]:
    """The rank's threads other than the main one that are doing something (named; idle ones left out:
    the recorder's, PyTorch's and gloo's, pool workers waiting for work), each as {name, at, code,
    stack, source}: `at` its innermost user frame (else innermost frame), `stack` its innermost frames."""
    out = []
    for t in threads:
        if not isinstance(t, dict) or t.get("is_main") or IDLE_NAMES.match(str(t.get("name") or "")):
            continue
        stack = [str(f) for f in t.get("stack") or []]
        if not stack or IDLE_WAIT.search(stack[-1]) or any("flightrec" in f and "watchdog" in f for f in stack[-3:]):
            continue
        code = t.get("code")
        code = list(code) if isinstance(code, list) and len(code) == len(stack) else [None] * len(stack)
        at = innermost_user(stack, code) or (stack[-1], code[-1])
        out.append({"name": str(t.get("name")), "at": at[0], "code": at[1], "stack": stack[-THREAD_FRAMES:],
                    "source": code[-THREAD_FRAMES:]})
    return out
