"""Slow ranks and links from timing: robust to one-off hiccups, to clock shifts, and silent on healthy jobs."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

import analyzers
from analyzers.timing.straggler_links import p2p_links
from analyzers.timing.straggler_scoring import rank_scores
from analyzers.timing.stragglers import find_slow
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


def test_a_few_ops_are_too_few_to_name_a_straggler() -> None:
    """Late in 3 of 5 ops happens by chance on a loaded host (a healthy CI job did it); the same
    share over 20 ops does not."""
    few = _synthetic(2, 3.0, range(1, 4))
    result = find_slow(few[few["seq"] <= 5], {"0": 4}, {})
    assert result.stragglers == [] and any("too few" in n for n in result.notes)
    many = _synthetic(2, 3.0, range(1, 13))
    assert [s["rank"] for s in find_slow(many[many["seq"] <= 20], {"0": 4}, {}).stragglers] == [2]


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


def _pipeline(slow_stage: int | None, stages: int = 4, micro: int = 4, steps: int = 12,
              compute_ms: float = 4.0, slow_pct: float = 30.0, overhead_ms: float = 0.0) -> pd.DataFrame:
    """A simulated pipeline (blocking send/recv, forward then backward, a global all_reduce per step).

    Each stage runs on its own clock (offset by seconds), computes, and waits for its peers exactly
    as blocking transfers make it: a simple discrete-event model of the real scenario. With
    `overhead_ms`, every op starts up to that much after the previous one ended (a loaded host).
    """
    ms = 1_000_000
    clock_skew = {r: r * 3_000 * ms for r in range(stages)}
    now = [0] * stages  # true time each stage is free
    rows: list[dict[str, object]] = []
    seqs: dict[tuple[int, int], int] = {}
    rng = np.random.default_rng(7)

    def cost(r: int) -> int:
        return int(compute_ms * ms * (1 + slow_pct / 100 if r == slow_stage else 1))

    def overhead() -> int:
        return int(rng.uniform(0, overhead_ms) * ms)

    def transfer(src: int, dst: int) -> None:
        seq = seqs[(src, dst)] = seqs.get((src, dst), 0) + 1
        now[src] += overhead()
        now[dst] += overhead()
        done = max(now[src], now[dst]) + ms // 10
        for rank, op, peer in ((src, "send", dst), (dst, "recv", src)):
            rows.append({"rank": rank, "group": "0", "seq": seq, "kind": "p2p", "op": op, "peer": peer,
                         "t_enqueue_ns": now[rank] + clock_skew[rank], "t_complete_ns": done + clock_skew[rank]})
            now[rank] = done

    coll = 0
    for _ in range(steps):
        for direction in (1, -1):  # forward, then backward
            order = range(stages) if direction == 1 else range(stages - 1, -1, -1)
            for _ in range(micro):
                for r in order:
                    now[r] += cost(r)
                    nxt = r + direction
                    if 0 <= nxt < stages:
                        transfer(r, nxt)
        coll += 1
        now = [t + overhead() for t in now]
        done = max(now) + ms // 10
        for r in range(stages):
            rows.append({"rank": r, "group": "0", "seq": coll, "kind": "coll", "op": "all_reduce", "peer": -1,
                         "t_enqueue_ns": now[r] + clock_skew[r], "t_complete_ns": done + clock_skew[r]})
            now[r] = done
    return pd.DataFrame(rows).assign(state="completed", is_async=False)


def test_slow_pipeline_stage_is_named_not_the_stages_it_holds_up() -> None:
    found = find_slow(_pipeline(slow_stage=2), {"0": 4}, {}).stragglers
    assert [s["rank"] for s in found] == [2], found
    assert any(c.startswith("0 send to") for c in found[0]["channels"])
    assert 0.8 < found[0]["late_ms_median"] < 1.6  # 30% of 4 ms of compute


def test_balanced_pipeline_has_no_straggler() -> None:
    assert find_slow(_pipeline(slow_stage=None), {"0": 4}, {}).stragglers == []


def test_scheduling_overhead_between_ops_is_not_compute() -> None:
    """0.1-0.4 ms between a send and the next op (a loaded host) must not count as a compute gap:
    as an instance's shortest gap it would make stage 0 look slow on the global all_reduce."""
    for slow_stage in (2, None):
        found = find_slow(_pipeline(slow_stage=slow_stage, overhead_ms=0.4), {"0": 4}, {}).stragglers
        assert [s["rank"] for s in found] == ([] if slow_stage is None else [slow_stage]), found


def _noisy_exits(slow_rank: int, steps: int = 60, world: int = 4, step_ms: float = 20.0,
                 extra_ms: float = 1.0, exit_skew_ms: float = 3.0) -> pd.DataFrame:
    """One all_reduce per step; members leave each one up to `exit_skew_ms` apart (a busy host),
    so who arrives last at the next one is mostly chance, while `slow_rank` computes longer."""
    ms = 1_000_000
    rng = np.random.default_rng(3)
    free = np.zeros(world, dtype=np.int64)
    rows = []
    for seq in range(1, steps + 1):
        enqueue = free + int(step_ms * ms) + np.where(np.arange(world) == slow_rank, int(extra_ms * ms), 0)
        done = int(enqueue.max()) + ms // 10
        free = done + (rng.uniform(0, exit_skew_ms, world) * ms).astype(np.int64)
        for r in range(world):
            rows.append({"rank": r, "group": "0", "seq": seq, "kind": "coll", "op": "all_reduce",
                         "state": "completed", "is_async": False, "t_enqueue_ns": int(enqueue[r]),
                         "t_complete_ns": int(free[r])})
    return pd.DataFrame(rows)


def test_straggler_is_found_when_exit_skew_reshuffles_arrivals() -> None:
    entries = _noisy_exits(slow_rank=3)
    result = find_slow(entries, {"0": 4}, {})
    late = result.lateness
    assert late[late["rank"] == 3]["last"].mean() < 0.6  # arriving last alone would not tell
    assert [s["rank"] for s in result.stragglers] == [3], result.stragglers
    assert 0.5 <= result.stragglers[0]["late_ms_median"] <= 1.0
    assert find_slow(_noisy_exits(slow_rank=-1), {"0": 4}, {}).stragglers == []


def _tp_dp(slow: set[int], steps: int = 30) -> tuple[pd.DataFrame, dict[str, list[int]]]:
    """16 ranks: TP groups tp{t} = 4 consecutive ranks, DP groups dp{i} = {i, i+4, i+8, i+12};
    ranks in `slow` compute 3 ms more per phase."""
    members = {f"tp{t}": list(range(4 * t, 4 * t + 4)) for t in range(4)} | {f"dp{i}": [i + 4 * k for k in range(4)]
                                                                           for i in range(4)}
    rows, now, seqs = [], dict.fromkeys(range(16), 0), dict.fromkeys(members, 0)
    for _ in range(steps):
        for kind in ("tp", "dp"):
            for r in range(16):
                now[r] += 10_000_000 + (3_000_000 if r in slow else 0) + r * 10_000
            for name, ranks in members.items():
                if not name.startswith(kind):
                    continue
                seqs[name] += 1
                done = max(now[r] for r in ranks) + 100_000
                for r in ranks:
                    rows.append({"rank": r, "group": name, "seq": seqs[name], "kind": "coll", "op": "all_reduce",
                                 "peer": -1, "t_enqueue_ns": now[r], "t_complete_ns": done})
                    now[r] = done
    return pd.DataFrame(rows).assign(state="completed", is_async=False), members


def test_a_whole_slow_tp_group_is_named_as_the_scope() -> None:
    entries, members = _tp_dp(slow={4, 5, 6, 7})
    found = find_slow(entries, {g: len(r) for g, r in members.items()}, {}, members).stragglers
    assert sorted(s["rank"] for s in found) == [4, 5, 6, 7]
    assert {s["scope"] for s in found} == {"group tp1"}


def test_one_slow_rank_in_a_tp_group_is_named_alone() -> None:
    entries, members = _tp_dp(slow={6})
    found = find_slow(entries, {g: len(r) for g, r in members.items()}, {}, members).stragglers
    assert [(s["rank"], s["scope"]) for s in found] == [(6, "rank")]


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_scattered_reductions_equal_pandas_transforms(data) -> None:  # noqa: ANN001
    import numpy as np
    import pandas as pd

    from analyzers.timing.arrays import _per_id

    n = data.draw(st.integers(1, 50))
    ids = np.asarray(data.draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)), dtype=np.int64)
    ints = np.asarray(data.draw(st.lists(st.integers(-10**12, 10**12), min_size=n, max_size=n)), dtype=np.int64)
    floats = np.asarray(data.draw(st.lists(st.one_of(st.just(float("nan")), st.floats(-1e9, 1e9)), min_size=n, max_size=n)))
    by = pd.Series(ints).groupby(ids)
    assert (_per_id(np.maximum, ids, ints) == by.transform("max").to_numpy()).all()
    assert (_per_id(np.minimum, ids, ints) == by.transform("min").to_numpy()).all()
    np.testing.assert_array_equal(_per_id(np.fmin, ids, floats), pd.Series(floats).groupby(ids).transform("min").to_numpy())


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_compute_gaps_equal_the_per_rank_group_by(data) -> None:  # noqa: ANN001
    """The segmented numpy passes of `_blocking_ops` give the per-rank cummax / forward-fill of pandas,
    whether the rows are taken in one slice or in slices of a few ranks."""
    import numpy as np

    from analyzers.reading.sample import MIN_COMPUTE_NS
    from analyzers.timing import blocking_ops
    from analyzers.timing.blocking_ops import _blocking_ops

    n = data.draw(st.integers(1, 40))
    ranks = sorted(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    enq = np.cumsum(data.draw(st.lists(st.integers(0, 300_000), min_size=n, max_size=n)))
    dur = np.asarray(data.draw(st.lists(st.integers(0, 400_000), min_size=n, max_size=n)))
    entries = pd.DataFrame({
        "rank": ranks, "group": pd.Categorical(["0"] * n), "seq": np.arange(1, n + 1), "kind": pd.Categorical(["coll"] * n),
        "op": pd.Categorical(["all_reduce"] * n), "peer": -1, "state": pd.Categorical(["completed"] * n),
        "is_async": False, "t_enqueue_ns": pd.array(enq, dtype="Int64"), "t_complete_ns": pd.array(enq + dur, dtype="Int64"),
    })
    whole = blocking_ops.SLICE_ROWS
    blocking_ops.SLICE_ROWS = data.draw(st.sampled_from([whole, 1, 5]))
    try:
        ops = _blocking_ops(entries)
    finally:
        blocking_ops.SLICE_ROWS = whole
    busy = ops.groupby("rank", sort=False)["t_complete_ns"].cummax().to_numpy().astype("float64")
    before = np.concatenate([[np.nan], busy[:-1]])
    before[np.flatnonzero(np.diff(ops["rank"].to_numpy())) + 1] = np.nan
    gap = pd.Series(ops["t_enqueue_ns"].to_numpy() - before)
    expected = gap.where(gap >= MIN_COMPUTE_NS).groupby(ops["rank"].to_numpy(), sort=False).ffill().fillna(gap).to_numpy()
    np.testing.assert_array_equal(ops["gap_ns"].to_numpy(), expected)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_median_with_implied_zeros_equals_the_group_by_median(data) -> None:  # noqa: ANN001
    """rank_scores takes each channel's median from its voting rows only, the others being zeros."""
    import numpy as np

    from analyzers.timing.straggler_scoring import _median_with_zeros

    keys = data.draw(st.integers(1, 6))
    n = np.asarray(data.draw(st.lists(st.integers(1, 9), min_size=keys, max_size=keys)))
    key, values, full_key, full = [], [], [], []
    for k in range(keys):
        voting = data.draw(st.lists(st.integers(1, 10**6), max_size=int(n[k])))
        key += [k] * len(voting)
        values += voting
        full_key += [k] * int(n[k])
        full += voting + [0] * (int(n[k]) - len(voting))
    got = _median_with_zeros(np.asarray(key, dtype=np.int64), np.asarray(values, dtype="float64"), n)
    expected = pd.Series(full, dtype="float64").groupby(full_key).median().to_numpy()
    np.testing.assert_allclose(got, expected)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_ids_within_ranks_equal_the_one_hash_numbering(data) -> None:  # noqa: ANN001
    """Numbering (rank, channel) a slice of ranks at a time gives the ids one hash over all rows gives."""
    import numpy as np

    from analyzers.keys import group_ids, ids_within_ranks

    n = data.draw(st.integers(1, 60))
    rank = np.asarray(data.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)))
    if data.draw(st.booleans()):  # the usual case, sorted by rank; unsorted rows take the one-hash path
        rank = np.sort(rank)
    other = np.asarray(data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)))
    pieces, sort = data.draw(st.integers(1, 20)), data.draw(st.booleans())
    np.testing.assert_array_equal(ids_within_ranks(rank, other, sort, pieces), group_ids([rank, other], sort))


def test_a_qualifying_channel_stands_for_the_rank_over_a_worse_one_short_of_votes() -> None:
    """Rank 2 is 1 ms late in 14 of 20 ops on one channel and 2 ms late in 11 of 20 on another:
    the first qualifies (70% of votes), the second does not (55%); the rank is judged by the first."""
    rows = []
    for instance in range(40):
        channel, votes, own = ("a", 14, 1e6) if instance < 20 else ("b", 11, 2e6)
        for rank in range(4):
            vote = rank == 2 and instance % 20 < votes
            rows.append({"rank": rank, "channel": channel, "instance": instance, "last": vote,
                         "late_ns": own if vote else 0.0, "own_late_ns": own if vote else 0.0})
    lateness = pd.DataFrame(rows).astype({"channel": "category"})
    per = rank_scores(lateness)
    assert per.loc[2, "channel"] == "a" and per.loc[2, "late_ms_median"] == 1.0
    assert per.loc[2, "vote_share"] == 0.7 and per.loc[2, "channels"] == ["a"]
    assert per.loc[2, "score"] >= 3.5


def test_channels_number_like_a_full_group_by() -> None:
    """_channels hashes only the transfers' rows; it must number every row exactly as a group-by
    over (group, direction, peer) of all rows does, in order of first appearance."""
    from analyzers.keys import first_rows, group_ids
    from analyzers.timing.lateness import _channels

    rng = np.random.default_rng(7)
    for n in (0, 1, 50, 2000):
        group_code = rng.integers(0, 6, n)
        is_p2p = rng.random(n) < 0.3
        direction = np.where(is_p2p, rng.integers(1, 3, n), 0).astype(np.int8)
        peer = np.where(is_p2p, rng.integers(0, 5, n), -1)
        channel, first = _channels(group_code, direction, peer, np.flatnonzero(is_p2p), 6)
        expected = group_ids([group_code, direction, peer]) if n else np.zeros(0, dtype=np.int64)
        assert channel.tolist() == expected.tolist()
        assert first.tolist() == (first_rows(expected).tolist() if n else [])


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_packed_order_is_lexsorts(data):
    """_order_by packs whole-nanosecond values with their key into one argsort: the same order as
    lexsort, and lexsort itself for fractions, infinities or values too large to pack."""
    from analyzers.timing.straggler_scoring import _order_by

    n = data.draw(st.integers(0, 40))
    key = np.array(data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)), dtype=np.int64)
    pool = st.sampled_from([0.0, 1.0, 3.0, 2.5, 1e15, 7e18, np.inf]) if data.draw(st.booleans()) else st.integers(0, 9).map(float)
    values = np.array(data.draw(st.lists(pool, min_size=n, max_size=n)), dtype=np.float64)
    assert _order_by(key, values).tolist() == np.lexsort((values, key)).tolist()


def test_slices_of_ranks_give_the_whole_pass(monkeypatch) -> None:  # noqa: ANN001
    """`_blocking_ops` reads the entries a slice of whole ranks at a time: the timing result is the one
    reading them at once gives, however the ranks are cut."""
    from analyzers.timing import blocking_ops

    a = analyzers.load(GOLDEN / "straggler_20")
    whole = a.slow
    monkeypatch.setattr(blocking_ops, "SLICE_ROWS", 7)
    assert len(blocking_ops._rank_slices(a.entries["rank"].to_numpy())) == a.entries["rank"].nunique() > 1
    sliced = analyzers.load(GOLDEN / "straggler_20").slow
    pd.testing.assert_frame_equal(whole.lateness, sliced.lateness)
    assert whole.stragglers == sliced.stragglers and whole.stragglers
