"""Arming and disarming the recorder: the one place that owns the process-wide state."""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from . import log
from .dumper import build_dump, joined, process_rank, warn_write_failed, write_dump
from .entry import Entry
from .patching import Patcher
from .recorder import Recorder
from .settings import Settings, SettingsError, load_settings
from .signals import AbortHandler, TermHandler
from .watchdog import Watchdog


class _Armed:
    """Everything `enable()` changed, so `disable()` can put it back."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.recorder = Recorder(settings)
        self.patcher = Patcher(self.recorder)
        self._dumping_thread: int | None = None
        self.term = TermHandler(lambda reason: self.dump(reason, "terminated by signal"),
                                dumping_here=lambda: self._dumping_thread == threading.get_ident())
        self.abort = AbortHandler(lambda reason: self.dump(reason, "the process aborted (SIGABRT)"))
        self.watchdog = Watchdog(self.recorder, settings, self.dump, self.term)
        self.dump_lock = threading.Lock()
        self.recorder.on_failure = self._on_failure

    def start(self) -> None:
        self.patcher.install()
        self.term.install()
        if threading.current_thread() is threading.main_thread():
            self.abort.install()
        self.watchdog.start()

    def stop(self) -> None:
        self.recorder.active = False
        self.watchdog.stop()
        self.patcher.restore()
        self.term.uninstall()
        self.abort.uninstall()

    def dump(self, reason: str, detail: str | None = None) -> bool:
        """Write this rank's dump; False (with a warning) when the folder cannot take it."""
        with self.dump_lock:
            self._dumping_thread = threading.get_ident()
            try:
                written = self._write(reason, detail)
            finally:
                self._dumping_thread = None
        self.term.run_deferred()  # a SIGTERM that arrived during the write: dump again and die
        return written

    def _write(self, reason: str, detail: str | None) -> bool:
        try:
            is_rank = joined() or self.recorder.ring.recorded > 0
            if process_rank()[0] < 0 and not is_rank:
                return False  # e.g. torchrun's agent process: it never joined a group
            payload = build_dump(self.recorder, reason, detail)
            # a process that inherited RANK but never joined (a spawned DataLoader worker) may
            # only write where the rank has no dump yet: never over the rank's own
            if write_dump(payload, self.settings.dir, replace=is_rank) is None:
                return False
        except OSError as exc:
            warn_write_failed(self.settings.dir, exc)
            return False
        except Exception as exc:  # noqa: BLE001
            log.warn_once(f"dump-{type(exc).__name__}", f"could not build a dump: {exc!r}")
            return False
        self.watchdog.dumped_now()
        return True

    def _on_failure(self, entry: Entry, in_calling_thread: bool) -> None:
        dumped = False
        if in_calling_thread:  # the exception may end the process: write before re-raising
            dumped = self.dump("op_failed", f"{entry.op} group={entry.group} seq={entry.seq}: {entry.error}")
        self.watchdog.notify_failure(entry, dumped)


_state: _Armed | None = None
_lock = threading.Lock()
_fork_hook_installed = False


def _after_fork_in_child() -> None:
    global _state
    armed = _state
    if armed is None:
        return
    armed.recorder.active = False  # children record nothing into a copy of our buffer
    armed.term.after_fork_in_child()
    armed.abort.uninstall()
    _state = None


def _at_exit() -> None:
    """Dump if asked, then quiesce: past atexit no thread of ours may run Python or C++ calls."""
    armed = _state
    if armed is None:
        return
    try:
        if armed.settings.dump_on_exit:
            armed.dump("exit", "normal interpreter exit")
        armed.recorder.active = False
        armed.watchdog.stop()
        armed.abort.uninstall()  # an abort in C++ teardown must not call into a finalising interpreter
    except Exception:  # noqa: BLE001 - shutting down: say nothing
        pass


def enable(**options: Any) -> bool:
    """Arm the recorder; options override the FLIGHTREC_* variables. False if settings are invalid."""
    global _state, _fork_hook_installed
    with _lock:
        if _state is not None:
            return True
        try:
            settings = load_settings(**options)
        except SettingsError as exc:
            log.warn(f"{exc}; recorder disabled, training continues")
            return False
        armed = _Armed(settings)
        try:
            armed.start()
        except Exception as exc:  # noqa: BLE001
            log.warn(f"could not arm the recorder ({exc!r}); training continues without it")
            try:
                armed.stop()
            except Exception:  # noqa: BLE001
                pass
            return False
        _state = armed
        if not _fork_hook_installed:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            atexit.register(_at_exit)
            _fork_hook_installed = True
        return True


def disable() -> None:
    """Disarm and restore every function and handler `enable()` replaced."""
    global _state
    with _lock:
        armed, _state = _state, None
    if armed is not None:
        armed.stop()


def dump(reason: str = "api") -> str | None:
    """Write this rank's dump now; returns its path, or None when the recorder is off or it failed."""
    armed = _state
    if armed is None:
        return None
    from .dumper import dump_filename

    ok = armed.dump("api" if reason == "api" else f"api:{reason}", reason)
    return os.path.join(armed.settings.dir, dump_filename(process_rank()[0])) if ok else None


def current() -> _Armed | None:
    return _state
