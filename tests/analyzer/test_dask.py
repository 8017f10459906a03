"""`--dask ADDRESS`: the files read, and the timing pass run per group, as tasks on a Dask cluster
(analyzers/reading/cluster.py); the report equals the one of a single process on the same folder.

The cluster is a real `dask.distributed.LocalCluster` of two worker processes on this machine, its
workers reading the same folder by path and by `file://` URL; it is closed after the module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import analyzers
from analyzers.cli import analyze_command
from analyzers.reading import cluster as cluster_mod
from analyzers.reading.cluster import ClusterUnavailable
from fixtures import builders, sim, synth

distributed = pytest.importorskip("dask.distributed")  # the `dask` extra (installed by the test extra)

RANKS = 64


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as local:
        yield local.scheduler_address


def _same(report: dict[str, Any], expected: dict[str, Any]) -> None:
    assert json.dumps(report, sort_keys=True, default=str) == json.dumps(expected, sort_keys=True, default=str)


@pytest.mark.parametrize("read", ["full", "sampled", "summary"])
@pytest.mark.parametrize("fault", ["straggler", "stall"])
def test_the_report_equals_the_single_process_one(tmp_path: Path, cluster: str, fault: str, read: str) -> None:
    folder = synth.write_folder(tmp_path / fault, RANKS, 600, fault)
    expected = analyzers.load(folder, read=read).report()
    on_cluster = analyzers.load(folder, read=read, dask=cluster).report()
    _same(on_cluster, expected)
    assert synth.check(on_cluster, RANKS, fault) == [] or (read == "summary" and fault == "straggler")


def test_workers_read_a_url_themselves(tmp_path: Path, cluster: str) -> None:
    folder = synth.write_folder(tmp_path / "url", RANKS, 300, "stall")
    expected = analyzers.load(folder).report()
    report = analyzers.load(f"file://{folder}", dask=cluster).report()
    assert (report["verdict"], report["root_causes"], report["victims"]) == (
        expected["verdict"], expected["root_causes"], expected["victims"])


def test_simulated_slow_ranks_and_hangs(tmp_path: Path, cluster: str) -> None:
    """Jobs with pipelines, several groups and wrapped rings: the per-group parts join back exactly."""
    for seed in (1, 12, 23, 35, 40, 57):
        folder = sim.write(sim.scenario(seed), tmp_path / str(seed))
        _same(analyzers.load(folder, dask=cluster).report(), analyzers.load(folder).report())


def test_cli_takes_an_address_and_explains_a_dead_one(tmp_path: Path, cluster: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    folder = builders.cascade(tmp_path / "cascade")
    result = CliRunner().invoke(analyze_command, [str(folder), "--dask", cluster, "--format", "json", "-q"])
    assert result.exit_code == 0, result.output
    assert [c["rank"] for c in json.loads(result.output)["root_causes"]] == [5]
    monkeypatch.setattr(cluster_mod, "CONNECT_TIMEOUT_S", 2)
    with pytest.raises(ClusterUnavailable, match="no Dask scheduler answers at tcp://127.0.0.1:9"):
        analyzers.load(folder, dask="tcp://127.0.0.1:9")


def test_the_work_runs_on_the_cluster(tmp_path: Path, cluster: str) -> None:
    """The files are read, and the groups timed, by the cluster's workers: its task stream shows both."""
    folder = synth.write_folder(tmp_path / "tasks", RANKS, 600, "straggler")
    with distributed.Client(cluster) as client, distributed.get_task_stream(client=client) as stream:
        report = analyzers.load(folder, read="sampled", dask=cluster).report()
    assert synth.check(report, RANKS, "straggler") == []
    keys = [str(task["key"]) for task in stream.data]
    assert sum(k.startswith("('read_batch-") or k.startswith("read_batch-") for k in keys) >= 2, keys[:5]
    assert any("lateness_of_ops" in k for k in keys), keys[:5]
