"""Line collectives up across group members and find the positions where ranks disagree.

Why vectorised: a job of thousands of ranks dumps millions of entries. Each entry gets comparable
signatures (op, shapes under the all_gather / reduce_scatter size rules, dtypes, reduce op) that are
computed once per *distinct* combination, then `groupby((group, seq)).nunique()` finds every
disagreeing position at once. Only disagreeing positions are looked at one by one, and all of them
are reported (not just the first of a group). Coalesced/batched blocks that share a sequence number
on a rank are compared as one unit.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .columns import Transfers, dense_ids, first_rows, pack_keys, pair_transfers
from .constants import (
    ALL_GATHER_OPS,
    GATHER_OPS,
    LOOSE_SHAPE_OPS,
    NO_PAYLOAD_OPS,
    REDUCE_SCATTER_OPS,
    SCATTER_OPS,
)

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
class MatchResult:
    """All mismatches, plus the (group, seq, rank) culprits the wait graph points edges at."""

    mismatches: list[Mismatch]
    culprits: pd.DataFrame  # columns group, seq, rank (collectives only)
    positions: pd.DataFrame  # one row per (rank, group, seq) collective unit with its signatures
    notes: list[str]


def match(entries: pd.DataFrame, members: dict[str, tuple[int, ...]], transfers: Transfers | None = None) -> MatchResult:
    """Compare every collective position and every matched send/recv pair (`transfers`: the
    table's sends joined to their receives, when the caller has them already)."""
    notes: list[str] = []
    positions = collective_positions(entries, members)
    mismatches = _collective_mismatches(positions)
    mismatches += _p2p_mismatches(entries, pair_transfers(entries) if transfers is None else transfers)
    if len(mismatches) > MAX_REPORTED:
        notes.append(f"{len(mismatches)} mismatching positions; the report lists the first {MAX_REPORTED}")
    mismatches.sort(key=lambda m: (m.group, m.seq, FIELDS.index(m.field) if m.field in FIELDS else 9))
    rows = [(m.group, m.seq, r) for m in mismatches if m.kind == "coll" for r in m.ranks]
    culprits = pd.DataFrame(rows, columns=["group", "seq", "rank"]).drop_duplicates()
    return MatchResult(mismatches=mismatches[:MAX_REPORTED], culprits=culprits, positions=positions, notes=notes)


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
    if op in ALL_GATHER_OPS:
        total_in, total_out = _numel(i), _numel(o)
        rule = "" if total_out == total_in * size else f" (output != input x group size {size})"
        return f"in {_fmt(i)}, out numel {total_out}{rule}", f"{idt}->{odt}"
    if op in REDUCE_SCATTER_OPS:
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
