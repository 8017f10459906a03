"""The next step for a named rank, in plain words: what the on-call engineer does on which machine.

Why: a root cause says what is wrong; the engineer paged at 3 a.m. needs the one thing to do next,
with the host and process to do it on. Each kind of cause has its own first move; nothing here is a
guess beyond what the cause already states.
"""

from __future__ import annotations

from typing import Any

from .. import stackview
from ..constants import COMM_STUCK, CRASHED, EXITED, KIND_DEADLOCK, MISMATCH, MISSING_DUMP, NOT_ENTERED
from ..diagnosis.stalls import short_site


def cause_step(c: dict[str, Any]) -> str | None:
    """The first thing to do about root cause `c` (a report's `root_causes` item)."""
    r, kind = c["rank"], c["kind"]
    on = _on(c)
    if kind == NOT_ENTERED and c.get("gil_stacks"):
        return f"see where rank {r} holds the GIL in C code{on}: `py-spy dump --native --pid {c.get('pid') or 'PID'}`"
    if kind == NOT_ENTERED:
        user = stackview.innermost_user(list(c.get("stack") or []), list(c.get("source") or []) or None)
        if user is None:
            return f"see where rank {r} is{on}: `py-spy dump --pid {c.get('pid') or 'PID'}` (its dump has no stack)"
        return f"find why rank {r} is still at {short_site(user[0])}{on}: its peers wait for it to reach the collective"
    if kind == CRASHED and c.get("stack"):
        return f"fix the error rank {r} raised{on} (traceback below); the others failed because it died"
    if kind in (CRASHED, MISSING_DUMP):
        return (f"read rank {r}'s own log and the kernel log{on} (dmesg: out of memory, segfault): "
                "it died or froze without a word")
    if kind == EXITED:
        return (f"rank {r} left early{on}: every rank must issue the same collectives (uneven data? "
                "torch.distributed.algorithms.Join, or drop_last)")
    if kind == MISMATCH:
        where = f" at {short_site(c['site'])}" if c.get("site") else ""
        return f"make rank {r} call the same op, shapes and dtypes as its peers{where}"
    if kind == KIND_DEADLOCK:
        return "reorder the sends and receives of the ranks in the cycle: each waits for another to go first"
    if kind == COMM_STUCK:
        return f"every member entered the op: check the link and the device{on} (backend logs, NIC, GPU health)"
    return None


def slow_step(s: dict[str, Any], report: dict[str, Any]) -> str:
    """The first thing to do about slow rank `s` (a report's `stragglers` item)."""
    place = (report.get("hosts") or {}).get(str(s["rank"])) or {}
    on = f" on host {place['host']}" if place.get("host") else ""
    late = next((a for a in s.get("late_at") or [] if a.get("site")), None)
    before = f" before {short_site(late['site'])}" if late else " between its collectives"
    return (f"profile rank {s['rank']}{on} (e.g. `py-spy record` on its process): it takes longer than its peers"
            f"{before}")


def _on(c: dict[str, Any]) -> str:
    """` on host vm (pid 77)`, or nothing where the report cannot place the rank."""
    if not c.get("host"):
        return ""
    return f" on host {c['host']}" + (f" (pid {c['pid']})" if c.get("pid") is not None else "")
