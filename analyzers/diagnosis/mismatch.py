"""What the comparison of positions finds: a position where ranks disagree (`Mismatch`), and the extra
op that explains a position with no majority (`Shift`).

Why a module of their own: the majority vote (matching.py), the two alignments (alignment.py,
site_alignment.py) and the payload check (payloads.py) all make or settle these records, and the
root causes and the divergence read them; none of those should import another only for its types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..textutil import ranges

FIELDS = ("op", "shapes", "dtypes", "reduce_op")  # what a collective position compares, in report order


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


def code_text(cats: pd.Index, code: int) -> str:
    """A categorical code as a mismatch's `values` show it: its category, `nan` for a null (-1)."""
    return str(cats[code]) if code >= 0 else "nan"
