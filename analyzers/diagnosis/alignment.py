"""Positions with no majority settled by aligning the ranks' op streams, never by rank number.

Why: with two ranks (or two equal camps) "the majority" does not exist. An op issued by one side only
shifts its later ops by one, so the side whose stream lines up with the other's one position later,
and that issued exactly one op more, is the one that diverged. When the streams cannot tell, every
rank of the position is named. (An extra op of the usual kind and size, which leaves no field to
disagree on, is found by its call sites instead: site_alignment.py.)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..keys import dense_ids
from ..textutil import ranges
from .mismatch import FIELDS, Mismatch, Shift


def settle_ties(mismatches: list[Mismatch], pos: pd.DataFrame, entries: pd.DataFrame) -> list[Shift]:
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


def _pending_where(entries: pd.DataFrame) -> dict[int, set[str]]:
    """Per rank, the groups of its ops not completed (few rows: the ops ranks are stuck in)."""
    open_ = entries.loc[~entries["state"].isin(("completed",)).to_numpy(), ["rank", "group"]].drop_duplicates()
    out: dict[int, set[str]] = {}
    for rank, group in zip(open_["rank"].tolist(), open_["group"].astype(str).tolist(), strict=True):
        out.setdefault(int(rank), set()).add(group)
    return out


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
