"""Recorder settings, read from the environment.

Invalid values never crash the job: `load_settings` raises `SettingsError` with a one-line message
naming the variable, and the caller turns the recorder off.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import log

DEFAULT_DIR = "./flightrec-dumps"
DEFAULT_BUFFER = 2000
DEFAULT_TIMEOUT_S = 300.0
MAX_BUFFER = 10_000_000
ON_HANG_CHOICES = ("wait", "abort")  # FLIGHTREC_ON_HANG: what a rank does once its hang dump is written
DEFAULT_ABORT_GRACE_S = 5.0  # with abort: how long the other ranks get to write theirs (FLIGHTREC_ABORT_GRACE_S)
MAX_ABORT_GRACE_S = 3600.0
DEFAULT_STRAGGLER_WINDOW_S = 60.0  # FLIGHTREC_STRAGGLER_WINDOW_S: the window a straggler's cost is measured over
DEFAULT_STRAGGLER_SHARE = 0.05  # FLIGHTREC_STRAGGLER_SHARE: the share of it that makes a rank a straggler


class SettingsError(ValueError):
    """A setting has a value the recorder cannot use."""


@dataclass(frozen=True)
class Settings:
    """Everything the recorder can be told; defaults are the documented ones."""

    dir: str = DEFAULT_DIR
    buffer: int = DEFAULT_BUFFER
    timeout_s: float = DEFAULT_TIMEOUT_S
    # who chose timeout_s: "default" (then the watchdog lowers it under groups whose backend ends ops at
    # their timeout, record/group_timeouts.py), "FLIGHTREC_TIMEOUT" or "enable()" (applied as given, with a warning)
    timeout_from: str = "default"
    stacks: bool = False
    dump_on_exit: bool = False
    snapshot_s: float = 0.0  # > 0: the watchdog rewrites this rank's dump every so many seconds
    on_hang: str = "wait"  # "abort": exit non-zero after a hang dump, so the launcher restarts the job
    abort_grace_s: float = DEFAULT_ABORT_GRACE_S
    gil_watch: bool = True  # faulthandler's timer writes the stacks when the watchdog cannot run (watch/gil_watch.py)
    poll_s: float = field(default=0.0)  # 0 = derived from timeout_s
    straggler_window_s: float = DEFAULT_STRAGGLER_WINDOW_S  # 0: no live pace, no alerts (watch/pace.py)
    straggler_share: float = DEFAULT_STRAGGLER_SHARE
    metrics_file: str = ""  # rank 0 rewrites this Prometheus textfile every scoring round; "" = none

    @property
    def watchdog_tick_s(self) -> float:
        """How often the watchdog wakes: fast enough to honour short test timeouts, cheap otherwise."""
        if self.poll_s > 0:
            return self.poll_s
        return min(0.5, max(0.05, self.timeout_s / 10))

    def as_dict(self) -> dict[str, object]:
        return {
            "dir": self.dir,
            "buffer": self.buffer,
            "timeout_s": self.timeout_s,
            "timeout_from": self.timeout_from,
            "stacks": self.stacks,
            "dump_on_exit": self.dump_on_exit,
            "snapshot_s": self.snapshot_s,
            "on_hang": self.on_hang,
            "abort_grace_s": self.abort_grace_s,
            "gil_watch": self.gil_watch,
            "straggler_window_s": self.straggler_window_s,
            "straggler_share": self.straggler_share,
            "metrics_file": self.metrics_file,
        }


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean (use 0 or 1)")


def _parse_buffer(raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise SettingsError(f"FLIGHTREC_BUFFER={raw!r} is not an integer number of entries") from None
    if not 1 <= value <= MAX_BUFFER:
        raise SettingsError(f"FLIGHTREC_BUFFER={raw!r} must be between 1 and {MAX_BUFFER}")
    return value


DURATION_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}  # FLIGHTREC_TIMEOUT=30s, 5m, 1h, 500ms
DURATION_FORMS = "seconds (30, 2.5) or a number with a unit: 500ms, 30s, 5m, 1h"


def _seconds(name: str, raw: str) -> float:
    """`raw` in seconds: a bare number is seconds; ms, s, m and h suffixes are read as such."""
    text = raw.strip().lower()
    unit = next((u for u in ("ms", "s", "m", "h") if text.endswith(u)), None)
    try:
        value = float(text[: -len(unit)] if unit else text) * DURATION_UNITS.get(unit or "s", 1.0)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a duration: give {DURATION_FORMS}") from None
    if not math.isfinite(value):
        raise SettingsError(f"{name}={raw!r} is not a finite duration: give {DURATION_FORMS}")
    return value


def _parse_timeout(raw: str) -> float:
    value = _seconds("FLIGHTREC_TIMEOUT", raw)
    if value <= 0:
        raise SettingsError(f"FLIGHTREC_TIMEOUT={raw!r} must be a positive duration: {DURATION_FORMS}")
    return value


def _parse_snapshot(raw: str) -> float:
    value = _seconds("FLIGHTREC_SNAPSHOT_S", raw)
    if value < 0:
        raise SettingsError(f"FLIGHTREC_SNAPSHOT_S={raw!r} must be 0 (off) or a positive duration: {DURATION_FORMS}")
    return value


def _parse_on_hang(raw: str) -> str:
    """`wait` or `abort`; anything else is not worth turning the recorder off for: one warning, then `wait`."""
    value = raw.strip().lower()
    if value in ON_HANG_CHOICES:
        return value
    log.warn_once("on-hang", f"FLIGHTREC_ON_HANG={raw!r} is neither 'wait' nor 'abort'; using 'wait' "
                             "(a hung job stays up until it is stopped)")
    return "wait"


def _parse_abort_grace(raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise SettingsError(f"FLIGHTREC_ABORT_GRACE_S={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 <= value <= MAX_ABORT_GRACE_S:
        raise SettingsError(f"FLIGHTREC_ABORT_GRACE_S={raw!r} must be between 0 and {MAX_ABORT_GRACE_S:g} seconds")
    return value


def _parse_straggler_window(raw: str) -> float:
    value = _seconds("FLIGHTREC_STRAGGLER_WINDOW_S", raw)
    if value != 0 and value < 1:
        raise SettingsError(f"FLIGHTREC_STRAGGLER_WINDOW_S={raw!r} must be 0 (off) or at least 1 s: {DURATION_FORMS}")
    return value


def _parse_straggler_share(raw: str) -> float:
    text = raw.strip()
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise SettingsError(f"FLIGHTREC_STRAGGLER_SHARE={raw!r} is not a share (0.05 or 5%)") from None
    if not 0 < value < 1:
        raise SettingsError(f"FLIGHTREC_STRAGGLER_SHARE={raw!r} must be between 0 and 1 (0.05 or 5%)")
    return value


def load_settings(env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Settings from `env` (default `os.environ`), then keyword overrides from `flightrec.enable()`."""
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    if "FLIGHTREC_DIR" in env:
        if not env["FLIGHTREC_DIR"].strip():
            raise SettingsError("FLIGHTREC_DIR is empty: give a folder for the dumps")
        values["dir"] = env["FLIGHTREC_DIR"]
    if "FLIGHTREC_BUFFER" in env:
        values["buffer"] = _parse_buffer(env["FLIGHTREC_BUFFER"])
    if "FLIGHTREC_TIMEOUT" in env:
        values["timeout_s"] = _parse_timeout(env["FLIGHTREC_TIMEOUT"])
        values["timeout_from"] = "FLIGHTREC_TIMEOUT"
    if "FLIGHTREC_STACKS" in env:
        values["stacks"] = _parse_bool("FLIGHTREC_STACKS", env["FLIGHTREC_STACKS"])
    if "FLIGHTREC_DUMP_ON_EXIT" in env:
        values["dump_on_exit"] = _parse_bool("FLIGHTREC_DUMP_ON_EXIT", env["FLIGHTREC_DUMP_ON_EXIT"])
    if "FLIGHTREC_SNAPSHOT_S" in env:
        values["snapshot_s"] = _parse_snapshot(env["FLIGHTREC_SNAPSHOT_S"])
    if "FLIGHTREC_ON_HANG" in env:
        values["on_hang"] = _parse_on_hang(env["FLIGHTREC_ON_HANG"])
    if "FLIGHTREC_ABORT_GRACE_S" in env:
        values["abort_grace_s"] = _parse_abort_grace(env["FLIGHTREC_ABORT_GRACE_S"])
    if "FLIGHTREC_GIL_WATCH" in env:
        values["gil_watch"] = _parse_bool("FLIGHTREC_GIL_WATCH", env["FLIGHTREC_GIL_WATCH"])
    if "FLIGHTREC_STRAGGLER_WINDOW_S" in env:
        values["straggler_window_s"] = _parse_straggler_window(env["FLIGHTREC_STRAGGLER_WINDOW_S"])
    if "FLIGHTREC_STRAGGLER_SHARE" in env:
        values["straggler_share"] = _parse_straggler_share(env["FLIGHTREC_STRAGGLER_SHARE"])
    if env.get("FLIGHTREC_METRICS_FILE", "").strip():
        values["metrics_file"] = env["FLIGHTREC_METRICS_FILE"].strip()
    for key, value in overrides.items():
        if key not in Settings.__dataclass_fields__:
            raise SettingsError(f"flightrec.enable() got an unknown option {key!r}")
        if key == "buffer":
            value = _parse_buffer(str(value))
        elif key == "timeout_s":
            value = _parse_timeout(str(value))
            values["timeout_from"] = "enable()"
        elif key == "timeout_from":
            raise SettingsError("flightrec.enable() got an unknown option 'timeout_from' (it says who set timeout_s)")
        elif key == "snapshot_s":
            value = _parse_snapshot(str(value))
        elif key == "on_hang":
            value = _parse_on_hang(str(value))
        elif key == "abort_grace_s":
            value = _parse_abort_grace(str(value))
        elif key == "straggler_window_s":
            value = _parse_straggler_window(str(value))
        elif key == "straggler_share":
            value = _parse_straggler_share(str(value))
        elif key == "metrics_file":
            value = os.fspath(value)  # type: ignore[arg-type]
        elif key in ("stacks", "dump_on_exit", "gil_watch"):
            value = bool(value)
        elif key == "dir":
            value = os.fspath(value)  # type: ignore[arg-type]
        values[key] = value
    return Settings(**values)  # type: ignore[arg-type]
