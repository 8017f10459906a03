"""Slow ranks and slow links from timing, without trusting clocks across hosts.

In a blocking collective the early members wait for the last one, so each member's own duration
(completion minus enqueue, both on its own clock) already orders them: the last to arrive waits
least. A member's lateness in one collective is the longest duration there minus its own. Ranks are
then compared with robust statistics over many collectives (median lateness, a MAD-based score, and
how often each was the last), so one hiccup does not make a straggler and a persistent 5% does.
Clocks are only used to report each rank's offset, estimated from the collectives themselves:
members leave a blocking collective at almost the same instant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .columns import first_rows, group_ids

MIN_SCORE = 3.5  # robust z-score a straggler must reach
MIN_VOTE_SHARE = 0.6  # ... and be the last to arrive in at least this share of its collectives
MIN_LATE_MS = 0.5  # ... by at least this much (median), so scheduler jitter never qualifies
MIN_INSTANCES = 5  # fewer complete collectives than this: no verdict on speed
SLOW_LINK_RATIO = 2.0
MIN_COMPUTE_NS = 100_000  # a gap between two blocking ops shorter than this is no compute, only overhead


@dataclass
class SlowResult:
    lateness: pd.DataFrame  # one row per member of each complete blocking collective or transfer
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    slow_links: list[dict[str, Any]] = field(default_factory=list)
    link_matrix: pd.DataFrame = field(default_factory=pd.DataFrame)
    clock_offsets_ms: dict[int, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _ints(series: pd.Series, missing: int = -1) -> np.ndarray:
    return series.to_numpy(dtype="int64", na_value=missing)


def _ordered(rank: np.ndarray, t: np.ndarray) -> bool:
    """True when rows are already sorted by rank, then by time (checked in one pass, no sort)."""
    step_rank, step_t = np.diff(rank), np.diff(t)
    return bool(((step_rank > 0) | ((step_rank == 0) & (step_t >= 0))).all())


def _blocking_ops(entries: pd.DataFrame) -> pd.DataFrame:
    """Completed blocking ops with timing, each with the compute gap before it on its own rank.

    The gap (enqueue minus the latest completion of the rank's earlier blocking ops, one clock) is
    the time the rank spent on its own work before arriving: what can make it late by itself.
    Built from numpy columns: at 16k ranks this table has tens of millions of rows.
    """
    is_coll, is_p2p = (entries["kind"] == "coll").to_numpy(), (entries["kind"] == "p2p").to_numpy()
    enq, comp = _ints(entries["t_enqueue_ns"]), _ints(entries["t_complete_ns"])
    timed = entries["t_enqueue_ns"].notna().to_numpy() & entries["t_complete_ns"].notna().to_numpy()
    mask = ((is_coll | is_p2p) & (entries["state"] == "completed").to_numpy()
            & ~entries["is_async"].to_numpy(dtype=bool, na_value=False) & timed & (_ints(entries["seq"]) >= 0))
    ops = pd.DataFrame({
        "rank": _ints(entries["rank"])[mask],
        "group": entries["group"].astype("category").array[mask],
        "seq": _ints(entries["seq"])[mask],
        "kind": pd.Categorical.from_codes(np.where(is_coll[mask], 0, 1).astype(np.int8),
                                          categories=pd.Index(["coll", "p2p"], dtype=object)),
        "op": entries["op"].astype("category").array[mask],
        "peer": _ints(entries["peer"])[mask] if "peer" in entries.columns else np.full(int(mask.sum()), -1),
        "t_enqueue_ns": enq[mask], "t_complete_ns": comp[mask],
    })
    ops["group"] = ops["group"].astype("category")
    ops["group"] = ops["group"].cat.rename_categories([str(c) for c in ops["group"].cat.categories])
    enq_col, rank_col = ops["t_enqueue_ns"].to_numpy(), ops["rank"].to_numpy()
    if len(ops) > 1 and not _ordered(rank_col, enq_col):  # entries come by rank in record order: usually sorted
        ops = ops.iloc[np.lexsort((enq_col, rank_col))].reset_index(drop=True)
    rank = ops["rank"].to_numpy()
    starts = np.zeros(len(rank), dtype=np.int64)  # each row's first row of its rank
    if len(rank):
        cuts = np.flatnonzero(np.diff(rank)) + 1
        starts[cuts] = cuts
        starts = np.maximum.accumulate(starts)
    busy = _running_max(ops["t_complete_ns"].to_numpy(), starts).astype("float64")
    before = np.empty_like(busy)
    before[0:1] = np.nan
    before[1:] = busy[:-1]
    before[starts == np.arange(len(rank))] = np.nan  # a rank's first op: gap unknown
    gap = ops["t_enqueue_ns"].to_numpy() - before
    # Back-to-back ops (a receive then a send) have no compute between them: such an op is
    # preceded by the rank's latest real compute, so that is the gap it is judged by.
    real = np.flatnonzero(gap >= MIN_COMPUTE_NS)
    latest = np.full(len(gap), -1, dtype=np.int64)
    latest[real] = real
    latest = np.maximum.accumulate(latest) if len(latest) else latest  # the latest real compute so far...
    own = latest >= starts  # ... on the same rank
    ops["gap_ns"] = np.where(own, gap[np.maximum(latest, 0)], gap)
    ops["duration_ns"] = ops["t_complete_ns"] - ops["t_enqueue_ns"]
    return ops


def _running_max(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Cumulative max restarting at each rank's first row (`starts`): one accumulate over values
    lifted by segment, so no segment can see the one before it; a group-by when that overflows."""
    if not len(values):
        return values
    low, high = int(values.min()), int(values.max())
    segment = np.cumsum(starts == np.arange(len(starts))) - 1
    width = high - low + 1
    if width * (int(segment[-1]) + 1) >= 1 << 62:
        return pd.Series(values).groupby(segment, sort=False).cummax().to_numpy()
    lift = segment * width - low
    return np.maximum.accumulate(values + lift) - lift


def _per_id(reduce: np.ufunc, ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`reduce` (np.maximum, np.minimum, np.fmin) of `values` over the rows of each id, back on every
    row: a groupby-transform on small non-negative ids, as one scattered reduction."""
    first = first_rows(ids)
    present = first < len(ids)
    out = np.zeros(len(first), dtype=values.dtype)
    out[present] = values[first[present]]  # seeded with one member's own value
    reduce.at(out, ids, values)
    return out[ids]


def _instances(ops: pd.DataFrame, group_sizes: dict[str, int]) -> pd.DataFrame:
    """Ops keyed by the instance they belong to: (group, seq) for collectives, plus the pair for p2p.

    Only complete instances count: every member of a collective, both sides of a transfer. Keys
    and channels are integer codes; channel labels are made once per channel, not per row.
    """
    is_send, is_p2p = (ops["op"] == "send").to_numpy(), (ops["kind"] == "p2p").to_numpy()
    usable = ~is_p2p | ((is_send | (ops["op"] == "recv").to_numpy()) & (ops["peer"] >= 0).to_numpy())
    ops = ops[usable].reset_index(drop=True)
    is_send, is_p2p = is_send[usable], is_p2p[usable]
    rank, peer = ops["rank"].to_numpy(), ops["peer"].to_numpy()
    group_code = ops["group"].cat.codes.to_numpy().astype("int64")
    src = np.where(is_p2p, np.where(is_send, rank, peer), -1)
    dst = np.where(is_p2p, np.where(is_send, peer, rank), -1)
    instance = group_ids([is_p2p.astype("int64"), group_code, src, dst, ops["seq"].to_numpy()])
    members = np.bincount(instance)[instance]
    sizes = np.array([group_sizes.get(str(g), 0) for g in ops["group"].cat.categories], dtype="int64")
    expected = np.where(is_p2p, 2, sizes[group_code] if len(sizes) else 0)
    keep = (members == expected) & (members >= 2)
    direction = np.where(is_p2p, np.where(is_send, 1, 2), 0)
    channel = group_ids([group_code, direction, np.where(is_p2p, peer, -1)])
    first = first_rows(channel)
    names = np.asarray(ops["group"].cat.categories.astype(str))
    labels = [f"{names[group_code[i]]}" if direction[i] == 0 else
              f"{names[group_code[i]]} {'send to' if direction[i] == 1 else 'recv from'} {peer[i]}" for i in first]
    ops["instance"] = instance
    ops["channel"] = pd.Categorical.from_codes(channel, categories=labels)  # one label per (group, direction, peer)
    return ops[keep].reset_index(drop=True)


def collective_lateness(entries: pd.DataFrame, group_sizes: dict[str, int]) -> pd.DataFrame:
    """Lateness of every member of every complete blocking collective and blocking transfer.

    `late_ns`: the longest wait in the instance minus the member's own (0 for the last to arrive).
    `own_late_ns`: the part of it the member's own work explains: no more than how much longer its
    gap before the op was than the shortest gap there. A rank that arrives late only because it
    was held up in an earlier op by someone else (a pipeline stage behind a slow one, the last
    stage draining) gets little of it; the slow rank gets all of it.
    """
    ops = _blocking_ops(entries)
    empty = {"instance": pd.Series(dtype="int64"), "channel": pd.Series(dtype=str), "late_ns": pd.Series(dtype="int64"),
             "own_late_ns": pd.Series(dtype="float64"), "last": pd.Series(dtype=bool)}
    if ops.empty:
        return ops.assign(**empty)
    done = _instances(ops, group_sizes)
    if done.empty:
        return done.assign(**{k: v for k, v in empty.items() if k not in done.columns})
    instance = done["instance"].to_numpy()
    duration = done["duration_ns"].to_numpy()
    longest, shortest = _per_id(np.maximum, instance, duration), _per_id(np.minimum, instance, duration)
    done["late_ns"] = longest - duration
    done["last"] = duration == shortest
    gap = done["gap_ns"].to_numpy()
    least_gap = _per_id(np.fmin, instance, gap)  # fmin: a rank's first op (gap NaN) does not hide the others'
    excess = np.clip(gap - least_gap, 0, None)
    done["own_late_ns"] = np.minimum(done["late_ns"].to_numpy(), np.where(np.isnan(excess), np.inf, excess))
    return done


def clock_offsets(lateness: pd.DataFrame, wall_offsets: dict[int, int]) -> dict[int, float]:
    """Each rank's clock relative to the others (ms), from when members left the same collective."""
    if lateness.empty or not wall_offsets:
        return {}
    exits = lateness[["rank", "instance", "t_complete_ns"]].copy()
    exits["wall"] = exits["t_complete_ns"].astype("int64") + exits["rank"].map(wall_offsets).fillna(0).astype("int64")
    exits["dev"] = exits["wall"] - exits.groupby("instance")["wall"].transform("median")
    return {int(r): round(float(v) / 1e6, 3) for r, v in exits.groupby("rank")["dev"].median().items()}


def rank_scores(lateness: pd.DataFrame) -> pd.DataFrame:
    """Per rank: its worst channel's median own lateness, votes and share, and a robust (MAD) score.

    A channel is one collective group or one direction to one peer: a slow pipeline stage is late
    on the sends that follow its compute and never on its receives, so taking the median over all
    of its ops would hide it. A vote is an instance where the rank arrived last and its own work
    explains most of the wait; lateness counts only in votes, so being held up by others (the last
    pipeline stage draining into a global all_reduce) is never the rank's own.
    """
    vote = lateness["last"] & (lateness["own_late_ns"] >= 0.25 * lateness["late_ns"]) & (lateness["late_ns"] > 0)
    data = lateness.assign(vote=vote, credited=lateness["own_late_ns"].where(vote, 0.0))
    per_channel = data.groupby(["rank", "channel"], observed=True).agg(
        late_ns=("credited", "median"), votes=("vote", "sum"), n=("vote", "size")).reset_index()
    per_channel = per_channel[per_channel["n"] >= MIN_INSTANCES]
    if per_channel.empty:
        return pd.DataFrame(columns=["late_ms_median", "votes", "n", "vote_share", "score", "channels"])
    per_channel["vote_share"] = per_channel["votes"] / per_channel["n"]
    worst = per_channel.sort_values(["rank", "late_ns", "vote_share"], ascending=[True, False, False])
    per = worst.groupby("rank").head(1).set_index("rank")
    per["late_ms_median"] = per["late_ns"] / 1e6
    center = float(per["late_ms_median"].median())
    mad = float((per["late_ms_median"] - center).abs().median()) * 1.4826
    spread = max(mad, 0.1)  # ms: a floor so near-identical ranks do not divide by ~0
    per["score"] = (per["late_ms_median"] - center) / spread
    slow_channels = per_channel[(per_channel["late_ns"] / 1e6 >= MIN_LATE_MS) & (per_channel["vote_share"] >= MIN_VOTE_SHARE)]
    slow_channels = slow_channels.sort_values("late_ns", ascending=False)  # worst channel first
    per["channels"] = slow_channels.assign(channel=slow_channels["channel"].astype(str)).groupby(
        "rank", sort=False)["channel"].agg(list)
    per["channels"] = per["channels"].apply(lambda c: c if isinstance(c, list) else [])
    return per


def p2p_links(entries: pd.DataFrame) -> pd.DataFrame:
    """Per (src, dst): median transfer time of completed, matched sends and receives (ms)."""
    p2p = entries[(entries["kind"] == "p2p") & (entries["state"] == "completed") & (entries["seq"] >= 0)
                  & entries["t_enqueue_ns"].notna() & entries["t_complete_ns"].notna()]
    if p2p.empty:
        return pd.DataFrame(columns=["src", "dst", "transfer_ms", "count"])
    # the group as its integer code and the op tested on its categories: no string per transfer
    p2p = p2p.assign(duration_ns=(p2p["t_complete_ns"] - p2p["t_enqueue_ns"]).astype("int64"),
                     group=pd.Categorical(p2p["group"]).codes)
    is_send = (p2p["op"] == "send").to_numpy()
    p2p = p2p.assign(src=np.where(is_send, p2p["rank"], p2p["peer"]), dst=np.where(is_send, p2p["peer"], p2p["rank"]))
    sends, recvs = p2p[is_send], p2p[~is_send]
    pairs = sends.merge(recvs, on=["group", "src", "dst", "seq"], suffixes=("_s", "_r"))
    if pairs.empty:
        return pd.DataFrame(columns=["src", "dst", "transfer_ms", "count"])
    # the side that arrived later waited least: its duration is closest to the transfer itself
    pairs["transfer_ms"] = np.minimum(pairs["duration_ns_s"], pairs["duration_ns_r"]) / 1e6
    return pairs.groupby(["src", "dst"]).agg(transfer_ms=("transfer_ms", "median"), count=("transfer_ms", "size")).reset_index()


def _median_of_the_others(values: np.ndarray) -> np.ndarray:
    """For each value, the median of all the other values (exact, one sort for all)."""
    order = np.argsort(values, kind="stable")
    v = values[order]
    n = len(v)
    position = np.empty(n, dtype="int64")
    position[order] = np.arange(n)

    def rest(j: int) -> np.ndarray:  # the j-th smallest value once each element is left out
        return np.where(j < position, v[min(j, n - 1)], v[min(j + 1, n - 1)])

    m = (n - 1) // 2
    return rest(m) if (n - 1) % 2 else (rest(m - 1) + rest(m)) / 2


def find_slow(entries: pd.DataFrame, group_sizes: dict[str, int], wall_offsets: dict[int, int],
              members: dict[str, list[int]] | None = None) -> SlowResult:
    lateness = collective_lateness(entries, group_sizes)
    result = SlowResult(lateness=lateness, clock_offsets_ms=clock_offsets(lateness, wall_offsets))
    links = p2p_links(entries)
    result.link_matrix = links.pivot(index="src", columns="dst", values="transfer_ms") if len(links) else pd.DataFrame()
    if len(links) >= 2:
        ratio = links["transfer_ms"].to_numpy() / np.maximum(_median_of_the_others(links["transfer_ms"].to_numpy()), 1e-3)
        slow = links[(ratio >= SLOW_LINK_RATIO) & (links["transfer_ms"].to_numpy() >= MIN_LATE_MS)]
        for row, r in zip(slow.itertuples(index=False), ratio[slow.index.to_numpy()], strict=True):  # only slow links
            result.slow_links.append({"src": int(row.src), "dst": int(row.dst),
                                      "transfer_ms_median": round(float(row.transfer_ms), 3),
                                      "ratio": round(float(r), 2), "count": int(row.count)})
        result.slow_links.sort(key=lambda link: -link["ratio"])
    instances = int(lateness["instance"].nunique()) if len(lateness) else 0
    if instances < MIN_INSTANCES:
        if instances:
            result.notes.append(f"only {instances} complete blocking ops have timing: too few to tell slow ranks")
        return result
    per = rank_scores(lateness)
    chosen = per[(per["score"] >= MIN_SCORE) & (per["vote_share"] >= MIN_VOTE_SHARE)
                 & (per["late_ms_median"] >= MIN_LATE_MS)].sort_values("score", ascending=False)
    for rank, row in chosen.iterrows():
        channels = list(row["channels"])
        result.stragglers.append({
            "rank": int(rank), "score": round(float(row["score"]), 2),
            "late_ms_median": round(float(row["late_ms_median"]), 3), "votes": int(row["votes"]),
            "collectives": int(row["n"]), "groups": sorted({c.split(" ", 1)[0] for c in channels}),
            "channels": channels,
        })
    _attribute_groups(result.stragglers, members or {})
    return result


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
