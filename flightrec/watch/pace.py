"""Live pace: every rank's collective waits, published through the job's store; rank 0 names a straggler
in its log while it still costs, and writes the metrics file.

Why waits: in a collective, the member that arrives last waits least, and every other member waits for
it. Each rank measures only its own waits (its own clock, so no clock skew enters); over the same run of
collectives of a group, the rank whose waits fall short of its peers' median by more than a share of the
window is the one holding them back, by that much (`cost`). Random jitter (an oversubscribed host, noise)
spreads the short waits over the members and cancels out in the median; a straggler's does not.

What counts: collectives whose wait was measured, the same ones on every member: host-timed calls issued
from Python that returned complete (a blocking gloo call), and device-timed ops (NCCL/HCCL events). DDP's
bucket all-reduces, issued from C++, carry no measured time and do not count; on such a job the alert
reads the other collectives (the loss all-reduce, barriers) or says nothing.

Alignment: a rank notes its cumulative wait at every GRID-th collective of each group (`Pace`), so
members compare the same collectives whichever moment each publishes. Rank 0 (`Scorer`) takes, per
group, the newest grid point every member reached and the one about a window before it.

Everything here is standard library: it runs in the recorder's watchdog thread, and `flightrec watch`
runs the same scoring outside the job.
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

GRID = 8  # a grid point every 8th collective of a group
GRID_KEEP = 512  # grid points kept (and published) per group: 4,096 collectives
PACE_KEY = "flightrec/pace"  # + /<attempt>/<rank>: one JSON record per rank, overwritten
MIN_COST_S = 0.5  # below this a window's cost is never a straggler, whatever the share
MIN_INTERVAL_SHARE = 0.5  # an interval counts as costly when it costs this share of the window's per-interval cost
PERSISTENT = 0.75  # share of a window's grid intervals a persistent straggler costs in
QUIET_AFTER = 2  # scoring rounds without cost before a "no longer" line


def pace_key(attempt: int, rank: int) -> str:
    return f"{PACE_KEY}/{attempt}/{rank}"


@dataclass
class _GroupPace:
    next_seq: int = 1  # the next collective seq expected to complete
    wait_ns: int = 0  # cumulative measured wait
    counted: int = 0  # collectives whose wait was measured
    done: int = 0  # collectives completed, measured or not
    grid: deque = field(default_factory=lambda: deque(maxlen=GRID_KEEP))  # (seq, wait_ns, counted, t_ns)


def measured_wait_ns(entry: Any) -> int | None:
    """The wait of a completed collective, where it was measured (module docstring), else None."""
    start, end = getattr(entry, "t_dev_start_ns", None), getattr(entry, "t_dev_end_ns", None)
    if start is not None and end is not None and end >= start:
        return int(end - start)
    if entry.source != "python" or entry.is_async or entry.device != "cpu" or entry.t_complete_ns is None:
        return None
    wait = entry.t_complete_ns - entry.t_enqueue_ns
    return int(wait) if wait >= 0 else None


class Pace:
    """One rank's waits per group, from the ring, kept by the watchdog thread (never the training thread)."""

    def __init__(self) -> None:
        self.groups: dict[str, _GroupPace] = {}
        self.ops_done = 0
        self.wait_ns = 0

    def update(self, entries: Iterable[Any]) -> None:
        """Take in the collectives completed since the last call, in seq order per group; an op still in
        flight stops its group's count until it completes."""
        by_group: dict[str, dict[int, Any]] = {}
        for e in entries:
            if e.kind == "coll" and e.seq > 0:
                pace = self.groups.get(e.group)
                if pace is None or e.seq >= pace.next_seq:
                    by_group.setdefault(e.group, {})[e.seq] = e
        for group, ops in by_group.items():
            pace = self.groups.setdefault(group, _GroupPace(next_seq=min(ops)))
            if pace.next_seq not in ops and min(ops) > pace.next_seq:
                # the ring wrapped past ops not yet taken in: the waits from here on are not comparable with the
                # grid points before (peers counted ops this rank lost), so the grid starts again
                pace.next_seq = min(ops)
                pace.grid.clear()
            while True:
                e = ops.get(pace.next_seq)
                if e is None or e.state not in ("completed", "failed") or e.seq != pace.next_seq:
                    break
                wait = measured_wait_ns(e) if e.state == "completed" else None
                pace.done += 1
                self.ops_done += 1
                if wait is not None:
                    pace.wait_ns += wait
                    pace.counted += 1
                    self.wait_ns += wait
                if pace.next_seq % GRID == 0:
                    pace.grid.append((pace.next_seq, pace.wait_ns, pace.counted, e.t_complete_ns or time.monotonic_ns()))
                pace.next_seq += 1

    def record(self, rank: int, world_size: int = -1, in_flight: Mapping[str, tuple[int, float]] | None = None,
               every_s: float = 0.0) -> dict[str, Any]:
        """What this rank publishes: its grid points per group, ops done, total wait, and the op each group
        waits in (`in_flight`: group -> (seq, seconds)), stamped with the wall time of publishing and how
        often it publishes (`every_s`: a record older than a few of those is a rank that stopped answering)."""
        in_flight = in_flight or {}
        groups = {
            g: {"done": p.next_seq - 1, "grid": [[s, round(w / 1e6, 3), n, round(t / 1e6, 3)] for s, w, n, t in p.grid],
                "in": list(in_flight[g]) if g in in_flight else None}
            for g, p in self.groups.items()
        }
        return {"rank": rank, "world": world_size, "host": socket.gethostname(), "pid": os.getpid(),
                "time": time.time(), "every_s": every_s,
                "ops": self.ops_done, "wait_s": round(self.wait_ns / 1e9, 3), "groups": groups}


@dataclass
class Straggle:
    """One rank holding one group back over the last window."""

    rank: int
    host: str
    group: str
    cost_s: float
    window_s: float
    pattern: str  # persistent / periodic / intermittent
    collectives: int  # measured collectives the window spans

    @property
    def share(self) -> float:
        return self.cost_s / self.window_s if self.window_s > 0 else 0.0

    def line(self, members: str = "") -> str:
        group = f"group {self.group}{f' {members}' if members else ''}"
        return (f"straggler: rank {self.rank} ({self.host}) held {group} back {self.cost_s:.1f} s of the last "
                f"{self.window_s:.0f} s ({100 * self.share:.1f}%), {self.pattern}, over {self.collectives} collectives")


def _window(points: list[list[float]], window_s: float) -> tuple[int, int] | None:
    """Indexes (first, last) into one rank's grid points spanning about `window_s` back from the last."""
    if len(points) < 2:
        return None
    last_t = points[-1][3]
    first = len(points) - 2
    while first > 0 and (last_t - points[first][3]) / 1e3 < window_s:
        first -= 1
    return first, len(points) - 1


def score_group(group: str, records: Mapping[int, Mapping[str, Any]], window_s: float, share: float) -> list[Straggle]:
    """The members of `group` whose waits fell short of their peers' by more than `share` of the window."""
    grids = {r: {int(p[0]): p for p in rec["groups"][group]["grid"]} for r, rec in records.items()
             if group in rec.get("groups", {})}
    if len(grids) < 2:
        return []
    common = sorted(set.intersection(*(set(g) for g in grids.values())))
    if len(common) < 2:
        return []
    ref = min(grids)  # any member's clock spans the window the same within a collective's length
    points = [grids[ref][s] for s in common]
    span = _window(points, window_s)
    if span is None:
        return []
    seqs = common[span[0]:span[1] + 1]
    elapsed = statistics.median((grids[r][seqs[-1]][3] - grids[r][seqs[0]][3]) / 1e3 for r in grids)
    if elapsed <= 0:
        return []
    # per rank, per grid interval: measured wait (ms) and count
    waits = {r: [grids[r][b][1] - grids[r][a][1] for a, b in pairwise(seqs)] for r in grids}
    counted = [grids[ref][b][2] - grids[ref][a][2] for a, b in pairwise(seqs)]
    if sum(counted) == 0:
        return []
    ranks = list(grids)
    # per interval, each rank's shortfall against the median of the others (one sort per interval)
    shortfall = {r: [0.0] * len(counted) for r in ranks}
    for k in range(len(counted)):
        column = [waits[r][k] for r in ranks]
        for r, others in zip(ranks, _others_medians(column), strict=True):
            shortfall[r][k] = others - waits[r][k]
    out = []
    for r in ranks:
        per_interval = shortfall[r]
        cost_s = sum(per_interval) / 1e3
        if cost_s < max(MIN_COST_S, share * elapsed):
            continue
        out.append(Straggle(r, str(records[r].get("host", "?")), group, cost_s, elapsed,
                            _pattern(per_interval), sum(counted)))
    return out


def _others_medians(values: list[float]) -> list[float]:
    """For each value, the median of all the other values: one sort, not one per value (1,024 ranks'
    records score in well under a second)."""
    n = len(values)
    order = sorted(range(n), key=values.__getitem__)
    ordered = [values[i] for i in order]
    position = [0] * n
    for p, i in enumerate(order):
        position[i] = p
    half = (n - 1) // 2
    out = []
    for i in range(n):
        def at(j: int, skip: int = position[i]) -> float:  # the j-th smallest of the others
            return ordered[j] if j < skip else ordered[j + 1]
        out.append(at(half) if (n - 1) % 2 else (at(half - 1) + at(half)) / 2)
    return out


def _pattern(per_interval: list[float]) -> str:
    """From the first interval it cost in on: persistent when it costs in most of them, periodic when in
    intervals at a steady spacing, else intermittent."""
    mean = sum(per_interval) / len(per_interval)
    costly = [k for k, c in enumerate(per_interval) if c > MIN_INTERVAL_SHARE * mean and c > 0]
    if not costly:
        return "intermittent"
    if len(costly) >= PERSISTENT * (len(per_interval) - costly[0]):
        return "persistent"
    gaps = [b - a for a, b in pairwise(costly)]
    if len(costly) >= 3 and max(gaps) - min(gaps) <= 1 and min(gaps) >= 2:
        return "periodic"
    return "intermittent"


def score(records: Mapping[int, Mapping[str, Any]], window_s: float, share: float) -> list[Straggle]:
    """Every group's stragglers, costliest first (ties in cost by rank only for a stable order of lines)."""
    groups = sorted({g for rec in records.values() for g in rec.get("groups", {})})
    found = [s for g in groups for s in score_group(g, records, window_s, share)]
    return sorted(found, key=lambda s: (-s.cost_s, s.group, s.rank))


class AlertLog:
    """Which straggler lines were said, so each is said again only when what it says changes."""

    def __init__(self) -> None:
        self.said: dict[tuple[int, str], tuple[str, int]] = {}  # (rank, group) -> (pattern, cost band)
        self.quiet: dict[tuple[int, str], int] = {}

    def news(self, found: list[Straggle], members: Mapping[str, str] | None = None) -> list[str]:
        members = members or {}
        lines = []
        now = {(s.rank, s.group): s for s in found}
        for key, s in now.items():
            band = int(math.floor(math.log2(max(s.share, 1e-9) * 100)))  # doubles: 1-2%, 2-4%, 4-8%, ...
            if self.said.get(key) != (s.pattern, band):
                lines.append(s.line(members.get(s.group, "")))
                self.said[key] = (s.pattern, band)
            self.quiet.pop(key, None)
        for key in list(self.said):
            if key in now:
                continue
            self.quiet[key] = self.quiet.get(key, 0) + 1
            if self.quiet[key] >= QUIET_AFTER:
                rank, group = key
                lines.append(f"straggler: rank {rank} no longer holds group {group} back")
                del self.said[key], self.quiet[key]
        return lines


def parse_records(raw: Mapping[int, str | None]) -> dict[int, dict[str, Any]]:
    """Published records by rank; an unreadable or missing one is left out (the rank has not published)."""
    out = {}
    for rank, text in raw.items():
        if not text:
            continue
        try:
            rec = json.loads(text)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("groups"), dict):
            out[rank] = rec
    return out


def metrics_text(records: Mapping[int, Mapping[str, Any]], found: list[Straggle], now: float | None = None) -> str:
    """The Prometheus textfile: per rank, ops completed, time waiting, cost to others (last window), and the
    age of its record (a rank that stopped answering ages)."""
    now = time.time() if now is None else now
    cost: dict[int, float] = {}
    for s in found:
        cost[s.rank] = cost.get(s.rank, 0.0) + s.cost_s
    lines = [
        "# HELP flightrec_ops_completed_total Collectives this rank completed, per its own recorder.",
        "# TYPE flightrec_ops_completed_total counter",
        "# HELP flightrec_wait_seconds_total Measured time this rank waited inside collectives.",
        "# TYPE flightrec_wait_seconds_total counter",
        "# HELP flightrec_cost_to_others_seconds Time this rank held its groups back over the last window.",
        "# TYPE flightrec_cost_to_others_seconds gauge",
        "# HELP flightrec_record_age_seconds Seconds since this rank last published its pace.",
        "# TYPE flightrec_record_age_seconds gauge",
    ]
    for rank in sorted(records):
        rec = records[rank]
        labels = f'rank="{rank}",host="{_label(str(rec.get("host", "")))}"'
        lines += [f"flightrec_ops_completed_total{{{labels}}} {int(rec.get('ops', 0))}",
                  f"flightrec_wait_seconds_total{{{labels}}} {float(rec.get('wait_s', 0.0)):.3f}",
                  f"flightrec_cost_to_others_seconds{{{labels}}} {cost.get(rank, 0.0):.3f}",
                  f"flightrec_record_age_seconds{{{labels}}} {max(0.0, now - float(rec.get('time', now))):.1f}"]
    return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def write_atomically(path: str, text: str) -> None:
    """Replace `path` whole: a reader (node_exporter's textfile collector) never sees half a file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)
