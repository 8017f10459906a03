"""One row per (rank, group, seq) collective unit, with a comparable signature for each field.

Why vectorised: a job of thousands of ranks dumps millions of entries. Each entry's signatures (op,
shapes under the all_gather / reduce_scatter size rules, dtypes, reduce op) are computed once per
*distinct* combination and spread back by code. Coalesced/batched blocks that share a sequence number
on a rank become one unit, their fields joined op by op in record order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..keys import dense_ids, first_rows, pack_keys
from .mismatch import FIELDS
from .signatures import signature

_SIG_COLUMNS = ["group", "op", "in_shapes", "out_shapes", "in_dtypes", "out_dtypes"]


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
        shape_sig[i], dtype_sig[i] = signature(str(row.op), row.in_shapes, row.out_shapes, row.in_dtypes, row.out_dtypes, size)
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
    """A coalesced unit's state: its least advanced op's (the unit completes only as a whole)."""
    values = set(states)
    for s in ("failed", "started", "enqueued", "unknown"):
        if s in values:
            return s
    return "completed"
