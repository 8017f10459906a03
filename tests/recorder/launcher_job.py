"""Processes started the way launchers other than torchrun start them, for tests/recorder/test_launchers.py.

`launcher_job.py worker KIND MODE OUT PORT`: a training process whose environment is the one KIND's
launcher gives (`worker_env`); like a real training script it reads its rank from that launcher's own
variables and passes it to init_process_group (no RANK is set, except by DeepSpeed's launcher, which
sets it). `launcher_job.py launch KIND MODE OUT PORT NPROC`: a launcher's own Python process (sbatch's
batch script running Python, DeepSpeed's launcher): it imports torch.distributed, starts NPROC workers
with their environments, waits for them (bounded), and writes whether it was armed into OUT/.launcher.json.
Each process is armed only by FLIGHTREC=1 in its environment (the `flightrec.pth` start-up hook), except
in MODE `preinit`, which calls flightrec.enable() itself before it ever joins a group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

SLURM_JOB = "777"
SLURM_STEP = "3"
OMPI_JOB = "51380225"  # Open MPI 4's OMPI_MCA_ess_base_jobid (and PMIX_NAMESPACE)
PMIX_NAMESPACE = "prterun-node1-5150@1"
WAIT_S = 60.0  # nothing here runs longer: the test's own bound is below it anyway


def batch_env() -> dict[str, str]:
    """What slurmstepd gives sbatch's batch script: the job, task 0 of the batch step, no SLURM_STEP_ID."""
    return {"SLURM_JOB_ID": SLURM_JOB, "SLURM_JOBID": SLURM_JOB, "SLURM_JOB_NAME": "train", "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "2", "SLURM_NNODES": "1",
            "SLURM_RESTART_COUNT": "1", "SLURM_TASK_PID": str(os.getpid())}


def worker_env(kind: str, rank: int, nproc: int, port: int) -> dict[str, str]:
    """The variables KIND's launcher sets in the environment of worker `rank` (one node, nproc workers)."""
    if kind == "openmpi":  # mpirun (Open MPI 4.1: also PMIx's variables, its namespace the job id)
        return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(nproc),
                "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(nproc),
                "OMPI_COMM_WORLD_NODE_RANK": str(rank), "OMPI_MCA_ess_base_jobid": OMPI_JOB,
                "OMPI_MCA_ess_base_vpid": str(rank), "PMIX_RANK": str(rank), "PMIX_NAMESPACE": OMPI_JOB}
    if kind == "mpich":  # hydra's mpiexec (MPICH, Intel MPI)
        return {"PMI_RANK": str(rank), "PMI_SIZE": str(nproc), "MPI_LOCALRANKID": str(rank),
                "MPI_LOCALNRANKS": str(nproc)}
    if kind == "pmix":  # a PMIx launcher (PRRTE's prterun) with nothing else set
        return {"PMIX_RANK": str(rank), "PMIX_NAMESPACE": PMIX_NAMESPACE}
    if kind == "slurm":  # a task of step SLURM_STEP that srun started inside the batch job
        return {**batch_env(), "SLURM_STEP_ID": SLURM_STEP, "SLURM_STEPID": SLURM_STEP, "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(rank), "SLURM_NTASKS": str(nproc), "SLURM_STEP_NUM_TASKS": str(nproc)}
    if kind == "deepspeed":  # deepspeed.launcher.launch
        return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "CROSS_RANK": "0", "CROSS_SIZE": "1", "LOCAL_SIZE": str(nproc)}
    raise ValueError(f"unknown launcher kind {kind!r}")


def launcher_rank(kind: str) -> tuple[int, int]:
    """(rank, world size) as a training script under KIND reads them from its launcher's variables."""
    env = os.environ
    names = {"openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), "mpich": ("PMI_RANK", "PMI_SIZE"),
             "slurm": ("SLURM_PROCID", "SLURM_NTASKS"), "deepspeed": ("RANK", "WORLD_SIZE")}[kind]
    return int(env[names[0]]), int(env[names[1]])


# What deepspeed/comm/torch.py and deepspeed/comm/comm.py do on the path ZeRO-3 takes (DeepSpeed is not
# installed here): TorchBackend keeps torch.distributed's all_gather_into_tensor and reduce_scatter_tensor
# as attributes before its constructor calls init_process_group; deepspeed.comm's allgather_fn and
# reduce_scatter_fn call them through the backend held in the module global `cdb`.
DS_TORCH = '''
import torch.distributed


class TorchBackend:
    def __init__(self, backend, init_method=None):
        self.all_gather_function = self.get_all_gather_function()
        self.reduce_scatter_function = self.get_reduce_scatter_function()
        self.init_process_group(backend, init_method)

    @classmethod
    def get_all_gather_function(cls):
        if hasattr(torch.distributed, "all_gather_into_tensor"):
            return torch.distributed.all_gather_into_tensor
        return torch.distributed._all_gather_base

    @classmethod
    def get_reduce_scatter_function(cls):
        if hasattr(torch.distributed, "reduce_scatter_tensor"):
            return torch.distributed.reduce_scatter_tensor
        return torch.distributed._reduce_scatter_base

    def init_process_group(self, backend, init_method):
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend, init_method=init_method)

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        return self.all_gather_function(output_tensor=output_tensor, input_tensor=input_tensor, group=group,
                                        async_op=async_op)

    def reduce_scatter_tensor(self, output_tensor, input_tensor, op=torch.distributed.ReduceOp.SUM, group=None,
                              async_op=False):
        return self.reduce_scatter_function(output_tensor, input_tensor, op=op, group=group, async_op=async_op)

    def all_reduce(self, tensor, op=torch.distributed.ReduceOp.SUM, group=None, async_op=False):
        return torch.distributed.all_reduce(tensor=tensor, op=op, group=group, async_op=async_op)
'''

DS_COMM = '''
from deepspeed.comm.torch import TorchBackend

cdb = None


def init_distributed(dist_backend):
    global cdb
    cdb = TorchBackend(dist_backend)


def allgather_fn(output_tensor, input_tensor, group=None, async_op=False):
    return cdb.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def reduce_scatter_fn(output_tensor, input_tensor, group=None, async_op=False):
    return cdb.reduce_scatter_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def all_reduce(tensor, group=None, async_op=False):
    return cdb.all_reduce(tensor, group=group, async_op=async_op)
'''


def _install_deepspeed_standin() -> types.ModuleType:
    """Modules `deepspeed.comm.torch` and `deepspeed.comm.comm` with the code above, under those names."""
    for name in ("deepspeed", "deepspeed.comm"):
        package = types.ModuleType(name)
        package.__path__ = []
        sys.modules[name] = package
    for name, source in (("deepspeed.comm.torch", DS_TORCH), ("deepspeed.comm.comm", DS_COMM)):
        module = types.ModuleType(name)
        sys.modules[name] = module
        exec(compile(source, f"<{name}>", "exec"), module.__dict__)  # noqa: S102 - the stand-in's own source
    return sys.modules["deepspeed.comm.comm"]


def _ready(out: Path, name: str) -> None:
    marker = out / name
    marker.with_suffix(".tmp").write_text(json.dumps({"pid": os.getpid()}))
    marker.with_suffix(".tmp").rename(marker)


def worker(kind: str, mode: str, out: Path, port: int) -> None:
    import torch
    import torch.distributed as dist

    import flightrec

    if mode == "preinit":  # armed by the script itself, then stuck before it ever joins a group
        assert flightrec.enable()
        _ready(out, f"ready-{os.getpid()}")
        deadline = time.monotonic() + WAIT_S
        while not (out / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return
    if mode == "deepspeed":
        comm = _install_deepspeed_standin()
        comm.init_distributed("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        shard = torch.full((2,), float(rank))
        comm.allgather_fn(torch.zeros(2 * size), shard)  # ZeRO-3 gathering a parameter
        comm.reduce_scatter_fn(torch.zeros(2), torch.ones(2 * size))  # ... and scattering its gradient
        comm.all_reduce(torch.ones(3))
        flightrec.dump("zero")
        dist.destroy_process_group()
        return
    rank, size = launcher_rank(kind)
    if mode == "exit":
        rank = size - 1 - rank  # the script's own numbering: torch.distributed's rank is not the launcher's
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # as MPI scripts do; not RANK
    dist.init_process_group("gloo", rank=rank, world_size=size)
    for _ in range(2):
        dist.all_reduce(torch.ones(4))
    if mode == "stall":
        _ready(out, f"ready-{rank}")
        if rank == 1:
            time.sleep(WAIT_S)  # the straggler: rank 0 waits for it in the next all_reduce
            return
        dist.all_reduce(torch.ones(4))
        return
    if mode == "api":
        flightrec.dump("launcher")
    dist.destroy_process_group()  # mode `exit`: the exit record is written after this, at interpreter exit


def launch(kind: str, mode: str, out: Path, port: int, nproc: int) -> None:
    """The launcher's own Python process: never a rank, whatever its environment holds."""
    import torch.distributed  # noqa: F401 - as DeepSpeed's launcher (through deepspeed.accelerator) does

    from flightrec import arming

    children = []
    for rank in range(nproc):
        env = {**os.environ, **worker_env(kind, rank, nproc, port)}
        argv = [sys.executable, __file__, "worker", kind, mode, str(out), str(port)]
        if kind == "deepspeed":
            argv.append(f"--local_rank={rank}")  # what deepspeed.launcher.launch appends
        children.append(subprocess.Popen(argv, env=env))
    codes = []
    for child in children:
        try:
            codes.append(child.wait(timeout=WAIT_S))
        except subprocess.TimeoutExpired:
            child.kill()
            codes.append(None)
    state = {"armed": arming.current() is not None, "pid": os.getpid(), "codes": codes,
             "watchdog": any(t.name == "flightrec-watchdog" for t in threading.enumerate()),
             "children": [c.pid for c in children]}
    (out / ".launcher.json").write_text(json.dumps(state))


if __name__ == "__main__":
    role, job_kind, job_mode, folder, job_port = sys.argv[1:6]
    if role == "launch":
        launch(job_kind, job_mode, Path(folder), int(job_port), int(sys.argv[6]))
    else:
        worker(job_kind, job_mode, Path(folder), int(job_port))
