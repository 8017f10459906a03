"""Which torchelastic restart attempt to analyse, when the dumps of several are in the folder.

Why before the job split (jobs.py): a restart keeps the job's id, world size and store and is armed
later, so read as one job its ranks would each have two dumps, or its earlier attempt would be called
"another job". The recorder writes attempt k > 0 as `rank-NNNNN.attempt-k.json.gz` and records
`attempt` in the dump; a dump that does not say (older schemas, PyTorch's recorder) is attempt 0.

Default: the attempt holding the most recently armed process (then the latest dump, then the
highest number): in one job, its latest attempt; in a folder shared with an older job that also
restarted, still the newest job's. `--attempt N` (`analyzers.load(..., attempt=N)`) picks one.

Cost: a few Python operations per dump, nothing per entry.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..textutil import plural
from .rankdump import RankDump


class NoSuchAttempt(LookupError):
    """The attempt asked for has no readable dump; the message names the attempts present."""


def attempt_of(d: RankDump) -> int:
    """The dump's restart attempt (0 when it does not say or says something that is not a count)."""
    value = d.meta.get("attempt")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _positive(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else -1


def _newness(dumps: list[RankDump], attempt: int) -> tuple[int, int, int]:
    armed = max((_positive(d.meta.get("armed_wall_ns")) for d in dumps), default=-1)
    dumped = max((_positive(d.meta.get("dump_time_ns")) for d in dumps), default=-1)
    return armed, dumped, attempt


@dataclass
class AttemptSplit:
    """The dumps of the attempt analysed, and the report's `attempts` object."""

    kept: list[RankDump]
    report: dict[str, Any]


def split_attempts(dumps: list[RankDump], wanted: int | None = None) -> AttemptSplit:
    """Keep one attempt's dumps: `wanted`, else the newest (see the module's docstring).

    Raises NoSuchAttempt when `wanted` has no dump while others do.
    """
    by_attempt: dict[int, list[RankDump]] = defaultdict(list)
    for d in dumps:
        by_attempt[attempt_of(d)].append(d)
    if not by_attempt:
        return AttemptSplit(dumps, {"analysed": wanted or 0, "others": []})
    if wanted is not None and wanted not in by_attempt:
        present = ", ".join(f"{a} ({plural(len(by_attempt[a]), 'dump')})" for a in sorted(by_attempt))
        raise NoSuchAttempt(f"no dump of restart attempt {wanted} (attempts present: {present})")
    chosen = wanted if wanted is not None else max(by_attempt, key=lambda a: _newness(by_attempt[a], a))
    others = [{"attempt": a, "ranks": sorted({d.rank for d in ds}), "files": sorted(d.file for d in ds)}
              for a, ds in sorted(by_attempt.items()) if a != chosen]
    return AttemptSplit(by_attempt[chosen], {"analysed": chosen, "others": others})
