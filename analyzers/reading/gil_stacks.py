"""flightrec's held-GIL stacks file (`rank-NNNNN.stacks.txt`, flightrec/watch/gil_watch.py): faulthandler's text.

Why a file of its own: a rank stuck in C code that holds the GIL writes no dump (its watchdog thread
cannot run), but faulthandler's C thread still writes every Python thread's stack there. The first
line (written by the recorder) says whose file it is; each `Timeout (...)!` line starts one write;
the file's modification time is the time of the last one. A file with no such line never fired.
"""

from __future__ import annotations

import re
from typing import Any

from .rankdump import DumpError, SideFile

MAGIC = b"# flightrec-stacks/1"  # flightrec/watch/gil_watch.py's MAGIC
KIND = "gil_stacks"
HEADER_FIELD = re.compile(r"(\w+)=(\S+)")
TIMEOUT_LINE = re.compile(r"^Timeout \(([^)]*)\)!\s*$")
THREAD_LINE = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
FRAME_LINE = re.compile(r'^\s+File "(.*)", line (\d+) in (.*?)\s*$')


def is_stacks(data: bytes) -> bool:
    return data.startswith(MAGIC)


def _int(text: str | None, base: int = 10) -> int | None:
    try:
        return int(text, base) if text is not None else None
    except ValueError:
        return None


def parse(data: bytes, name: str, hint: int | None) -> SideFile:
    """The header's fields and the threads of the last write (outermost frame first, as dumps keep
    stacks; faulthandler prints the innermost first). `threads` is empty when the timer never fired."""
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines()
    header = dict(HEADER_FIELD.findall(lines[0])) if lines else {}
    rank = _int(header.get("rank"))
    if rank is None and hint is None:
        raise DumpError("flightrec stacks file that names no rank")
    starts = [i for i, line in enumerate(lines) if TIMEOUT_LINE.match(line)]
    main, watchdog = _int(header.get("main"), 16), _int(header.get("watchdog"), 16)
    threads: list[dict[str, Any]] = []
    for line in lines[starts[-1] + 1:] if starts else []:
        head = THREAD_LINE.match(line)
        if head:
            ident = int(head.group(2), 16)
            name_ = "MainThread" if ident == main else "flightrec-watchdog" if ident == watchdog else f"thread-{head.group(2)}"
            threads.append({"name": name_, "ident": ident, "is_main": ident == main, "stack": []})
            continue
        frame = FRAME_LINE.match(line)
        if frame and threads:
            threads[-1]["stack"].insert(0, f"{frame.group(1)}:{frame.group(2)} in {frame.group(3)}")
    meta = {"limit_s": header.get("limit_s"), "pid": _int(header.get("pid")), "attempt": _int(header.get("attempt")) or 0,
            "writes": len(starts)}
    return SideFile(file=name, rank=rank if rank is not None else hint, threads=threads, kind=KIND, meta=meta)
