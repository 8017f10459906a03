"""Matching rules: size rules, coalesced units, ties, and every root cause of a random hang."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

import analyzers
from fixtures.builders import Job


def _report(job: Job, tmp: Path, **kw) -> dict:
    return analyzers.load(job.write(tmp, **kw)).report()


def test_size_rules_accept_correct_gathers_and_scatters(tmp_path):
    job = Job(3)
    job.collective("0", "all_gather_into_tensor", shape=(2, 5))
    job.collective("0", "reduce_scatter_tensor", shape=(7,))
    job.collective("0", "all_gather", shape=(4,), out_shapes=[[4], [4], [4]])
    job.collective("0", "all_to_all_single", ranks=[0], in_shapes=[[9]], out_shapes=[[3]])
    job.collective("0", "all_to_all_single", ranks=[1, 2], in_shapes=[[6]], out_shapes=[[6]])
    assert _report(job, tmp_path)["verdict"] == "healthy"


def test_reduce_scatter_size_rule(tmp_path):
    job = Job(2)
    job.collective("0", "reduce_scatter_tensor", shape=(4,), ranks=[0])
    job.collective("0", "reduce_scatter_tensor", shape=(4,), ranks=[1], in_shapes=[[6]])
    (m,) = _report(job, tmp_path)["mismatches"]
    assert m["field"] == "shapes" and m["tie"] and "group size 2" in " ".join(m["values"])


def test_coalesced_block_is_one_unit(tmp_path):
    job = Job(2)
    for r in (0, 1):
        unit = len(job.entries[r])
        job.entry(r, group="0", seq=1, op="all_reduce", unit=unit, in_shapes=[[4]], out_shapes=[[4]], reduce_op="SUM")
        job.entry(r, group="0", seq=1, op="all_reduce", unit=unit, in_shapes=[[8] if r else [4]], out_shapes=[[8] if r else [4]],
                  reduce_op="SUM")
    (m,) = _report(job, tmp_path)["mismatches"]
    assert (m["seq"], m["field"]) == (1, "shapes")
    assert set(m["values"]) == {"[[4]] -> [[4]] + [[4]] -> [[4]]", "[[4]] -> [[4]] + [[8]] -> [[8]]"}


def test_p2p_payload_mismatch(tmp_path):
    job = Job(2)
    job.send("0", 0, 1, shape=(4,))
    job.recv("0", 1, 0, shape=(5,))
    report = _report(job, tmp_path)
    (m,) = report["mismatches"]
    assert (m["kind"], m["src"], m["dst"], m["field"], m["ranks"]) == ("p2p", 0, 1, "shapes", [0, 1])


def test_comm_stuck_p2p_pair(tmp_path):
    job = Job(2)
    job.send("0", 0, 1, state="started")
    job.recv("0", 1, 0, state="started")
    report = _report(job, tmp_path)
    assert [(c["rank"], c["kind"], c["ranks"]) for c in report["root_causes"]] == [(0, "comm_stuck", [0, 1])]


def test_blocked_elsewhere_chains(tmp_path):
    """Rank 1 entered world seq 1 asynchronously and is blocked in group "1": both groups wait for rank 2
    (rank 1 waits in both at once, so it is rank 0's fellow waiter in world, not its culprit)."""
    job = Job(3)
    job.group("1", [1, 2], "tp")
    job.collective("1", "all_reduce", ranks=[1], state="started")
    job.collective("0", "all_reduce", ranks=[0, 1], state="started", is_async=True)
    job.stack(2, ["train.py:1 in main", "io.py:5 in read"])
    report = _report(job, tmp_path)
    assert {w["rank"]: w["reasons"] for w in report["waits"]} == {
        0: {"2": "not_entered"},
        1: {"2": "not_entered"},
    }
    assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(2, "not_entered")]


@settings(max_examples=25, deadline=None)
@given(world=st.integers(2, 6), data=st.data())
def test_every_absent_rank_is_a_root_cause(world, data):
    ranks = list(range(world))
    late = data.draw(st.sets(st.sampled_from(ranks), min_size=1, max_size=world - 1))
    dead = data.draw(st.sets(st.sampled_from(sorted(late))))
    job = Job(world)
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce", ranks=[r for r in ranks if r not in late], state="started")
    with tempfile.TemporaryDirectory() as tmp:
        report = _report(job, Path(tmp), skip=dead)
    expected = sorted((r, "missing_dump" if r in dead else "not_entered") for r in late)
    assert sorted((c["rank"], c["kind"]) for c in report["root_causes"]) == expected
    assert report["victims"] == sorted(set(ranks) - late)
    assert report["verdict"] == "hang"


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_mismatch_scan_by_codes_agrees_with_nunique(data):
    """The code scan (all fields at once, then field by field) finds exactly the positions pandas'
    nunique finds (and the fallback for keys that do not pack, seq near 2^62, finds the same)."""
    import numpy as np
    import pandas as pd

    from analyzers.diagnosis import matching

    n = data.draw(st.integers(1, 60))
    draw = lambda values: data.draw(st.lists(st.sampled_from(values), min_size=n, max_size=n))  # noqa: E731
    pos = pd.DataFrame({
        "rank": np.arange(n), "group": pd.Categorical(draw(["0", "1", "2"])), "seq": draw([1, 2, 3]),
        "op": pd.Categorical(draw(["all_reduce", "broadcast", "unknown"])),
        "shapes": pd.Categorical(draw(["[[4]]", "[[8]]", None])), "dtypes": pd.Categorical(draw(["float32"])),
        "reduce_op": pd.Categorical(draw(["SUM", ""])),
    })
    found = {(m.group, m.seq, m.field, tuple(m.ranks)) for m in matching._collective_mismatches(pos)}
    known = pos[pos["op"] != "unknown"]
    counts = known.groupby(["group", "seq"], observed=True)[list(matching.FIELDS)].nunique()
    expected = {(g, s, f) for (g, s), row in counts.iterrows() for f in matching.FIELDS
                if row[f] > 1 and (f == "op" or row["op"] <= 1)}
    assert {(g, s, f) for g, s, f, _ in found} == expected
    huge = pos.assign(seq=pos["seq"] * (1 << 61))
    assert {(g, s // (1 << 61), f, r) for g, s, f, r in
            ((m.group, m.seq, m.field, tuple(m.ranks)) for m in matching._collective_mismatches(huge))} == found


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_sorted_join_pairs_exactly_what_a_merge_pairs(data):
    """pair_transfers' sort-and-search join gives pandas' inner merge, pairs in the same order;
    it declines (the caller merges) when a key repeats on the searched side."""
    import numpy as np
    import pandas as pd

    from analyzers.diagnosis.transfers import _join_on_unique

    left = np.array(data.draw(st.lists(st.integers(0, 15), max_size=30)), dtype=np.int64)
    right = np.array(data.draw(st.lists(st.integers(0, 15), max_size=30, unique=data.draw(st.booleans()))), dtype=np.int64)
    got = _join_on_unique(left, right)
    if len(set(right.tolist())) < len(right):
        assert got is None
        return
    merged = pd.DataFrame({"k": left, "l": np.arange(len(left))}).merge(
        pd.DataFrame({"k": right, "r": np.arange(len(right))}), on="k")
    assert got is not None
    assert list(zip(got[0].tolist(), got[1].tolist(), strict=True)) == list(zip(merged["l"], merged["r"], strict=True))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_distinct_rows_by_flags_are_the_sorted_distinct_rows(data):
    """distinct_rows (a presence table over the packed key) gives pandas' sorted drop_duplicates,
    negative values included; None when the key space is over its limit."""
    import numpy as np
    import pandas as pd

    from analyzers import keys

    n = data.draw(st.integers(0, 40))
    a = np.array(data.draw(st.lists(st.integers(-3, 50), min_size=n, max_size=n)), dtype=np.int64)
    b = np.array(data.draw(st.lists(st.integers(-1, 9), min_size=n, max_size=n)), dtype=np.int16)
    got = keys.distinct_rows([a, b])
    expected = pd.DataFrame({"a": a, "b": b}).drop_duplicates().sort_values(["a", "b"])
    assert got is not None
    assert list(zip(got[0].tolist(), got[1].tolist(), strict=True)) == list(zip(expected["a"], expected["b"], strict=True))
    if n >= 2:  # a key space over the limit: declined (the caller hashes instead)
        wide = a.copy()
        wide[0] = keys.PRESENCE_LIMIT * 2
        assert keys.distinct_rows([wide, b]) is None
