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
checked over the rest of the overlap. Reported only when that alignment holds everywhere. Timing is a
separate piece of evidence (`timing_shift`, timing/shifts.py), added where it can tell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .. import stackview
from ..constants import CPP_SITE
from ..keys import dense_ids, pack_keys
from ..textutil import ranges
from .mismatch import Shift

MAX_ITEMS = 100  # ranks named per report
UNKNOWN_SITE = "unknown call site"


@dataclass
class Divergence:
    """Each rank whose count of ops at one (group, op, call site) differs from its peers'."""

    items: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Table:
    """Collectives as integer codes (rank, g, seq, op, site; one row per entry), and each code's name."""

    rows: pd.DataFrame
    groups: np.ndarray
    ops: np.ndarray
    sites: np.ndarray


def find_divergence(entries: pd.DataFrame, exited: set[int], shifts: list[Shift] | None = None) -> Divergence:
    """Per (group, op), the ranks whose count of issued collectives differs from their peers', told per call
    site where one site's count differs by as much."""
    table = _collectives(entries)
    out = Divergence()
    if table is None:
        return out
    rows = _window(table.rows)
    by_op, by_site = _positions(rows, [rows["op"].to_numpy(), rows["op"].to_numpy() * len(table.sites) + rows["site"].to_numpy()])
    unsure = _unknown_mixed(by_op, table)
    if len(unsure):
        names = ", ".join(str(table.groups[g]) for g in unsure[:5])
        out.notes.append(f"group(s) {names}: some ranks recorded ops issued from C++ of unknown kind where others know "
                         "the kind; the ops issued per group and call site are not compared there")
        keep = ~np.isin(rows["g"].to_numpy(), unsure)
        rows = rows[keep]
        by_op = by_op[~np.isin(by_op["g"].to_numpy(), unsure)]
        by_site = by_site[~np.isin(by_site["g"].to_numpy(), unsure)]
    firsts = _first_shifts(by_site, table)
    gcode = {str(name): i for i, name in enumerate(table.groups)}
    aligned = {(gcode[sh.group], r) for sh in shifts or [] if sh.group in gcode for r in [*sh.ranks, *sh.others]}
    pairs = _compared(by_op, exited, set(firsts) | aligned)
    rows = rows[np.isin(_pair_key(rows["g"], rows["rank"]), _pair_key(pairs["g"], pairs["rank"]))]
    if rows.empty:
        return out
    counts = _counts(rows, pairs)
    spread = counts.groupby(["g", "op"])["n"].transform("nunique") > 1
    by_group = {}
    for sh in shifts or []:
        if sh.group in gcode:
            by_group[gcode[sh.group]] = sh
    starts = rows.groupby("g")["seq"].min()
    total = 0
    for (g, op), part in counts[spread.to_numpy()].groupby(["g", "op"]):  # (group, op) pairs whose counts differ: few
        ranks, n = part["rank"].to_numpy(), part["n"].to_numpy()
        ref = _reference(ranks, n, by_group.get(int(g)))
        group, op_name = str(table.groups[g]), str(table.ops[op])
        if ref is None:
            camps = ", ".join(f"{ranges(ranks[n == k].tolist())}: {int(k)}" for k in np.unique(n))
            out.notes.append(f"ranks {ranges(ranks.tolist())} issued different numbers of {op_name} in group {group} "
                             f"({camps}), and no majority or stream alignment tells which one diverged")
            continue
        expected, peers = ref
        odd = ranks[(n != expected) & ~np.isin(ranks, peers)]
        total += len(odd)
        mine = rows[(rows["g"] == g).to_numpy() & (rows["op"] == op).to_numpy()]
        for r in odd[: max(0, MAX_ITEMS - len(out.items))]:  # at most MAX_ITEMS ranks in all
            for site, issued, theirs in _sites(mine, int(r), peers, int(n[ranks == r][0]) - expected):
                item: dict[str, Any] = {"rank": int(r), "group": group, "op": op_name,
                                        "site": None if site is None else str(table.sites[site]), "issued": issued,
                                        "peers_issued": theirs, "peers": peers.tolist(), "from_seq": int(starts[g])}
                if (int(g), int(r)) in firsts:
                    item["first_shift"] = firsts[(int(g), int(r))]
                out.items.append(item)
    out.items.sort(key=lambda d: (d["group"], d["rank"], d["op"], str(d["site"])))
    if total > MAX_ITEMS:
        out.notes.append(f"{total} ranks issued a different number of some collective than their peers; the report "
                         f"lists the first {MAX_ITEMS}")
    return out


def _names(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Codes (-1: null) and each code's name as str, computed per category, not per row."""
    cat = values.array if isinstance(values.dtype, pd.CategoricalDtype) else pd.Categorical(values)
    return np.asarray(cat.codes, dtype=np.int64), np.asarray([str(c) for c in cat.categories], dtype=object)


def _collectives(entries: pd.DataFrame) -> _Table | None:
    """rank, group, seq, op, site codes of every collective with a seq; a C++-issued op's site says so."""
    coll = entries.loc[(entries["kind"] == "coll").to_numpy() & (entries["seq"] > 0).to_numpy(),
                       ["rank", "group", "seq", "op", "site", "source"]]
    if coll.empty:
        return None
    g, groups = _names(coll["group"])
    op, ops = _names(coll["op"])
    site, labels = _names(coll["site"])
    blank = np.append(labels == "", True)[site]  # code -1 (null) -> the appended True
    cpp = (coll["source"] == "c++").to_numpy(dtype=bool)
    site = np.where(~blank, site, np.where(cpp, len(labels), len(labels) + 1))
    rows = pd.DataFrame({"rank": coll["rank"].to_numpy(np.int64), "g": g, "seq": coll["seq"].to_numpy(np.int64),
                         "op": op, "site": site}, copy=False)  # fresh columns: no 2-D block copy
    return _Table(rows, groups, ops, np.append(labels, [CPP_SITE, UNKNOWN_SITE]))


def _pair_key(g: Any, rank: Any) -> np.ndarray:
    return np.asarray(g, dtype=np.int64) * (1 << 40) + np.asarray(rank, dtype=np.int64)


def _window(rows: pd.DataFrame) -> pd.DataFrame:
    """Each group's rows from the oldest seq every rank of it still holds (rings wrap)."""
    oldest = rows.groupby(["g", "rank"])["seq"].min().groupby(level="g").max()
    lo = oldest.reindex(rows["g"]).to_numpy()
    return rows[rows["seq"].to_numpy() >= lo].reset_index(drop=True)


def _positions(rows: pd.DataFrame, tokens: list[np.ndarray]) -> list[pd.DataFrame]:
    """Per token kind, one row per (g, rank, seq), sorted so (the first op of a coalesced unit), with its
    token and the group's strict-majority token at that seq (`major`, -1 where none). The rows are sorted
    once (one packed int64 key) for every kind."""
    g, r, sq = rows["g"].to_numpy(), rows["rank"].to_numpy(), rows["seq"].to_numpy()
    key = pack_keys([g, r, sq])
    order = np.argsort(key, kind="stable") if key is not None else np.lexsort((sq, r, g))
    g, r, sq = g[order], r[order], sq[order]
    first = np.ones(len(g), dtype=bool)
    if key is not None:
        ordered = key[order]
        first[1:] = ordered[1:] != ordered[:-1]
    else:
        first[1:] = (g[1:] != g[:-1]) | (r[1:] != r[:-1]) | (sq[1:] != sq[:-1])
    g, r, sq = g[first], r[first], sq[first]
    at = dense_ids([g, sq])  # one id per (group, seq)
    held = np.bincount(at)[at]
    out = []
    for token in tokens:
        tk = token[order][first]
        vote = dense_ids([at, tk])
        wins = 2 * np.bincount(vote)[vote] > held
        major = np.full(int(at.max()) + 1, -1, dtype=np.int64)
        major[at[wins]] = tk[wins]
        out.append(pd.DataFrame({"g": g, "rank": r, "seq": sq, "token": tk, "major": major[at]}, copy=False))
    return out


def _unknown_mixed(by_op: pd.DataFrame, table: _Table) -> np.ndarray:
    """Groups where one seq holds an op of unknown kind (a C++ op whose details were not recorded) on some
    ranks and a known op on others: that op would count under two names."""
    unknown = np.flatnonzero(["unknown" in str(name) for name in table.ops])
    if not len(unknown):
        return np.empty(0, dtype=np.int64)
    vague = np.isin(by_op["token"].to_numpy(), unknown)
    both = pd.Series(vague).groupby([by_op["g"].to_numpy(), by_op["seq"].to_numpy()]).agg(["any", "all"])
    mixed = both["any"] & ~both["all"]
    return np.unique(mixed.index.get_level_values(0)[mixed.to_numpy()]).astype(np.int64)


def _compared(by_op: pd.DataFrame, exited: set[int], shifted: set[tuple[int, int]]) -> pd.DataFrame:
    """The (g, rank) pairs whose counts are compared: all but the ranks that are merely behind (their ops
    agree with the majority's wherever they hold one, they ended earlier and did not exit normally).

    "Agree" is by op; call sites alone do not make a rank diverge unless its stream's alignment with the
    majority's changed (`shifted`): a program may call the same collective from another line on some ranks.
    """
    pos = by_op
    pos["off"] = pos["token"].to_numpy() != pos["major"].to_numpy()
    per = pos.groupby(["g", "rank"]).agg(end=("seq", "max"), off=("off", "any")).reset_index()
    last = per.groupby("g")["end"].transform("max").to_numpy()
    marked = np.array([_pair_key(g, r) for g, r in shifted], dtype=np.int64)
    moved = np.isin(_pair_key(per["g"], per["rank"]), marked)
    done = np.isin(per["rank"].to_numpy(), np.fromiter(exited, dtype=np.int64, count=len(exited)))
    behind = (per["end"].to_numpy() < last) & ~per["off"].to_numpy() & ~moved & ~done
    per = per[~behind]
    return per[per.groupby("g")["rank"].transform("size").to_numpy() > 1][["g", "rank"]]


def _counts(rows: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """n per (g, op, rank): every compared rank of a group against every op of that group (0 where none)."""
    n = rows.groupby(["g", "op", "rank"]).size().rename("n")
    ops = rows[["g", "op"]].drop_duplicates()
    full = pairs.merge(ops, on="g")
    full = full.join(n, on=["g", "op", "rank"])
    full["n"] = full["n"].fillna(0).astype(np.int64)
    return full


def _reference(ranks: np.ndarray, n: np.ndarray, shift: Shift | None) -> tuple[int, np.ndarray] | None:
    """The peers' count and the peers: a strict majority's, else the camp the stream alignment cleared."""
    values, k = np.unique(n, return_counts=True)
    if 2 * int(k.max()) > len(n):
        best = int(values[k.argmax()])
        return best, np.sort(ranks[n == best])
    if shift is not None:
        others = np.isin(ranks, shift.others)
        theirs = np.unique(n[others])
        if len(theirs) == 1 and np.isin(shift.ranks, ranks).all():
            return int(theirs[0]), np.sort(ranks[others])
    return None


def _sites(rows: pd.DataFrame, rank: int, peers: np.ndarray, diff: int) -> list[tuple[int | None, int, int]]:
    """(site, issued, peers_issued) where `rank`'s count at a site differs from its peers' (all agreeing) by
    as much as its whole count of the op does, in the same direction; else one item without a site (the
    ranks call the op from different lines, so no one site holds the difference)."""
    mine = rows.loc[(rows["rank"] == rank).to_numpy(), "site"].value_counts()
    theirs = rows[np.isin(rows["rank"].to_numpy(), peers)].groupby(["site", "rank"]).size()
    stats = theirs.groupby(level="site").agg(["min", "max", "size"])
    out: list[tuple[int | None, int, int]] = []
    for site in sorted(set(mine.index) | set(stats.index)):  # this op's sites: few
        issued = int(mine.get(site, 0))
        if site in stats.index:
            low, high, held = (int(v) for v in stats.loc[site])
            if held != len(peers) or low != high:
                continue  # the peers disagree among themselves at this site
            peer = low
        else:
            peer = 0
        if issued - peer == diff:
            out.append((int(site), issued, peer))
    if out:
        return out
    total = int(mine.sum())
    return [(None, total, total - diff)]


def _first_shifts(pos: pd.DataFrame, table: _Table) -> dict[tuple[int, int], dict[str, Any]]:
    """(g, rank) -> where its stream first went another way, when the rest lines up with the majority's
    one position later (`offset` 1: it skipped an op) or earlier (-1: it issued one extra), by (op, site)."""
    width = len(table.sites)
    off = (pos["token"] != pos["major"]).to_numpy() & (pos["major"] >= 0).to_numpy()
    if not off.any():
        return {}
    pair = _pair_key(pos["g"], pos["rank"])
    firsts = pd.Series(pos["seq"].to_numpy()[off]).groupby(pair[off]).min()
    first = firsts.reindex(pair).to_numpy()  # NaN for pairs that never differ
    span = int(pos["seq"].max()) + 2
    majors = pd.Series(pos["major"].to_numpy(), index=pos["g"].to_numpy() * span + pos["seq"].to_numpy())
    majors = majors[~majors.index.duplicated()]
    seq, token, g = pos["seq"].to_numpy(), pos["token"].to_numpy(), pos["g"].to_numpy()
    fits: dict[int, pd.Series] = {}
    for offset in (1, -1):  # skipped: its op at `first` is theirs at first + 1; extra: its op at first is its own
        use = (seq >= first) if offset == 1 else (seq > first)  # NaN compares False
        theirs = majors.reindex(g[use] * span + seq[use] + offset).fillna(-1).to_numpy(np.int64)
        known = theirs >= 0
        bad = known & (token[use] != theirs)
        per = pd.DataFrame({"known": known, "bad": bad}).groupby(pair[use]).any()
        fits[offset] = per["known"] & ~per["bad"]
    out: dict[tuple[int, int], dict[str, Any]] = {}
    at_first = pos[(seq == first)]  # one row per diverging pair: where it first differs
    for row in at_first.itertuples(index=False):  # the diverging ranks only
        key = int(_pair_key(row.g, row.rank))
        offset = next((o for o in (1, -1) if bool(fits[o].get(key, False))), None)
        if offset is None:
            continue
        peer = int(row.major)
        out[(int(row.g), int(row.rank))] = {
            "seq": int(row.seq), "offset": offset,
            "op": str(table.ops[row.token // width]), "site": str(table.sites[row.token % width]),
            "peers_op": str(table.ops[peer // width]), "peers_site": str(table.sites[peer % width]),
        }
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
    if shift:
        later = "one position later: it skipped one op" if shift["offset"] == 1 else "one position earlier: it issued one extra op"
        text += (f"; its stream shifted at seq {shift['seq']}: {shift['op']} {where(shift['site'], short)} where its "
                 f"peers issued {shift['peers_op']} {where(shift['peers_site'], short)}, and from there its ops line up "
                 f"with theirs {later}")
    timed = item.get("timing_shift")
    if timed:
        text += "; " + timing_line(timed, where(timed.get("site") or CPP_SITE, short))
    return text


def timing_line(shift: dict[str, Any], where: str) -> str:
    """'its timing shifted at seq 6 (all_reduce at train.py:12): from there 6 of 6 collectives departed
    from its usual arrival against its peers' (-0.2 ms) by 19.9 ms (median)' (`timing_shift`, timing/shifts.py)."""
    op = f" ({shift['op']} {where})" if shift.get("op") else ""
    return (f"its timing shifted at seq {shift['seq']}{op}: from there {shift['departed']} of {shift['of']} collectives "
            f"departed from its usual arrival against its peers' ({shift['before_ms']:+.1f} ms) by "
            f"{shift['departure_ms']:.1f} ms (median)")
