"""Slow ranks by what they cost the others: intermittent, periodic and several slow ranks are found,
shared random hiccups are not (issue 22). Synthetic one-all_reduce-per-step jobs with known truth."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from analyzers.timing.stragglers import find_slow

MS = 1_000_000
Extra = Callable[[int, int, np.random.Generator], float]  # (rank, step, rng) -> extra compute in ms


def steps_job(world: int, extra: Extra, steps: int = 100, step_ms: float = 10.0, seed: int = 0) -> pd.DataFrame:
    """Each step every rank computes `step_ms` (+ up to 0.2 ms jitter, + `extra`), then all-reduces;
    members leave the all-reduce up to 0.3 ms apart (a busy host)."""
    rng = np.random.default_rng(seed)
    free = np.zeros(world, dtype=np.int64)
    rows = []
    for seq in range(1, steps + 1):
        compute = step_ms + rng.uniform(0, 0.2, world) + np.array([extra(r, seq, rng) for r in range(world)])
        enqueue = free + (compute * MS).astype(np.int64)
        done = int(enqueue.max()) + MS // 10
        free = done + (rng.uniform(0, 0.3, world) * MS).astype(np.int64)
        rows += [{"rank": r, "group": "0", "seq": seq, "kind": "coll", "op": "all_reduce", "peer": -1,
                  "state": "completed", "is_async": False, "t_enqueue_ns": int(enqueue[r]), "t_complete_ns": int(free[r])}
                 for r in range(world)]
    return pd.DataFrame(rows)


def slow(entries: pd.DataFrame, world: int) -> list[dict]:
    return find_slow(entries, {"0": world}, {}).stragglers


@pytest.mark.parametrize("world", [4, 8])
def test_every_fourth_step_slow_is_found_with_its_period_and_cost(world: int) -> None:
    """30 ms late on every fourth 10 ms step: its median lateness is zero, its cost ~750 ms."""
    (s,) = slow(steps_job(world, lambda r, step, rng: 30.0 if r == 2 and step % 4 == 0 else 0.0), world)
    assert s["rank"] == 2 and (s["pattern"], s["period"]) == ("periodic", 4)
    assert 700 < s["cost_ms"] < 800 and s["cost_pct"] > 30 and 25 <= s["late_ms_when_late"] <= 31
    assert s["instances"][:3] == ["0:4", "0:8", "0:12"]
    assert list(s["cost_by_group_ms"]) == ["0"] and abs(s["cost_by_group_ms"]["0"] - s["cost_ms"]) < 0.01


def test_every_rank_that_cost_anything_is_in_costs_most_first() -> None:
    result = find_slow(steps_job(4, lambda r, step, rng: 3.0 if r == 1 else 0.0, seed=5), {"0": 4}, {})
    costs = result.costs
    assert costs[0]["rank"] == 1 and costs[0]["held_up"] > 80
    assert [c["cost_ms"] for c in costs] == sorted((c["cost_ms"] for c in costs), reverse=True)
    assert all(c["cost_ms"] > 0 for c in costs)


def test_randomly_intermittent_straggler_is_found_with_how_often() -> None:
    (s,) = slow(steps_job(4, lambda r, step, rng: 30.0 if r == 1 and rng.random() < 0.25 else 0.0, seed=1), 4)
    assert s["rank"] == 1 and s["pattern"] == "intermittent" and 0.15 < s["late_share"] < 0.35


@pytest.mark.parametrize("world", [4, 8])
def test_two_equally_slow_ranks_are_both_found(world: int) -> None:
    found = slow(steps_job(world, lambda r, step, rng: 3.0 if r in (1, 3) else 0.0, seed=2), world)
    assert sorted(s["rank"] for s in found) == [1, 3]
    assert all(s["cost_pct"] > 5 for s in found)


@pytest.mark.parametrize(("world", "p", "low", "high"), [(4, 0.05, 5, 30), (8, 0.05, 5, 30), (8, 0.02, 50, 200)])
def test_random_hiccups_on_every_rank_are_not_stragglers(world: int, p: float, low: float, high: float) -> None:
    """Shared noise: each rank stalls now and then at random. Thirty jobs per mix: none is slow."""
    def hiccup(r: int, step: int, rng: np.random.Generator) -> float:
        return rng.uniform(low, high) if rng.random() < p else 0.0
    named = {seed: slow(steps_job(world, hiccup, seed=seed), world) for seed in range(30)}
    assert {seed: found for seed, found in named.items() if found} == {}


def test_a_late_start_is_not_a_cost() -> None:
    """A rank that joins the first collective 200 ms late (start-up skew) holds nobody up by its work."""
    assert slow(steps_job(4, lambda r, step, rng: 200.0 if r == 3 and step == 1 else 0.0), 4) == []


def test_one_long_stall_is_a_one_off_not_a_straggler() -> None:
    assert slow(steps_job(4, lambda r, step, rng: 300.0 if r == 2 and step == 50 else 0.0), 4) == []


def test_async_ops_left_out_of_the_timing_are_said_to_be() -> None:
    entries = steps_job(4, lambda r, step, rng: 0.0, steps=30)
    entries.loc[entries["seq"] % 3 == 0, "is_async"] = True
    notes = find_slow(entries, {"0": 4}, {}).notes
    assert any(note.startswith("40 async ops are left out of the timing") for note in notes), notes
