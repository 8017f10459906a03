"""When a diverging rank's timing first shifted against its peers', where timing can tell.

Why: a rank that skipped one collective is named per call site by its op counts (diagnosis/divergence.py),
and the position where its stream went another way is found when its ops' names or call sites tell.
Where every op looks alike (DDP's bucket all-reduces, issued from C++) positions cannot tell; timing
sometimes can: from the op it skipped on, its ops pair with its peers' next ones, so the compute
between two of their calls lands inside the collective, and its arrival against theirs moves.

Its arrival against theirs, per collective of the group, comes from the per-member lateness the
straggler analysis computes (timing/lateness.py `collective_lateness`: the longest wait minus the
member's own, each on its own clock, so no clock skew enters): `lag` = the peers' median lateness minus
its own (positive: it arrived after most of them). The shift is the first collective whose lag departs
from the median lag of every collective before it by more than `MIN_SHIFT_MS` and five times their
spread (median absolute deviation), with at least half of the collectives from there on departing as
well, and by at least half as much as they do (`SAME_SIZE`): one late arrival is noise, a rank whose
arrivals moved for good has changed what it pairs with, and a hiccup just before the shift, lifted by
the departures after it, is not where it began.
A rank's first collective of the group is left out (start-up skew). Fewer than `MIN_SIDE` collectives on
either side of the first persistent departure, or none: timing cannot tell, and nothing is reported.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

MIN_SHIFT_MS = 3.0  # the jitter of an estimated end on a loaded host reaches ~2 ms (stragglers.ESTIMATED_MIN_LATE_MS)
NOISE_FACTOR = 5.0  # ... and this many times the spread of the lags before it
MIN_SIDE = 3  # collectives needed before and from the shift
PERSISTENT_SHARE = 0.5  # share of the collectives from the shift on that depart as well
SAME_SIZE = 0.5  # the shift's first departure is at least this share of the median departure from it on
MAX_POINTS = 2048  # the newest collectives looked at per rank and group (the test is quadratic in them)
MAX_PAIRS = 20  # (rank, group) pairs looked at per report


def timing_shifts(items: list[dict[str, Any]], lateness: pd.DataFrame, entries: pd.DataFrame) -> None:
    """Add `timing_shift` to each divergence item whose (rank, group) lag series shifted (module docstring)."""
    if not items or lateness.empty:
        return
    found: dict[tuple[int, str], dict[str, Any] | None] = {}
    for item in items:
        key = (int(item["rank"]), str(item["group"]))
        if key not in found and len(found) < MAX_PAIRS:
            lags = _lags(lateness, *key)
            found[key] = _shift(lags, entries, *key) if lags is not None else None
        if found.get(key):
            item["timing_shift"] = found[key]


def _lags(lateness: pd.DataFrame, rank: int, group: str) -> pd.Series | None:
    """seq -> the rank's lag (ms) in each complete collective of `group` it took part in."""
    channel = lateness["channel"]
    if group not in channel.cat.categories:  # a collective's channel is its group's name
        return None
    rows = lateness[(channel.cat.codes == channel.cat.categories.get_loc(group)).to_numpy()]
    if rows.empty:
        return None
    mine = rows[(rows["rank"] == rank).to_numpy()]
    if len(mine) < 2 * MIN_SIDE:
        return None
    peers = rows[(rows["rank"] != rank).to_numpy()].groupby("instance", observed=True)["late_ns"].median()
    theirs = peers.reindex(mine["instance"].to_numpy()).to_numpy()
    lag = pd.Series((theirs - mine["late_ns"].to_numpy()) / 1e6, index=mine["seq"].to_numpy()).dropna()
    return lag.sort_index().iloc[1:].iloc[-MAX_POINTS:]  # its first: start-up skew, not a pace


def _shift(lags: pd.Series, entries: pd.DataFrame, rank: int, group: str) -> dict[str, Any] | None:
    """The first persistent departure of `lags` from the collectives before it, with its op."""
    lag = lags.to_numpy(dtype=float)
    n = len(lag)
    if n < 2 * MIN_SIDE:
        return None
    base = pd.Series(lag).expanding().median().shift(1).to_numpy()  # over the collectives before each one
    idx = np.arange(n)
    candidates = idx[(idx >= 1) & (np.abs(lag - base) > MIN_SHIFT_MS)]
    for i in candidates:  # the first departure that persists: few are tried in any real series
        limit = max(MIN_SHIFT_MS, NOISE_FACTOR * float(np.median(np.abs(lag[:i] - base[i]))))
        after = np.abs(lag[i:] - base[i]) > limit
        if not after[0] or after.mean() < PERSISTENT_SHARE:
            continue
        moved = lag[i:][after] - base[i]
        if abs(moved[0]) < SAME_SIZE * float(np.median(np.abs(moved))):
            continue  # a hiccup lifted by the shift after it
        if i < MIN_SIDE or n - i < MIN_SIDE:
            return None  # too close to either end to tell a shift from where the series starts or stops
        seq = int(lags.index[i])
        shift: dict[str, Any] = {"seq": seq, "before_ms": round(float(base[i]), 3),
                                 "departure_ms": round(float(np.median(np.abs(moved))), 3),
                                 "departed": int(after.sum()), "of": int(len(after))}
        shift.update(_op_at(entries, rank, group, seq))
        return shift
    return None


def _op_at(entries: pd.DataFrame, rank: int, group: str, seq: int) -> dict[str, Any]:
    """The rank's own op at `seq` of `group`: its name and call site."""
    at = entries[(entries["rank"] == rank).to_numpy() & (entries["seq"] == seq).to_numpy()]
    at = at[(at["group"].astype(str) == group).to_numpy() & (at["kind"] == "coll").to_numpy()]
    if at.empty:
        return {}
    site = at["site"].iloc[0]
    return {"op": str(at["op"].iloc[0]), "site": str(site) if isinstance(site, str) and site else None}

