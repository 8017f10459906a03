"""Property test against the ground-truth simulator (fixtures/sim.py, issue 21).

Why: each seed is a random job with a random fault that the model ran to a standstill; the model
knows the true verdict and culprits. Per fault kind, every seed's report must give that verdict (or
the decided one where the model says `inconclusive`), name every true culprit and never an innocent
rank. Kinds the analyzer does not get right yet are strict xfails (they fail loudly once fixed, so
the mark must then go); the rest are hard assertions.

`FLIGHTREC_SIM_SEEDS=20000 pytest tests/analyzer/test_sim.py` runs more seeds (default: 720 for the
flightrec format, 30% as many for PyTorch's); `python -m fixtures.sim --seeds 2000 --table` prints the
per-kind table. Each known-wrong kind also always runs the seeds named for it (so its strict xfail does
not depend on the seed count).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from fixtures import sim

SEEDS = int(os.environ.get(sim.SEED_ENV, "720"))
TORCH_SEEDS = max(len(sim.FAULT_KINDS), SEEDS * 3 // 10)

# Known analyzer defects (issue 21): (format, kind) -> (why, seeds where it shows). Remove an entry once fixed.
KNOWN_WRONG: dict[tuple[str, str], tuple[str, tuple[int, ...]]] = {
}


# Seeds that once showed a defect, fixed since: always run, so the fix stays.
FIXED: dict[tuple[str, str], tuple[int, ...]] = {
    ("flightrec", "early_exit"): (741,),  # an async op in an exit record made its peers comm_stuck
    ("flightrec", "slow_rank"): (1511,),  # a slow first stage late on one of its two sends a step: 50% of the votes
    ("flightrec", "healthy"): (522, 3582),  # cost counted over 17 ops of a small pipeline job named a straggler
    ("flightrec", "ring_wrap"): (1382,),  # p2p progress counters were ignored past a wrapped ring
    ("flightrec", "missing_dump"): (168,),  # a hang seen only through a lost dump was called healthy
    ("flightrec", "completed_mismatch"): (16, 34, 70),  # an old completed mismatch made the verdict desync
    # a crash hid a mismatch culprit (1131); a rank computing with an async op in flight hid behind a crash (1797)
    ("flightrec", "two_faults"): (1131, 1797),
    ("flightrec", "missing_op"): (155, 353, 389),  # the skipped-p2p rule made a wait cycle a one-sided hang
    ("flightrec", "coll_inversion"): (103, 283),  # likewise
    ("torch", "missing_op"): (155,),
    ("torch", "coll_inversion"): (103,),
    ("torch", "missing_dump"): (168,),
}


def _cases() -> list:
    out = []
    for fmt in ("flightrec", "torch"):
        for kind in sim.FAULT_KINDS:
            marks = []
            if (fmt, kind) in KNOWN_WRONG:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[(fmt, kind)][0]))
            out.append(pytest.param(fmt, kind, marks=marks, id=f"{fmt}-{kind}"))
    return out


def seeds_of(kind: str, count: int, fmt: str = "flightrec") -> list[int]:
    """The seeds among 0..count-1 that draw `kind` (kinds rotate with the seed), plus its known-wrong ones."""
    known = KNOWN_WRONG.get((fmt, kind), ("", ()))[1] + FIXED.get((fmt, kind), ())
    return sorted(set(range(sim.FAULT_KINDS.index(kind), count, len(sim.FAULT_KINDS))) | set(known))


@pytest.mark.parametrize(("fmt", "kind"), _cases())
def test_reports_name_exactly_the_true_culprits(fmt: str, kind: str, tmp_path) -> None:
    """Every seed of this fault kind: the model's verdict, every true culprit, no innocent rank."""
    wrong: list[str] = []
    seeds = seeds_of(kind, SEEDS if fmt == "flightrec" else TORCH_SEEDS, fmt)
    for seed in seeds:
        sc, report, errors = sim.evaluate(seed, fmt, root=str(tmp_path))
        assert sc.kind == kind
        if errors:
            wrong.append(f"{sim.describe(sc, report, fmt)}\nerrors: {errors}")
    print(f"{fmt} {kind}: {len(seeds) - len(wrong)}/{len(seeds)} right")
    assert not wrong, f"{len(wrong)} of {len(seeds)} seeds wrong; first:\n" + "\n\n".join(wrong[:2])


def test_the_model_is_deterministic_and_its_truth_consistent() -> None:
    """Same seed, same job; every injected process fault that anyone waits on is a (possible) culprit."""
    kinds: Counter[str] = Counter()
    for seed in range(0, 400, 7):
        a, b = sim.scenario(seed), sim.scenario(seed)
        assert a.world.programs == b.world.programs and a.truth.as_dict() == b.truth.as_dict()
        t = a.truth
        kinds[t.verdict] += 1
        assert not set(t.culprits) & set(t.acceptable)
        if a.kind == "healthy":
            assert t.verdict == "healthy" and set(a.run.status) == {"finished"}
        for f in a.faults:
            acted = {"stall": "stalled", "crash": "crashed", "early_exit": "exited", "frozen": "frozen",
                     "stale_dump": "frozen"}.get(f.kind)
            if acted and a.run.status[f.rank] == acted and a.run.pc[f.rank] == f.at:  # the fault struck
                assert f.rank in set(t.culprits) | set(t.acceptable), sim.describe(a)
        named = set(t.culprits) | set(t.acceptable)
        if t.verdict not in ("healthy", "slow"):
            assert named, sim.describe(a)
        else:
            assert not named
    assert {"healthy", "hang", "desync", "deadlock", "crash", "slow"} <= set(kinds), kinds


def test_known_wrong_seeds_draw_their_kind() -> None:
    for (_, kind), (_, seeds) in KNOWN_WRONG.items():
        assert all(sim.kind_of(s) == kind for s in seeds), (kind, seeds)


def test_dumps_are_written_in_both_formats(tmp_path) -> None:
    """A crash seed: the flightrec folder holds the survivors' dumps and the truth; PyTorch's one pickles."""
    sc = sim.scenario(2)
    assert sc.kind == "crash"
    fr = sim.write(sc, tmp_path / "fr")
    culprit = sc.faults[0].rank
    assert not (fr / f"rank-{culprit:05d}.json.gz").exists() and (fr / ".truth.json").exists()
    assert len(list(fr.glob("rank-*.json.gz"))) == sc.world.size - 1
    pt = sim.write(sc, tmp_path / "pt", "torch")
    assert sorted(p.name for p in pt.glob("nccl_trace_rank_*")) and not (pt / f"nccl_trace_rank_{culprit}").exists()
