"""The analyzer on dump folders recorded by real gloo runs of the recorder (fixtures/golden)."""

from __future__ import annotations

from pathlib import Path

import pytest

import analyzers
from fixtures.run import GOLDEN, SCENARIOS, check, dumped_ranks

GOLDEN_SCENARIOS = [n for n, s in SCENARIOS.items() if s.golden]


def test_every_golden_scenario_is_committed() -> None:
    assert GOLDEN_SCENARIOS and all((GOLDEN / n).is_dir() for n in GOLDEN_SCENARIOS)


@pytest.mark.parametrize("name", GOLDEN_SCENARIOS)
def test_golden_dumps_are_what_the_recorder_writes_now(name: str) -> None:
    """Regenerated from real runs (`python -m fixtures.run --golden`), never a schema the recorder left."""
    from flightrec.format.schema import SCHEMA_VERSION
    from tests.helpers import read_dump

    dumps = sorted((GOLDEN / name).glob("rank-*.json.gz"))
    assert dumps and {read_dump(str(p))["schema_version"] for p in dumps} == {SCHEMA_VERSION}


@pytest.mark.parametrize("name", GOLDEN_SCENARIOS)
def test_golden_report(name: str) -> None:
    folder = GOLDEN / name
    report = analyzers.load(str(folder)).report()
    assert check(SCENARIOS[name], report, dumped_ranks(folder)) == []


def test_cascade_names_only_the_originating_rank() -> None:
    analysis = analyzers.load(str(GOLDEN / "cascade"))
    report = analysis.report()
    assert [c["rank"] for c in report["root_causes"]] == [5]
    assert sorted(report["root_causes"][0]["victims"]) == [0, 1, 2, 3, 4, 6, 7]
    assert set(analysis.graph.nodes) == set(range(8))
    assert all(v == 5 or analysis.graph.has_edge(u, v) for u, v in analysis.graph.edges)


def test_crash_has_no_dump_and_is_blamed_alone(tmp_path: Path) -> None:
    report = analyzers.load(str(GOLDEN / "crash")).report()
    assert report["ranks"]["missing"] == [1]
    assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(1, "crashed")]
