"""What the launcher told this process: its rank, world size, local and node rank, job and restart.

torchrun, DeepSpeed's launcher, Open MPI's mpirun, MPICH / Intel MPI (hydra's mpiexec), PMIx launchers
and Slurm's srun each hand a worker these in variables of their own. The recorder needs them where
torch.distributed cannot say: the dump's file name before the process joined its group (a hang or
crash before init_process_group under `flightrec.enable()`) and the job's name and restart attempt.
Once torch.distributed knows the rank it wins (identity.process_rank), and it is remembered here so an
exit record written after destroy_process_group still carries it.

A launcher's own process has no rank here: torchrun's agent and DeepSpeed's launcher set RANK only in
their workers' environment, and Slurm's batch script (sbatch) has SLURM_JOB_ID and SLURM_PROCID=0
but no SLURM_STEP_ID, which slurmstepd sets only for a step with an ordinary id, the steps srun
starts, not the batch step (Slurm's src/common/env.c, setup_env). Such processes never arm anyway: the start-up hook arms a
process when it joins its default group (_autostart.py), which no launcher does.

Where several launchers are nested (srun starting torchrun, mpirun starting its daemons through
srun), the innermost one's variables come first: RANK (torchrun, DeepSpeed, or the training script
copying the MPI rank), then Open MPI's, PMIx's, PMI's, and Slurm's last. Standard library only: the
log prefix reads it before torch is imported.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

# Each list: the variables that say it, innermost launcher first (see the module docstring).
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
WORLD_SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS")
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
# the node's index: torchrun's GROUP_RANK, DeepSpeed's CROSS_RANK, the node's in the Slurm step. Not Open MPI's
# OMPI_COMM_WORLD_NODE_RANK: that is the process's rank among all processes on its node (mpirun gives 0, 1, ...
# to the ranks of one node), and neither Open MPI nor hydra says which node this is.
NODE_RANK_VARS = ("GROUP_RANK", "CROSS_RANK", "SLURM_NODEID")
# how many ranks run on this node: torchrun's LOCAL_WORLD_SIZE, DeepSpeed's LOCAL_SIZE, Open MPI's, MPICH's
LOCAL_WORLD_SIZE_VARS = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
SLURM_TASK_ONLY = frozenset({"SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID"})
NO_RUN_ID = ("", "none")  # torchrun's TORCHELASTIC_RUN_ID when no --rdzv-id was given


@dataclass(frozen=True)
class Launch:
    """This process as its launcher described it; None where no variable says."""

    launcher: str | None  # torchrun, deepspeed, openmpi, pmix, pmi, slurm; None: no launcher seen
    rank: int | None
    world_size: int | None
    local_rank: int | None
    node_rank: int | None
    job_id: str | None
    attempt: int  # restarts before this run (0: the first run)
    local_world_size: int | None = None  # ranks on this node
    problems: tuple[str, ...] = ()  # variables set to something unusable, in words (ignored here)


def slurm_task(env: Mapping[str, str]) -> bool:
    """A task of a Slurm step that srun started (not sbatch's batch script, which has no SLURM_STEP_ID)."""
    return bool(env.get("SLURM_JOB_ID", "").strip()) and env.get("SLURM_STEP_ID", "").strip().isdigit()


def which_launcher(env: Mapping[str, str]) -> str | None:
    """The launcher whose variables this process has, innermost first."""
    if env.get("TORCHELASTIC_RUN_ID") is not None and env.get("RANK") is not None:
        return "torchrun"
    if all(env.get(name) is not None for name in ("RANK", "CROSS_RANK", "LOCAL_SIZE")):
        return "deepspeed"  # deepspeed.launcher.launch sets these three in each worker
    if env.get("OMPI_COMM_WORLD_RANK") is not None:
        return "openmpi"
    if env.get("PMIX_RANK") is not None:
        return "pmix"
    if env.get("PMI_RANK") is not None:
        return "pmi"  # MPICH, Intel MPI and MVAPICH's hydra; srun --mpi=pmi2
    if slurm_task(env):
        return "slurm"
    return None


def _first_count(env: Mapping[str, str], names: tuple[str, ...], task: bool, problems: list[str]) -> int | None:
    """The first of `names` set to a count (Slurm's task variables only in a task of a step)."""
    for name in names:
        if name in SLURM_TASK_ONLY and not task:
            continue
        raw = env.get(name)
        if raw is None:
            continue
        value = raw.strip()
        if value.isdigit():
            return int(value)
        problems.append(f"{name}={raw!r} is not a non-negative integer")
    return None


def _job_id(env: Mapping[str, str], task: bool) -> str | None:
    """torchrun's run id unless it is its default `none`, else FLIGHTREC_JOB_ID, else Slurm's `JOB.STEP`
    (the job alone outside a step), else the MPI launch's id."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id.lower() not in NO_RUN_ID:
        return run_id
    own = env.get("FLIGHTREC_JOB_ID", "").strip()
    if own:
        return own
    slurm = env.get("SLURM_JOB_ID", "").strip()
    if slurm:
        return f"{slurm}.{env['SLURM_STEP_ID'].strip()}" if task else slurm
    for name in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"):  # Open MPI 5 / PMIx; Open MPI 4's mpirun
        value = env.get(name, "").strip()
        if value:
            return value
    return run_id or None  # torchrun's `none` when nothing else names the job (readers take it as unknown)


def _attempt(env: Mapping[str, str], problems: list[str]) -> int:
    """Restarts before this run. torchrun's TORCHELASTIC_RESTART_COUNT, Slurm's SLURM_RESTART_COUNT
    (a requeued job); both (torchrun inside a requeued job): slurm * (TORCHELASTIC_MAX_RESTARTS + 1)
    + torchrun, so that each run of either has its own number and a later run a larger one."""
    torchrun = _first_count(env, ("TORCHELASTIC_RESTART_COUNT",), True, problems)
    slurm = _first_count(env, ("SLURM_RESTART_COUNT",), True, problems)
    if slurm is None:
        return torchrun or 0
    if torchrun is None:
        return slurm
    most = _first_count(env, ("TORCHELASTIC_MAX_RESTARTS",), True, problems)
    if most is None:
        problems.append("TORCHELASTIC_MAX_RESTARTS is not set beside SLURM_RESTART_COUNT: "
                        "the attempt is torchrun's restart count alone")
        return torchrun
    return slurm * (most + 1) + torchrun


def detect(env: Mapping[str, str] | None = None) -> Launch:
    """Read this process's launcher variables from `env` (default os.environ)."""
    env = os.environ if env is None else env
    problems: list[str] = []
    task = slurm_task(env)
    return Launch(
        launcher=which_launcher(env),
        rank=_first_count(env, RANK_VARS, task, problems),
        world_size=_first_count(env, WORLD_SIZE_VARS, task, problems),
        local_rank=_first_count(env, LOCAL_RANK_VARS, task, problems),
        node_rank=_first_count(env, NODE_RANK_VARS, task, problems),
        job_id=_job_id(env, task),
        attempt=_attempt(env, problems),
        local_world_size=_first_count(env, LOCAL_WORLD_SIZE_VARS, task, problems),
        problems=tuple(problems),
    )


_known: tuple[int, int] | None = None  # (rank, world size) torch.distributed last gave this process
_known_lock = threading.Lock()


def remember(rank: int, world_size: int) -> None:
    """torch.distributed's rank and world size, kept past destroy_process_group."""
    global _known
    if rank >= 0:
        with _known_lock:
            _known = (rank, world_size)


def remembered() -> tuple[int, int] | None:
    return _known


def known_rank(env: Mapping[str, str] | None = None) -> int | None:
    """The rank torch.distributed gave this process, else its launcher's; None where neither says."""
    known = _known
    return known[0] if known is not None else detect(env).rank
