"""Line collectives up across group members and find the positions where ranks disagree.

Why vectorised: a job of thousands of ranks dumps millions of entries. Each entry gets comparable
signatures (op, shapes under the all_gather / reduce_scatter size rules, dtypes, reduce op) that are
computed once per *distinct* combination, then `groupby((group, seq)).nunique()` finds every
disagreeing position at once. Only disagreeing positions are looked at one by one, and all of them
are reported (not just the first of a group). Coalesced/batched blocks that share a sequence number
on a rank are compared as one unit, op by op in record order; an op holding several tensors (a coalesced
all_gather/reduce_scatter) is held to its size rule tensor by tensor.

Positions with no majority (two ranks, or two equal camps) are settled by aligning the ranks' op
streams, never by rank number: an op issued by one side only shifts its later ops by one, so the side
whose stream lines up with the other's one position later, and that issued exactly one op more, is
the one that diverged. When the streams cannot tell, every rank of the position is named.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..constants import (
    ALL_GATHER_OPS,
    GATHER_OPS,
    LOOSE_SHAPE_OPS,
    NO_PAYLOAD_OPS,
    REDUCE_SCATTER_OPS,
    SCATTER_OPS,
)
from ..keys import dense_ids, first_rows, pack_keys
from ..textutil import ranges
from .transfers import Transfers, pair_transfers

FIELDS = ("op", "shapes", "dtypes", "reduce_op")
MAX_REPORTED = 1000
_SIG_COLUMNS = ["group", "op", "in_shapes", "out_shapes", "in_dtypes", "out_dtypes"]


@dataclass
class Mismatch:
    """Ranks that disagree with the majority at one position, for one field."""

    group: str
    seq: int
    field: str
    ranks: list[int]
    values: dict[str, list[int]]
    expected: str
    op: str
    kind: str = "coll"
    tie: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    undecided: bool = False  # no majority and the evidence cannot tell who diverged: `ranks` are all of them
    shift: Shift | None = None  # the alignment that settled a position with no majority

    def as_dict(self) -> dict[str, Any]:
        """The report's `mismatches` item."""
        out = {
            "group": self.group,
            "seq": self.seq,
            "ranks": self.ranks,
            "field": self.field,
            "values": self.values,
            "expected": self.expected,
            "op": self.op,
            "kind": self.kind,
            "tie": self.tie,
        }
        out.update(self.extra)
        return out


@dataclass
class Shift:
    """One side of a position with no majority issued one op the other side did not: its later ops
    line up with the others' one position earlier (found by aligning the op streams)."""

    group: str
    seq: int  # where the extra op sits in the shifted ranks' stream
    op: str
    ranks: list[int]  # the ranks that issued the extra op
    others: list[int]
    last: int  # the others' last seq in the group: the shifted ranks' later seqs have no partner

    def text(self) -> str:
        """One sentence for the report: which stream has the extra op, and what lines up."""
        who, them = _ranks_text(self.ranks), _ranks_text(self.others)
        many = len(self.ranks) > 1
        stream, its, it = ("op streams have", "their", "they") if many else ("op stream has", "its", "it")
        return (f"{who}'s {stream} one extra {self.op} at seq {self.seq} of group {self.group}: from there on {its} "
                f"ops line up with {them}'s one position earlier, and {it} issued one op more (up to seq "
                f"{self.last + 1}, {them} up to seq {self.last}), so {them} never "
                f"issue{'' if len(self.others) > 1 else 's'} a seq {self.last + 1}")


def _ranks_text(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}"


@dataclass
class MatchResult:
    """All mismatches, plus the (group, seq, rank) culprits the wait graph points edges at."""

    mismatches: list[Mismatch]
    culprits: pd.DataFrame  # columns group, seq, rank (collectives only)
    positions: pd.DataFrame  # one row per (rank, group, seq) collective unit with its signatures
    notes: list[str]
    shifts: list[Shift] = field(default_factory=list)  # positions with no majority settled by alignment


def match(entries: pd.DataFrame, members: dict[str, tuple[int, ...]], transfers: Transfers | None = None) -> MatchResult:
    """Compare every collective position and every matched send/recv pair (`transfers`: the
    table's sends joined to their receives, when the caller has them already)."""
    notes: list[str] = []
    positions = collective_positions(entries, members)
    mismatches = _collective_mismatches(positions)
    shifts = _settle_ties(mismatches, positions, entries)
    by_site, site_shifts = _site_shifts(entries, positions, members, {m.group for m in mismatches})
    mismatches, shifts = mismatches + by_site, shifts + site_shifts
    mismatches += _p2p_mismatches(entries, pair_transfers(entries) if transfers is None else transfers)
    if len(mismatches) > MAX_REPORTED:
        notes.append(f"{len(mismatches)} mismatching positions; the report lists the first {MAX_REPORTED}")
    mismatches.sort(key=lambda m: (m.group, m.seq, FIELDS.index(m.field) if m.field in FIELDS else 9))
    rows = [(m.group, m.seq, r) for m in mismatches if m.kind == "coll" for r in m.ranks]
    culprits = pd.DataFrame(rows, columns=["group", "seq", "rank"]).drop_duplicates()
    return MatchResult(mismatches=mismatches[:MAX_REPORTED], culprits=culprits, positions=positions, notes=notes,
                       shifts=shifts)


def collective_positions(entries: pd.DataFrame, members: dict[str, tuple[int, ...]]) -> pd.DataFrame:
    """One row per (rank, group, seq) collective unit, with string signatures for each field."""
    coll = entries.loc[
        (entries["kind"] == "coll") & (entries["seq"] > 0), ["rank", "id", "seq", "state", "reduce_op", *_SIG_COLUMNS]
    ]
    if coll.empty:
        return pd.DataFrame(columns=["rank", "group", "seq", "id", "state", *FIELDS])
    # one id per distinct (group, op, shapes, dtypes) combination, from the categorical codes
    key = dense_ids([pd.Categorical(coll[c]).codes for c in _SIG_COLUMNS])  # pack_keys widens
    firsts = coll.iloc[first_rows(key)]  # one row per distinct combination, in id order
    shape_sig = np.empty(len(firsts), dtype=object)
    dtype_sig = np.empty(len(firsts), dtype=object)
    for i, row in enumerate(firsts.itertuples(index=False)):  # distinct combinations only
        size = len(members.get(str(row.group), ())) or 1
        shape_sig[i], dtype_sig[i] = _signature(str(row.op), row.in_shapes, row.out_shapes, row.in_dtypes, row.out_dtypes, size)
    def text(values: Any) -> pd.Categorical:
        """Categorical with str categories: grouping, nunique and str tests then run on codes, not per row."""
        cat = values if isinstance(values, pd.Categorical) else pd.Categorical(values)
        return cat.rename_categories(pd.Index([str(c) for c in cat.categories], dtype=object))

    def by_key(per_combination: np.ndarray) -> pd.Categorical:  # one value per distinct combination
        small = pd.Categorical(pd.Series(per_combination, dtype=object))
        return pd.Categorical.from_codes(small.codes[key], categories=small.categories)

    reduce_op = coll["reduce_op"].array
    if "" not in reduce_op.categories:
        reduce_op = reduce_op.add_categories([""])
    sig = pd.DataFrame(
        {
            "rank": coll["rank"].to_numpy(),
            "group": text(coll["group"].array),
            "seq": coll["seq"].to_numpy(),
            "id": coll["id"].to_numpy(),
            "state": text(coll["state"].array),
            "op": text(coll["op"].array),
            "shapes": text(by_key(shape_sig)),
            "dtypes": text(by_key(dtype_sig)),
            "reduce_op": text(reduce_op.fillna("")),
        },
        copy=False,  # fresh columns: consolidating them into 2-D blocks would copy tens of millions of rows
    )
    dup = _repeated(sig["rank"].to_numpy(), pd.Categorical(sig["group"]).codes, sig["seq"].to_numpy())
    if dup.any():  # coalesced blocks: one unit per (rank, group, seq), fields joined in record order
        units = sig[dup].sort_values("id").groupby(["rank", "group", "seq"], sort=False).agg(
            id=("id", "min"),
            state=("state", _unit_state),
            op=("op", " + ".join),
            shapes=("shapes", " + ".join),
            dtypes=("dtypes", " + ".join),
            reduce_op=("reduce_op", " + ".join),
        )
        sig = pd.concat([sig[~dup], units.reset_index()], ignore_index=True)
    return sig


def _repeated(rank: np.ndarray, group: np.ndarray, seq: np.ndarray) -> pd.Series:
    """Rows whose (rank, group, seq) occurs more than once: one packed int64 key, sorted once
    (a sort beats hashing millions of keys, and repeats are rare)."""
    key = pack_keys([rank, group, seq])
    if key is None:
        return pd.DataFrame({"r": rank, "g": group, "s": seq}).duplicated(keep=False)
    ordered = np.sort(key)
    repeats = ordered[1:][ordered[1:] == ordered[:-1]]
    return pd.Series(np.isin(key, repeats) if len(repeats) else np.zeros(len(key), dtype=bool))


def _unit_state(states: pd.Series) -> str:
    values = set(states)
    for s in ("failed", "started", "enqueued", "unknown"):
        if s in values:
            return s
    return "completed"


def _collective_mismatches(pos: pd.DataFrame) -> list[Mismatch]:
    if pos.empty:
        return []
    op = pd.Categorical(pos["op"])
    unknown = np.append([("unknown" in str(c)) for c in op.categories], False)  # C++ ops of unknown kind match anything
    pos = pos[~unknown[op.codes]]
    if pos.empty:
        return []
    position = dense_ids([pd.Categorical(pos["group"]).codes, pos["seq"].to_numpy()])
    codes = {name: pd.Categorical(pos[name]).codes for name in FIELDS}
    # All fields at once first (nulls included): a position where no member differs in any field
    # cannot vary in one. At scale that is nearly every position, so the per-field passes below
    # run only over the few positions that differ somewhere.
    combined = pack_keys(list(codes.values()))  # nulls (-1) are a value of their own here
    suspect = np.flatnonzero(_varies(position, combined) if combined is not None else np.ones(len(pos), dtype=bool))
    if not len(suspect):
        return []
    pos, position = pos.iloc[suspect], position[suspect]
    at = {name: _varies(position, codes[name][suspect]) for name in FIELDS}
    out: list[Mismatch] = []
    for name in FIELDS:
        rows = at[name] if name == "op" else at[name] & ~at["op"]
        if not rows.any():
            continue
        for (group, seq), part in pos[rows].groupby(["group", "seq"], sort=False, observed=True):
            out.append(_minority(str(group), int(seq), name, part))
    return out


def _varies(position: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Per row: does its position hold more than one distinct non-null value (nunique > 1)?

    Each position keeps one of its members' values (whichever a plain scattered write leaves); the
    position varies exactly when some member's value differs from it. No hashing, no ufunc.at.
    """
    k = int(position.max()) + 1 if len(position) else 0
    valid = codes >= 0  # codes are never negative but for null (-1)
    where = position[valid]
    reference = np.full(k, -1, dtype=codes.dtype)
    reference[where] = codes[valid]
    differs = np.zeros(k, dtype=bool)
    differs[where[codes[valid] != reference[where]]] = True
    return differs[position]


def _minority(group: str, seq: int, name: str, part: pd.DataFrame) -> Mismatch:
    by_value: dict[str, list[int]] = {}
    for value, ranks in part.groupby(name, sort=False)["rank"]:
        by_value[str(value)] = sorted(int(r) for r in ranks)
    ordered = sorted(by_value.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    expected = ordered[0][0]
    tie = len(ordered) > 1 and len(ordered[1][1]) == len(ordered[0][1])
    culprits = sorted(r for v, rs in by_value.items() if v != expected for r in rs)
    ops = part["op"].value_counts()
    return Mismatch(
        group=group, seq=seq, field=name, ranks=culprits, values=dict(ordered), expected=expected, op=str(ops.index[0]), tie=tie
    )


def _pending_where(entries: pd.DataFrame) -> dict[int, set[str]]:
    """Per rank, the groups of its ops not completed (few rows: the ops ranks are stuck in)."""
    open_ = entries.loc[~entries["state"].isin(("completed",)).to_numpy(), ["rank", "group"]].drop_duplicates()
    out: dict[int, set[str]] = {}
    for rank, group in zip(open_["rank"].tolist(), open_["group"].astype(str).tolist(), strict=True):
        out.setdefault(int(rank), set()).add(group)
    return out


def _settle_ties(mismatches: list[Mismatch], pos: pd.DataFrame, entries: pd.DataFrame) -> list[Shift]:
    """Name the culprits of positions with no majority from the op streams, never from rank numbers.

    Why: with two ranks (or two equal camps) "the majority" does not exist, and taking the lowest rank's
    value as the expected one blames whichever rank is not the lowest (PyTorch's tutorial: rank 0 issues
    one extra all_reduce, and rank 1 was blamed). The first such position of each group is aligned
    (`_align`); the shift it finds settles that position and every later one between the same two camps.
    Where no shift explains the streams, every rank of the position is named and the mismatch says so.
    """
    ties = sorted((m for m in mismatches if m.kind == "coll" and m.tie), key=lambda m: (m.group, m.seq))
    pending = _pending_where(entries) if ties else {}
    decided: dict[str, Shift | None] = {}
    for m in ties:  # one per tied position: few
        if m.group not in decided:
            decided[m.group] = _align(pos, m, pending)
    for m in ties:
        camps = [sorted(rs) for rs in m.values.values()]
        shift = decided.get(m.group)
        if shift is not None and m.seq >= shift.seq and sorted([shift.ranks, shift.others]) == sorted(camps):
            m.ranks, m.shift = list(shift.ranks), shift
            m.expected = next(v for v, rs in m.values.items() if sorted(rs) == shift.others)
            m.values = {m.expected: m.values[m.expected], **m.values}  # the other camp's value first
            if m.field == "op":  # a position is labelled by the expected op, as with a majority
                m.op = m.expected
            later = "" if m.seq == shift.seq else f" (a consequence of the extra op at seq {shift.seq})"
            m.extra["alignment"] = shift.text() + later
        else:
            m.ranks, m.undecided, m.expected = sorted(r for rs in camps for r in rs), True, ""
            m.extra["alignment"] = (
                f"no majority, and aligning the op streams of ranks {ranges(m.ranks)} does not tell which one diverged "
                "(no single extra or missing op explains them): all are named, none is picked by rank number"
            )
    return [s for s in decided.values() if s is not None]


def _align(pos: pd.DataFrame, m: Mismatch, pending: dict[int, set[str]]) -> Shift | None:
    """The camp of the tied position `m` whose op stream has one extra op there, if exactly one does.

    A camp C diverged when (1) every C rank's ops after `m.seq` equal the other camp's ops one position
    earlier, (2) the other camp agrees with itself from `m.seq` on, and (3) every C rank issued exactly
    one op more in the group (its last seq is one past theirs): an inserted op, not a swapped one. With
    more than two camps one extra op cannot explain the position (the others disagree among themselves).
    (4) No rank of the other camp is stuck in an op of another group: such a rank may simply not have
    reached its next op here yet, so its stream being one op shorter proves nothing.
    """
    camps = [sorted(rs) for rs in m.values.values()]
    if len(camps) != 2:
        return None
    ranks = np.array(sorted(r for c in camps for r in c), dtype=np.int64)
    mine = pos.loc[(pos["group"] == m.group).to_numpy() & np.isin(pos["rank"].to_numpy(), ranks)]
    token = dense_ids([pd.Categorical(mine[f]).codes for f in FIELDS])  # one code per distinct (op, shapes, ...)
    rank, seq = mine["rank"].to_numpy(), mine["seq"].to_numpy().astype(np.int64)
    row = np.searchsorted(ranks, rank)
    last = np.full(len(ranks), -1, dtype=np.int64)
    np.maximum.at(last, row, seq)  # a handful of ranks
    after = seq >= m.seq
    width = int(seq[after].max()) - m.seq + 2 if after.any() else 2  # one spare column for the shift
    grid = np.full((len(ranks), width), -1, dtype=np.int64)  # token per (rank, seq - m.seq); -1: none
    grid[row[after], seq[after] - m.seq] = token[after]
    at = {int(r): i for i, r in enumerate(ranks)}

    def diverged(camp: list[int], other: list[int]) -> bool:
        if any(pending.get(r, set()) - {m.group} for r in other):
            return False
        lasts_c, lasts_o = {int(last[at[r]]) for r in camp}, {int(last[at[r]]) for r in other}
        if len(lasts_o) != 1 or lasts_c != {next(iter(lasts_o)) + 1}:
            return False
        ref = grid[at[other[0]]]
        theirs = grid[[at[r] for r in other]]
        if ((theirs != ref) & (theirs >= 0) & (ref >= 0)).any():
            return False
        shifted, base = grid[[at[r] for r in camp]][:, 1:], ref[:-1]
        both = (shifted >= 0) & (base >= 0)
        return bool(both.any(axis=1).all()) and not ((shifted != base) & both).any()

    found = [(c, o) for c, o in (camps, camps[::-1]) if diverged(c, o)]
    if len(found) != 1:
        return None
    camp, other = found[0]
    here = mine.loc[(rank == camp[0]) & (seq == m.seq), "op"]
    op = str(here.iloc[0]) if len(here) else m.op
    return Shift(group=m.group, seq=m.seq, op=op, ranks=camp, others=other, last=int(last[at[other[0]]]))


PENDING_UNIT_STATES = ("enqueued", "started", "failed")
MAX_SITE_CAMP = 256  # ranks waiting in one group beyond which the call-site alignment is not tried


def _site_shifts(entries: pd.DataFrame, pos: pd.DataFrame, members: dict[str, tuple[int, ...]],
                 settled: set[str]) -> tuple[list[Mismatch], list[Shift]]:
    """An extra op that agrees in kind and size with the others' ops, told apart by its call site.

    Why: rank 0 all-reducing one extra tensor of the usual shape leaves no field to disagree on; its
    later ops pair with the other rank's previous ones and its last one waits for an op never issued,
    which looks like the other rank not entering (what `fr_trace` reports). Tried only where a group's
    ranks split into two equal camps (no majority) whose last seqs differ by one, the camp ahead still
    waiting in its last op: there, if the call sites disagree at some position and agree everywhere
    once the camp ahead is shifted back by one from it, that camp issued an extra op. Unknown sites
    (C++-issued ops) never count as agreement on their own: at least one known pair must line up.
    """
    if "site" not in entries.columns or pos.empty:
        return [], []
    waiting = pos.loc[pos["state"].isin(PENDING_UNIT_STATES).to_numpy(), ["rank", "group"]]
    out: list[Mismatch] = []
    shifts: list[Shift] = []
    for group, ranks in waiting.groupby("group", observed=True)["rank"]:  # groups with a waiting rank
        n = ranks.nunique()
        if str(group) in settled or n > MAX_SITE_CAMP or 2 * n != len(members.get(str(group), ())):
            continue  # only half of the group waiting can be two equal camps
        found = _site_shift(entries, pos, str(group))
        if found is not None:
            out.append(found[0])
            shifts.append(found[1])
    return out, shifts


def _site_shift(entries: pd.DataFrame, pos: pd.DataFrame, group: str) -> tuple[Mismatch, Shift] | None:
    """The call-site alignment of `_site_shifts` for one group (its two camps split by their last seq)."""
    mine = pos.loc[(pos["group"] == group).to_numpy(), ["rank", "seq", "state", "op"]]
    last = mine.groupby("rank")["seq"].max()
    ends = sorted(set(last.tolist()))
    if len(ends) != 2 or ends[1] != ends[0] + 1:
        return None
    ahead, behind = sorted(last.index[last == ends[1]].tolist()), sorted(last.index[last == ends[0]].tolist())
    if len(ahead) != len(behind):
        return None  # a majority: the usual rules apply
    tail = mine[(mine["seq"] == ends[1]).to_numpy()]
    if not tail["state"].isin(PENDING_UNIT_STATES).all():
        return None  # the camp ahead is not stuck in its last op
    ranks = np.array(ahead + behind, dtype=np.int64)
    rows = entries.loc[(entries["group"] == group).to_numpy() & (entries["kind"] == "coll").to_numpy()
                       & (entries["seq"] > 0).to_numpy(), ["rank", "seq", "id", "site"]]
    rows = rows[np.isin(rows["rank"].to_numpy(), ranks)].sort_values("id").drop_duplicates(["rank", "seq"])
    site = pd.Categorical(rows["site"])
    grid = np.full((len(ranks), ends[1] + 2), -1, dtype=np.int64)  # site code per (rank, seq); -1: unknown
    at = np.searchsorted(np.sort(ranks), rows["rank"].to_numpy())
    order = np.argsort(ranks)
    grid[order[at], rows["seq"].to_numpy().astype(np.int64)] = site.codes
    front, back = grid[: len(ahead)], grid[len(ahead):]
    ref = back[0]
    known = (back >= 0) & (ref >= 0)
    if ((back != ref) & known).any():
        return None  # the camp behind disagrees with itself
    both = (front >= 0) & (ref >= 0)
    differs = np.flatnonzero(((front != ref) & both).any(axis=0))
    if not len(differs):
        return None  # the streams agree where they overlap: nothing tells the camps apart
    p = int(differs[0])
    shifted, base = front[:, p + 1:], ref[p: -1]
    pairs = (shifted >= 0) & (base >= 0)
    if not pairs.any(axis=1).all() or ((shifted != base) & pairs).any():
        return None
    op_at = mine[(mine["rank"] == ahead[0]).to_numpy() & (mine["seq"] == p).to_numpy()]["op"]
    op = str(op_at.iloc[0]) if len(op_at) else "op"
    shift = Shift(group=group, seq=p, op=op, ranks=ahead, others=behind, last=ends[0])
    theirs, ours = _label(site.categories, int(ref[p])), _label(site.categories, int(front[0, p]))
    why = f"{shift.text()} (the ops agree in kind and size: their call sites tell them apart)"
    m = Mismatch(group=group, seq=p, field="site", ranks=list(ahead), values={theirs: list(behind), ours: list(ahead)},
                 expected=theirs, op=op, tie=True, shift=shift, extra={"alignment": why})
    return m, shift


def _shared_codes(a: pd.Categorical, b: pd.Categorical) -> tuple[np.ndarray, np.ndarray, pd.Index]:
    """One set of categories for two categoricals, and each one's code -> shared code table (its
    last slot, for code -1, is -1), so codes gathered at any rows compare as ints."""
    cats = a.categories.append(b.categories).unique()
    return np.append(cats.get_indexer(a.categories), -1), np.append(cats.get_indexer(b.categories), -1), cats


def _carried(own: np.ndarray, other: np.ndarray, empty: np.ndarray) -> np.ndarray:
    """The payload codes an op carries: its own side's, or the other side's where its own is empty."""
    return np.where((own < 0) | np.isin(own, empty), other, own)


def _p2p_mismatches(entries: pd.DataFrame, transfers: Transfers) -> list[Mismatch]:
    """Sends whose payload (shapes, dtypes) differs from their matching receive's.

    Compared as integer codes at the matched pairs' rows: at scale there are millions of transfers
    and a handful of distinct payloads, and strings are made only for the pairs that differ.
    """
    if not len(transfers):
        return []
    send, recv = transfers.send, transfers.recv
    payload: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    labels: dict[str, pd.Index] = {}
    for name, (ins, outs) in {"shapes": ("in_shapes", "out_shapes"), "dtypes": ("in_dtypes", "out_dtypes")}.items():
        a, b = pd.Categorical(entries[ins]), pd.Categorical(entries[outs])
        remap_in, remap_out, cats = _shared_codes(a, b)
        empty = np.flatnonzero(cats == "[]") if name == "shapes" else np.empty(0, dtype=np.int64)
        # a send's payload is its input, a receive's its output
        payload[name] = (_carried(remap_in[a.codes[send]], remap_out[b.codes[send]], empty),
                         _carried(remap_out[b.codes[recv]], remap_in[a.codes[recv]], empty))
        labels[name] = cats
    group = pd.Categorical(entries["group"])
    rank = entries["rank"].to_numpy()
    seq = entries["seq"].to_numpy()
    out: list[Mismatch] = []
    for name in ("shapes", "dtypes"):
        sent, received = payload[name]
        for i in np.flatnonzero(sent != received):  # only the pairs that differ
            s_row, r_row = int(send[i]), int(recv[i])
            sv, rv = _label(labels[name], int(sent[i])), _label(labels[name], int(received[i]))
            src, dst = int(rank[s_row]), int(rank[r_row])
            out.append(
                Mismatch(
                    group=str(group[s_row]),
                    seq=int(seq[s_row]),
                    field=name,
                    ranks=sorted({src, dst}),
                    values={f"send {sv}": [src], f"recv {rv}": [dst]},
                    expected=sv,
                    op="send/recv",
                    kind="p2p",
                    extra={"src": src, "dst": dst},
                )
            )
    return out


def _label(cats: pd.Index, code: int) -> str:
    return str(cats[code]) if code >= 0 else "nan"


def _signature(op: str, ins: Any, outs: Any, in_dt: Any, out_dt: Any, size: int) -> tuple[str, str]:
    """Shape and dtype signatures under each op family's rules (computed per distinct combination)."""
    if op in NO_PAYLOAD_OPS:
        return "", ""
    i, o = _shapes(ins), _shapes(outs)
    idt, odt = _text(in_dt), _text(out_dt)
    coalesced = len(i) == len(o) > 1  # one input and one output tensor per op of the block: each op by itself
    if op in ALL_GATHER_OPS:
        if coalesced:
            outs = [_numel([s]) for s in o]
            bad = [k for k, (a, b) in enumerate(zip(i, outs, strict=True)) if b != _numel([a]) * size]
            rule = f" (output != input x group size {size} for tensor(s) {bad})" if bad else ""
            return f"in {_fmt(i)}, out numel {outs}{rule}", f"{idt}->{odt}"
        total_in, total_out = _numel(i), _numel(o)
        rule = "" if total_out == total_in * size else f" (output != input x group size {size})"
        return f"in {_fmt(i)}, out numel {total_out}{rule}", f"{idt}->{odt}"
    if op in REDUCE_SCATTER_OPS:
        if coalesced:
            ins = [_numel([s]) for s in i]
            bad = [k for k, (a, b) in enumerate(zip(ins, o, strict=True)) if a != _numel([b]) * size]
            rule = f" (input != output x group size {size} for tensor(s) {bad})" if bad else ""
            return f"in numel {ins}, out {_fmt(o)}{rule}", f"{idt}->{odt}"
        total_in, total_out = _numel(i), _numel(o)
        rule = "" if total_in == total_out * size else f" (input != output x group size {size})"
        return f"in numel {total_in}, out {_fmt(o)}{rule}", f"{idt}->{odt}"
    if op in SCATTER_OPS:
        return f"out {_fmt(o)}", odt
    if op in GATHER_OPS:
        return f"in {_fmt(i)}", idt
    if op in LOOSE_SHAPE_OPS:
        return f"{len(i)} -> {len(o)} tensors", f"{idt}->{odt}"
    if op == "broadcast":
        return _fmt(i or o), idt or odt
    return f"{_fmt(i)} -> {_fmt(o)}", f"{idt}->{odt}"


def _shapes(text: Any) -> list[list[int]]:
    if not isinstance(text, str) or not text:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return [list(s) for s in value if isinstance(s, list)] if isinstance(value, list) else []


def _numel(shapes: list[list[int]]) -> int:
    return sum(math.prod(s) for s in shapes)


def _fmt(shapes: list[list[int]]) -> str:
    return "[" + ", ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes) + "]"


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""
