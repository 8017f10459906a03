"""The recorder's only voice: one line on stderr, each distinct problem once.

Errors inside the recorder are swallowed so training never sees them; they are kept for the dump.
"""

from __future__ import annotations

import os
import sys
import threading

from . import launchers

_seen: set[str] = set()
_lock = threading.Lock()
errors: list[str] = []


def _prefix() -> str:
    """The rank torch.distributed gave this process (remembered past destroy_process_group), else RANK.
    Not the other launchers' variables: an agent under srun (torchrun's) has Slurm's task id there."""
    known = launchers.remembered()
    rank = str(known[0]) if known is not None else os.environ.get("RANK")
    return f"[flightrec rank {rank}]" if rank is not None else "[flightrec]"


def warn(message: str) -> None:
    try:
        sys.stderr.write(f"{_prefix()} {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - stderr closed at shutdown: nothing left to tell
        pass


def warn_once(key: str, message: str) -> None:
    """Warn the first time `key` is seen; later ones are counted silently in the dump."""
    with _lock:
        if key in _seen:
            return
        _seen.add(key)
        if len(errors) < 100:
            errors.append(message)
    warn(message)


def reset() -> None:
    with _lock:
        _seen.clear()
        errors.clear()
