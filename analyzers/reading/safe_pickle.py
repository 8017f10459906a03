"""A pickle reader that can never run code: only plain containers and scalars are admitted.

Why: PyTorch's flight recorder writes its dumps as pickles, and a dump folder is untrusted input
(copied from a cluster, attached to a ticket). `pickle.load` would call whatever `__reduce__` names;
this unpickler refuses every global lookup and every persistent id, so dicts, lists, tuples, str,
bytes, int, float, bool and None are all that can come out of it.
"""

from __future__ import annotations

import io
import pickle
from typing import Any


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle asked for something other than plain containers and scalars."""


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: D102 - see class docstring
        raise UnsafePickleError(f"pickle refers to {module}.{name}; only plain containers are allowed")

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise UnsafePickleError("pickle uses persistent ids; only plain containers are allowed")


def loads(data: bytes) -> Any:
    """Unpickle `data` admitting only dict/list/tuple/str/bytes/int/float/bool/None."""
    return _RestrictedUnpickler(io.BytesIO(data)).load()
