"""A torchrun worker that joins gloo, runs one all_reduce, says it is ready, then blocks for good.

Rank 0 sleeps in Python; the others wait in a second all_reduce that rank 0 never joins. Only a
signal from the launcher ends it. argv[1]: the folder for the `ready-<rank>` markers (their text: the pid).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(2))
    marker = Path(sys.argv[1]) / f"ready-{rank}"
    marker.with_suffix(".tmp").write_text(str(os.getpid()))
    marker.with_suffix(".tmp").rename(marker)
    print(f"rank {rank} ready, pid {os.getpid()}", flush=True)
    if rank == 0:
        while True:
            time.sleep(0.2)
    dist.all_reduce(torch.ones(2))


if __name__ == "__main__":
    main()
