"""When a diverging rank's arrivals moved against its peers' (analyzers/timing/shifts.py), on lateness tables
built the way the straggler analysis builds them; the end-to-end case is the `skip_op` scenario."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzers.diagnosis.divergence import timing_line
from analyzers.timing.shifts import timing_shifts


def _lateness(lags_ms: list[float], rank: int = 3, members: int = 4, noise_ms: float = 0.3, seed: int = 0) -> pd.DataFrame:
    """Collectives 1..n of group "0": `rank` arrives lags_ms[i] after its peers (negative: before)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, lag in enumerate(lags_ms):
        arrive = {r: rng.normal(0.0, noise_ms) for r in range(members)}
        arrive[rank] += lag
        last = max(arrive.values())
        rows += [{"rank": r, "seq": i + 1, "instance": i, "late_ns": int((last - a) * 1e6)} for r, a in arrive.items()]
    out = pd.DataFrame(rows)
    out["channel"] = pd.Categorical(["0"] * len(out))
    return out


def _entries(n: int) -> pd.DataFrame:
    return pd.DataFrame({"rank": 3, "group": "0", "seq": np.arange(1, n + 1), "kind": "coll", "op": "all_reduce",
                         "site": "train.py:12 in step"})


def _shift(lags: list[float], **kw: object) -> dict | None:
    items = [{"rank": 3, "group": "0"}]
    timing_shifts(items, _lateness(lags, **kw), _entries(len(lags)))
    return items[0].get("timing_shift")


def test_an_alternating_shift_is_found_where_it_starts() -> None:
    """A skipped op on 20 ms steps: from there it is 20 ms late, then 20 ms early, by turns."""
    shift = _shift([0.0] * 5 + [20.0, -20.0] * 4)
    assert shift is not None and shift["seq"] == 6 and shift["op"] == "all_reduce", shift
    assert 18 < shift["departure_ms"] < 22 and shift["departed"] == shift["of"] == 8
    assert "its timing shifted at seq 6 (all_reduce at train.py:12)" in timing_line(shift, "at train.py:12")


def test_a_blip_just_before_the_shift_is_not_its_start() -> None:
    """A loaded host's 4 ms hiccup one collective before a 20 ms shift: the persistent departures that follow
    belong to the shift, not to the hiccup (CI once read seq 5 for the skip_op scenario's seq 6)."""
    shift = _shift([0.0] * 4 + [4.0] + [20.0, -20.0] * 4)
    assert shift is not None and shift["seq"] == 6, shift


def test_a_lasting_offset_is_found() -> None:
    shift = _shift([0.0] * 8 + [15.0] * 6)
    assert shift is not None and shift["seq"] == 9
    assert _shift([400.0] + [0.0] * 7 + [15.0] * 6)["seq"] == 9  # its first collective's start-up skew is no pace


def test_no_shift_where_timing_cannot_tell() -> None:
    assert _shift([0.0] * 12) is None  # noise only
    assert _shift([0.0] * 6 + [30.0] + [0.0] * 6) is None  # one late arrival is a hiccup, not a shift
    assert _shift([0.0] * 2 + [20.0, -20.0] * 2) is None  # too few collectives before it
    assert _shift([0.0] * 8 + [2.0, -2.0] * 3) is None  # within the jitter of a loaded host


def test_nothing_without_timing() -> None:
    items = [{"rank": 3, "group": "0"}]
    timing_shifts(items, pd.DataFrame(), _entries(3))
    assert "timing_shift" not in items[0]
