"""How a process group's members are written in a dump (kept free of torch: the synthetic-dump
writer and the analyzer's tests use it too)."""

from __future__ import annotations

from typing import Any

RANGE_MIN_MEMBERS = 16  # shorter member lists stay lists


def compact_ranks(ranks: Any) -> list[int] | dict[str, int]:
    """Members as a list, or as `{"start", "stop", "step"}` (Python's range) when they are evenly
    spaced and many: the world group of a 16,384-rank job is then 40 bytes in every dump, not 90 KB
    that every reader must parse (docs/dump-format.md)."""
    if isinstance(ranks, range) and len(ranks) >= RANGE_MIN_MEMBERS and ranks.step > 0:
        return {"start": ranks.start, "stop": ranks.start + len(ranks) * ranks.step, "step": ranks.step}
    members = [int(r) for r in ranks]
    if len(members) >= RANGE_MIN_MEMBERS:
        step = members[1] - members[0]
        if step > 0 and members == list(range(members[0], members[-1] + 1, step)):
            return {"start": members[0], "stop": members[-1] + step, "step": step}
    return members
