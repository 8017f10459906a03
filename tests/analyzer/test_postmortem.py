"""Postmortem tables (`analyzers.reporting.postmortem`) and the Parquet export (`flightrec export`)."""

from __future__ import annotations

import json

import networkx as nx
import pandas as pd
import pytest
from click.testing import CliRunner

import analyzers
from analyzers.reading.columns import ENTRY_COLUMNS
from analyzers.reporting import postmortem as pm
from analyzers.reporting.export import EXPORT_SCHEMA, export, groups_path_for, read_metadata
from flightrec.cli.commands import main as flightrec_main

from .conftest import GOLDEN


@pytest.fixture(scope="module")
def hang() -> analyzers.Analysis:
    return analyzers.load(GOLDEN / "compute_hang")


def test_derived_columns_for_a_compute_hang(hang):
    df = pm.entries(hang)
    assert list(df.columns) == [*ENTRY_COLUMNS, *pm.DERIVED_COLUMNS]
    assert len(df) == len(hang.entries)
    # one collective id per (group, seq), shared by every rank, numbered in the order entered
    ids = df.groupby("seq")["collective_id"].agg(["nunique", "first"])
    assert (ids["nunique"] == 1).all() and list(ids["first"]) == [0, 1, 2, 3]
    # ranks 0, 1, 3 are blocked in seq 4; rank 2 never entered it and is the root cause
    blocked = df[df["blocking"]]
    assert sorted(blocked["rank"]) == [0, 1, 3] and set(blocked["seq"]) == {4}
    assert set(blocked["status"]) == {"blocking"}
    assert set(df.loc[~df["blocking"], "status"]) == {"completed"}
    roles = df.groupby("rank")["rank_role"].first().astype(str).to_dict()
    assert roles == {0: "victim", 1: "victim", 2: "root_cause", 3: "victim"}
    # lateness is the analyzer's: present exactly on the timed collectives, one last arrival each
    lat = hang.slow.lateness
    timed = df[df["late_ns"].notna()]
    assert len(timed) == len(lat[lat["group"].astype(str) == "0"])
    merged = timed.merge(lat, on=["rank", "seq", "t_enqueue_ns"], suffixes=("", "_a"))
    assert len(merged) == len(timed)
    assert (merged["late_ns"].astype("int64") == merged["late_ns_a"].astype("int64")).all()
    assert (timed.groupby("seq")["last_to_arrive"].sum() >= 1).all()
    assert df.loc[df["seq"] == 4, "late_ns"].isna().all()
    wall = df["t_enqueue_wall_ns"] - df["t_enqueue_ns"]
    assert wall.nunique() == 4  # one clock offset per rank
    assert (df["duration_ns"].dropna() > 0).all()


def test_statuses_for_desync_deadlock_and_torch_fr():
    desync = pm.entries(analyzers.load(GOLDEN / "op_desync"))
    culprit = desync[(desync["rank"] == 1) & (desync["seq"] == 4)]
    assert list(culprit["status"]) == ["mismatch"] and culprit["blocking"].all()
    deadlock = pm.entries(analyzers.load(GOLDEN / "p2p_deadlock"))
    recvs = deadlock[deadlock["op"] == "recv"]
    assert recvs["collective_id"].nunique() == 2  # 2->1 and 1->2 are different transfers
    assert set(recvs["status"]) == {"blocking"}
    fr = pm.entries(analyzers.load(GOLDEN / "torch_fr_gloo"))
    # what PyTorch's gloo recorder lacks stays missing: no completion, so no duration and no lateness
    assert fr["t_complete_ns"].isna().all() and fr["duration_ns"].isna().all() and fr["late_ns"].isna().all()
    inferred = fr[fr["blocking"] & (fr["state"] == "completed")]
    assert list(inferred["rank"]) == [1]  # the analyzer inferred it still waits: status says so
    assert list(inferred["status"]) == ["blocking"]


def test_tables(hang):
    coll = pm.collectives(hang)
    assert list(coll["collective_id"]) == [0, 1, 2, 3]
    last = coll.iloc[-1]
    assert (last["entered"], last["completed"], last["members"], bool(last["blocking"])) == (3, 0, 4, True)
    assert coll.iloc[:3]["completed"].eq(4).all() and coll.iloc[:3]["last_rank"].notna().all()
    per = pm.rank_lateness(hang)
    assert list(per["rank"]) == [0, 1, 2, 3] and per["collectives"].eq(3).all()
    lat = pm.lateness(hang)
    assert len(lat) == 12 and lat.groupby("collective_id")["last_to_arrive"].sum().ge(1).all()
    ranks = pm.ranks(hang).set_index("rank")
    assert ranks.loc[2, "root_cause_kind"] == "not_entered" and ranks.loc[0, "waits_for"] == [2]
    causes = pm.root_causes(hang)
    assert list(causes["rank"]) == [2] and causes.iloc[0]["stack"]
    assert list(pm.waits(hang)["rank"]) == [0, 1, 3]
    assert isinstance(pm.wait_graph(hang), nx.DiGraph) and pm.report(hang)["verdict"] == "hang"
    crash = pm.ranks(analyzers.load(GOLDEN / "crash")).set_index("rank")
    assert not crash.loc[1, "dumped"] and crash.loc[1, "root_cause_kind"] == "crashed"


@pytest.mark.parametrize("fixture", ["compute_hang", "torch_fr_gloo"])
def test_parquet_roundtrip(tmp_path, fixture):
    a = analyzers.load(GOLDEN / fixture)
    done = export(a, tmp_path / "trace.parquet")
    assert done.groups_path == tmp_path / "trace.groups.parquet"
    back = pd.read_parquet(done.entries_path)
    ours = pm.entries(a).reset_index(drop=True)
    assert len(back) == len(a.entries) == done.entries
    assert list(back.columns) == list(ours.columns)
    listed = ("in_shapes", "out_shapes", "in_dtypes", "out_dtypes")
    for name in listed:  # list columns, not text of Python lists
        for text, value in zip(ours[name].astype(object), back[name], strict=True):
            if name.endswith("shapes") and isinstance(text, str) and text.startswith("[["):
                assert [list(map(int, t)) for t in value] == json.loads(text), name
            elif name.endswith("dtypes") and isinstance(text, str) and text:
                assert list(value) == text.split(","), name
            else:
                assert value is None or len(value) == 0, (name, text, value)
    assert any(value is not None and len(value) for value in back["in_shapes"])
    ours = ours.drop(columns=list(listed))
    for name in ours.columns:
        want, got = ours[name].dtype, back[name].dtype
        if isinstance(want, pd.CategoricalDtype):
            assert isinstance(got, pd.CategoricalDtype), name
        else:
            assert got == want, (name, got, want)
    for name in ours.columns:
        if name == "stack":
            assert [None if s is None else list(s) for s in back[name]] == list(ours[name]), name
        else:
            assert back[name].astype(object).fillna(-9).tolist() == ours[name].astype(object).fillna(-9).tolist(), name
    groups = pd.read_parquet(done.groups_path)
    assert list(groups["group"]) == list(a.groups["group"].astype(str))
    assert [list(r) for r in groups["ranks"]] == [list(r) for r in a.groups["ranks"]]
    meta = read_metadata(done.entries_path)
    assert meta["schema"] == EXPORT_SCHEMA and meta["verdict"] == "hang" and meta["table"] == "entries"


def test_export_command(tmp_path):
    out = tmp_path / "out" / "trace.parquet"
    result = CliRunner().invoke(flightrec_main, ["export", str(GOLDEN / "crash"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 12 entries" in result.output
    assert len(pd.read_parquet(out)) == 12 and len(pd.read_parquet(groups_path_for(out))) == 1
    bad = CliRunner().invoke(flightrec_main, ["export", str(tmp_path / "nowhere"), "--out", str(out)])
    assert bad.exit_code == 2
    assert "export" in CliRunner().invoke(flightrec_main, ["--help"]).output


def test_groups_path_for():
    assert groups_path_for("a/trace.parquet").as_posix() == "a/trace.groups.parquet"
    assert groups_path_for("trace").as_posix() == "trace.groups.parquet"


def test_cost_per_rank_and_steps_show_the_straggler() -> None:
    """Issue 22: the per-step view and the cost table, where people would rather look than read."""
    import analyzers
    from analyzers.reporting import postmortem as pm
    from analyzers.reporting.html_report import render_html
    from fixtures.run import GOLDEN

    a = analyzers.load(str(GOLDEN / "straggler_20"))
    cost = pm.rank_cost(a)
    assert cost["rank"].iloc[0] == 1 and bool(cost["straggler"].iloc[0]) and cost["cost_pct"].iloc[0] > 5
    assert (cost["cost_ms"].iloc[1:] < cost["cost_ms"].iloc[0] / 10).all()
    steps = pm.steps(a)
    assert list(steps.columns) == ["step", "group", "seq", "rank", "step_ms", "own_late_ms", "held_up_by"]
    held = steps.drop_duplicates("step")["held_up_by"]
    assert (held == 1).mean() > 0.8  # rank 1 held up most steps
    page = render_html(a)
    assert "Cost per rank" in page
