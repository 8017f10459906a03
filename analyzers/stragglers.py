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

MIN_SCORE = 3.5  # robust z-score a straggler must reach
MIN_VOTE_SHARE = 0.6  # ... and be the last to arrive in at least this share of its collectives
MIN_LATE_MS = 0.5  # ... by at least this much (median), so scheduler jitter never qualifies
MIN_INSTANCES = 5  # fewer complete collectives than this: no verdict on speed
SLOW_LINK_RATIO = 2.0


@dataclass
class SlowResult:
    lateness: pd.DataFrame  # one row per (group, seq, rank) of complete blocking collectives
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    slow_links: list[dict[str, Any]] = field(default_factory=list)
    link_matrix: pd.DataFrame = field(default_factory=pd.DataFrame)
    clock_offsets_ms: dict[int, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def collective_lateness(entries: pd.DataFrame, group_sizes: dict[str, int]) -> pd.DataFrame:
    """Lateness of every member in every blocking collective that all members completed."""
    done = entries[
        (entries["kind"] == "coll") & (entries["state"] == "completed") & ~entries["is_async"].astype(bool)
        & entries["t_enqueue_ns"].notna() & entries["t_complete_ns"].notna()
    ][["rank", "group", "seq", "op", "t_enqueue_ns", "t_complete_ns"]].copy()
    if done.empty:
        return done.assign(duration_ns=pd.Series(dtype="int64"), late_ns=pd.Series(dtype="int64"),
                           last=pd.Series(dtype=bool))
    done["group"] = done["group"].astype(str)
    done["duration_ns"] = (done["t_complete_ns"] - done["t_enqueue_ns"]).astype("int64")
    by_instance = done.groupby(["group", "seq"], observed=True)["duration_ns"]
    done["members"] = by_instance.transform("size")
    done = done[done["members"] == done["group"].map(group_sizes).fillna(0).astype(int)]
    done = done[done["members"] >= 2]
    by_instance = done.groupby(["group", "seq"], observed=True)["duration_ns"]
    done["late_ns"] = by_instance.transform("max") - done["duration_ns"]
    done["last"] = done["duration_ns"] == by_instance.transform("min")
    return done.drop(columns=["members"]).reset_index(drop=True)


def clock_offsets(lateness: pd.DataFrame, wall_offsets: dict[int, int]) -> dict[int, float]:
    """Each rank's clock relative to the others (ms), from when members left the same collective."""
    if lateness.empty or not wall_offsets:
        return {}
    exits = lateness[["rank", "group", "seq", "t_complete_ns"]].copy()
    exits["wall"] = exits["t_complete_ns"].astype("int64") + exits["rank"].map(wall_offsets).fillna(0).astype("int64")
    exits["dev"] = exits["wall"] - exits.groupby(["group", "seq"], observed=True)["wall"].transform("median")
    return {int(r): round(float(v) / 1e6, 3) for r, v in exits.groupby("rank")["dev"].median().items()}


def rank_scores(lateness: pd.DataFrame) -> pd.DataFrame:
    """Per rank: median lateness, last-arrival votes and share, and a robust (MAD) score."""
    per = lateness.groupby("rank").agg(late_ns=("late_ns", "median"), votes=("last", "sum"), n=("last", "size"))
    per["late_ms_median"] = per["late_ns"] / 1e6
    per["vote_share"] = per["votes"] / per["n"]
    center = float(per["late_ms_median"].median())
    mad = float((per["late_ms_median"] - center).abs().median()) * 1.4826
    spread = max(mad, 0.1)  # ms: a floor so near-identical ranks do not divide by ~0
    per["score"] = (per["late_ms_median"] - center) / spread
    return per


def _groups_of(lateness: pd.DataFrame, rank: int) -> list[str]:
    mine = lateness[lateness["rank"] == rank].groupby("group", observed=True)["last"].mean()
    return sorted(str(g) for g, share in mine.items() if share >= MIN_VOTE_SHARE)


def p2p_links(entries: pd.DataFrame) -> pd.DataFrame:
    """Per (src, dst): median transfer time of completed, matched sends and receives (ms)."""
    p2p = entries[(entries["kind"] == "p2p") & (entries["state"] == "completed") & (entries["seq"] >= 0)
                  & entries["t_enqueue_ns"].notna() & entries["t_complete_ns"].notna()]
    if p2p.empty:
        return pd.DataFrame(columns=["src", "dst", "transfer_ms", "count"])
    p2p = p2p.assign(duration_ns=(p2p["t_complete_ns"] - p2p["t_enqueue_ns"]).astype("int64"),
                     group=p2p["group"].astype(str))
    is_send = p2p["op"].astype(str) == "send"
    p2p = p2p.assign(src=np.where(is_send, p2p["rank"], p2p["peer"]), dst=np.where(is_send, p2p["peer"], p2p["rank"]))
    sends, recvs = p2p[is_send], p2p[~is_send]
    pairs = sends.merge(recvs, on=["group", "src", "dst", "seq"], suffixes=("_s", "_r"))
    if pairs.empty:
        return pd.DataFrame(columns=["src", "dst", "transfer_ms", "count"])
    # the side that arrived later waited least: its duration is closest to the transfer itself
    pairs["transfer_ms"] = np.minimum(pairs["duration_ns_s"], pairs["duration_ns_r"]) / 1e6
    return pairs.groupby(["src", "dst"]).agg(transfer_ms=("transfer_ms", "median"), count=("transfer_ms", "size")).reset_index()


def find_slow(entries: pd.DataFrame, group_sizes: dict[str, int], wall_offsets: dict[int, int]) -> SlowResult:
    lateness = collective_lateness(entries, group_sizes)
    result = SlowResult(lateness=lateness, clock_offsets_ms=clock_offsets(lateness, wall_offsets))
    links = p2p_links(entries)
    result.link_matrix = links.pivot(index="src", columns="dst", values="transfer_ms") if len(links) else pd.DataFrame()
    if len(links) >= 2:
        for row in links.itertuples(index=False):  # one row per rank pair, not per entry
            others = links[(links["src"] != row.src) | (links["dst"] != row.dst)]["transfer_ms"]
            ratio = row.transfer_ms / max(float(others.median()), 1e-3)
            if ratio >= SLOW_LINK_RATIO and row.transfer_ms >= MIN_LATE_MS:
                result.slow_links.append({"src": int(row.src), "dst": int(row.dst),
                                          "transfer_ms_median": round(float(row.transfer_ms), 3),
                                          "ratio": round(float(ratio), 2), "count": int(row.count)})
        result.slow_links.sort(key=lambda link: -link["ratio"])
    instances = lateness[["group", "seq"]].drop_duplicates().shape[0] if len(lateness) else 0
    if instances < MIN_INSTANCES:
        if instances:
            result.notes.append(f"only {instances} complete blocking collectives have timing: too few to tell slow ranks")
        return result
    per = rank_scores(lateness)
    chosen = per[(per["score"] >= MIN_SCORE) & (per["vote_share"] >= MIN_VOTE_SHARE)
                 & (per["late_ms_median"] >= MIN_LATE_MS)].sort_values("score", ascending=False)
    for rank, row in chosen.iterrows():
        result.stragglers.append({
            "rank": int(rank), "score": round(float(row["score"]), 2),
            "late_ms_median": round(float(row["late_ms_median"]), 3), "votes": int(row["votes"]),
            "collectives": int(row["n"]), "groups": _groups_of(lateness, int(rank)),
        })
    return result
