"""Slow ranks and links from timing: robust to one-off hiccups, to clock shifts, and silent on healthy jobs."""

from __future__ import annotations

import pandas as pd

import analyzers
from analyzers.stragglers import find_slow, p2p_links
from fixtures.run import GOLDEN


def _windows(entries: pd.DataFrame, size: int) -> list[pd.DataFrame]:
    top = int(entries["seq"].max())
    return [entries[(entries["seq"] > lo) & (entries["seq"] <= lo + size)] for lo in range(0, top - size + 1, size)]


def test_real_straggler_comes_first_with_evidence() -> None:
    report = analyzers.load(str(GOLDEN / "straggler_20")).report()
    assert report["verdict"] == "slow" and report["root_causes"] == []
    first = report["stragglers"][0]
    assert first["rank"] == 1 and first["votes"] > first["collectives"] / 2 and first["late_ms_median"] > 2
    assert [s["rank"] for s in report["stragglers"]] == [1]


def test_healthy_run_split_into_windows_reports_no_straggler() -> None:
    analysis = analyzers.load(str(GOLDEN / "healthy_timed"))
    sizes = {"0": 4}
    windows = _windows(analysis.entries, 20)
    assert len(windows) >= 10
    for window in windows:
        assert find_slow(window, sizes, {}).stragglers == []


def test_straggler_is_found_in_every_window_of_a_slow_run() -> None:
    analysis = analyzers.load(str(GOLDEN / "straggler_20"))
    for window in _windows(analysis.entries, 20):
        assert [s["rank"] for s in find_slow(window, {"0": 4}, {}).stragglers] == [1]


def test_clock_shifts_change_offsets_not_stragglers() -> None:
    analysis = analyzers.load(str(GOLDEN / "straggler_20"))
    wall = {r: int(d.meta["wall_offset_ns"]) for r, d in analysis.dumps.items()}
    shifted = dict(wall)
    shifted[0] += 5_000_000_000  # rank 0's clock 5 s ahead
    shifted[3] -= 3_000_000_000  # rank 3's 3 s behind
    before, after = find_slow(analysis.entries, {"0": 4}, wall), find_slow(analysis.entries, {"0": 4}, shifted)
    assert before.stragglers == after.stragglers
    assert abs(after.clock_offsets_ms[0] - before.clock_offsets_ms[0] - 5000) < 1
    assert abs(after.clock_offsets_ms[3] - before.clock_offsets_ms[3] + 3000) < 1


def _synthetic(late_rank: int, late_ms: float, instances: range, world: int = 4) -> pd.DataFrame:
    rows = []
    for seq in range(1, 41):
        for r in range(world):
            start = seq * 100_000_000 + r * 100_000  # arrivals 0.1 ms apart: ordinary jitter
            if r == late_rank and seq in instances:
                start += int(late_ms * 1e6)
            rows.append({"rank": r, "group": "0", "seq": seq, "kind": "coll", "op": "all_reduce",
                         "state": "completed", "is_async": False, "t_enqueue_ns": start,
                         "t_complete_ns": seq * 100_000_000 + 50_000_000})
    return pd.DataFrame(rows)


def test_one_off_hiccup_is_not_a_straggler() -> None:
    assert find_slow(_synthetic(2, 40.0, range(7, 8)), {"0": 4}, {}).stragglers == []


def test_persistent_lateness_is() -> None:
    found = find_slow(_synthetic(2, 3.0, range(1, 41)), {"0": 4}, {}).stragglers
    assert [s["rank"] for s in found] == [2] and found[0]["votes"] == 40


def test_slow_link_matrix() -> None:
    rows = []
    for seq in range(1, 11):
        for src, dst, ms in ((0, 1, 1.0), (1, 2, 1.0), (2, 3, 8.0)):
            base = seq * 100_000_000
            rows.append({"rank": src, "group": "0", "seq": seq, "kind": "p2p", "op": "send", "peer": dst,
                         "state": "completed", "t_enqueue_ns": base, "t_complete_ns": base + int(ms * 1e6)})
            rows.append({"rank": dst, "group": "0", "seq": seq, "kind": "p2p", "op": "recv", "peer": src,
                         "state": "completed", "t_enqueue_ns": base, "t_complete_ns": base + int(ms * 1e6)})
    entries = pd.DataFrame(rows).assign(is_async=False)
    links = p2p_links(entries)
    assert len(links) == 3
    result = find_slow(entries, {"0": 4}, {})
    assert [(k["src"], k["dst"]) for k in result.slow_links] == [(2, 3)]
    assert result.link_matrix.loc[2, 3] == 8.0
