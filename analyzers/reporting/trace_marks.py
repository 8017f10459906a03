"""The analysis drawn on the timeline: a root-cause marker on each root-cause rank, and a flow arrow
from each waiting rank's blocking op to each rank it waits for (docs/timeline.md).

Why apart: these events come from the report, not from the entries; they only need to know where
the placed ops are (`Anchors`) and the ranks' tracks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..textutil import plural, ranges
from .trace_columns import strings, us
from .trace_placement import Placement

ROOT_CAUSE_CNAME = "terrible"  # Chrome's reserved colour name (Perfetto colours by name and ignores it)
MARKER_ARGS = ("op", "group", "group_desc", "seq", "site", "last_op", "host", "pid", "local_rank")


@dataclass(frozen=True)
class Anchors:
    """Where the analysis's events attach to the placed ops; (ts, tid, cat): a slice's start (ns since
    t0), thread and category (its op kind)."""

    wait_start: dict[int, int]  # rank -> start of its earliest drawn blocking op
    blocking_at: dict[int, tuple[int, int, str]]  # rank -> its earliest blocking slice
    last_at: dict[int, tuple[int, int, str]]  # rank -> its latest-starting slice


def anchors(df: pd.DataFrame, placed: Placement) -> Anchors:
    """The anchors of the ops placed from the entry table `df`."""
    ops = placed.ops
    blocking = df["blocking"].to_numpy()[ops.row]
    kind = np.asarray(strings(df["kind"], ops.row), dtype=object)
    wait_start: dict[int, int] = {}
    blocking_at: dict[int, tuple[int, int, str]] = {}
    for i in np.flatnonzero(blocking).tolist():  # in start order
        r = int(ops.rank[i])
        wait_start.setdefault(r, int(ops.ts[i]))
        if not ops.instant[i]:
            blocking_at.setdefault(r, (int(ops.ts[i]), int(ops.tid[i]), kind[i]))
    spans = np.flatnonzero(~ops.instant)
    last_ranks, at = np.unique(ops.rank[spans][::-1], return_index=True)
    last = spans[len(spans) - 1 - at]  # each rank's latest-starting slice
    last_at = {int(r): (int(ops.ts[i]), int(ops.tid[i]), kind[i])
               for r, i in zip(last_ranks.tolist(), last.tolist(), strict=True)}
    return Anchors(wait_start=wait_start, blocking_at=blocking_at, last_at=last_at)


def markers(root_causes: list[dict[str, Any]], waits: list[dict[str, Any]], placed: Placement, where: Anchors,
            pid: dict[int, int]) -> list[dict[str, Any]]:
    """An instant on each root-cause rank at its last known moment: its dump time, else its last
    recorded time, else (no record at all) where the first rank waiting for it began to wait; a rank
    with none of these has no marker."""
    last = _last_times(placed)
    waiters: dict[int, list[int]] = {}
    for w in waits:
        for m in w["waits_for"]:
            waiters.setdefault(m, []).append(w["rank"])
    out: list[dict[str, Any]] = []
    seen: set[tuple[int, str]] = set()
    for c in root_causes:
        for r in c["ranks"]:
            if (r, c["kind"]) in seen:
                continue
            seen.add((r, c["kind"]))
            if r in placed.dump_at:
                at, how = placed.dump_at[r] - placed.t0, "the rank's dump time (its last known moment)"
            elif r in last:
                at, how = last[r], "the rank's last recorded time (the dump does not say when it was taken)"
            else:
                starts = [where.wait_start[w] for w in waiters.get(r, []) if w in where.wait_start]
                if not starts:
                    continue
                at, how = min(starts), "no record of this rank: placed where the first rank waiting for it began to wait"
            out.append({"name": f"root cause: {c['kind']}", "cat": "root_cause", "ph": "i", "s": "t", "ts": us(at),
                        "pid": pid[r], "tid": r, "cname": ROOT_CAUSE_CNAME, "args": _marker_args(c, r, how)})
    return out


def waits_text(waits: list[dict[str, Any]]) -> dict[int, str]:
    """Each waiting rank's `waits_for` argument: whom it waits for, in words ('' for nobody)."""
    return {w["rank"]: f"rank{'s' if len(w['waits_for']) > 1 else ''} {ranges(w['waits_for'])}" if w["waits_for"] else ""
            for w in waits}


def flows(waits: list[dict[str, Any]], where: Anchors, marks: list[dict[str, Any]],
          pid: dict[int, int]) -> list[dict[str, Any]]:
    """A flow arrow (start and finish event) from each waiting rank's blocking op to each rank it waits
    for: to that rank's own blocking op, else its latest op, else its root-cause marker. Both ends sit
    at the start of the slice they belong to and carry the waiter's op kind as category (DevTools binds
    a flow only to an event of the same time and category; Perfetto and chrome://tracing to the
    enclosing slice). A wait whose waiting op is not drawn as a slice has no arrow."""
    marker_at = {m["tid"]: m["ts"] for m in marks}
    out: list[dict[str, Any]] = []
    n = 0
    for w in waits:
        src = where.blocking_at.get(w["rank"])
        if src is None:
            continue
        for m in w["waits_for"]:
            anchor = where.blocking_at.get(m) or where.last_at.get(m)
            if anchor is not None:
                ts, tid = us(anchor[0]), anchor[1]
            elif m in marker_at:
                ts, tid = marker_at[m], m
            else:
                continue
            n += 1
            common = {"name": "waits for", "cat": src[2], "id": n}
            out.append({**common, "ph": "s", "ts": us(src[0]), "pid": pid[w["rank"]], "tid": src[1]})
            out.append({**common, "ph": "f", "bp": "e", "ts": ts, "pid": pid[m], "tid": tid})
    return out


def _last_times(placed: Placement) -> dict[int, int]:
    """Each rank's latest drawn time (end of a slice, or an instant), ns since t0."""
    ops = placed.ops
    if not len(ops.row):
        return {}
    stop = ops.ts + ops.dur
    return {int(r): int(t) for r, t in pd.Series(stop).groupby(ops.rank).max().items()}


def _marker_args(c: dict[str, Any], rank: int, how: str) -> dict[str, Any]:
    """A root cause's marker args: its kind and detail, how its time was chosen, what the cause names."""
    args = {"kind": c["kind"], "detail": c["detail"], "time": how}
    for key in MARKER_ARGS:
        if c.get(key) not in (None, ""):
            args[key] = c[key]
    if c["ranks"] != [rank]:
        args["ranks"] = ranges(c["ranks"])
    if c["victims"]:
        args["victims"] = f"{plural(len(c['victims']), 'rank')}: {ranges(c['victims'])}"
    return args
