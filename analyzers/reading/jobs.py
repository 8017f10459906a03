"""Which dumps of a folder belong together: one job's latest run, and which of its dumps are stale.

Why: FLIGHTREC_DIR is often shared. Job A (4 ranks) hangs and writes rank-00000..00003; job B
(2 ranks) later replaces rank-00000/00001 in the same folder. Read as one job, ranks 2 and 3 of A
look like members of B that never entered B's collectives, and the verdict is confidently wrong.
And a rank that froze after an earlier dump (it cannot answer the later dump request) leaves that
earlier dump behind: it is history, not the rank's current state.

Job split. A flightrec dump names its job: `job_id` (TORCHELASTIC_RUN_ID, else FLIGHTREC_JOB_ID,
else Slurm's or the MPI launch's id: docs/dump-format.md; null and "none" count as unknown),
`world_size` (-1: unknown), `store` (MASTER_ADDR:MASTER_PORT) and `armed_wall_ns` (when that
process's recorder was armed). Dumps that disagree on one of the first three are different jobs;
with the same identity, the armed times sorted and cut wherever two consecutive ones are more than
`RUN_GAP_NS` (60 s) apart give the runs (the ranks of one run arm within seconds; the next run of
the job starts after the previous one ran). A missing field never splits: a dump that does not say
(older schemas, PyTorch's recorder) stays with the analysed job (when it lacks an identity field
that separates the jobs) or with the newest run of its identity (when it lacks only
`armed_wall_ns`). The newest job (latest `armed_wall_ns`, then latest `dump_time_ns`) is analysed;
the others are named in a warning and in the report's `jobs`.

Stale dumps. Peers answering one dump request write within seconds (each polls the store once a
second, a store call takes at most ~7 s, then the write), and every later timeout asks every live
rank again. So in the analysed job, a flightrec dump whose `dump_time_ns` is more than
`STALE_AFTER_NS` (30 s) older than the job's newest dump did not answer the latest request: it is
stale. Not stale: a dump written as the process ended (`reason` exit, signal or abort: its last
state), and any dump when that rule would make more than half of the dumps stale (then one or a few
ranks dumped alone later, e.g. a `flightrec.dump()` call, and the spread is only stated in gaps).

Cost: a few Python operations per dump (one dump per rank), nothing per entry.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..textutil import plural, ranges
from .rankdump import RankDump

RUN_GAP_NS = 60 * 1_000_000_000  # armed times further apart than this: different runs of one job
STALE_AFTER_NS = 30 * 1_000_000_000  # a dump this much older than its job's newest one is stale
FINAL_REASONS = frozenset({"exit", "signal", "abort"})  # written as the process ended: its last state
MAX_NAMED_FILES = 10  # files named in a warning line (the report's `jobs` lists them all)
MAX_STALE_LINES = 8  # stale ranks described one per line; beyond, one summary line
IDENTITY = ("job_id", "world_size", "store")


def clock(ns: int | None) -> str:
    """Wall-clock ns -> 'HH:MM:SS UTC' (dumps of one incident are minutes apart, not days)."""
    if ns is None:
        return "?"
    return time.strftime("%H:%M:%S UTC", time.gmtime(ns / 1e9))


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    text = value.strip()
    return text if text and text.lower() not in ("none", "null") else None


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def identity(d: RankDump) -> tuple[str | None, int | None, str | None]:
    """(job_id, world_size, store) as the dump states them; None where it does not say."""
    m = d.meta
    return _text(m.get("job_id")), _positive(m.get("world_size")), _text(m.get("store"))


@dataclass
class Job:
    """One run of one job: its identity (None where no dump says) and its dumps."""

    job_id: str | None
    world_size: int | None
    store: str | None
    dumps: list[RankDump] = field(default_factory=list)

    @property
    def launcher(self) -> str | None:
        """Which launcher started its ranks (torchrun, slurm, openmpi, ...: the dumps' `launcher`), the
        names joined where ranks disagree; None where no dump says."""
        named = sorted({name for name in (_text(d.meta.get("launcher")) for d in self.dumps) if name})
        return ", ".join(named) if named else None

    @property
    def armed_ns(self) -> list[int]:
        return [a for a in (_positive(d.meta.get("armed_wall_ns")) for d in self.dumps) if a is not None]

    @property
    def dump_times_ns(self) -> list[int]:
        return [t for t in (_positive(d.meta.get("dump_time_ns")) for d in self.dumps) if t is not None]

    def newness(self) -> tuple[int, int]:
        """Sort key: the latest armed time, then the latest dump time (-1 when unknown)."""
        return max(self.armed_ns, default=-1), max(self.dump_times_ns, default=-1)

    def item(self) -> dict[str, Any]:
        """The identity as the report states it."""
        armed, times = self.armed_ns, self.dump_times_ns
        return {
            "job_id": self.job_id,
            "launcher": self.launcher,
            "world_size": self.world_size,
            "store": self.store,
            "armed_wall_ns": min(armed) if armed else None,
            "dump_time_ns": max(times) if times else None,
            "dumps": len(self.dumps),
        }

    def describe(self) -> str:
        """'job "x" (world size 4, store h:p, armed 12:00:01 UTC)' with what is known."""
        parts = [f"world size {self.world_size}" if self.world_size else "world size unknown"]
        if self.store:
            parts.append(f"store {self.store}")
        armed = self.armed_ns
        if armed:
            parts.append(f"armed {clock(min(armed))}")
        times = self.dump_times_ns
        if times:
            parts.append(f"last dump {clock(max(times))}")
        if self.launcher:
            parts.append(f"launched by {self.launcher}")
        name = f'job "{self.job_id}"' if self.job_id else "a job without id"
        return f"{name} ({', '.join(parts)})"


@dataclass
class JobSplit:
    """What `split_jobs` decided: the dumps to analyse, the report's `jobs` object, the warnings."""

    kept: list[RankDump]
    jobs: dict[str, Any]
    notes: list[str]


def split_jobs(dumps: list[RankDump]) -> JobSplit:
    """Split the dumps by job identity and run (see the module's docstring); keep the newest job."""
    ids = [identity(d) for d in dumps]
    splitting = [i for i in range(len(IDENTITY)) if len({v[i] for v in ids if v[i] is not None}) > 1]
    by_identity: dict[tuple[Any, ...], list[RankDump]] = defaultdict(list)
    unassigned: list[RankDump] = []  # lacks a field that tells the jobs apart: never split off
    for d, v in zip(dumps, ids, strict=True):
        key = tuple(v[i] for i in splitting)
        if any(k is None for k in key):
            unassigned.append(d)
        else:
            by_identity[key].append(d)
    if not by_identity:
        by_identity[()] = []
    runs: list[Job] = []
    for members in by_identity.values():
        runs += _runs(members)
    for run in runs:  # fields that do not split: the value any of its dumps states
        for k, name in enumerate(IDENTITY):
            value = next((identity(d)[k] for d in run.dumps if identity(d)[k] is not None), None)
            setattr(run, name, value)
    runs.sort(key=Job.newness)
    chosen = runs[-1]
    chosen.dumps = chosen.dumps + unassigned
    ignored = [r for r in runs[:-1] if r.dumps]
    report = {
        "analysed": chosen.item(),
        "ignored": [{**r.item(), "ranks": sorted({d.rank for d in r.dumps}), "files": sorted(d.file for d in r.dumps)}
                    for r in ignored],
    }
    notes = [_ignored_line(chosen, r) for r in ignored]
    return JobSplit(kept=chosen.dumps if ignored else dumps, jobs=report, notes=notes)


def _runs(dumps: list[RankDump]) -> list[Job]:
    """One identity's dumps cut into runs at gaps of more than RUN_GAP_NS between armed times."""
    timed = sorted((a, i) for i, d in enumerate(dumps) if (a := _positive(d.meta.get("armed_wall_ns"))) is not None)
    runs: list[Job] = [Job(None, None, None)]
    last: int | None = None
    for armed, i in timed:
        if last is not None and armed - last > RUN_GAP_NS:
            runs.append(Job(None, None, None))
        runs[-1].dumps.append(dumps[i])
        last = armed
    with_time = {i for _, i in timed}
    runs[-1].dumps += [d for i, d in enumerate(dumps) if i not in with_time]  # no armed time: the newest run
    return runs


def _ignored_line(chosen: Job, other: Job) -> str:
    ranks = sorted({d.rank for d in other.dumps})
    files = sorted(d.file.rsplit("/", 1)[-1] for d in other.dumps)
    named = ", ".join(files[:MAX_NAMED_FILES]) + (f", ... ({len(files)} files)" if len(files) > MAX_NAMED_FILES else "")
    return (
        f"dumps of more than one job in this folder: analysed {chosen.describe()}, {plural(len(chosen.dumps), 'dump')}; "
        f"ignored {other.describe()}: rank(s) {ranges(ranks)} ({named}), left by an earlier job or run "
        "in the same FLIGHTREC_DIR (give each job its own folder)"
    )


@dataclass
class Stale:
    """A rank whose dump is stale: when it was written and how much older than the newest dump."""

    rank: int
    written_ns: int
    age_ns: int
    reason: str | None

    def text(self) -> str:
        """The `absent` reason shown in root causes."""
        return (f"its dump is stale (written {clock(self.written_ns)}, {self.age_ns / 1e9:.0f} s before the others'): "
                "its current state is unknown (frozen?)")


@dataclass
class StaleResult:
    stale: dict[int, Stale]
    notes: list[str]


def find_stale(dumps: dict[int, RankDump]) -> StaleResult:
    """Stale dumps of one job (see the module's docstring): rank -> Stale, plus the gap lines."""
    times = {r: t for r, t in ((r, _positive(d.meta.get("dump_time_ns"))) for r, d in dumps.items()) if t is not None}
    if len(times) < 2:
        return StaleResult({}, [])
    newest = max(times.values())
    newest_ranks = [r for r, t in times.items() if t == newest]
    old = {r: t for r, t in times.items() if newest - t > STALE_AFTER_NS}
    final = {r for r in old if str(dumps[r].meta.get("reason") or "").split(":", 1)[0] in FINAL_REASONS}
    candidates = {r: t for r, t in old.items() if r not in final}
    if not candidates:
        return StaleResult({}, [])
    if 2 * len(candidates) > len(times):
        fresh = sorted(r for r, t in times.items() if newest - t <= STALE_AFTER_NS)
        return StaleResult({}, [
            f"rank(s) {ranges(fresh)} dumped more than {STALE_AFTER_NS // 10**9} s after the other "
            f"{plural(len(candidates), 'rank')} (newest {clock(newest)}); most dumps are older, so none is taken as stale, "
            "but the ranks' states are from different moments"
        ])
    stale = {r: Stale(r, t, newest - t, dumps[r].meta.get("reason")) for r, t in sorted(candidates.items())}
    notes = []
    ref = f"the newest dump ({'ranks' if len(newest_ranks) > 1 else 'rank'} {ranges(newest_ranks)}, {clock(newest)})"
    for s in list(stale.values())[:MAX_STALE_LINES]:
        notes.append(
            f"rank {s.rank}: its dump is stale: written {clock(s.written_ns)}"
            + (f" (reason {s.reason})" if s.reason else "")
            + f", {s.age_ns / 1e9:.0f} s before {ref}; it did not answer the later dump request (frozen, or its "
            "watchdog could not run), so its entries are history and its current state is unknown"
        )
    if len(stale) > MAX_STALE_LINES:
        rest = list(stale)[MAX_STALE_LINES:]
        ages = [stale[r].age_ns / 1e9 for r in rest]
        notes.append(f"rank(s) {ranges(rest)}: their dumps are stale too ({min(ages):.0f}-{max(ages):.0f} s before {ref})")
    return StaleResult(stale, notes)
