"""Dumps of several jobs in one folder, and stale dumps (analyzers/reading/jobs.py; issue 19, point 7)."""

from __future__ import annotations

import gzip
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

import analyzers
from analyzers.reading import jobs
from analyzers.reading.rankdump import RankDump
from analyzers.reporting import render
from analyzers.reporting.render import text_report
from fixtures.builders import WALL_BASE_NS, Job, _warmup
from fixtures.launch import launch
from flightrec.format.packed import plain
from tests.helpers import entries

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "fixtures" / "jobs" / "train.py"
S = 1_000_000_000


# --- the split rule, on synthetic metadata -------------------------------------------------------------
def _dump(rank: int, **meta: Any) -> RankDump:
    return RankDump(rank=rank, file=f"d/rank-{rank:05d}.json.gz", fmt="flightrec", entries={}, meta=meta)


def _kept(dumps: list[RankDump]) -> list[str]:
    return sorted(d.file for d in jobs.split_jobs(dumps).kept)


def test_missing_fields_never_split() -> None:
    dumps = [
        _dump(0, job_id="j", world_size=4, store="h:1", armed_wall_ns=100 * S, dump_time_ns=200 * S),
        _dump(1, job_id=None, world_size=4, store="h:1", armed_wall_ns=101 * S),
        _dump(2, job_id="none", world_size=-1, store=None, armed_wall_ns=None),  # never joined, no identity
        _dump(3),  # an older schema: no identity at all
    ]
    split = jobs.split_jobs(dumps)
    assert len(split.kept) == 4 and split.notes == []
    assert split.jobs["ignored"] == []
    assert split.jobs["analysed"]["job_id"] == "j" and split.jobs["analysed"]["world_size"] == 4


def test_no_identity_at_all_is_one_job() -> None:
    split = jobs.split_jobs([_dump(r) for r in range(3)])
    assert len(split.kept) == 3 and split.jobs["ignored"] == [] and split.notes == []


def test_different_job_id_splits_and_the_newest_is_kept() -> None:
    old = [_dump(r, job_id="A", world_size=2, armed_wall_ns=100 * S, dump_time_ns=150 * S) for r in (2, 3)]
    new = [_dump(r, job_id="B", world_size=2, armed_wall_ns=110 * S, dump_time_ns=120 * S) for r in (0, 1)]
    split = jobs.split_jobs(old + new)
    assert sorted(d.rank for d in split.kept) == [0, 1]  # armed last, even though A dumped later
    assert split.jobs["analysed"]["job_id"] == "B"
    (ignored,) = split.jobs["ignored"]
    assert ignored["job_id"] == "A" and ignored["ranks"] == [2, 3] and len(ignored["files"]) == 2
    assert len(split.notes) == 1 and '"A"' in split.notes[0] and "2-3" in split.notes[0]


def test_world_size_or_store_splits() -> None:
    a = [_dump(r, world_size=4, store="h:1", armed_wall_ns=100 * S) for r in (2, 3)]
    b = [_dump(r, world_size=2, store="h:2", armed_wall_ns=105 * S) for r in (0, 1)]
    assert _kept(a + b) == _kept(b)
    c = [_dump(r, world_size=4, store="h:9", armed_wall_ns=106 * S) for r in (0, 1)]
    assert _kept(a + c) == _kept(c)


def test_same_identity_runs_split_on_a_gap_over_60s() -> None:
    first = [_dump(r, job_id="j", world_size=4, armed_wall_ns=(1000 + r) * S) for r in range(4)]
    close = [_dump(r, job_id="j", world_size=4, armed_wall_ns=(1003 + 50 + r) * S) for r in (0, 1)]
    assert len(jobs.split_jobs(first + close).kept) == 6  # 50 s apart: one run (sorted consecutive gaps)
    later = [_dump(r, job_id="j", world_size=4, armed_wall_ns=(1003 + 61 + r) * S) for r in (0, 1)]
    split = jobs.split_jobs(first + later)
    assert sorted(d.rank for d in split.kept) == [0, 1]
    assert split.jobs["ignored"][0]["ranks"] == [0, 1, 2, 3]
    # a run of many ranks armed one every 10 s is still one run: only gaps between consecutive times count
    slow_start = [_dump(r, job_id="j", world_size=20, armed_wall_ns=(1000 + 10 * r) * S) for r in range(20)]
    assert len(jobs.split_jobs(slow_start).kept) == 20


def test_a_dump_without_armed_time_stays_with_its_identity() -> None:
    a = [_dump(r, job_id="A", armed_wall_ns=100 * S) for r in (2, 3)] + [_dump(4, job_id="A")]
    b = [_dump(r, job_id="B", armed_wall_ns=200 * S) for r in (0, 1)]
    split = jobs.split_jobs(a + b)
    assert sorted(d.rank for d in split.kept) == [0, 1]
    assert split.jobs["ignored"][0]["ranks"] == [2, 3, 4]


# --- the stale rule ------------------------------------------------------------------------------------
def _stale(times: dict[int, int], reasons: dict[int, str] | None = None) -> list[int]:
    dumps = {r: _dump(r, dump_time_ns=t, reason=(reasons or {}).get(r, "peer_request")) for r, t in times.items()}
    return sorted(jobs.find_stale(dumps).stale)


def test_stale_rule() -> None:
    now = 10_000 * S
    assert _stale({0: now, 1: now - 8 * S, 2: now - 29 * S, 3: now - 2 * S}) == []  # one request's answers
    assert _stale({0: now, 1: now - 1 * S, 2: now - 2 * S, 3: now - 95 * S}) == [3]
    assert _stale({0: now, 1: now, 2: now - 95 * S, 3: now - 95 * S}) == [2, 3]  # half may be stale
    assert _stale({0: now, 1: now - 95 * S, 2: now - 95 * S, 3: now - 95 * S}) == []  # one rank dumped alone later
    assert _stale({0: now, 1: now, 2: now, 3: now - 95 * S}, {3: "exit"}) == []  # its last state, not stale
    assert _stale({0: now, 1: now - 95 * S}) == [1]
    text = jobs.find_stale({0: _dump(0, dump_time_ns=now), 1: _dump(1, dump_time_ns=now - 95 * S)}).stale[1].text()
    assert "stale" in text and "95 s before" in text and "unknown" in text


# --- through the loader, with builder folders (fast) ---------------------------------------------------
def _write(job: Job, folder: Path, ranks: list[int], **top: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        obj = {**job.dump(r), **top}
        (folder / f"rank-{r:05d}.json.gz").write_bytes(gzip.compress(json.dumps(obj).encode()))


def test_builder_two_jobs_in_one_folder(tmp_path: Path) -> None:
    a = Job(4)
    _warmup(a, 3)
    a.collective("0", "all_reduce", ranks=[0, 1, 3], state="started")  # job A: rank 2 hung
    _write(a, tmp_path, [0, 1, 2, 3], job_id="A", store="h:1", armed_wall_ns=WALL_BASE_NS - 100 * S)
    b = Job(2)
    _warmup(b, 2)
    _write(b, tmp_path, [0, 1], job_id="B", store="h:2", armed_wall_ns=WALL_BASE_NS - 10 * S)
    report = analyzers.load(str(tmp_path)).report()
    assert report["verdict"] == "healthy", report["summary"]  # job B is healthy; A's hang is not B's
    assert report["ranks"]["expected"] == 2 and report["ranks"]["dumped"] == [0, 1]
    assert report["jobs"]["analysed"]["job_id"] == "B"
    assert [(j["job_id"], j["ranks"]) for j in report["jobs"]["ignored"]] == [("A", [2, 3])]
    assert any("more than one job" in g and "2-3" in g for g in report["gaps"])
    assert "warning:" in text_report(report).splitlines()[2]


def test_builder_one_job_has_an_empty_ignored_list(scenario: Any) -> None:
    report = analyzers.load(str(scenario("compute_hang"))).report()
    assert report["jobs"]["ignored"] == [] and report["jobs"]["analysed"]["job_id"] == "builder"
    assert report["ranks"]["stale"] == []
    assert not any(line.startswith("warning:") for line in text_report(report).splitlines())


def test_builder_stale_rank_is_no_current_state(tmp_path: Path) -> None:
    job = Job(4)
    _warmup(job, 3)
    job.collective("0", "all_reduce", ranks=[0, 1, 2])
    job.collective("0", "all_reduce", ranks=[3], state="started")  # rank 3's old dump: waiting in seq 4 back then
    job.collective("0", "all_reduce", ranks=[0, 1, 2], state="started")  # now: 0-2 wait in seq 5
    job.set(3, dump_time_ns=WALL_BASE_NS - 120 * S)
    job.write(tmp_path)
    report = analyzers.load(str(tmp_path)).report()
    assert report["ranks"]["stale"] == [3] and 3 in report["ranks"]["dumped"]
    assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(3, "missing_dump")], report["root_causes"]
    assert "stale" in report["root_causes"][0]["detail"]
    assert all(w["reasons"].get("3") == "stale" for w in report["waits"])
    assert 3 not in [w["rank"] for w in report["waits"]]  # its old pending op is not where it is now


# --- real jobs: job A (4 ranks) then job B (2 ranks) into one FLIGHTREC_DIR ----------------------------
@pytest.fixture(scope="module")
def real_dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a folder with job A's then job B's dumps, a copy of job A's dumps alone). Job A: rank 3 hangs in
    compute; job B: rank 1 does."""
    folder = tmp_path_factory.mktemp("shared")
    a = launch(TRAIN, 4, folder, ["--fault", "compute_hang", "--fault-rank", "3"], env={"FLIGHTREC_TIMEOUT": "2"},
               wait_for_ranks=[0, 1, 2, 3], timeout_s=90)
    assert not a.timed_out and len(a.dumps) == 4, a.output[-3000:]
    only_a = tmp_path_factory.mktemp("job_a")
    for p in a.dumps:
        shutil.copy(p, only_a / p.name)
    time.sleep(1.5)  # launch() takes dumps from up to 1 s before its start as the job's own: A's must be older
    b = launch(TRAIN, 2, folder, ["--fault", "compute_hang", "--fault-rank", "1"], env={"FLIGHTREC_TIMEOUT": "2"},
               wait_for_ranks=[0, 1], timeout_s=90)
    assert not b.timed_out, b.output[-3000:]
    for rank in (0, 1):  # job B's own dumps replaced job A's
        assert json.loads(gzip.decompress((folder / f"rank-{rank:05d}.json.gz").read_bytes()))["world_size"] == 2
    return folder, only_a


def test_real_two_jobs_in_one_folder(real_dumps: tuple[Path, Path]) -> None:
    folder, _ = real_dumps
    report = analyzers.load(str(folder)).report()
    assert report["verdict"] == "hang", report["summary"]
    assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(1, "not_entered")], report["root_causes"]
    assert report["ranks"]["expected"] == 2 and report["ranks"]["dumped"] == [0, 1]
    assert report["jobs"]["analysed"]["world_size"] == 2
    (ignored,) = report["jobs"]["ignored"]
    assert ignored["world_size"] == 4 and ignored["ranks"] == [2, 3]
    assert sorted(Path(f).name for f in ignored["files"]) == ["rank-00002.json.gz", "rank-00003.json.gz"]
    assert any("more than one job" in g for g in report["gaps"])
    text = text_report(report)
    assert any(line.startswith("warning:") and "2-3" in line for line in text.splitlines()[:4]), text
    # torchrun started it (with no --rdzv-id: no job id): the report names the launcher with the evidence
    job = report["jobs"]["analysed"]
    assert job["launcher"] == "torchrun" and job["job_id"] is None, job
    assert "evidence: 2 of 2 ranks dumped (torchrun)" in text, text


def test_the_launcher_is_part_of_the_identity_said() -> None:
    mixed = [_dump(0, job_id="7", launcher="slurm"), _dump(1, job_id="7", launcher="torchrun"), _dump(2, job_id="7")]
    split = jobs.split_jobs(mixed)
    assert split.jobs["analysed"]["launcher"] == "slurm, torchrun" and len(split.kept) == 3  # never splits a job
    assert jobs.split_jobs([_dump(0), _dump(1)]).jobs["analysed"]["launcher"] is None
    assert "launched by openmpi" in jobs.Job("j", 2, None, [_dump(0, launcher="openmpi")]).describe()
    report = {"ranks": {"dumped": [0, 1], "expected": 2, "missing": [], "unreadable": []},
              "jobs": {"analysed": {"launcher": "slurm", "job_id": "4242.0"}}}
    assert render._evidence_line(report) == 'evidence: 2 of 2 ranks dumped (slurm job "4242.0")'


def _make_stale(path: Path, keep_through_seq: int, older_s: int) -> None:
    """Rewrite a real dump as if written `older_s` earlier, while waiting in world all_reduce `keep_through_seq`."""
    obj = json.loads(gzip.decompress(path.read_bytes()))
    rows = entries(obj)
    last = next(i for i, e in enumerate(rows)
                if e["kind"] == "coll" and e["group"] == "0" and e["seq"] == keep_through_seq)
    cols: dict[str, Any] = {}
    for name, col in obj["entries"].items():
        if isinstance(col, dict) and "values" in col:
            cols[name] = {"values": list(col["values"]), "codes": plain(col["codes"])[:last + 1]}
        else:
            cols[name] = plain(col)[:last + 1]
    state = cols["state"]
    if "started" not in state["values"]:
        state["values"].append("started")
    state["codes"][last] = state["values"].index("started")
    if "t_complete_ns" in cols:
        cols["t_complete_ns"][last] = None
    obj["entries"] = cols
    obj["recorded"], obj["dropped"] = last + 1, 0
    shift = older_s * S
    obj["dump_time_ns"] -= shift
    obj["clock"] = {"wall_ns": obj["clock"]["wall_ns"] - shift, "mono_ns": obj["clock"]["mono_ns"] - shift}
    obj["reason"], obj["reason_detail"] = "timeout", "all_reduce incomplete (rewritten by the test)"
    path.write_bytes(gzip.compress(json.dumps(obj).encode()))


def test_real_stale_dump_is_not_the_current_state(real_dumps: tuple[Path, Path], tmp_path: Path) -> None:
    _, only_a = real_dumps
    for p in only_a.iterdir():
        shutil.copy(p, tmp_path / p.name)
    _make_stale(tmp_path / "rank-00003.json.gz", keep_through_seq=2, older_s=120)
    report = analyzers.load(str(tmp_path)).report()
    assert report["ranks"]["stale"] == [3]
    assert report["verdict"] == "hang"
    assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(3, "missing_dump")], report["root_causes"]
    assert "stale" in report["root_causes"][0]["detail"]
    assert sorted(report["root_causes"][0]["victims"]) == [0, 1, 2]
    assert 3 not in [w["rank"] for w in report["waits"]]
    assert any(g.startswith("rank 3: its dump is stale") and "120 s before" in g for g in report["gaps"])
