"""Line collectives up across group members and find the positions where ranks disagree.

Why vectorised: a job of thousands of ranks dumps millions of entries. Each entry gets comparable
signatures (positions.py, under each op family's rules: signatures.py), then one scan of integer codes
finds every disagreeing position at once. Only disagreeing positions are looked at one by one, and all of
them are reported (not just the first of a group). Coalesced/batched blocks that share a sequence number
on a rank are compared as one unit, op by op in record order; an op holding several tensors (a coalesced
all_gather/reduce_scatter) is held to its size rule tensor by tensor.

This module is the majority vote and the order of the passes (`match`). Positions with no majority are
settled by aligning the ranks' op streams (alignment.py), an extra op of the usual kind and size by
aligning call sites (site_alignment.py), and send/recv pairs are compared on their payloads
(payloads.py); the records they make are in mismatch.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..keys import dense_ids, pack_keys
from .alignment import settle_ties
from .mismatch import FIELDS, Mismatch, Shift
from .payloads import p2p_mismatches
from .positions import collective_positions
from .site_alignment import site_shifts
from .transfers import Transfers, pair_transfers

MAX_REPORTED = 1000


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
    shifts = settle_ties(mismatches, positions, entries)
    by_site, site_found = site_shifts(entries, positions, members, {m.group for m in mismatches})
    mismatches, shifts = mismatches + by_site, shifts + site_found
    mismatches += p2p_mismatches(entries, pair_transfers(entries) if transfers is None else transfers)
    if len(mismatches) > MAX_REPORTED:
        notes.append(f"{len(mismatches)} mismatching positions; the report lists the first {MAX_REPORTED}")
    mismatches.sort(key=lambda m: (m.group, m.seq, FIELDS.index(m.field) if m.field in FIELDS else 9))
    rows = [(m.group, m.seq, r) for m in mismatches if m.kind == "coll" for r in m.ranks]
    culprits = pd.DataFrame(rows, columns=["group", "seq", "rank"]).drop_duplicates()
    return MatchResult(mismatches=mismatches[:MAX_REPORTED], culprits=culprits, positions=positions, notes=notes,
                       shifts=shifts)


def _collective_mismatches(pos: pd.DataFrame) -> list[Mismatch]:
    """Every (position, field) where the members differ, each with its minority (the majority vote)."""
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
    """The ranks outside the most common value of one field at one position (`tie` when no value has most)."""
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
