"""Where op streams diverged: per call site, how many ops each rank issued in each group, next to its peers.

Why: a rank that skipped one collective is caught at the end, at the first position whose sizes differ
(or where its peers wait for an op it never issues). That says where the job broke, not where the
rank's program went another way. Counting each rank's ops per (group, op, call site) and comparing the
counts with its peers' names the site: "rank 3 issued 9 all_reduce at train.py:12 where its peers
issued 10".

Counts are only compared over history every compared rank holds, and only where a difference cannot be
an artefact:
- rings wrap: each group is counted from the oldest seq that every member still holds;
- a rank that is merely behind is a hang, not a divergence: a rank whose ops agree (op and call site)
  with the majority's at every seq it holds, that ended earlier than the others and did not exit
  normally (it is blocked, computing, or crashed: it may yet issue, or never could) is left out of its
  group's comparison. A rank that exited normally issues nothing more: its shorter stream counts.
- with no majority count (two ranks, or equal camps) the camp that the matcher's stream alignment named
  (an extra op) is compared with the other; otherwise nobody is named (a gap line says so).

`first_shift`: the first seq where the rank's (op, call site) differs from its peers' and from which on
its ops line up with theirs one position later (it skipped one) or earlier (it issued one extra),
checked over the rest of the overlap. Reported only when that alignment holds everywhere; timing is
not used (a skipped step's compute is often within the noise of a step's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .. import stackview
from ..constants import CPP_SITE
from ..keys import dense_ids
from ..textutil import ranges
from .matching import Shift

MAX_ITEMS = 100
UNKNOWN_SITE = "unknown call site"


@dataclass
class Divergence:
    """Each rank whose count of ops at one (group, op, call site) differs from its peers'."""

    items: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def find_divergence(entries: pd.DataFrame, exited: set[int], shifts: list[Shift] | None = None) -> Divergence:
    """Per (group, op), the ranks whose count of issued collectives differs from their peers', told per call
    site where the site's count differs by the same amount."""
    coll = _collectives(entries)
    if coll.empty:
        return Divergence()
    coll = _window(coll)
    firsts = _first_shifts(coll)
    aligned = {(s.group, r) for s in shifts or [] for r in [*s.ranks, *s.others]}  # the matcher's stream alignment
    compared = _compared(coll, exited, set(firsts) | aligned)
    coll = coll.merge(compared, on=["group", "rank"], how="inner")
    out = Divergence()
    if coll.empty:
        return out
    per_op = _grid(coll, ["group", "op"])
    per_site = _grid(coll, ["group", "op", "site"])
    shifts_by_group = {s.group: s for s in shifts or []}
    starts = coll.groupby("group")["seq"].min()
    for (group, op), row in per_op.iterrows():  # (group, op) pairs: few
        by_rank = {int(r): int(v) for r, v in row.dropna().items()}
        if len(set(by_rank.values())) < 2:
            continue
        ref = _reference(by_rank, shifts_by_group.get(str(group)))
        if ref is None:
            camps = sorted(set(by_rank.values()))
            out.notes.append(
                f"ranks {ranges(list(by_rank))} issued different numbers of {op} in group {group} "
                f"({', '.join(f'{ranges([r for r, v in by_rank.items() if v == n])}: {n}' for n in camps)}), "
                "and no majority or stream alignment tells which one diverged")
            continue
        expected, peers = ref
        sites = per_site.loc[(group, op)]
        for r, n in by_rank.items():
            if n == expected or r in peers:
                continue
            for site, issued, theirs in _sites(sites, r, peers, n - expected):
                item: dict[str, Any] = {"rank": r, "group": str(group), "op": str(op), "site": site, "issued": issued,
                                        "peers_issued": theirs, "peers": peers, "from_seq": int(starts[group])}
                if (str(group), r) in firsts:
                    item["first_shift"] = firsts[(str(group), r)]
                out.items.append(item)
    out.items.sort(key=lambda d: (d["group"], d["rank"], d["op"], str(d["site"])))
    if len(out.items) > MAX_ITEMS:
        out.notes.append(f"{len(out.items)} call sites whose counts differ; the report lists the first {MAX_ITEMS}")
        out.items = out.items[:MAX_ITEMS]
    return out


def _grid(coll: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Counts per `keys` (rows) and rank (columns): 0 where a compared rank issued none, NaN where the rank
    is not compared in that group."""
    counts = coll.groupby([*keys, "rank"], observed=True).size().unstack("rank")
    member = coll[["group", "rank"]].drop_duplicates().assign(x=1.0).pivot(index="group", columns="rank", values="x")
    held = member.reindex(index=counts.index.get_level_values("group"), columns=counts.columns).to_numpy()
    return pd.DataFrame(np.where(held == 1.0, counts.fillna(0).to_numpy(), np.nan), index=counts.index,
                        columns=counts.columns)


def _sites(sites: pd.DataFrame | None, rank: int, peers: list[int], diff: int) -> list[tuple[str | None, int, int]]:
    """(site, issued, peers_issued) where `rank`'s count at a site differs from its peers' (all agreeing) by
    as much as its whole count of the op does, in the same direction; else one item without a site (the
    ranks call the op from different lines, so no one site holds the difference)."""
    if sites is not None:
        mine, theirs = sites[rank], sites[peers]
        agree = theirs.nunique(axis=1) == 1
        delta = mine - theirs.iloc[:, 0]
        hit = agree & (delta == diff)
        if hit.any():
            return [(str(site), int(mine[site]), int(theirs.loc[site].iloc[0])) for site in sites.index[hit]]
        total = sites[rank].sum()
        return [(None, int(total), int(total) - diff)]
    return []
def _collectives(entries: pd.DataFrame) -> pd.DataFrame:
    """rank, group, seq, op, site of every collective with a seq; a C++-issued op's site says so."""
    coll = entries.loc[(entries["kind"] == "coll").to_numpy() & (entries["seq"] > 0).to_numpy(),
                       ["rank", "group", "seq", "op", "site", "source"]]
    if coll.empty:
        return pd.DataFrame(columns=["rank", "group", "seq", "op", "site"])
    site = pd.Categorical(coll["site"].astype(object).where(coll["site"].notna(), ""))
    cpp = (coll["source"].astype(str) == "c++").to_numpy()
    labels = np.asarray([str(c) for c in site.categories] + [""], dtype=object)
    text = labels[site.codes]  # code -1 (null) -> ""
    text = np.where(text != "", text, np.where(cpp, CPP_SITE, UNKNOWN_SITE))
    return pd.DataFrame({
        "rank": coll["rank"].to_numpy(np.int64),
        "group": coll["group"].astype(str).to_numpy(),
        "seq": coll["seq"].to_numpy(np.int64),
        "op": coll["op"].astype(str).to_numpy(),
        "site": pd.Categorical(text),
    })


def _window(coll: pd.DataFrame) -> pd.DataFrame:
    """Each group's rows from the oldest seq every rank of it still holds (rings wrap)."""
    oldest = coll.groupby(["group", "rank"])["seq"].min().groupby(level="group").max().rename("lo")
    lo = oldest.reindex(coll["group"]).to_numpy()
    return coll[coll["seq"].to_numpy() >= lo].reset_index(drop=True)


def _tokens(coll: pd.DataFrame, fields: list[str]) -> pd.DataFrame:
    """One row per (group, rank, seq): its `fields` as one code, and the group's majority code at that seq
    (-1 where no strict majority)."""
    one = coll.drop_duplicates(["group", "rank", "seq"]).copy()
    one["token"] = dense_ids([pd.Categorical(one[f]).codes for f in fields])
    tally = one.groupby(["group", "seq", "token"]).size().rename("k").reset_index()
    held = one.groupby(["group", "seq"]).size().rename("held")
    tally = tally.join(held, on=["group", "seq"])
    major = tally[2 * tally["k"] > tally["held"]].set_index(["group", "seq"])["token"].rename("major")
    one = one.join(major, on=["group", "seq"])
    one["major"] = one["major"].fillna(-1).astype(np.int64)
    return one


def _compared(coll: pd.DataFrame, exited: set[int], shifted: set[tuple[str, int]]) -> pd.DataFrame:
    """The (group, rank) pairs whose counts are compared: all but the ranks that are merely behind (their ops
    agree with the majority's wherever they hold one, they ended earlier and did not exit normally).

    "Agree" is by op; call sites alone do not make a rank diverge unless its stream's alignment with the
    majority's changed (`shifted`): a program may call the same collective from another line on some ranks.
    """
    one = _tokens(coll, ["op"])
    one["off"] = one["token"] != one["major"]
    per = one.groupby(["group", "rank"]).agg(end=("seq", "max"), off=("off", "any")).reset_index()
    per["last"] = per.groupby("group")["end"].transform("max")
    moved = np.array([(str(g), int(r)) in shifted for g, r in zip(per["group"], per["rank"], strict=True)], dtype=bool)
    behind = (per["end"] < per["last"]) & ~per["off"] & ~moved & ~per["rank"].isin(list(exited))
    per = per[~behind]
    per = per[per.groupby("group")["rank"].transform("size") > 1]
    return per[["group", "rank"]]


def _reference(by_rank: dict[int, int], shift: Shift | None) -> tuple[int, list[int]] | None:
    """The peers' count and the peers: a strict majority's, else the camp the stream alignment cleared."""
    values = pd.Series(by_rank)
    tally = values.value_counts()
    if 2 * int(tally.iloc[0]) > len(values):
        n = int(tally.index[0])
        return n, sorted(int(r) for r in values.index[values == n])
    if shift is not None:
        theirs = {by_rank[r] for r in shift.others if r in by_rank}
        if len(theirs) == 1 and all(r in by_rank for r in shift.ranks):
            return theirs.pop(), sorted(r for r in shift.others if r in by_rank)
    return None


def _first_shifts(coll: pd.DataFrame) -> dict[tuple[str, int], dict[str, Any]]:
    """(group, rank) -> where its stream first went another way, when the rest lines up with the majority's
    one position later (`offset` 1: it skipped an op) or earlier (-1: it issued one extra)."""
    one = _tokens(coll, ["op", "site"])
    off = one[(one["token"] != one["major"]).to_numpy() & (one["major"] >= 0).to_numpy()]
    out: dict[tuple[str, int], dict[str, Any]] = {}
    if off.empty:
        return out
    firsts = off.groupby(["group", "rank"])["seq"].min()
    for (group, rank), first in firsts.items():  # the diverging ranks only: few
        mine = one[(one["group"] == group).to_numpy() & (one["rank"] == rank).to_numpy()]
        major = one[(one["group"] == group).to_numpy()].drop_duplicates("seq").set_index("seq")["major"]
        for offset in (1, -1):  # skipped: its op at `first` is theirs at first + 1; extra: its op at first is its own
            later = mine[mine["seq"] >= first] if offset == 1 else mine[mine["seq"] > first]
            theirs = major.reindex(later["seq"].to_numpy() + offset).to_numpy()
            known = ~np.isnan(theirs.astype(float)) & (theirs >= 0)
            if known.any() and (later["token"].to_numpy()[known] == theirs[known]).all():
                at = mine[mine["seq"] == first].iloc[0]
                peer = one[(one["group"] == group).to_numpy() & (one["seq"] == first).to_numpy()
                           & (one["token"] == one["major"]).to_numpy()].iloc[0]
                out[(str(group), int(rank))] = {
                    "seq": int(first), "offset": offset, "op": str(at["op"]), "site": str(at["site"]),
                    "peers_op": str(peer["op"]), "peers_site": str(peer["site"]),
                }
                break
    return out


def where(site: str, short: bool = False) -> str:
    """'at train.py:12 in step', or 'issued from C++ (...)' for an op Python never saw; `short`: the file's
    name only."""
    if site == CPP_SITE:
        return site
    if site == UNKNOWN_SITE:
        return "at an unknown call site"
    return f"at {stackview.where_text(site, None) if short else site}"


def line(item: dict[str, Any], short: bool = False) -> str:
    """'rank 3 issued 9 all_reduce at train.py:12 in step where its peers (ranks 0-2) issued 10 (group 0,
    counted from seq 1); ...' and where its stream shifted when known."""
    peers = item["peers"]
    site = f" {where(item['site'], short)}" if item.get("site") else " (its call sites differ from its peers')"
    text = (f"rank {item['rank']} issued {item['issued']} {item['op']}{site} where its peer{'s' if len(peers) > 1 else ''}"
            f" ({'ranks' if len(peers) > 1 else 'rank'} {ranges(peers)}) issued {item['peers_issued']} "
            f"(group {item['group']}, counted from seq {item['from_seq']})")
    shift = item.get("first_shift")
    if not shift:
        return text
    later = "one position later: it skipped one op" if shift["offset"] == 1 else "one position earlier: it issued one extra op"
    return (f"{text}; its stream shifted at seq {shift['seq']}: {shift['op']} {where(shift['site'], short)} where its "
            f"peers issued {shift['peers_op']} {where(shift['peers_site'], short)}, and from there its ops line up "
            f"with theirs {later}")
