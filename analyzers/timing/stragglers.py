"""Slow ranks and slow links from timing, without trusting clocks across hosts.

In a blocking collective the early members wait for the last one, so each member's own duration
(completion minus enqueue, both on its own clock) already orders them: the last to arrive waits
least. A member's lateness in one collective is the longest duration there minus its own, and the
part of it its own compute explains is its own lateness. Ranks are then compared with robust
statistics over many collectives (median own lateness, a MAD-based score, and how often each held
the others up the most), so one hiccup does not make a straggler and a persistent 5% does.
Clocks are only used to report each rank's offset, estimated from the collectives themselves:
members leave a blocking collective at almost the same instant.

This module gives the verdict (`find_slow`); the parts it puts together are apart so that each can be
read, tested and tuned alone: the timed ops (blocking_ops.py), the lateness table and its Dask join
(lateness.py), the per-rank statistics (straggler_scoring.py), the links (straggler_links.py) and the
only uses of wall clocks (clocks.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from ..constants import MIN_LATE_MS
from ..diagnosis.transfers import Transfers
from ..textutil import ranges
from .blocking_ops import device_times
from .clocks import _estimated_completions, clock_offsets
from .lateness import RunParts, collective_lateness
from .straggler_links import p2p_links, slow_links
from .straggler_scoring import (
    ESTIMATED_MIN_LATE_MS,
    MIN_INSTANCES,
    MIN_SCORE,
    _above_chance,
    _holds,
    cost_pattern,
    rank_costs,
    rank_scores,
)

# A rank is slow when persistently so (straggler_scoring: MIN_SCORE, MIN_VOTE_SHARE, MIN_LATE_MS or
# ESTIMATED_MIN_LATE_MS, MIN_INSTANCES), or when costly:
# Cost: a rank whose own work held the others up for at least this share of the analysed window is
# slow, however rarely (a 30 ms hiccup on every fourth 10 ms step costs the others ~40% of the job)...
MIN_COST_PCT = 2.0
MIN_COST_VOTES = 3  # ... in at least this many collectives (one long hiccup is a one-off, not a straggler)...
NOISE_RATIO = 3.0  # ... and at least this many times the cost of a typical rank (its lower quartile)...
MIN_VOTE_Z = 3.5  # ... holding the others up significantly more often than its share: where every rank
# hiccups now and then at random, each holds them up about 1/size of the time (z: its excess in standard
# deviations of that binomial count); more with more ranks (one in a thousand jobs by chance: FALSE_ALARM)
FALSE_ALARM = 0.001
SHOWN_COSTS = 100  # ranks listed in the report's `costs` (postmortem.rank_cost has them all)


@dataclass
class SlowResult:
    lateness: pd.DataFrame  # one row per member of each complete blocking collective or transfer
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    slow_links: list[dict[str, Any]] = field(default_factory=list)
    links: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per (src, dst) with transfers
    clock_offsets_ms: dict[int, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    window_ms: float | None = None  # the analysed window the stragglers' `cost_pct` is a share of
    costs: list[dict[str, Any]] = field(default_factory=list)  # the report's `costs`: every rank that cost anything

    @property
    def link_matrix(self) -> pd.DataFrame:
        """Median transfer time (ms), sender rows × receiver columns. Built when asked: at 16k ranks
        in a pipeline it is ~12k × 12k cells (over a gigabyte), nearly all empty."""
        if self.links.empty:
            return pd.DataFrame()
        return self.links.pivot(index="src", columns="dst", values="transfer_ms")


def find_slow(entries: pd.DataFrame, group_sizes: dict[str, int], wall_offsets: dict[int, int],
              members: dict[str, list[int]] | None = None, transfers: Transfers | None = None,
              run_parts: RunParts | None = None) -> SlowResult:
    """The timing verdict: slow ranks (persistent or costly), slow links, clock offsets, the lateness
    table they rest on, and the notes on what was left out. `run_parts`: see `collective_lateness`."""
    entries, _ = device_times(entries)
    entries, estimated = _estimated_completions(entries, wall_offsets)
    lateness = collective_lateness(entries, group_sizes, run_parts)
    result = SlowResult(lateness=lateness, clock_offsets_ms=clock_offsets(lateness, wall_offsets))
    untimed = int(entries["is_async"].to_numpy(dtype=bool, na_value=False).sum()) if len(entries) else 0
    if untimed:
        result.notes.append(f"{untimed} async ops are left out of the timing: their completion says when the backend "
                            "finished, not how long a rank waited for its peers (that shows in the op it next blocks in)")
    links = p2p_links(entries, transfers)
    result.links = links
    result.slow_links = slow_links(links)
    instances = int(lateness["instance"].max()) + 1 if len(lateness) else 0  # numbered 0..k-1 (lateness._instances)
    if instances < MIN_INSTANCES:
        if instances:
            result.notes.append(f"only {instances} complete blocking ops have timing: too few to tell slow ranks "
                                f"({MIN_INSTANCES} needed)")
        return result
    min_late = ESTIMATED_MIN_LATE_MS if estimated else MIN_LATE_MS
    holds = _holds(lateness)
    per = rank_scores(lateness, min_late, holds)
    persistent = per[(per["score"] >= MIN_SCORE) & (per["vote_share"] >= per["min_share"])
                     & (per["late_ms_median"] >= min_late)]
    costs = rank_costs(lateness, holds)
    baseline = float(costs["cost_ns"].quantile(0.25)) if len(costs) else 0.0
    window = float(costs["window_ns"].iloc[0]) if len(costs) else 0.0
    costly = costs[(costs["cost_ns"] >= MIN_COST_PCT / 100 * window) & (costs["votes"] >= MIN_COST_VOTES)
                   & (costs["n"] >= MIN_INSTANCES)
                   & (costs["cost_ns"] >= NOISE_RATIO * baseline) & (costs["late_ns_when_late"] >= min_late * 1e6)]
    z_min = max(MIN_VOTE_Z, NormalDist().inv_cdf(1 - FALSE_ALARM / max(len(costs), 1)))
    top = costs[costs["cost_ns"] > 0].sort_values("cost_ns", ascending=False, kind="stable").head(SHOWN_COSTS)
    result.costs = [{"rank": int(r), "cost_ms": round(float(c) / 1e6, 3),
                     "cost_pct": round(100 * float(c) / window, 2) if window > 0 else None, "held_up": int(v)}
                    for r, c, v in zip(top.index, top["cost_ns"], top["votes"], strict=True)]
    significant = _above_chance(holds, set(costly.index), z_min) if len(costly) else set()
    for rank in sorted(set(persistent.index) | significant):
        row = per.loc[rank] if rank in per.index else None
        channels = list(row["channels"]) if row is not None else []
        how = cost_pattern(lateness, int(rank), holds)
        cost, pattern, involved = how["cost_ns"], how["pattern"], how["instances"]
        if rank not in persistent.index and pattern == "one-off":
            continue  # one long stall is not a slow rank (its cost shows in `lateness`)
        result.stragglers.append({
            "rank": int(rank), "cost_ms": round(cost / 1e6, 3),
            "cost_pct": round(100 * cost / window, 2) if window > 0 else None,
            "pattern": pattern, "period": how["period"], "late_share": round(how["share"], 3),
            "cost_by_group_ms": how["by_group"],
            "late_ms_when_late": round(float(costs.at[rank, "late_ns_when_late"]) / 1e6, 3),
            "score": round(float(row["score"]), 2) if row is not None else None,
            "late_ms_median": round(float(row["late_ms_median"]), 3) if row is not None else 0.0,
            "votes": int(row["votes"] if row is not None else costs.at[rank, "votes"]),
            "collectives": int(row["n"] if row is not None else costs.at[rank, "n"]),
            "groups": sorted({c.split(" ", 1)[0] for c in channels} | {i.split(":", 1)[0] for i in involved}),
            "channels": channels, "instances": involved,
        })
    result.stragglers.sort(key=lambda s: -s["cost_ms"])  # what each cost the others, most first
    if estimated:
        _estimated_note(result, estimated, rank_scores(lateness, MIN_LATE_MS, holds))
    result.window_ms = round(window / 1e6, 3)
    _attribute_groups(result.stragglers, members or {})
    return result


def _estimated_note(result: SlowResult, estimated: int, exact: pd.DataFrame) -> None:
    """Say once, short, that C++-issued ops' ends are estimated, only where it changes the answer: a slow
    rank's figures rest on them, or a rank that the bar for measured ends (`exact`: scored at MIN_LATE_MS)
    would call persistently slow stays under the raised one."""
    late = exact["late_ms_median"].to_numpy(dtype=float) if len(exact) else np.zeros(0)
    would = ((exact["score"] >= MIN_SCORE) & (exact["vote_share"] >= exact["min_share"])).to_numpy(dtype=bool) \
        if len(exact) else np.zeros(0, dtype=bool)
    near = [int(r) for r in exact.index[would & (late >= MIN_LATE_MS) & (late < ESTIMATED_MIN_LATE_MS)]]
    if not result.stragglers and not near:
        return
    why = (f"; rank(s) {ranges(near)} were {MIN_LATE_MS:g}-{ESTIMATED_MIN_LATE_MS:g} ms late, under that bar"
           if near else "")
    result.notes.append(f"{estimated} C++-issued collectives (DDP) have no recorded end: their end is estimated, "
                        f"and a rank must be {ESTIMATED_MIN_LATE_MS:g} ms late to count as slow{why}")


def _attribute_groups(stragglers: list[dict[str, Any]], members: dict[str, list[int]]) -> None:
    """A group whose every member is slow (a slow TP group, a slow node) is named as the scope.

    Its members are then late together towards everyone outside it, which a single slow rank
    never is; `scope` says which reading the evidence supports.
    """
    slow = {s["rank"] for s in stragglers}
    world = len({r for ranks in members.values() for r in ranks})
    whole = sorted((len(ranks), name) for name, ranks in members.items()
                   if 2 <= len(ranks) < world and set(ranks) <= slow)
    for straggler in stragglers:
        scope = next((name for _, name in whole if straggler["rank"] in members[name]), None)
        straggler["scope"] = f"group {scope}" if scope is not None else "rank"
