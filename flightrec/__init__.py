"""flightrec: a flight recorder for torch.distributed, and the analyzer that reads its dumps.

Importing this package does not import torch: the recorder loads only when armed.
"""

from __future__ import annotations

from typing import Any

from .format.schema import __version__

__all__ = ["enable", "disable", "dump", "__version__"]


def enable(**options: Any) -> bool:
    """Record every torch.distributed op of this process; see docs/dump-format.md for options."""
    from .arming import enable as _enable

    return _enable(**options)


def disable() -> None:
    """Stop recording and restore every function and signal handler that `enable` replaced."""
    from .arming import disable as _disable

    _disable()


def dump(reason: str = "api") -> str | None:
    """Write this rank's dump now and return its path."""
    from .arming import dump as _dump

    return _dump(reason)
