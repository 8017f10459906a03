"""Call sites and thread stacks, taken cheaply from frame objects."""

from __future__ import annotations

import linecache
import os
import sys
import threading
from types import CodeType, FrameType

import torch

from ..format.libraries import is_library_file

Frame = tuple[str, int, str]

_TORCH_DIST = os.path.dirname(os.path.abspath(torch.distributed.__file__)) + os.sep
_FLIGHTREC = os.path.dirname(os.path.abspath(__file__)) + os.sep
_CONTEXTLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep + "contextlib.py"


def _pass_through_layers() -> tuple[str, ...]:
    """Layers of training frameworks that only pass calls on to torch.distributed (DeepSpeed's
    `deepspeed.comm`, and its NVTX decorator around ZeRO-3's gathers and scatters): a call site inside
    them says nothing, the frame that called them does (ZeRO's partitioning code, the training step).
    Located, never imported."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("deepspeed")
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.submodule_search_locations:
        return ()
    return tuple(path for folder in spec.submodule_search_locations
                 for path in (os.path.join(os.path.abspath(folder), "comm") + os.sep,
                              os.path.join(os.path.abspath(folder), "utils", "nvtx.py")))


_SKIP = (_TORCH_DIST, _FLIGHTREC, _CONTEXTLIB, *_pass_through_layers())
# What a frame is to `call_site`: a layer that only passes the call on (never a site), a library's
# (a site only when no frame of the user's code is on the stack), or the user's own code.
PASS, LIBRARY, USER = 0, 1, 2
SITE_WALK_LIMIT = 256  # frames walked for the user's code; a deeper stack keeps the first library site


def frame_class(filename: str) -> int:
    """PASS, LIBRARY or USER (flightrec/format/libraries.py says what is a library)."""
    if filename.startswith(_SKIP):
        return PASS
    return LIBRARY if is_library_file(filename) else USER


# id(code) -> (code, frame_class): hashing a code object hashes its whole body (~0.5 µs), its id does
# not; the entry keeps the code alive so an id is never reused while it is in the cache.
_SKIP_BY_CODE: dict[int, tuple[CodeType, int]] = {}
_SKIP_CACHE_LIMIT = 65536  # code made at run time (exec in a loop) must not grow it forever

Site = tuple[CodeType, int]  # (code, f_lasti): the line is looked up only when a dump is written


def call_site(depth: int = 2) -> Site | None:
    """The innermost frame of the user's code: where training code called us, through any library
    (an FSDP2 hook under torch's no_grad decorator, DeepSpeed's ZeRO, Lightning's loop). With no user
    frame on the stack (a hook run on an autograd thread), the first frame outside torch.distributed
    and flightrec.

    Kept raw on the hot path; `site_frame` turns it into (file, line, function) when needed. The C hot
    path (`_fastpath.c`, `call_site`) walks the same way, with the same cache.
    """
    try:
        frame: FrameType | None = sys._getframe(depth)
    except ValueError:
        return None
    cache = _SKIP_BY_CODE
    fallback: Site | None = None
    walked = 0
    while frame is not None and walked < SITE_WALK_LIMIT:
        code = frame.f_code
        known = cache.get(id(code))
        if known is None or known[0] is not code:
            if len(cache) >= _SKIP_CACHE_LIMIT:
                cache.clear()
            known = cache[id(code)] = (code, frame_class(code.co_filename))
        if known[1] == USER:
            return (code, frame.f_lasti)
        if known[1] == LIBRARY and fallback is None:
            fallback = (code, frame.f_lasti)
        frame = frame.f_back
        walked += 1
    return fallback


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


# A thread stack in a dump: at most this many frames; a deeper one keeps its outermost OUTER_FRAMES
# (the training script's entry point and loop: where a user starts reading) and its innermost rest,
# with one marker line between saying how many were left out.
STACK_LIMIT = 64
OUTER_FRAMES = 12
OMITTED = "... {} frames omitted ..."
SOURCE_FILES_PER_DUMP = 256  # source lines are read at dump time only; a bound on the files opened


def _whole_stack(frame: FrameType | None) -> list[Frame]:
    """Every frame of a thread, outermost first (a dump is rare: the walk is not on any hot path)."""
    out: list[Frame] = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    out.reverse()
    return out


def _trimmed(frames: list[Frame]) -> tuple[list[Frame | None], int]:
    """`frames` cut to STACK_LIMIT (the cut, None, between the outermost and the innermost ones), and
    how many frames the cut left out."""
    if len(frames) <= STACK_LIMIT:
        return list(frames), 0
    inner = STACK_LIMIT - OUTER_FRAMES - 1
    return [*frames[:OUTER_FRAMES], None, *frames[-inner:]], len(frames) - OUTER_FRAMES - inner


class _SourceLines:
    """The text of each frame's line, as a traceback shows it; None where the file cannot be read.

    Why at dump time: the analyzer usually runs on another machine, without the training code."""

    def __init__(self) -> None:
        self.files: set[str] = set()

    def line(self, filename: str, lineno: int) -> str | None:
        if filename not in self.files:
            if len(self.files) >= SOURCE_FILES_PER_DUMP or filename.startswith("<"):
                return None
            self.files.add(filename)
        try:
            text = linecache.getline(filename, lineno)
        except Exception:  # noqa: BLE001 - a source line is a nicety: never fail a dump for it
            return None
        return text.strip() or None


def current_stack(depth: int = 2) -> list[Frame]:
    try:
        return frames_of(sys._getframe(depth))
    except ValueError:
        return []


def all_thread_stacks() -> list[dict[str, object]]:
    """Every thread's Python stack, for the dump: where each thread is right now, with each frame's
    source line (`code`, parallel to `stack`)."""
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    source = _SourceLines()
    out: list[dict[str, object]] = []
    for ident, frame in frames.items():
        thread = threads.get(ident)
        kept, omitted = _trimmed(_whole_stack(frame))
        out.append({
            "name": thread.name if thread is not None else f"thread-{ident}",
            "ident": ident,
            "daemon": bool(thread.daemon) if thread is not None else True,
            "is_main": ident == main_ident,
            "stack": [f"{f[0]}:{f[1]} in {f[2]}" if f is not None else OMITTED.format(omitted)
                      for f in kept],
            "code": [source.line(f[0], f[1]) if f is not None else None for f in kept],
        })
    out.sort(key=lambda t: (not t["is_main"], str(t["name"])))
    return out

