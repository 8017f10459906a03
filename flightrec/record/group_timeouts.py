"""The process groups' own timeouts, and the limit flightrec's watchdog keeps under them.

Why: PyTorch's NCCL watchdog (torch_npu's HCCL one likewise) ends an op that outlives its group's
timeout; with TORCH_NCCL_ASYNC_ERROR_HANDLING (on by default) it aborts the whole process. A process
that is gone writes no hang dump and answers no peer's request to dump, so flightrec's `timeout` dump
has to land before that, with time left for the peers it asks to write theirs.

The rule (README, docs/architecture.md):
- a group *ends ops at its timeout* when one of its backends is NCCL or HCCL and that backend's async
  error handling is not 0 (unset or unreadable: PyTorch's default, which handles errors), or its
  blocking wait is on;
- for such a group of timeout T, the latest safe limit is `T - min(T / 2, DUMP_MARGIN_S)`;
- FLIGHTREC_TIMEOUT not set: an op of such a group is reported after min(the default, that limit);
  every other op after the default (gloo alone: nothing changes);
- FLIGHTREC_TIMEOUT set: it applies to every op as given, and one warning names the group with the
  shortest timeout when the setting is past that group's latest safe limit.

A group's timeout is read from its backends (`pg._get_backend(device).options._timeout`: torch 2.1 to
2.15, NCCL and gloo, where a custom backend exposes `options` too), so it is what the job passed to
init_process_group / new_group / split_group, c10d's default when it passed none, or what
`_set_pg_timeout` changed it to since. Where it cannot be read it is taken as c10d's default for the
backend, and said to be assumed. Nothing here ever raises into the job.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DUMP_MARGIN_S = 30.0  # what the rule leaves for this rank's dump and the peers' (capped at half the timeout)

# Backends whose watchdog ends an op at the group's timeout: (async error handling variables, blocking
# wait variables), each list in PyTorch's order of precedence (the first one set wins).
ENDS_OPS_AT_TIMEOUT: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "nccl": (("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"),
             ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")),
    "hccl": (("HCCL_ASYNC_ERROR_HANDLING",), ("HCCL_BLOCKING_WAIT",)),
}


@dataclass(frozen=True)
class GroupTimeout:
    """One group's timeout as the watchdog rule sees it."""

    seconds: float  # the shortest timeout among the backends that end ops (among all, when none does)
    backend: str  # the backend it belongs to
    read: bool  # read from the backend; False: unreadable, c10d's default for the backend assumed
    ends_ops: bool  # that backend ends an op at this timeout (ends_ops_at_timeout)

    @property
    def reported(self) -> float | None:
        """What the dump says the group's timeout is: only a value actually read."""
        return self.seconds if self.read else None


def _first_set(env: Mapping[str, str], names: Iterable[str]) -> str | None:
    for name in names:
        if name in env:
            return env[name]
    return None


def ends_ops_at_timeout(backend: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether `backend`'s own watchdog ends an op at the group's timeout (aborting the communicator
    and, in PyTorch's default mode, the process), under the environment `env` (default os.environ)."""
    names = ENDS_OPS_AT_TIMEOUT.get(backend.strip().lower())
    if names is None:
        return False
    env = os.environ if env is None else env
    handling, blocking = names
    raw = _first_set(env, handling)
    try:
        mode = int(raw.strip()) if raw is not None else None
    except ValueError:
        mode = None  # PyTorch ignores a value it cannot parse and keeps its default
    if mode is None or mode != 0:
        return True
    wait = _first_set(env, blocking)
    return wait is not None and wait.strip().lower() in ("1", "true", "yes", "on", "y")


def latest_safe_s(group_timeout_s: float) -> float:
    """The longest flightrec timeout whose dump still lands before a group timeout of `group_timeout_s`."""
    return group_timeout_s - min(group_timeout_s / 2, DUMP_MARGIN_S)


def default_timeout_s(backend: str) -> float | None:
    """c10d's default timeout for `backend` (what a group gets when the job passes none), as
    `_get_default_timeout` has it (which warns on a build without NCCL: not called here)."""
    try:
        import torch.distributed.distributed_c10d as c10d

        from . import torch_compat

        value = torch_compat.nccl_default_timeout(c10d) if backend == "nccl" else None  # else c10d's 30 min
        value = value or c10d.default_pg_timeout
        return float(value.total_seconds())
    except Exception:  # noqa: BLE001 - private API
        return None


def _options_timeout(backend: Any) -> float | None:
    try:
        seconds = float(backend.options._timeout.total_seconds())
    except Exception:  # noqa: BLE001 - a custom backend without options, or a different shape
        return None
    return seconds if seconds > 0 else None


def _backend_name(backend: Any) -> str:
    try:
        return str(backend.name()).lower()
    except Exception:  # noqa: BLE001
        return ""


def _served(backend_config: str) -> dict[str, str]:
    """`cpu:gloo,cuda:nccl` -> {"cpu": "gloo", "cuda": "nccl"}; a single name -> {"": name}."""
    if ":" not in backend_config:
        return {"": backend_config.strip().lower()}
    pairs = (part.split(":", 1) for part in backend_config.split(",") if ":" in part)
    return {device.strip(): name.strip().lower() for device, name in pairs}


def backend_timeouts(pg: Any, backend_config: str) -> list[tuple[str, float | None]]:
    """(backend name, its timeout in seconds or None when unreadable) for each backend of `pg`."""
    served = _served(backend_config)
    found: dict[str, float | None] = {}
    try:
        devices = list(pg._device_types)
    except Exception:  # noqa: BLE001 - not a c10d ProcessGroup
        devices = []
    for device in devices:
        try:
            backend = pg._get_backend(device)
        except Exception:  # noqa: BLE001 - no backend for that device
            continue
        kind = str(getattr(device, "type", device))
        name = _backend_name(backend) or served.get(kind) or served.get("", "")
        if not name:
            continue
        seconds = _options_timeout(backend)
        if name not in found or (seconds is not None and (found[name] is None or seconds < found[name])):
            found[name] = seconds
    for name in served.values():
        if name and name != "undefined":
            found.setdefault(name, None)
    return list(found.items())


def group_timeout(pg: Any, backend_config: str, env: Mapping[str, str] | None = None) -> GroupTimeout | None:
    """The group's timeout for the watchdog rule; None when no backend's timeout is known at all."""
    try:
        candidates = []
        for name, seconds in backend_timeouts(pg, backend_config):
            read = seconds is not None
            value = seconds if read else default_timeout_s(name)
            if value is not None:
                candidates.append(GroupTimeout(value, name, read, ends_ops_at_timeout(name, env)))
    except Exception:  # noqa: BLE001 - never into the job
        return None
    ending = [c for c in candidates if c.ends_ops] or candidates
    return min(ending, key=lambda c: c.seconds) if ending else None


@dataclass
class Limits:
    """How long an op may run before the watchdog reports it: `default_s`, or a group's own limit."""

    default_s: float
    by_group: dict[str, float] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)  # group -> how its limit was derived

    def seconds(self, group: str) -> float:
        return self.by_group.get(group, self.default_s)

    def shortest_s(self) -> float:
        """The shortest limit of any group: an op younger than it is in time, whatever its group."""
        return min(self.default_s, *self.by_group.values()) if self.by_group else self.default_s

    def note(self, group: str) -> str:
        """' (flightrec's limit ...)' for a derived limit, '' for the default."""
        why = self.why.get(group)
        return f" ({why})" if why else ""


def derive_limits(timeout_s: float, explicit: bool, groups: Mapping[str, GroupTimeout | None]) -> Limits:
    """The watchdog's limits: `timeout_s` as set when `explicit`, otherwise lowered per group that ends
    its ops at its timeout to that group's latest safe limit."""
    limits = Limits(timeout_s)
    if explicit:
        return limits
    for name, t in groups.items():
        if t is None or not t.ends_ops:
            continue
        safe = latest_safe_s(t.seconds)
        if safe < timeout_s:
            limits.by_group[name] = safe
            assumed = "" if t.read else ", c10d's default assumed"
            limits.why[name] = (f"flightrec's limit {safe:g}s: group {name}'s {t.backend} timeout is {t.seconds:g}s"
                                f"{assumed}, and its watchdog ends the op then")
    return limits


def unsafe_setting(timeout_s: float, explicit: bool, groups: Mapping[str, GroupTimeout | None]
                   ) -> tuple[str, GroupTimeout, int] | None:
    """(group, its timeout, how many groups in all) when an explicit setting is past the latest safe
    limit of a group that ends its ops at its timeout: the one with the shortest timeout; else None."""
    if not explicit:
        return None
    unsafe = sorted(((name, t) for name, t in groups.items()
                     if t is not None and t.ends_ops and timeout_s > latest_safe_s(t.seconds)),
                    key=lambda item: (item[1].seconds, item[0]))
    return (unsafe[0][0], unsafe[0][1], len(unsafe)) if unsafe else None


def warning_text(setting: str, timeout_s: float, group: str, t: GroupTimeout, count: int) -> str:
    """The one warning for a setting past a group's latest safe limit."""
    others = f" (and {count - 1} more group{'s' if count > 2 else ''})" if count > 1 else ""
    assumed = "" if t.read else " (c10d's default: it could not be read)"
    return (f"{setting}={timeout_s:g}s is too close to or past group {group!r}'s {t.backend} timeout of "
            f"{t.seconds:g}s{assumed}{others}: PyTorch's watchdog ends that group's hung op at its timeout "
            "(and with TORCH_NCCL_ASYNC_ERROR_HANDLING the process), possibly before flightrec's dump; use at most "
            f"{latest_safe_s(t.seconds):g}s, or leave it unset to have it derived")
