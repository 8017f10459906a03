"""`analyzers.load`: the tables, the graph, parallel loading."""

from __future__ import annotations

import networkx as nx
import pandas as pd
import pytest

import analyzers
from analyzers.reading.columns import CATEGORY_COLUMNS, ENTRY_COLUMNS


def test_tables_and_graph(scenario):
    a = analyzers.load(scenario("missing_dump"))
    assert list(a.entries.columns) == list(ENTRY_COLUMNS)
    for name in CATEGORY_COLUMNS:
        assert isinstance(a.entries[name].dtype, pd.CategoricalDtype), name
    assert sorted(a.entries["rank"].unique()) == [0, 1, 2]
    assert a.groups.loc[0, "ranks"] == (0, 1, 2, 3)
    assert isinstance(a.graph, nx.DiGraph)
    assert sorted(a.graph.nodes) == [0, 1, 2, 3]
    assert sorted(a.graph.edges) == [(0, 3), (1, 3), (2, 3)]
    assert a.graph.edges[0, 3]["reason"] == "no_dump"
    assert a.report()["schema"] == "flightrec-analysis/1"
    assert list(a.dump_table["rank"]) == [0, 1, 2]


def test_parallel_and_serial_loading_agree(scenario):
    folder = scenario("cascade")
    serial = analyzers.load(folder, workers=1)
    parallel = analyzers.load(folder, workers=3)
    pd.testing.assert_frame_equal(serial.entries, parallel.entries)
    assert serial.report() == parallel.report()


def test_unusable(tmp_path):
    with pytest.raises(analyzers.UnusableInput, match="empty folder"):
        analyzers.load(tmp_path)


def test_shapes_and_dtypes_as_text(scenario):
    a = analyzers.load(scenario("healthy"))
    ag = a.entries[a.entries["op"] == "all_gather_into_tensor"].iloc[0]
    assert (ag["in_shapes"], ag["out_shapes"], ag["in_dtypes"]) == ("[[2, 3]]", "[[8, 3]]", "float32")


@pytest.mark.parametrize("name", ["cascade", "mismatch_twice", "p2p_deadlock", "wrapped_unknown", "comm_stuck"])
def test_report_is_plain_json(scenario, name):
    import json

    report = analyzers.load(scenario(name)).report()
    assert json.loads(json.dumps(report)) == report  # no numpy scalars, no tuples, no NaN


def test_parallel_batches_with_and_without_nulls_agree(tmp_path):
    """Reader batches send all-null columns as their length only; mixed with a batch that has
    values (an error on one rank), the merged table is the serial one."""
    from fixtures.builders import Job

    job = Job(24)
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce", ranks=[20], state="failed", error="RuntimeError: peer closed")
    job.collective("0", "all_reduce", ranks=[r for r in range(24) if r != 20], state="started")
    folder = job.write(tmp_path / "d")
    serial = analyzers.load(folder, workers=1)
    parallel = analyzers.load(folder, workers=2)
    pd.testing.assert_frame_equal(serial.entries, parallel.entries)
    assert serial.entries["error"].notna().sum() == 1 and serial.entries["t_dev_start_ns"].isna().all()
    assert serial.report() == parallel.report()
