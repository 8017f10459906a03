"""Arms the recorder in training workers only, for `FLIGHTREC=1 torchrun train.py`.

Loaded from `flightrec.pth` at interpreter start-up only when FLIGHTREC is set; it imports nothing
heavy itself. torchrun's agent imports torch.distributed too but never joins a group: armed there,
our SIGTERM handling killed it before it could stop its workers. So when torch.distributed finishes
importing, only a hook goes in, and the recorder is armed when the process joins its default group.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

TARGET = "torch.distributed"
C10D = "torch.distributed.distributed_c10d"
# Every path that sets the default group (init_process_group, init_device_mesh, shrink_group) calls
# `_update_default_pg` through the module global, where the hook goes; torch releases without it get
# init_process_group wrapped instead (torch_compat.join_hook_name).

_armed = False
_arm_lock = threading.Lock()
_hooks: list[tuple[ModuleType, str, Callable[..., Any], Callable[..., Any]]] = []  # (module, name, original, hook)


def _arm() -> None:
    global _armed
    with _arm_lock:
        if _armed:
            return
        _armed = True
    _unhook()
    try:
        from flightrec.arming import enable

        enable()
    except Exception as exc:  # noqa: BLE001 - never break the job
        sys.stderr.write(f"[flightrec] could not arm the recorder: {exc!r}\n")


def _unhook() -> None:
    """Put the originals back before arming: the recorder wraps init_process_group itself."""
    while _hooks:
        module, name, original, hook = _hooks.pop()
        if getattr(module, name, None) is hook:
            setattr(module, name, original)


def _joined(c10d: ModuleType) -> bool:
    try:
        return bool(c10d.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def _make_hook(c10d: ModuleType, original: Callable[..., Any]) -> Callable[..., Any]:
    def hook(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if not _armed and _joined(c10d):
            _arm()
        return result

    hook.__wrapped__ = original  # type: ignore[attr-defined]
    return hook


def _settings_valid() -> bool:
    """Say so at import when the FLIGHTREC_* values are unusable, as arming would have (and stay off)."""
    try:
        from flightrec.settings import SettingsError, load_settings

        try:
            load_settings()
        except SettingsError as exc:
            from flightrec import log

            log.warn(f"{exc}; recorder disabled, training continues")
            return False
    except Exception:  # noqa: BLE001 - let enable() tell
        pass
    return True


def _watch_joining() -> None:
    """torch.distributed is imported: arm now if the process already joined, else when it joins."""
    try:
        c10d = sys.modules.get(C10D)
        if c10d is None or _armed or _hooks:
            return  # built without distributed support: no group can ever exist
        if _joined(c10d):
            _arm()
            return
        if not _settings_valid():
            return
        from .record import torch_compat  # torch is imported by now

        name = torch_compat.join_hook_name(c10d)
        original = getattr(c10d, name, None)
        if not callable(original):
            return
        hook = _make_hook(c10d, original)
        modules = [c10d] + [m for m in (sys.modules.get(TARGET),) if m is not None and m is not c10d]
        for module in modules:
            if getattr(module, name, None) is original:
                _hooks.append((module, name, original, hook))
                setattr(module, name, hook)
    except Exception as exc:  # noqa: BLE001 - never break the job's imports
        sys.stderr.write(f"[flightrec] could not arm the recorder: {exc!r}\n")


class _HookAfterExec(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _watch_joining()


class _WatchTorchDistributed(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        _remove_finder()
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _HookAfterExec(spec.loader)
        return spec


_finder = _WatchTorchDistributed()


def _remove_finder() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def install() -> None:
    if TARGET in sys.modules:
        _watch_joining()
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


install()
