"""The steps of a postmortem as tables: what a notebook (and `flightrec export`) works with.

Why a module of its own: the analysis answers "who caused it"; after that, people dig with pandas.
Each function takes an `Analysis` and returns a DataFrame (or the networkx wait graph, or the
report dict) whose columns are documented in docs/postmortem.md. The derived columns join the
analyzer's conclusions (which collective an entry belongs to, how late its rank was there, whether
it is the op a rank is blocked in) onto every recorded entry, computed column-wise. What a dump
format does not record (completion times of PyTorch's gloo recorder, thread stacks) stays null:
nothing here invents it.
"""

from __future__ import annotations

import weakref
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd

from ..analysis import Analysis
from ..constants import COMPLETED, FAILED, PENDING_STATES, UNKNOWN
from ..timing.straggler_scoring import rank_costs

# Values of the derived `status` column (what the analysis concluded about each entry).
ST_COMPLETED, ST_FAILED, ST_BLOCKING, ST_PENDING, ST_MISMATCH, ST_UNKNOWN = (
    "completed", "failed", "blocking", "pending", "mismatch", "unknown")
STATUSES = (ST_COMPLETED, ST_FAILED, ST_BLOCKING, ST_PENDING, ST_MISMATCH, ST_UNKNOWN)
# Values of `rank_role` (the rank's place in the wait graph).
ROLES = ("root_cause", "victim", "waiting", "idle")

DERIVED_COLUMNS = (
    "collective_id",
    "t_enqueue_wall_ns",
    "t_complete_wall_ns",
    "duration_ns",
    "late_ns",
    "last_to_arrive",
    "blocking",
    "status",
    "rank_role",
)

_cache: weakref.WeakKeyDictionary[Analysis, pd.DataFrame] = weakref.WeakKeyDictionary()


def report(a: Analysis) -> dict[str, Any]:
    """The machine report (docs/report-format.md) as a dict."""
    return a.report()


def wait_graph(a: Analysis) -> nx.DiGraph:
    """The wait-for graph: a node per rank, an edge r -> m when r waits for m."""
    return a.graph


def entries(a: Analysis) -> pd.DataFrame:
    """Every entry of every rank (`Analysis.entries`) plus the derived columns (DERIVED_COLUMNS)."""
    if a in _cache:
        return _cache[a]
    rep = a.report()
    df = a.entries.copy()
    offsets = pd.Series({r: d.meta.get("wall_offset_ns") for r, d in a.dumps.items()}, dtype="Int64")
    offset = df["rank"].map(offsets).astype("Int64")
    df["collective_id"] = _collective_ids(df, offset)
    df["t_enqueue_wall_ns"] = (df["t_enqueue_ns"] + offset).astype("Int64")
    df["t_complete_wall_ns"] = (df["t_complete_ns"] + offset).astype("Int64")
    df["duration_ns"] = (df["t_complete_ns"] - df["t_enqueue_ns"]).astype("Int64")
    late = _lateness_columns(a, df)
    df["late_ns"] = late["late_ns"]
    df["last_to_arrive"] = late["last"]
    df["blocking"] = _blocking(df, rep)
    df["status"] = _status(df, rep)
    df["rank_role"] = pd.Categorical(df["rank"].map(rank_roles(a)), categories=list(ROLES))
    _cache[a] = df
    return df


def collectives(a: Analysis) -> pd.DataFrame:
    """One row per matched collective (or p2p transfer): who entered it, who finished, how spread out."""
    df = entries(a)
    sub = df[df["collective_id"].notna()]
    cols = ["collective_id", "kind", "group", "seq", "src", "dst", "op", "members", "entered", "completed",
            "blocking", "mismatch", "first_enqueue_wall_ns", "last_enqueue_wall_ns", "arrival_spread_ms", "last_rank"]
    if sub.empty:
        return pd.DataFrame(columns=cols)
    is_send = (sub["kind"] == "p2p") & (sub["op"] == "send")
    is_recv = (sub["kind"] == "p2p") & ~is_send
    sub = sub.assign(
        group=sub["group"].astype(str),
        kind=sub["kind"].astype(str),
        op=sub["op"].astype(str),
        src=np.where(is_send, sub["rank"], np.where(is_recv, sub["peer"], -1)),
        dst=np.where(is_send, sub["peer"], np.where(is_recv, sub["rank"], -1)),
        done=sub["state"] == COMPLETED,
        is_blocking=sub["blocking"],
        is_mismatch=sub["status"] == ST_MISMATCH,
    )
    g = sub.groupby("collective_id", sort=True)
    out = g.agg(
        kind=("kind", "first"), group=("group", "first"), seq=("seq", "first"), src=("src", "max"), dst=("dst", "max"),
        op=("op", lambda s: " / ".join(sorted(set(s)))), entered=("rank", "nunique"), blocking=("is_blocking", "any"),
        mismatch=("is_mismatch", "any"), first_enqueue_wall_ns=("t_enqueue_wall_ns", "min"),
        last_enqueue_wall_ns=("t_enqueue_wall_ns", "max"),
    )
    out["completed"] = sub[sub["done"]].groupby("collective_id")["rank"].nunique().reindex(out.index).fillna(0).astype(int)
    sizes = dict(zip(a.groups["group"].astype(str), a.groups["size"].astype(int), strict=True))
    out["members"] = np.where(out["kind"] == "p2p", 2, out["group"].map(sizes).fillna(0).astype(int))
    out["arrival_spread_ms"] = (out["last_enqueue_wall_ns"] - out["first_enqueue_wall_ns"]).astype("Float64") / 1e6
    lat = sub[sub["late_ns"].notna()]
    last = lat[lat["last_to_arrive"].fillna(False).astype(bool)].groupby("collective_id")["rank"].min()
    out["last_rank"] = last.reindex(out.index).astype("Int64")
    return out.reset_index()[cols]


def lateness(a: Analysis) -> pd.DataFrame:
    """Per rank and timed collective: how late the rank arrived (ms); one row per (rank, collective)."""
    df = entries(a)
    sub = df[df["late_ns"].notna()]
    out = pd.DataFrame({
        "rank": sub["rank"].to_numpy(),
        "collective_id": sub["collective_id"].to_numpy(),
        "group": sub["group"].astype(str).to_numpy(),
        "seq": sub["seq"].to_numpy(),
        "op": sub["op"].astype(str).to_numpy(),
        "t_enqueue_wall_ns": sub["t_enqueue_wall_ns"].to_numpy(),
        "late_ms": sub["late_ns"].astype("float64").to_numpy() / 1e6,
        "last_to_arrive": sub["last_to_arrive"].astype(bool).to_numpy(),
    })
    return out.sort_values(["collective_id", "rank"], kind="stable").reset_index(drop=True)


def rank_lateness(a: Analysis) -> pd.DataFrame:
    """Per rank: median, 90th percentile and worst lateness (ms), times last to arrive, straggler flag."""
    lat = lateness(a)
    ranks = pd.Index(sorted(a.dumps), name="rank")
    per = lat.groupby("rank").agg(
        collectives=("late_ms", "size"), late_ms_median=("late_ms", "median"),
        late_ms_p90=("late_ms", lambda s: s.quantile(0.9)), late_ms_max=("late_ms", "max"),
        last_count=("last_to_arrive", "sum"),
    ).reindex(ranks)
    per["collectives"] = per["collectives"].fillna(0).astype(int)
    per["last_count"] = per["last_count"].fillna(0).astype(int)
    stragglers = {s["rank"] for s in a.report()["stragglers"]}
    per["straggler"] = per.index.isin(stragglers)
    offsets = a.report()["clock_offsets_ms"]
    per["clock_offset_ms"] = [offsets.get(str(r), np.nan) for r in per.index]
    return per.reset_index()


def rank_cost(a: Analysis) -> pd.DataFrame:
    """Per rank: what its own work cost the others over the collectives (ms, % of the analysed window),
    in how many of its timed collectives it held them up, how far above chance (`vote_z`), and whether
    it is reported as a straggler (docs/report-format.md, `stragglers[]`)."""
    costs = rank_costs(a.slow.lateness)
    ranks = pd.Index(sorted(a.dumps), name="rank")
    if costs.empty:
        return pd.DataFrame({"rank": ranks, "cost_ms": 0.0, "cost_pct": 0.0, "held_up": 0, "collectives": 0,
                             "vote_z": np.nan, "straggler": False})
    window = float(costs["window_ns"].iloc[0])
    per = costs.reindex(ranks)
    stragglers = {s["rank"] for s in a.report()["stragglers"]}
    return pd.DataFrame({
        "rank": ranks,
        "cost_ms": per["cost_ns"].fillna(0).to_numpy() / 1e6,
        "cost_pct": 100 * per["cost_ns"].fillna(0).to_numpy() / window if window > 0 else np.nan,
        "held_up": per["votes"].fillna(0).astype(int).to_numpy(),
        "collectives": per["n"].fillna(0).astype(int).to_numpy(),
        "vote_z": per["vote_z"].to_numpy(),
        "straggler": ranks.isin(stragglers),
    }).sort_values("cost_ms", ascending=False, kind="stable").reset_index(drop=True)


def steps(a: Analysis) -> pd.DataFrame:
    """The per-step view: one row per (rank, step), a step being a collective of the group with the most
    timed collectives (the loop's own all-reduce). `step_ms`: the time since the rank's previous step
    (own clock); `own_late_ms`: how much its own work held the others up there; `held_up_by`: the rank
    whose own work held that step up most (-1: nobody beyond jitter, 0.5 ms)."""
    lat = a.slow.lateness
    cols = ["step", "group", "seq", "rank", "step_ms", "own_late_ms", "held_up_by"]
    if lat.empty:
        return pd.DataFrame(columns=cols)
    group = lat["group"].astype(str)
    busiest = group.value_counts().index[0]
    sub = lat[(group == busiest).to_numpy()].sort_values(["rank", "seq"], kind="stable")
    enq = sub["t_enqueue_ns"].to_numpy().astype(np.int64)
    rank = sub["rank"].to_numpy()
    step_ms = np.full(len(sub), np.nan)
    same = np.r_[False, rank[1:] == rank[:-1]]
    step_ms[same] = (enq[1:] - enq[:-1])[same[1:]] / 1e6
    out = pd.DataFrame({"group": busiest, "seq": sub["seq"].to_numpy(), "rank": rank, "step_ms": step_ms,
                        "own_late_ms": sub["own_late_ns"].to_numpy() / 1e6})
    worst = out.loc[out.groupby("seq")["own_late_ms"].idxmax(), ["seq", "rank", "own_late_ms"]]
    worst = worst[worst["own_late_ms"] >= 0.5]
    out["held_up_by"] = out["seq"].map(dict(zip(worst["seq"], worst["rank"], strict=True))).fillna(-1).astype(int)
    out["step"] = pd.factorize(out["seq"], sort=True)[0] + 1
    return out[cols].sort_values(["step", "rank"], kind="stable").reset_index(drop=True)


def ranks(a: Analysis) -> pd.DataFrame:
    """One row per rank (dumped or not): its dump, its role and state in the wait graph, what it waits for."""
    rep = a.report()
    graph = a.graph
    nodes = sorted(graph.nodes)
    kinds = {r: c["kind"] for c in rep["root_causes"] for r in c["ranks"]}
    roles = rank_roles(a)
    out = pd.DataFrame({
        "rank": nodes,
        "dumped": [bool(graph.nodes[r].get("dumped")) for r in nodes],
        "status": [graph.nodes[r].get("status") for r in nodes],
        "role": [roles.get(r, "idle") if r in a.dumps else ("root_cause" if r in kinds else "missing") for r in nodes],
        "root_cause_kind": [kinds.get(r) for r in nodes],
    })
    waits = pd.DataFrame([{"rank": w["rank"], "blocking_op": f"{w['op']} (group {w['group']}, seq {w['seq']})",
                           "waits_for": w["waits_for"], "evidence": w["evidence"]} for w in rep["waits"]],
                         columns=["rank", "blocking_op", "waits_for", "evidence"])
    dumps = a.dump_table.reindex(columns=["rank", "file", "format", "host", "reason", "entries"])
    out = out.merge(waits, on="rank", how="left").merge(dumps, on="rank", how="left")
    out["waits_for"] = [w if isinstance(w, list) else [] for w in out["waits_for"]]
    out["entries"] = out["entries"].fillna(0).astype(int)
    return out


def root_causes(a: Analysis) -> pd.DataFrame:
    """The report's root causes, one row each (stack as a list of frames, outermost first)."""
    cols = ["rank", "kind", "group", "group_desc", "seq", "op", "detail", "ranks", "site", "stack", "victims"]
    return pd.DataFrame(a.report()["root_causes"], columns=cols)


def waits(a: Analysis) -> pd.DataFrame:
    """The report's waits: one row per rank with a blocking op, and whom it waits for."""
    cols = ["rank", "group", "seq", "op", "peer", "waits_for", "reasons", "state", "evidence", "unknown"]
    out = pd.DataFrame(a.report()["waits"]).reindex(columns=cols)
    out["peer"] = out["peer"].astype("Int64")
    return out


# --- derived columns ------------------------------------------------------------------------------

def _collective_ids(df: pd.DataFrame, offset: pd.Series) -> pd.Series:
    """Same id on every rank's entry of one collective (group, seq) or transfer (group, src, dst, seq).

    Ids follow the order in which collectives were first entered (wall clock), so they read as steps.
    """
    kind = df["kind"].astype(object)
    coll = (kind == "coll") & (df["seq"] > 0)
    p2p = (kind == "p2p") & (df["seq"] > 0) & (df["peer"] >= 0)
    is_send = df["op"].astype(object) == "send"
    keys = pd.DataFrame({
        "kind": kind,
        "group": df["group"].astype(object),
        "seq": df["seq"],
        "src": np.where(p2p, np.where(is_send, df["rank"], df["peer"]), -1),
        "dst": np.where(p2p, np.where(is_send, df["peer"], df["rank"]), -1),
    })[coll | p2p]
    out = pd.Series(pd.NA, index=df.index, dtype="Int64")
    if keys.empty:
        return out
    key = keys.groupby(list(keys.columns), sort=True).ngroup()
    wall = (df.loc[keys.index, "t_enqueue_ns"] + offset.loc[keys.index]).astype("float64")
    first = wall.groupby(key).min()
    order = pd.Series(np.arange(len(first)), index=first.sort_values(kind="stable", na_position="last").index)
    out.loc[keys.index] = key.map(order).to_numpy()
    return out


def _lateness_columns(a: Analysis, df: pd.DataFrame) -> pd.DataFrame:
    """The analyzer's lateness (timing/lateness.py) joined back onto the entries it was measured on."""
    lat = a.slow.lateness
    out = pd.DataFrame({"late_ns": pd.array([pd.NA] * len(df), dtype="Int64"),
                        "last": pd.array([pd.NA] * len(df), dtype="boolean")}, index=df.index)
    if lat is None or lat.empty:
        return out
    key = ["rank", "group", "t_enqueue_ns"]
    left = pd.DataFrame({"rank": df["rank"].to_numpy(), "group": df["group"].astype(str).to_numpy(),
                         "t_enqueue_ns": df["t_enqueue_ns"].astype("float64").to_numpy(), "row": np.arange(len(df))})
    right = pd.DataFrame({"rank": lat["rank"].astype("int64").to_numpy(), "group": lat["group"].astype(str).to_numpy(),
                          "t_enqueue_ns": lat["t_enqueue_ns"].astype("float64").to_numpy(),
                          "late_ns": lat["late_ns"].astype("int64").to_numpy(), "last": lat["last"].astype(bool).to_numpy()})
    joined = left.merge(right.drop_duplicates(key), on=key, how="inner")
    out.iloc[joined["row"].to_numpy(), 0] = joined["late_ns"].to_numpy()
    out.iloc[joined["row"].to_numpy(), 1] = joined["last"].to_numpy()
    return out


def _blocking(df: pd.DataFrame, rep: dict[str, Any]) -> pd.Series:
    """True for the op each waiting rank is blocked in (its whole coalescing unit)."""
    hit = np.zeros(len(df), dtype=bool)
    if not rep["waits"]:
        return pd.Series(hit, index=df.index)
    w = pd.DataFrame([{"rank": x["rank"], "group": str(x["group"]), "seq": x["seq"], "peer": x.get("peer", -1),
                       "kind": "p2p" if "peer" in x else "coll"} for x in rep["waits"]])
    left = pd.DataFrame({"rank": df["rank"].to_numpy(), "group": df["group"].astype(str).to_numpy(),
                         "seq": df["seq"].to_numpy(), "kind": df["kind"].astype(str).to_numpy(),
                         "peer": np.where(df["kind"].astype(str) == "p2p", df["peer"], -1), "row": np.arange(len(df))})
    rows = left.merge(w, on=["rank", "group", "seq", "kind", "peer"])["row"].to_numpy()
    hit[rows] = True
    units = df.loc[hit & (df["unit"] >= 0).to_numpy(), ["rank", "unit"]].drop_duplicates()
    if len(units):
        in_unit = pd.MultiIndex.from_frame(df[["rank", "unit"]]).isin(pd.MultiIndex.from_frame(units))
        hit |= in_unit & (df["unit"] >= 0).to_numpy()
    return pd.Series(hit, index=df.index)


def _status(df: pd.DataFrame, rep: dict[str, Any]) -> pd.Categorical:
    """completed / failed / pending / unknown from the entry state; blocking, then mismatch, on top."""
    state = df["state"].astype(object)
    status = np.select(
        [state == COMPLETED, state == FAILED, state.isin(PENDING_STATES).to_numpy(), state == UNKNOWN],
        [ST_COMPLETED, ST_FAILED, ST_PENDING, ST_UNKNOWN], default=ST_UNKNOWN,
    ).astype(object)
    status[df["blocking"].to_numpy()] = ST_BLOCKING
    bad = [(str(m["group"]), m["seq"], r, m.get("src", -1), m.get("dst", -1)) for m in rep["mismatches"] for r in m["ranks"]]
    if bad:
        is_send = df["op"].astype(object) == "send"
        p2p = df["kind"].astype(object) == "p2p"
        left = pd.DataFrame({"group": df["group"].astype(str).to_numpy(), "seq": df["seq"].to_numpy(),
                             "rank": df["rank"].to_numpy(),
                             "src": np.where(p2p, np.where(is_send, df["rank"], df["peer"]), -1),
                             "dst": np.where(p2p, np.where(is_send, df["peer"], df["rank"]), -1),
                             "row": np.arange(len(df))})
        right = pd.DataFrame(bad, columns=["group", "seq", "rank", "src", "dst"]).drop_duplicates()
        status[left.merge(right, on=["group", "seq", "rank", "src", "dst"])["row"].to_numpy()] = ST_MISMATCH
    return pd.Categorical(status, categories=list(STATUSES))


def rank_roles(a: Analysis) -> dict[int, str]:
    """Rank -> root_cause, victim, waiting or idle (ranks without a dump appear only as root causes)."""
    rep = a.report()
    roots = {r for c in rep["root_causes"] for r in c["ranks"]}
    victims = set(rep["victims"])
    waiting = {w["rank"] for w in rep["waits"]}
    every = set(a.dumps) | roots | victims | waiting
    return {r: "root_cause" if r in roots else "victim" if r in victims else "waiting" if r in waiting else "idle"
            for r in every}
