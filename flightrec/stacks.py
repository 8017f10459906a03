"""Call sites and thread stacks, taken cheaply from frame objects."""

from __future__ import annotations

import os
import sys
import threading
from types import FrameType

import torch

Frame = tuple[str, int, str]

_TORCH_DIST = os.path.dirname(os.path.abspath(torch.distributed.__file__)) + os.sep
_FLIGHTREC = os.path.dirname(os.path.abspath(__file__)) + os.sep
_CONTEXTLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep + "contextlib.py"
_SKIP = (_TORCH_DIST, _FLIGHTREC, _CONTEXTLIB)


def call_site(depth: int = 2) -> Frame | None:
    """The first frame outside torch.distributed and flightrec: where training code called us."""
    try:
        frame: FrameType | None = sys._getframe(depth)
    except ValueError:
        return None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIP):
            return (filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None


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
