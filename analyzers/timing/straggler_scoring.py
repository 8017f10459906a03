"""Per-rank figures read off the lateness table: who held each collective up (`_Holds`), each rank's
robust score on its worst channel (`rank_scores`), what its own work cost the others and whether more
often than chance (`rank_costs`, `_above_chance`), and how a slow rank's cost is spread (`cost_pattern`).

Why apart from `find_slow`: these are the statistics (each a pass over every member of every instance),
and `find_slow` only applies the verdict's thresholds to them; the postmortem notebook reads the costs
of every rank from here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..constants import MIN_LATE_MS
from ..keys import first_rows, ids_within_ranks, pack_keys
from ..reading.sample import MIN_COMPUTE_NS
from .arrays import _per_id

MIN_SCORE = 3.5  # robust z-score a persistent straggler must reach
MIN_VOTE_SHARE = 0.6  # ... and hold the most own lateness in at least this share of its collectives
# (of its transfers to one peer: a slow first pipeline stage is late on the send after its compute and
# not on the one right after it, so half; its median own lateness must still reach MIN_LATE_MS)
P2P_VOTE_SHARE = 0.5
# MIN_LATE_MS (constants): ... by at least this much (median), so scheduler jitter never qualifies
# ... 3 ms where collectives' ends are estimated (C++-issued ones on gloo: the last member's start): the
# precision of that estimate on a loaded host, where the autograd thread that issues DDP's buckets waits
# for a core (a healthy 4-rank DDP job on 2 cores had one rank ~2 ms late in 65% of its buckets, 2 runs of 10)
ESTIMATED_MIN_LATE_MS = 3.0
# Fewer complete instances than this (in all, or on a channel): no verdict on speed. At 5, a healthy
# 4-rank job on a loaded host named a straggler that had the most own lateness in 3 of 5 ops (by
# chance 1 in 10 per rank); 12 of 20 happens by chance 1 in 1,000 with 4 members.
MIN_INSTANCES = 20
PERSISTENT_SHARE = 0.6  # patterns: late in at least this share of its collectives
ONE_OFF_SHARE = 0.8  # ... most of the cost from a single collective
PERIODIC_SHARE = 0.75  # ... this share of the gaps between its late collectives equal one period
SHOWN_INSTANCES = 10  # collectives listed per straggler


@dataclass
class _Holds:
    """Who held each timed instance up and for how long: computed once per analysis for the cost rules
    (rank_costs, _above_chance, cost_pattern), each a pass over every member of every instance."""

    instance: np.ndarray
    rank: np.ndarray
    own: np.ndarray
    held: np.ndarray  # its own lateness, no more than the longest wait it caused there
    vote: np.ndarray  # the most own lateness of its instance, > 0 and at least a quarter of its raw lateness
    gap_known: np.ndarray  # not the rank's first timed op (whose lateness may be start-up skew)
    transfer: np.ndarray  # a send/recv, not a collective
    weight: np.ndarray | None = None  # a sampled read's: how many instances each stands for (costs scale by it)

    def cost(self, rows: np.ndarray) -> np.ndarray:
        """`held` of `rows` (a mask), scaled by the weight when sampled."""
        return self.held[rows] if self.weight is None else self.held[rows] * self.weight[rows]

    @property
    def counted(self) -> np.ndarray:
        """The rows cost counts: collectives after the rank's first timed op."""
        return ~self.transfer & self.gap_known


def _holds(lateness: pd.DataFrame) -> _Holds:
    instance = lateness["instance"].to_numpy()
    late, own = lateness["late_ns"].to_numpy(), lateness["own_late_ns"].to_numpy()
    most = own == _per_id(np.maximum, instance, own)  # no member's own work was longer
    return _Holds(instance=instance, rank=lateness["rank"].to_numpy().astype(np.int64), own=own,
                  held=np.minimum(own, _per_id(np.maximum, instance, late)),
                  vote=most & (own > 0) & (own >= 0.25 * late), gap_known=_gap_known(lateness),
                  transfer=_is_transfer(lateness["channel"]),
                  weight=lateness["weight"].to_numpy() if "weight" in lateness.columns else None)


def _vote_z(h: _Holds, live: np.ndarray, width: int) -> np.ndarray:
    """Per rank id: how far its count of held-up instances among `live` rows exceeds chance, in standard
    deviations. Under shared noise each member of an instance someone held up is the one with
    probability 1/size."""
    size = np.bincount(h.instance[live], minlength=int(h.instance.max()) + 1)
    anyone = np.bincount(h.instance[h.vote & live], minlength=len(size)) > 0
    p = np.where(live & anyone[h.instance], 1.0 / np.maximum(size[h.instance], 1), 0.0)
    votes = np.bincount(h.rank[h.vote & live], minlength=width)
    expected = np.bincount(h.rank, weights=p, minlength=width)
    variance = np.bincount(h.rank, weights=p * (1 - p), minlength=width)
    return (votes - expected) / np.sqrt(np.maximum(variance, 1e-9))


def rank_scores(lateness: pd.DataFrame, min_late_ms: float = MIN_LATE_MS, holds: _Holds | None = None) -> pd.DataFrame:
    """Per rank: its worst channel's median own lateness, votes and share, and a robust (MAD) score.

    A channel is one collective group or one direction to one peer: a slow pipeline stage is late
    on the sends that follow its compute and never on its receives, so taking the median over all
    of its ops would hide it. A vote is an instance where the rank has the most own lateness and
    its own work explains at least a quarter of its wait; lateness counts only in votes, so being
    held up by others (the last pipeline stage draining into a global all_reduce) is never the
    rank's own. Not "arrived last": on a busy host members leave a collective up to milliseconds
    apart, which reorders arrivals at the next one, but not the extra work each did in between.
    """
    h = holds if holds is not None else _holds(lateness)
    own, vote = h.own, h.vote
    rank, channel = lateness["rank"].to_numpy(), lateness["channel"].cat.codes.to_numpy()
    key = ids_within_ranks(rank, channel)  # per (rank, channel)
    first = first_rows(key)
    n = np.bincount(key)
    votes = np.bincount(key[vote], minlength=len(n))
    per_channel = pd.DataFrame({
        "rank": rank[first],
        "channel": pd.Categorical.from_codes(channel[first], dtype=lateness["channel"].dtype),
        "late_ns": _median_with_zeros(key[vote], own[vote], n),
        "votes": votes,
        "n": n,
    }).sort_values(["rank", "channel"], kind="stable")  # (rank, channel) order, as a group-by gives
    per_channel = per_channel[per_channel["n"] >= MIN_INSTANCES]
    if per_channel.empty:
        return pd.DataFrame(columns=["late_ms_median", "votes", "n", "vote_share", "min_share", "score", "channels"])
    per_channel["vote_share"] = per_channel["votes"] / per_channel["n"]
    per_channel["min_share"] = np.where(_is_transfer(per_channel["channel"]), P2P_VOTE_SHARE, MIN_VOTE_SHARE)
    per_channel["qualifies"] = (per_channel["late_ns"] / 1e6 >= min_late_ms) & (per_channel["vote_share"] >= per_channel["min_share"])
    # the worst channel that qualifies stands for the rank (else its worst): a slow stage late on
    # three channels must not be judged by the one where noise left it a vote short
    worst = per_channel.sort_values(["rank", "qualifies", "late_ns", "vote_share"], ascending=[True, False, False, False])
    per = worst.groupby("rank").head(1).set_index("rank")
    per["late_ms_median"] = per["late_ns"] / 1e6
    center = float(per["late_ms_median"].median())
    mad = float((per["late_ms_median"] - center).abs().median()) * 1.4826
    spread = max(mad, 0.1)  # ms: a floor so near-identical ranks do not divide by ~0
    per["score"] = (per["late_ms_median"] - center) / spread
    slow_channels = per_channel[per_channel["qualifies"]]
    slow_channels = slow_channels.sort_values("late_ns", ascending=False)  # worst channel first
    per["channels"] = slow_channels.assign(channel=slow_channels["channel"].astype(str)).groupby(
        "rank", sort=False)["channel"].agg(list)
    per["channels"] = per["channels"].apply(lambda c: c if isinstance(c, list) else [])
    return per


def rank_costs(lateness: pd.DataFrame, holds: _Holds | None = None) -> pd.DataFrame:
    """Per rank: what its own work cost the others (`cost_ns`: the summed time it held up the
    collectives where it had the most own lateness), in how many (`votes`) of its `n` timed ops,
    the analysed window (`window_ns`), its median own lateness where it held them up, and how far
    above chance it did (`vote_z`, see _vote_z). `holds`: _holds(lateness), when the caller has it.

    Why cost and not a median: a rank 30 ms slow on every fourth step has a median lateness of zero,
    yet the others wait for it a quarter of the time; two equally slow ranks each hold half the votes.
    Counted over collectives only: on transfers a pipeline's fill and drain make some stage hold up
    its neighbour in every step by design (the bubble), which is no rank's fault; slow stages are
    found by their share of a transfer channel (rank_scores).
    """
    cols = ["cost_ns", "votes", "n", "window_ns", "late_ns_when_late", "vote_z"]
    if lateness.empty:
        return pd.DataFrame(columns=cols)
    h = holds if holds is not None else _holds(lateness)
    vote = h.vote & h.counted
    rank = h.rank
    width = int(rank.max()) + 1
    enq, comp = lateness["t_enqueue_ns"].to_numpy(), lateness["t_complete_ns"].to_numpy()
    n = np.bincount(rank, minlength=width)
    present = np.flatnonzero(n)
    first = np.full(width, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(width, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, rank, enq.astype(np.int64))  # scattered reductions: no group-by over every row
    np.maximum.at(last, rank, comp.astype(np.int64))
    window = float(np.median(last[present] - first[present]))
    out = pd.DataFrame(index=pd.Index(present, name="rank"))
    out["n"] = n[present]
    out["window_ns"] = window
    out["cost_ns"] = np.bincount(rank[vote], weights=h.cost(vote), minlength=width)[present]
    out["votes"] = np.bincount(rank[vote], minlength=width)[present].astype(int)
    voted = pd.Series(h.own[vote]).groupby(rank[vote]).median()  # the voting rows only: few
    out["late_ns_when_late"] = voted.reindex(out.index, fill_value=0.0)
    out["vote_z"] = _vote_z(h, h.counted, width)[present]
    return out


def _above_chance(h: _Holds, candidates: set[int], z_min: float) -> set[int]:
    """The candidates that hold the others up more often than chance, found step by step: the most
    significant first, then the others over the collectives it did not hold up (two equally slow ranks
    split the votes, so against all collectives the second looks barely above its share)."""
    remaining = np.ones(int(h.instance.max()) + 1 if len(h.instance) else 0, dtype=bool)
    width = int(h.rank.max()) + 1 if len(h.rank) else 0
    chosen: set[int] = set()
    while True:
        z = _vote_z(h, h.counted & remaining[h.instance], width)
        passing = [r for r in candidates - chosen if z[r] >= z_min]
        if not passing:
            return chosen
        best = max(float(z[r]) for r in passing)
        now = {r for r in passing if z[r] == best}  # equals: all of them, never the lowest rank
        chosen |= now
        remaining[h.instance[h.vote & h.counted & np.isin(h.rank, list(now))]] = False


def cost_pattern(lateness: pd.DataFrame, rank: int, holds: _Holds | None = None) -> dict[str, Any]:
    """A slow rank's cost (`cost_ns`, and `by_group` in ms) and how it is spread (`pattern`:
    `persistent`, `periodic` with its `period` counted in the rank's own collectives, `intermittent` or
    `one-off`); the first collectives involved (`instances`, `group:seq`); and the `share` of its
    collectives where it held the others up by more than jitter. Per straggler only: a handful of
    ranks, not every rank of the job. `holds`: _holds(lateness), when the caller has it."""
    h = holds if holds is not None else _holds(lateness)
    mine = h.rank == rank
    vote = (h.vote & h.gap_known)[mine]
    coll = ~h.transfer[mine]
    if (vote & coll).any():  # else a slow pipeline stage, found on its transfers: its cost is theirs
        vote &= coll
    held_all = h.held[mine]
    costs = h.cost(mine)
    cost = float(costs[vote].sum())
    groups = lateness["group"].astype(str).to_numpy()[mine]
    by_group = pd.Series(costs[vote]).groupby(groups[vote]).sum().sort_values(ascending=False)
    vote &= held_all >= MIN_COMPUTE_NS  # the pattern of the holds that matter, not of jitter's
    held = held_all[vote]
    rank_instances = h.instance[mine]
    part = pd.DataFrame({"instance": rank_instances[vote], "held": held,
                         "group": lateness["group"].to_numpy()[mine][vote], "seq": lateness["seq"].to_numpy()[mine][vote]})
    # the share of its collectives it held up; a sampled read counts each kept one for its stride
    weight = np.ones(int(mine.sum())) if h.weight is None else h.weight[mine].astype(np.float64)
    share = float(weight[vote].sum()) / max(float(weight.sum()), 1.0)
    pattern, period, involved = _pattern(part, share, np.sort(rank_instances))
    return {"cost_ns": cost, "pattern": pattern, "period": period, "instances": involved,
            "share": share,
            "by_group": {str(g): round(float(v) / 1e6, 3) for g, v in by_group.items()}}


def _pattern(part: pd.DataFrame, share: float, rank_instances: np.ndarray) -> tuple[str, int | None, list[str]]:
    if part.empty:
        return "intermittent", None, []
    part = part.sort_values("instance")
    shown = [f"{g}:{int(s)}" for g, s in zip(part["group"].astype(str), part["seq"], strict=True)][:SHOWN_INSTANCES]
    held = part["held"].to_numpy()
    if len(part) == 1 or (held.sum() > 0 and held.max() >= ONE_OFF_SHARE * held.sum()):
        return "one-off", None, shown
    if share >= PERSISTENT_SHARE:
        return "persistent", None, shown
    position = np.searchsorted(rank_instances, part["instance"].to_numpy())  # its k-th collective
    gaps = np.diff(position)
    if len(gaps) >= 2:
        values, counts = np.unique(gaps, return_counts=True)
        top = int(np.argmax(counts))
        if values[top] > 1 and counts[top] >= PERIODIC_SHARE * len(gaps):
            return "periodic", int(values[top]), shown
    return "intermittent", None, shown


def _gap_known(lateness: pd.DataFrame) -> np.ndarray:
    if "gap_known" in lateness.columns:
        return lateness["gap_known"].to_numpy(dtype=bool)
    return np.ones(len(lateness), dtype=bool)


def _is_transfer(channel: pd.Series) -> np.ndarray:
    """Channels of transfers (`<group> send to <peer>`, `<group> recv from <peer>`), not collectives."""
    labels = np.asarray([" send to " in str(c) or " recv from " in str(c) for c in channel.cat.categories] + [False])
    codes = channel.cat.codes.to_numpy()
    return labels[np.where(codes >= 0, codes, len(labels) - 1)]


def _median_with_zeros(key: np.ndarray, values: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Per key 0..k-1: the median of its `values` (all > 0) together with `n[key]` minus their
    count zeros. Only the few voting rows are sorted: the zeros are known to come first."""
    order = _order_by(key, values)
    key, values = key[order], values[order]
    count = np.bincount(key, minlength=len(n))
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    zeros = n - count

    def at(i: np.ndarray) -> np.ndarray:  # the i-th smallest of each key's n values
        inside = i >= zeros
        where = np.where(inside, start + i - zeros, 0)
        return np.where(inside, values[np.minimum(where, max(len(values) - 1, 0))] if len(values) else 0.0, 0.0)

    return (at((n - 1) // 2) + at(n // 2)) / 2


def _order_by(key: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`np.lexsort((values, key))`. Lateness is whole nanoseconds: then both go into one int64 and
    one argsort (~10x faster than lexsort's two passes over millions of votes at 16k ranks)."""
    whole = bool(np.isfinite(values).all()) and bool((values == np.floor(values)).all()) if len(values) else False
    packed = pack_keys([key, values.astype(np.int64)]) if whole and float(np.abs(values).max()) < 2.0**62 else None
    return np.lexsort((values, key)) if packed is None else np.argsort(packed, kind="stable")
