"""Live straggler scoring (flightrec/watch/pace.py) on simulated ranks fed through the same `Pace` the
watchdog keeps; the end-to-end case is tests/scenarios/test_live.py."""

from __future__ import annotations

import random
import statistics
from types import SimpleNamespace

from flightrec.watch import pace

STEP_NS = 100_000_000  # a collective every 100 ms


def _job(n_ops: int, delay_ms: dict[int, float] | None = None, onset: int = 0, ranks: int = 4,
         jitter_ms: float = 2.0, seed: int = 0, every: int = 1) -> dict[int, dict]:
    """Each rank's published record after `n_ops` all_reduces of group "0": rank r arrives delay_ms[r] late
    at every `every`-th collective from `onset` on, everybody with random jitter."""
    rng = random.Random(seed)
    delay_ms = delay_ms or {}
    paces = {r: pace.Pace() for r in range(ranks)}
    for k in range(1, n_ops + 1):
        arrive = {r: k * STEP_NS + int(rng.uniform(0, jitter_ms) * 1e6) for r in range(ranks)}
        for r, d in delay_ms.items():
            if k >= onset and (k - onset) % every == 0:
                arrive[r] += int(d * 1e6)
        done = max(arrive.values()) + 1_000_000
        for r in range(ranks):
            e = SimpleNamespace(kind="coll", group="0", seq=k, state="completed", source="python", is_async=False,
                                device="cpu", t_enqueue_ns=arrive[r], t_complete_ns=done, t_dev_start_ns=None,
                                t_dev_end_ns=None)
            paces[r].update([e])
    return {r: {**p.record(r), "host": f"node{r // 2}"} for r, p in paces.items()}


def test_a_persistent_straggler_is_named_with_its_cost_and_pattern() -> None:
    found = pace.score(_job(600, {2: 30.0}, onset=300), window_s=60, share=0.05)
    assert [(s.rank, s.group, s.pattern) for s in found] == [(2, "0", "persistent")], found
    (s,) = found
    assert 8.0 < s.cost_s < 9.5 and s.host == "node1"  # 300 collectives x 30 ms in the window
    assert "rank 2 (node1) held group 0 back" in s.line() and "persistent" in s.line()


def test_a_periodic_straggler() -> None:
    (s,) = pace.score(_job(600, {1: 200.0}, onset=8, every=32), window_s=60, share=0.02)
    assert s.rank == 1 and s.pattern == "periodic", s


def test_healthy_jobs_are_quiet() -> None:
    for seed in range(50):
        assert pace.score(_job(600, jitter_ms=20.0, seed=seed), window_s=60, share=0.05) == [], seed
    # a slow host with compute between collectives: everyone's arrivals jitter a lot, nobody is last for good
    assert pace.score(_job(600, jitter_ms=80.0, seed=7), window_s=60, share=0.05) == []


def test_below_the_share_is_quiet() -> None:
    assert pace.score(_job(600, {2: 3.0}), window_s=60, share=0.05) == []  # 3% of the time


def test_lines_repeat_only_when_they_change() -> None:
    alerts = pace.AlertLog()
    first = pace.Straggle(2, "node1", "0", 6.0, 60.0, "persistent", 480)
    assert len(alerts.news([first])) == 1
    assert alerts.news([pace.Straggle(2, "node1", "0", 6.5, 60.0, "persistent", 480)]) == []  # same band
    assert len(alerts.news([pace.Straggle(2, "node1", "0", 13.0, 60.0, "persistent", 480)])) == 1  # doubled
    assert alerts.news([]) == []
    assert alerts.news([]) == ["straggler: rank 2 no longer holds group 0 back"]


def test_an_op_in_flight_stops_its_group_until_it_completes() -> None:
    p = pace.Pace()
    ops = [SimpleNamespace(kind="coll", group="0", seq=k, state="completed", source="python", is_async=False,
                           device="cpu", t_enqueue_ns=k * 10, t_complete_ns=k * 10 + 5, t_dev_start_ns=None,
                           t_dev_end_ns=None) for k in range(1, 20)]
    ops[9].state = "started"
    p.update(ops)
    assert p.groups["0"].next_seq == 10 and p.groups["0"].counted == 9
    ops[9].state = "completed"
    p.update(ops)
    assert p.groups["0"].next_seq == 20 and p.groups["0"].counted == 19
    assert [g[0] for g in p.groups["0"].grid] == [8, 16]


def test_ops_the_ring_dropped_start_the_grid_again() -> None:
    p = pace.Pace()
    ops = [SimpleNamespace(kind="coll", group="0", seq=k, state="completed", source="python", is_async=False,
                           device="cpu", t_enqueue_ns=k * 10, t_complete_ns=k * 10 + 5, t_dev_start_ns=None,
                           t_dev_end_ns=None) for k in range(1, 60)]
    p.update(ops[:20])
    assert [g[0] for g in p.groups["0"].grid] == [8, 16]
    p.update(ops[40:])  # 21..40 left the ring before this round
    assert [g[0] for g in p.groups["0"].grid] == [48, 56] and p.groups["0"].next_seq == 60


def test_unmeasured_ops_count_toward_progress_not_wait() -> None:
    e = SimpleNamespace(kind="coll", group="0", seq=1, state="completed", source="c++", is_async=False, device="cpu",
                        t_enqueue_ns=0, t_complete_ns=50, t_dev_start_ns=None, t_dev_end_ns=None)
    assert pace.measured_wait_ns(e) is None
    e.t_dev_start_ns, e.t_dev_end_ns = 10, 40  # device events measure it
    assert pace.measured_wait_ns(e) == 30


def test_metrics_file_is_prometheus_text() -> None:
    records = _job(100, {2: 30.0})
    text = pace.metrics_text(records, [pace.Straggle(2, "node1", "0", 3.0, 10.0, "persistent", 96)], now=records[0]["time"])
    assert 'flightrec_cost_to_others_seconds{rank="2",host="node1"} 3.000' in text
    assert 'flightrec_ops_completed_total{rank="0",host="node0"} 100' in text
    assert text.count("# TYPE") == 4 and text.endswith("\n")


def test_the_others_median_is_each_values_peers_median() -> None:
    rng = random.Random(3)
    for n in (2, 3, 4, 5, 8, 9):
        for _ in range(100):
            values = [rng.choice([1.0, 2.0, 3.0, rng.random()]) for _ in range(n)]
            expected = [statistics.median(values[:i] + values[i + 1:]) for i in range(n)]
            assert pace._others_medians(values) == expected, values


def test_a_straggler_among_a_thousand_ranks() -> None:
    records = _job(400, {700: 30.0}, onset=100, ranks=1024, jitter_ms=5.0)
    assert [(s.rank, s.pattern) for s in pace.score(records, window_s=60, share=0.05)] == [(700, "persistent")]


def test_the_watch_screen_says_who_holds_the_group_and_who_stopped_answering() -> None:
    from flightrec.cli import live_view

    records = _job(600, {2: 30.0}, onset=300)
    now = max(r["time"] for r in records.values())
    for rank, rec in records.items():
        rec.update(time=now, world=5, every_s=10.0)
        if rank != 2:
            rec["groups"]["0"]["in"] = [601, 30.0 + rank]
    records[3]["time"] = now - 45
    text = live_view.screen(records, 60, 0.05, now=now)
    assert "3 of 5 ranks answering" in text
    assert "ranks 0-1, 3 wait in seq 601 for 33.0 s; rank 2 is not in it (done up to seq 600): it holds the group" in text
    assert "rank 2 (node1) held group 0 back" in text and "persistent" in text
    assert "rank 3 (node1) stopped answering: its last pace is 45 s old" in text
    assert "rank(s) 4 never published" in text
