"""What a backend's Works mean, by its name: one definition for the recorder (which follows them) and
the analyzer (which reads what was left in flight). Torch-free, so the analyzer can import it.
"""

from __future__ import annotations

# Backends whose Work.wait() returns once the op is complete (the CPU path): every other backend is
# taken to complete its Works later (a device stream, a progress thread), as NCCL does.
WAIT_MEANS_DONE = frozenset({"gloo", "mpi"})

# Backends whose Works on one device stream complete in the order they were issued (each group's
# collectives share one stream; p2p ops one per peer): the watchdog polls their newest Work first.
IN_ORDER = frozenset({"nccl", "hccl"})


def device_backend(backend: str, device: str) -> str:
    """The backend serving `device` tensors: `cpu:gloo,cuda:nccl`, `cuda` -> `nccl`; a single name serves
    every device."""
    if ":" not in backend:
        return backend.lower()
    served = dict(part.split(":", 1) for part in backend.split(",") if ":" in part)
    return served.get(device, "").lower()


def stream_ordered(backend: str) -> bool:
    """Whether a group of `backend` runs its CPU-tensor ops as NCCL runs its ops: queued on a stream,
    done later than the call and its wait return (the recorder's `StreamGroupState`). An op of such
    a group left in flight is where its stream waits, wherever the host thread went meanwhile."""
    served = device_backend(backend, "cpu")
    return bool(served) and served not in WAIT_MEANS_DONE
