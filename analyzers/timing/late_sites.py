"""Where in the user's code a slow rank held the others up: the call sites of the collectives it was late to.

Why: "rank 1 cost the others 233 ms" says whom to look at, not where. The collectives a slow rank
arrives late to follow the code that made it late (its forward, a data loader, a logging call), so
their call site is the line to start from. Ops issued from C++ (DDP's Reducer) have no Python call
site: they are named by op, and said to be issued from C++.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

SITES_SHOWN = 2  # call sites per slow rank, most held-up ops first


def late_at(stragglers: list[dict[str, Any]], entries: pd.DataFrame) -> dict[int, list[dict[str, Any]]]:
    """Slow rank -> [{op, site, count}]: the call sites of the collectives it held up (its `instances`,
    `group:seq`), most first; `site` null for ops issued from C++."""
    out: dict[int, list[dict[str, Any]]] = {}
    if not stragglers or entries.empty or "site" not in entries.columns:
        return out
    coll = entries.loc[entries["kind"].astype(str).to_numpy() == "coll", ["rank", "group", "seq", "op", "site"]]
    for s in stragglers:
        wanted = [tuple(str(i).rsplit(":", 1)) for i in s.get("instances") or []]
        if not wanted:
            continue
        mine = coll.loc[coll["rank"].to_numpy() == s["rank"]]
        keys = pd.MultiIndex.from_arrays([mine["group"].astype(str), mine["seq"].astype(str)])
        held = mine.loc[keys.isin(pd.MultiIndex.from_tuples(wanted)).astype(bool)]
        if held.empty:
            continue
        counts = (held.assign(op=held["op"].astype(str), site=held["site"].astype(object))
                  .groupby(["op", "site"], dropna=False, sort=False).size().sort_values(ascending=False, kind="stable"))
        out[int(s["rank"])] = [{"op": op, "site": None if _missing(site) else str(site), "count": int(n)}
                               for (op, site), n in counts.head(SITES_SHOWN).items()]
    return out


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))
