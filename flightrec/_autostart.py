"""Arms the recorder as soon as `torch.distributed` is imported, for `FLIGHTREC=1 torchrun train.py`.

Loaded from `flightrec.pth` at interpreter start-up only when FLIGHTREC is set; it imports nothing
heavy itself, it only waits for torch.distributed to finish importing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

TARGET = "torch.distributed"


def _arm() -> None:
    try:
        from flightrec.control import enable

        enable()
    except Exception as exc:  # noqa: BLE001 - never break the job's imports
        sys.stderr.write(f"[flightrec] could not arm the recorder: {exc!r}\n")


class _ArmAfterExec(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        # torch imports torch.distributed half-way through its own __init__; the parent attribute is
        # bound only after this returns, and the recorder's `import torch.distributed` needs it now.
        parent = sys.modules.get("torch")
        if parent is not None and not hasattr(parent, "distributed"):
            parent.distributed = module  # type: ignore[attr-defined]
        _arm()


class _WatchTorchDistributed(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        _remove_finder()
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ArmAfterExec(spec.loader)
        return spec


_finder = _WatchTorchDistributed()


def _remove_finder() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def install() -> None:
    if TARGET in sys.modules:
        _arm()
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


install()
