"""Who this process is in the job: its rank, world size and restart attempt, for the dump and its name.

torch.distributed's rank wins once the process joined (and is remembered past destroy_process_group,
launchers.remember); before that, and in a process that never joins, the launcher's variables say
(launchers.py). Torch is not imported here: a process that has not imported torch.distributed has not
joined.
"""

from __future__ import annotations

import sys

from . import launchers, log


def launch() -> launchers.Launch:
    """The launcher's variables (launchers.py); each unusable one is said once and ignored."""
    found = launchers.detect()
    for problem in found.problems:
        log.warn_once(f"launcher-{problem.split('=', 1)[0]}", f"{problem}; ignored")
    return found


def restart_attempt() -> int:
    """Restarts before this run: torchrun's TORCHELASTIC_RESTART_COUNT and Slurm's SLURM_RESTART_COUNT
    (launchers.py); 0 when neither is set."""
    return launch().attempt


def process_rank() -> tuple[int, int]:
    """(rank, world size): torch.distributed's once this process joined (kept past
    destroy_process_group), else its launcher's variables; -1 where nothing says."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
            launchers.remember(rank, world_size)
            return rank, world_size
    except Exception:  # noqa: BLE001
        pass
    known = launchers.remembered()
    if known is not None:
        return known
    found = launch()
    return (-1 if found.rank is None else found.rank), (-1 if found.world_size is None else found.world_size)
