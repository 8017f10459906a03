"""The names of the files a dump folder holds: one definition for the recorder that writes them, the
analyzer that finds them, and the fixtures and tests that write or look for them."""

from __future__ import annotations

import os
import re

DUMP_SUFFIX = ".json.gz"
DUMP_GLOB = "rank-*.json.gz"  # every rank's dump of every attempt
# `rank-00003.json.gz`, `rank-00003.attempt-2.json.gz`: group 1 is the rank, group 2 the restart attempt
DUMP_NAME = re.compile(r"^rank-(\d+)(?:\.attempt-(\d+))?\.json(?:\.gz)?$")
STACKS_SUFFIX = ".stacks.txt"  # faulthandler's stacks of a rank whose watchdog could not run


def dump_filename(rank: int, attempt: int = 0) -> str:
    """`rank-00003.json.gz`; from restart attempt 1 on `rank-00003.attempt-1.json.gz`, so that a restarted
    job's dumps never replace those of the attempt that hung or failed; a process that knows no rank
    writes `rank-unknown-<pid>.json.gz`."""
    stem = f"rank-{rank:05d}" if rank >= 0 else f"rank-unknown-{os.getpid()}"
    return f"{stem}.attempt-{attempt}{DUMP_SUFFIX}" if attempt > 0 else f"{stem}{DUMP_SUFFIX}"


def rank_of(name: str) -> int | None:
    """The rank a flightrec dump's file name carries, or None when it is not one."""
    m = DUMP_NAME.match(name)
    return int(m.group(1)) if m else None


def stacks_filename(dump_name: str) -> str:
    """`rank-00002.json.gz` -> `rank-00002.stacks.txt` (restart attempts keep their suffix)."""
    return dump_name.removesuffix(DUMP_SUFFIX) + STACKS_SUFFIX
