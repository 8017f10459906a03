"""Launchers other than torchrun (issue 25): mpirun (Open MPI, MPICH / hydra, PMIx), Slurm's srun under an
sbatch script, and DeepSpeed's launcher with `deepspeed.comm`.

Every job is real (gloo on 127.0.0.1, processes armed by FLIGHTREC=1 through the start-up hook). Most
give their processes the environment those launchers give (tests/recorder/launcher_job.py); the
tests at the end run the launchers themselves where they are there (apt's openmpi-bin and mpich, a
Slurm cluster answering `sinfo`, DeepSpeed in a Python `FLIGHTREC_TEST_DEEPSPEED_PYTHON` names) and
skip elsewhere. Every process is bounded in time and killed in the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from fixtures.launch import free_port, kill_tree
from flightrec import launchers
from flightrec.format.names import dump_filename
from flightrec.record import early_references, torch_compat
from tests.helpers import entries, read_dump
from tests.recorder import launcher_job

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("launcher_job.py")
NPROC = 2
# variables of any launcher the test itself may run under: none may leak into the emulated jobs
FOREIGN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "CROSS_RANK", "LOCAL_SIZE")
FOREIGN_PREFIXES = ("FLIGHTREC", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL")


# ---------------------------------------------------------------------------------------------- env parsing
def test_open_mpi() -> None:
    env = launcher_job.worker_env("openmpi", 3, 8, 0)
    # OMPI_COMM_WORLD_NODE_RANK (3 here) is the rank among the node's processes, not the node's index
    assert launchers.detect(env) == launchers.Launch("openmpi", 3, 8, 3, None, launcher_job.OMPI_JOB, 0, local_world_size=8)
    del env["PMIX_NAMESPACE"]  # without PMIx's namespace: the jobid
    assert launchers.detect(env).job_id == launcher_job.OMPI_JOB


def test_open_mpi_5_names_the_job_by_its_pmix_namespace() -> None:
    env = {**launcher_job.worker_env("openmpi", 1, 2, 0), "PMIX_NAMESPACE": "prterun-a-1@1"}
    del env["OMPI_MCA_ess_base_jobid"]
    found = launchers.detect(env)
    assert (found.launcher, found.rank, found.job_id) == ("openmpi", 1, "prterun-a-1@1")


def test_mpich_hydra() -> None:
    found = launchers.detect(launcher_job.worker_env("mpich", 5, 6, 0))
    assert found == launchers.Launch("pmi", 5, 6, 5, None, None, 0, local_world_size=6)


def test_pmix_alone() -> None:
    found = launchers.detect(launcher_job.worker_env("pmix", 2, 4, 0))
    assert found == launchers.Launch("pmix", 2, None, None, None, launcher_job.PMIX_NAMESPACE, 0)


def test_slurm_task_names_the_job_and_step_and_counts_requeues() -> None:
    found = launchers.detect(launcher_job.worker_env("slurm", 1, 2, 0))
    assert found == launchers.Launch("slurm", 1, 2, 1, 0, f"{launcher_job.SLURM_JOB}.{launcher_job.SLURM_STEP}", 1)


def test_sbatch_batch_script_is_no_rank() -> None:
    """SLURM_PROCID=0 there belongs to the batch step's one task, not to a rank of the job."""
    found = launchers.detect(launcher_job.batch_env())
    assert (found.launcher, found.rank, found.world_size, found.local_rank, found.node_rank) == (None,) * 5
    assert found.job_id == launcher_job.SLURM_JOB and found.attempt == 1


def test_deepspeed_worker_and_its_launcher() -> None:
    found = launchers.detect(launcher_job.worker_env("deepspeed", 1, 2, 29500))
    assert found == launchers.Launch("deepspeed", 1, 2, 1, 0, None, 0, local_world_size=2)
    assert launchers.detect({"PATH": "/usr/bin"}) == launchers.Launch(None, None, None, None, None, None, 0)


def test_torchrun_under_srun_takes_torchruns_rank_and_slurms_job() -> None:
    """srun starts one torchrun agent per node (SLURM_PROCID: the node), torchrun the workers (RANK)."""
    env = {**launcher_job.worker_env("slurm", 1, 2, 0), "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
           "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "2",
           "TORCHELASTIC_MAX_RESTARTS": "3"}
    found = launchers.detect(env)
    # attempt: one Slurm requeue of (3 + 1) torchrun attempts each, then torchrun's restart 2
    assert found == launchers.Launch("torchrun", 5, 8, 1, 1, f"{launcher_job.SLURM_JOB}.{launcher_job.SLURM_STEP}", 6)
    assert launchers.detect({**env, "TORCHELASTIC_RUN_ID": "job-7"}).job_id == "job-7"
    assert launchers.detect({**env, "FLIGHTREC_JOB_ID": "mine"}).job_id == "mine"


def test_open_mpi_under_slurm_takes_the_mpi_rank() -> None:
    """mpirun in an allocation starts its daemons with srun: its ranks inherit the daemon step's SLURM_PROCID."""
    env = {**launcher_job.worker_env("slurm", 0, 2, 0), **launcher_job.worker_env("openmpi", 6, 8, 0)}
    found = launchers.detect(env)
    assert (found.launcher, found.rank, found.world_size, found.local_rank) == ("openmpi", 6, 8, 6)
    assert found.job_id == f"{launcher_job.SLURM_JOB}.{launcher_job.SLURM_STEP}"


def test_torchruns_default_run_id_is_kept_only_when_nothing_else_names_the_job() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}
    assert launchers.detect(env).job_id == "none"  # as before: readers take it as unknown
    assert launchers.detect({**env, "OMPI_MCA_ess_base_jobid": "9"}).job_id == "9"


def test_unusable_values_are_named_and_skipped() -> None:
    found = launchers.detect({"RANK": "x1", "OMPI_COMM_WORLD_RANK": "4", "TORCHELASTIC_RESTART_COUNT": "-1"})
    assert found.rank == 4 and found.attempt == 0
    assert found.problems == ("RANK='x1' is not a non-negative integer",
                              "TORCHELASTIC_RESTART_COUNT='-1' is not a non-negative integer")


def test_references_deepspeed_kept_point_at_the_wrappers_and_are_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """flightrec/record/early_references.py: on the backend being constructed (found on the stack) and on `cdb`; a reference
    someone replaced since is left alone when disarming."""
    def original() -> None: ...

    def wrapper() -> None: ...

    backend_module = types.ModuleType("deepspeed.comm.torch")
    exec("class TorchBackend:\n"  # noqa: S102 - a class whose frames say they are deepspeed.comm.torch's
         "    def __init__(self, function, arming):\n"
         "        self.all_gather_function = function\n"
         "        self.reduce_scatter_function = print\n"
         "        arming()\n", backend_module.__dict__)
    monkeypatch.setitem(sys.modules, "deepspeed.comm.torch", backend_module)
    wrapper_of = {original: wrapper}.get
    changed: list = []
    backend = backend_module.TorchBackend(original, lambda: changed.extend(early_references.rebind(wrapper_of)))
    assert (backend.all_gather_function, backend.reduce_scatter_function) == (wrapper, print)
    early_references.restore(changed)
    assert backend.all_gather_function is original
    comm = types.ModuleType("deepspeed.comm.comm")
    comm.cdb = types.SimpleNamespace(all_gather_function=original, reduce_scatter_function=original)
    monkeypatch.setitem(sys.modules, "deepspeed.comm.comm", comm)
    changed = early_references.rebind(wrapper_of)
    assert comm.cdb.all_gather_function is wrapper and comm.cdb.reduce_scatter_function is wrapper
    comm.cdb.reduce_scatter_function = print
    early_references.restore(changed)
    assert (comm.cdb.all_gather_function, comm.cdb.reduce_scatter_function) == (original, print)


# ------------------------------------------------------------------------------------------------- real jobs
def _env(out: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN and not k.startswith(FOREIGN_PREFIXES)}
    env.update({"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
                "FLIGHTREC": "1", "FLIGHTREC_DIR": str(out), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def _run(commands: list[tuple[list[str], dict[str, str]]], out: Path, done: Callable[[], bool],
         timeout_s: float = 45.0) -> list[int | None]:
    """Start the processes, wait until `done()` or all of them exited, then kill whatever is left."""
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / ".job.log", "w", encoding="utf-8")  # noqa: SIM115 - closed in finally
    procs = []
    try:
        for argv, env in commands:
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=out,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout_s
        while not done() and any(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, f"job not done in {timeout_s} s:\n{_log(out)}"
            time.sleep(0.1)
        return [p.poll() for p in procs]
    finally:
        for p in procs:
            kill_tree(p.pid)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        log.close()


def _log(out: Path) -> str:
    return (out / ".job.log").read_text(errors="replace")[-4000:]


def _workers(kind: str, mode: str, out: Path, port: int, **extra: str) -> list[tuple[list[str], dict[str, str]]]:
    return [([sys.executable, str(JOB), "worker", kind, mode, str(out), str(port)],
             _env(out, **launcher_job.worker_env(kind, rank, NPROC, port), **extra)) for rank in range(NPROC)]


def _dumps(out: Path) -> dict[str, dict]:
    return {p.name: read_dump(str(p)) for p in sorted(out.glob("rank-*.json.gz"))}


def _settled(out: Path, names: list[str], quiet_s: float = 0.5) -> Callable[[], bool]:
    """All of `names` exist and none changed for `quiet_s` (a later dump of a rank replaces its first)."""
    last: dict[str, tuple] = {}

    def check() -> bool:
        try:
            stamp = tuple((out / n).stat().st_mtime_ns for n in names)
        except OSError:
            return False
        if last.get("stamp") != stamp:
            last["stamp"], last["since"] = stamp, time.monotonic()
            return False
        return time.monotonic() - last["since"] >= quiet_s

    return check


def _pids(out: Path, pattern: str) -> dict[str, int]:
    return {p.name: json.loads(p.read_text())["pid"] for p in out.glob(pattern)}


def test_open_mpi_stall_dumps_every_rank_under_its_mpi_rank(tmp_path: Path) -> None:
    """Rank 1 stalls, rank 0 times out in its all_reduce and asks rank 1 to dump: both land as their rank."""
    names = [dump_filename(r) for r in range(NPROC)]
    _run(_workers("openmpi", "stall", tmp_path, free_port(), FLIGHTREC_TIMEOUT="1"), tmp_path,
         _settled(tmp_path, names))
    dumps = _dumps(tmp_path)
    assert sorted(dumps) == names, _log(tmp_path)
    ready = _pids(tmp_path, "ready-*")
    for rank, name in enumerate(names):
        d = dumps[name]
        assert (d["rank"], d["world_size"], d["local_rank"], d["node_rank"]) == (rank, NPROC, rank, None)
        assert (d["launcher"], d["job_id"], d["attempt"]) == ("openmpi", launcher_job.OMPI_JOB, 0)
        assert d["pid"] == ready[f"ready-{rank}"]
    assert dumps[names[0]]["reason"] == "timeout" and dumps[names[1]]["reason"] == "peer_request"


def test_mpich_exit_records_after_destroy_carry_torch_distributeds_rank(tmp_path: Path) -> None:
    """The script numbers its ranks the other way round from PMI_RANK: once joined, torch.distributed's
    rank names the dump, also in the exit record written after destroy_process_group."""
    codes = _run(_workers("mpich", "exit", tmp_path, free_port()), tmp_path, lambda: False)
    assert codes == [0] * NPROC, _log(tmp_path)
    dumps = _dumps(tmp_path)
    assert sorted(dumps) == [dump_filename(r) for r in range(NPROC)], _log(tmp_path)
    for rank in range(NPROC):
        d = dumps[dump_filename(rank)]
        assert (d["rank"], d["reason"], d["launcher"], d["job_id"]) == (rank, "exit", "pmi", None)
        assert d["local_rank"] == NPROC - 1 - rank  # MPI_LOCALRANKID: the launcher's numbering
        assert [e["op"] for e in entries(d)] == ["all_reduce", "all_reduce"]


def test_pmix_ranks_stuck_before_init_dump_under_their_launcher_rank(tmp_path: Path) -> None:
    """Armed by flightrec.enable() and stuck before init_process_group: `flightrec dump-now` still gets a
    dump named by PMIX_RANK from each (a process that never joined a group wrote rank-unknown-<pid>)."""
    port = free_port()
    procs = _workers("pmix", "preinit", tmp_path, port)
    names = [dump_filename(r) for r in range(NPROC)]
    pids: dict[str, int] = {}

    def dumped() -> bool:
        if not pids:
            found = _pids(tmp_path, "ready-*")
            if len(found) < NPROC:
                return False
            pids.update(found)
            subprocess.run([sys.executable, "-m", "flightrec", "dump-now", str(tmp_path), "--wait", "0"],
                           env=_env(tmp_path), check=True, timeout=60, capture_output=True)
        if not all((tmp_path / n).exists() for n in names):
            return False
        (tmp_path / "go").write_text("")
        return True

    _run(procs, tmp_path, dumped)
    dumps = _dumps(tmp_path)
    assert sorted(dumps) == names, _log(tmp_path)
    assert {d["pid"] for d in dumps.values()} == set(pids.values())
    for rank, name in enumerate(names):
        d = dumps[name]
        assert (d["rank"], d["world_size"], d["reason"], d["launcher"]) == (rank, -1, "manual", "pmix")
        assert d["job_id"] == launcher_job.PMIX_NAMESPACE and d["groups"] == []


def _launch(kind: str, mode: str, out: Path, parent_env: dict[str, str]) -> dict:
    port = free_port()
    argv = [sys.executable, str(JOB), "launch", kind, mode, str(out), str(port), str(NPROC)]
    codes = _run([(argv, _env(out, **parent_env))], out, lambda: False)
    assert codes == [0], _log(out)
    state = json.loads((out / ".launcher.json").read_text())
    assert state["codes"] == [0] * NPROC, _log(out)
    return state


def test_srun_tasks_dump_as_their_rank_and_the_sbatch_script_never_arms(tmp_path: Path) -> None:
    """sbatch's batch script (Python here, with FLIGHTREC=1 and FLIGHTREC_DUMP_ON_EXIT=1) starts the step's
    tasks as srun does; only the tasks are armed, each dump is its task's, named with Slurm's requeue count."""
    state = _launch("slurm", "api", tmp_path, {**launcher_job.batch_env(), "FLIGHTREC_DUMP_ON_EXIT": "1"})
    assert (state["armed"], state["watchdog"]) == (False, False)
    dumps = _dumps(tmp_path)
    names = [f"rank-{r:05d}.attempt-1.json.gz" for r in range(NPROC)]
    assert sorted(dumps) == names, _log(tmp_path)  # nothing from the batch script: no rank-unknown-*, no extra
    for rank, name in enumerate(names):
        d = dumps[name]
        assert d["pid"] == state["children"][rank] and d["pid"] != state["pid"]
        assert (d["rank"], d["world_size"], d["local_rank"], d["attempt"]) == (rank, NPROC, rank, 1)
        assert (d["launcher"], d["job_id"]) == ("slurm", f"{launcher_job.SLURM_JOB}.{launcher_job.SLURM_STEP}")
        assert d["reason"] == "exit"  # FLIGHTREC_DUMP_ON_EXIT: the whole ring, written after the API dump


def test_deepspeed_launcher_never_arms_and_zero_collectives_are_recorded(tmp_path: Path) -> None:
    """deepspeed.comm's TorchBackend keeps all_gather_into_tensor and reduce_scatter_tensor before its
    init_process_group arms the recorder: ZeRO-3's gathers and scatters through them are recorded under
    their own API with DeepSpeed's call site (without flightrec/record/early_references.py: on 2.13 as the inner
    all_gather_single with a site in torch, on 2.4 only as C++-issued ops)."""
    if not torch_compat.gloo_tensor_collectives():
        pytest.skip("this torch's gloo has no all_gather_into_tensor / reduce_scatter_tensor")
    state = _launch("deepspeed", "deepspeed", tmp_path, {})
    assert (state["armed"], state["watchdog"]) == (False, False)
    dumps = _dumps(tmp_path)
    assert sorted(dumps) == [dump_filename(r) for r in range(NPROC)], _log(tmp_path)
    for rank in range(NPROC):
        d = dumps[dump_filename(rank)]
        assert d["pid"] == state["children"][rank]
        assert (d["rank"], d["local_rank"], d["node_rank"], d["launcher"], d["reason"]) == \
               (rank, rank, 0, "deepspeed", "api:zero")
        rows = entries(d)
        assert [(e["api"], e["source"], e["state"]) for e in rows] == [
            ("all_gather_into_tensor", "python", "completed"), ("reduce_scatter_tensor", "python", "completed"),
            ("all_reduce", "python", "completed")]
        gather, scatter, _ = rows
        assert gather["in_shapes"] == [[2]] and gather["out_shapes"] == [[2 * NPROC]]
        assert scatter["in_shapes"] == [[2 * NPROC]] and scatter["out_shapes"] == [[2]]
        assert gather["site"].endswith("in all_gather_into_tensor") and "deepspeed.comm.torch" in gather["site"]


# ------------------------------------------------------------------------------- real launchers, where installed
def _launcher(names: tuple[str, ...], says: str) -> str | None:
    """The first of `names` on PATH whose --version output contains `says`."""
    for name in names:
        path = shutil.which(name)
        if path is None:
            continue
        try:
            done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if says in done.stdout + done.stderr:
            return path
    return None


def test_real_open_mpi_mpirun_stall(tmp_path: Path) -> None:
    """Open MPI's own mpirun (apt's openmpi-bin, not on a fresh machine): a stall dumps both ranks under their rank."""
    mpirun = _launcher(("mpirun.openmpi", "mpirun"), "Open MPI")
    if mpirun is None:
        pytest.skip("Open MPI's mpirun is not installed")
    names = [dump_filename(r) for r in range(NPROC)]
    argv = [mpirun, "-np", str(NPROC), "--oversubscribe", sys.executable, str(JOB), "worker", "openmpi", "stall",
            str(tmp_path), str(free_port())]
    env = _env(tmp_path, FLIGHTREC_TIMEOUT="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    _run([(argv, env)], tmp_path, _settled(tmp_path, names))
    dumps = _dumps(tmp_path)
    assert sorted(dumps) == names, _log(tmp_path)
    ready = _pids(tmp_path, "ready-*")
    jobs = {d["job_id"] for d in dumps.values()}
    assert len(jobs) == 1 and next(iter(jobs)), jobs  # mpirun's job id, the same on every rank
    for rank, name in enumerate(names):
        d = dumps[name]
        assert (d["rank"], d["world_size"], d["local_rank"], d["node_rank"], d["launcher"]) == \
               (rank, NPROC, rank, None, "openmpi")
        assert d["pid"] == ready[f"ready-{rank}"]
    assert dumps[names[0]]["reason"] == "timeout" and dumps[names[1]]["reason"] == "peer_request"


def test_real_hydra_mpiexec_exit_records(tmp_path: Path) -> None:
    """MPICH's hydra mpiexec (apt's mpich, not on a fresh machine): exit records named by torch.distributed's rank."""
    mpiexec = _launcher(("mpiexec.hydra", "mpiexec.mpich", "mpiexec"), "HYDRA")
    if mpiexec is None:
        pytest.skip("MPICH's hydra mpiexec is not installed")
    argv = [mpiexec, "-n", str(NPROC), sys.executable, str(JOB), "worker", "mpich", "exit", str(tmp_path),
            str(free_port())]
    assert _run([(argv, _env(tmp_path))], tmp_path, lambda: False) == [0], _log(tmp_path)
    dumps = _dumps(tmp_path)
    assert sorted(dumps) == [dump_filename(r) for r in range(NPROC)], _log(tmp_path)
    for rank in range(NPROC):
        d = dumps[dump_filename(rank)]
        assert (d["rank"], d["reason"], d["launcher"], d["local_rank"]) == (rank, "exit", "pmi", NPROC - 1 - rank)


def _deepspeed_python() -> str | None:
    """A Python with DeepSpeed installed: this one, or the one `FLIGHTREC_TEST_DEEPSPEED_PYTHON` names (a
    venv of its own: DeepSpeed pins its own dependencies, so it is kept out of the test environment)."""
    named = os.environ.get("FLIGHTREC_TEST_DEEPSPEED_PYTHON")
    candidates = [named] if named else [sys.executable]
    for python in candidates:
        try:
            done = subprocess.run([python, "-c", "import deepspeed.launcher.runner"], capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return python
    return None


def test_real_deepspeed_launcher_zero3_stall(tmp_path: Path) -> None:
    """DeepSpeed's own launcher (`deepspeed --num_gpus 2`, CPU accelerator, gloo through deepspeed.comm) on a
    ZeRO-3 job whose rank 1 stalls: both workers armed by FLIGHTREC=1 alone, their dumps named deepspeed's,
    ZeRO-3's gathers and scatters recorded with ZeRO's call sites (not deepspeed.comm's pass-through layer),
    and the analysis names rank 1. Not on a fresh machine (DeepSpeed is not a dependency): skipped there."""
    python = _deepspeed_python()
    if python is None:
        pytest.skip("DeepSpeed is not installed (FLIGHTREC_TEST_DEEPSPEED_PYTHON may name a Python that has it)")
    names = [dump_filename(r) for r in range(NPROC)]
    argv = [python, "-m", "deepspeed.launcher.runner", "--num_gpus", str(NPROC), "--master_port", str(free_port()),
            str(ROOT / "fixtures" / "jobs" / "deepspeed_zero3.py"), "--stall-rank", "1"]
    env = _env(tmp_path, DS_ACCELERATOR="cpu", FLIGHTREC_TIMEOUT="3")
    env["PATH"] = os.pathsep.join([os.path.dirname(python), env.get("PATH", "")])
    _run([(argv, env)], tmp_path, _settled(tmp_path, names, quiet_s=1.0), timeout_s=240)
    dumps = _dumps(tmp_path)
    assert sorted(dumps) == names, _log(tmp_path)
    for rank, name in enumerate(names):
        d = dumps[name]
        assert (d["rank"], d["world_size"], d["local_rank"], d["launcher"]) == (rank, NPROC, rank, "deepspeed")
        zero = [e for e in entries(d) if e["api"] in ("all_gather_into_tensor", "reduce_scatter_tensor")]
        assert zero and all(e["source"] == "python" for e in zero), _log(tmp_path)
        passing_on = ("deepspeed/comm/", "deepspeed/utils/nvtx.py")
        assert not [e for e in zero if any(p in (e["site"] or "") for p in passing_on)], {e["site"] for e in zero}
        assert all("deepspeed/runtime/" in e["site"] for e in zero), {e["site"] for e in zero}  # ZeRO's own code
    analyzers = pytest.importorskip("analyzers")
    report = analyzers.load(str(tmp_path)).report()
    assert report["verdict"] == "hang", report["summary"]
    assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(1, "not_entered")], report["root_causes"]
    assert report["jobs"]["analysed"]["launcher"] == "deepspeed"


def test_real_slurm_srun_stall(tmp_path: Path) -> None:
    """Slurm's own srun (a single-node cluster someone set up: apt's slurm-wlm with slurmctld and slurmd
    running; not on a fresh machine): the step's two tasks dump as their rank, named by Slurm's job and
    step, and the analysis names the stalled task."""
    srun = _launcher(("srun",), "slurm")
    if srun is None:
        pytest.skip("Slurm's srun is not installed")
    try:
        idle = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        idle = ""
    if not {"idle", "mixed"} & set(idle.split()):
        pytest.skip("no Slurm cluster answers here (slurmctld and slurmd not running)")
    names = [dump_filename(r) for r in range(NPROC)]
    job_name = f"flightrec-test-{os.getpid()}-{time.monotonic_ns()}"
    # the tasks run under slurmstepd, not under srun: killing srun leaves them holding the node, so the
    # job is cancelled by name in the end, and Slurm's own time limit (2 minutes) bounds it regardless
    argv = [srun, "-n", str(NPROC), "--overcommit", "--time=2", f"--job-name={job_name}", sys.executable, str(JOB),
            "worker", "slurm", "stall", str(tmp_path), str(free_port())]
    try:
        _run([(argv, _env(tmp_path, FLIGHTREC_TIMEOUT="1"))], tmp_path, _settled(tmp_path, names), timeout_s=90)
    finally:
        subprocess.run(["scancel", f"--name={job_name}"], capture_output=True, timeout=30)
    dumps = _dumps(tmp_path)
    assert sorted(dumps) == names, _log(tmp_path)
    ready = _pids(tmp_path, "ready-*")
    jobs = {d["job_id"] for d in dumps.values()}
    assert len(jobs) == 1 and "." in next(iter(jobs)), jobs  # Slurm's JOB.STEP, the same on every task
    for rank, name in enumerate(names):
        d = dumps[name]
        assert (d["rank"], d["world_size"], d["local_rank"], d["launcher"]) == (rank, NPROC, rank, "slurm")
        assert d["pid"] == ready[f"ready-{rank}"]
    analyzers = pytest.importorskip("analyzers")
    report = analyzers.load(str(tmp_path)).report()
    assert report["verdict"] == "hang", report["summary"]
    assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(1, "not_entered")], report["root_causes"]
    assert report["jobs"]["analysed"]["launcher"] == "slurm"
