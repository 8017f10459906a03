"""Give freed heap memory back to the operating system between the big steps of a large analysis.

Why: reading thousands of dumps makes millions of small arrays and objects; once they are merged
into the entry table they are freed, but glibc keeps the pages in its arenas, so the process's
resident size stays near the sum of both. `malloc_trim` returns them: measured at 1,024 ranks, the
peak while loading fell from 0.77 to 0.52 GB. A no-op where glibc is not the allocator.

Called at the ends of phases only: by the loader (after the merge, once reading is done) and by
`Analysis` between matching, waits and the timing pass; the passes themselves do no housekeeping.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    # "libc.so.6" first: find_library forks ldconfig, and a fork of a big process is a big child
    # (its inherited high-water mark even shows in RUSAGE_CHILDREN)
    for find in (lambda: "libc.so.6", lambda: ctypes.util.find_library("c")):
        try:
            name = find()
            libc = ctypes.CDLL(name) if name else None
        except OSError:
            continue
        if libc is not None and hasattr(libc, "malloc_trim"):
            return libc
    return None


def release_free_memory() -> None:
    """Return free heap pages to the OS (glibc `malloc_trim(0)`); silently nothing elsewhere."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
WORKER_HEAP_BYTES = 256 << 20


def reuse_freed_memory(limit: int = WORKER_HEAP_BYTES) -> None:
    """Keep freed heap memory (up to `limit`) for the next allocation instead of returning it.

    Why: a reader process builds a table of a few tens of MB per batch and frees it; by default
    glibc maps such arrays fresh and unmaps them when freed, so every batch faults its pages in
    again: ~100 page faults and ~0.3 ms of system time per file read, ~5% of a reader's time
    (benchmarks/analyze_scale.py). Only for short-lived processes: memory held back this way
    stays counted in the process's resident size."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, limit)
        libc.mallopt(M_TRIM_THRESHOLD, 2 * limit)
