"""Call sites and thread stacks, taken cheaply from frame objects."""

from __future__ import annotations

import os
import sys
import threading
from types import CodeType, FrameType

import torch

Frame = tuple[str, int, str]

_TORCH_DIST = os.path.dirname(os.path.abspath(torch.distributed.__file__)) + os.sep
_FLIGHTREC = os.path.dirname(os.path.abspath(__file__)) + os.sep
_CONTEXTLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep + "contextlib.py"
_SKIP = (_TORCH_DIST, _FLIGHTREC, _CONTEXTLIB)


# id(code) -> (code, is ours): hashing a code object hashes its whole body (~0.5 µs), its id does
# not; the entry keeps the code alive so an id is never reused while it is in the cache.
_SKIP_BY_CODE: dict[int, tuple[CodeType, bool]] = {}
_SKIP_CACHE_LIMIT = 65536  # code made at run time (exec in a loop) must not grow it forever

Site = tuple[CodeType, int]  # (code, f_lasti): the line is looked up only when a dump is written


def call_site(depth: int = 2) -> Site | None:
    """The first frame outside torch.distributed and flightrec: where training code called us.

    Kept raw on the hot path; `site_frame` turns it into (file, line, function) when needed.
    """
    try:
        frame: FrameType | None = sys._getframe(depth)
    except ValueError:
        return None
    cache = _SKIP_BY_CODE
    while frame is not None:
        code = frame.f_code
        known = cache.get(id(code))
        if known is None or known[0] is not code:
            if len(cache) >= _SKIP_CACHE_LIMIT:
                cache.clear()
            known = cache[id(code)] = (code, code.co_filename.startswith(_SKIP))
        if not known[1]:
            return (code, frame.f_lasti)
        frame = frame.f_back
    return None


def site_frame(site: Site | None) -> Frame | None:
    """(file, line, function) of a call site kept by `call_site`."""
    if site is None:
        return None
    code, lasti = site
    line = code.co_firstlineno
    for start, end, number in code.co_lines():
        if start <= lasti < end:
            if number is not None:
                line = number
            break
    return (code.co_filename, line, code.co_name)


def frames_of(frame: FrameType | None, limit: int = 64) -> list[Frame]:
    """Frames from `frame` outwards, returned outermost first."""
    out: list[Frame] = []
    while frame is not None and len(out) < limit:
        out.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    out.reverse()
    return out


def current_stack(depth: int = 2) -> list[Frame]:
    try:
        return frames_of(sys._getframe(depth))
    except ValueError:
        return []


def all_thread_stacks() -> list[dict[str, object]]:
    """Every thread's Python stack, for the dump: where each thread is right now."""
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    out: list[dict[str, object]] = []
    for ident, frame in frames.items():
        thread = threads.get(ident)
        out.append({
            "name": thread.name if thread is not None else f"thread-{ident}",
            "ident": ident,
            "daemon": bool(thread.daemon) if thread is not None else True,
            "is_main": ident == main_ident,
            "stack": [f"{f[0]}:{f[1]} in {f[2]}" for f in frames_of(frame)],
        })
    out.sort(key=lambda t: (not t["is_main"], str(t["name"])))
    return out
