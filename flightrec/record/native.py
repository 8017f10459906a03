"""Where Entry and GroupState keep their fields: in C structs of the hot path's extension when it is
built, else in Python slots.

Why: the C hot path then writes their counters and times as C integers in place. As Python slots,
each number was a new int object per op, freeing the one it replaced, and after a collective (a
switch to the backend's thread and back, caches cold) that churn was about a quarter of what
recording an op cost (docs/overhead.md). The classes' behaviour stays in Python either way.
"""

from __future__ import annotations

import os
from types import ModuleType


def c_module() -> ModuleType | None:
    """`flightrec.record._fastpath`, when built, supported by this Python and not switched off (FLIGHTREC_FASTPATH=0)."""
    if os.environ.get("FLIGHTREC_FASTPATH", "1") == "0":
        return None
    try:
        from . import _fastpath
    except ImportError:  # not built: pure Python
        return None
    return _fastpath if _fastpath.SUPPORTED else None


def c_base(name: str) -> type | None:
    """`flightrec.record._fastpath.<name>`, where `c_module()` is there."""
    module = c_module()
    return None if module is None else getattr(module, name, None)
