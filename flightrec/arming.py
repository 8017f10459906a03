"""Arming and disarming the recorder: the one place that owns the process-wide state."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
from types import TracebackType
from typing import Any

from . import launchers, log
from .identity import process_rank
from .record.entry import Entry
from .record.recorder import Recorder
from .record.wrapping import Patcher
from .settings import Settings, SettingsError, load_settings
from .watch.dump_writer import build_dump, joined, warn_write_failed, write_dump
from .watch.signals import AbortHandler, TermHandler
from .watch.watchdog import Watchdog

# A dump written because this rank failed is not replaced by the SIGTERM dump that follows within
# seconds (torchrun stops every worker once one exited with an error): the failure says more.
FAILURE_REASONS = ("exception", "op_failed", "abort")
SNAPSHOT = "snapshot"  # the periodic dump of a running job (FLIGHTREC_SNAPSHOT_S)
# The dump of a rank whose hang dump's op completed after all (watch/recovery.py): the job runs on, so like a
# snapshot it is no evidence to keep; it replaces the hang dump, whose stall its `recovered` records carry.
RECOVERED = "recovered"
RUNNING = (SNAPSHOT, RECOVERED)  # dumps of a running job: never counted as a dump for the timeout check
HANG_DUMPS = ("timeout", "peer_request")  # what a `recovered` dump may replace
FAILURE_DUMP_KEPT_S = 60.0


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
        self.term.before_death = self.watchdog.discard_unused_stacks  # no atexit on a death by signal
        self.dump_lock = threading.Lock()
        self.recorder.on_failure = self._on_failure
        self.recorder.poll_soon = self.recorder.catch_up_due  # many ops waiting to be polled: poll now, on that thread
        self.crashed = False  # an uncaught exception was dumped: the exit record must not replace it
        self.failure_dumped_at = -1e18  # monotonic time of the last failure dump (FAILURE_REASONS)
        self.evidence_written = False  # a dump for a reason (not a snapshot, not `recovered`) is in the folder: keep it
        self.evidence_reason: str | None = None  # ... and its reason
        self._recoveries_at_evidence = 0  # the watchdog's recovered_count when it was written
        self.exiting = False  # the exit hook runs: a `recovered` dump would replace its exit record
        self.exceptions = ExceptionHooks(self._on_uncaught)

    def start(self) -> None:
        self.patcher.install()
        self.term.install()
        if threading.current_thread() is threading.main_thread():
            self.abort.install()
        self.exceptions.install()
        try:  # groups that exist already (armed from inside init_process_group): count C++ ops from now,
            self.recorder.groups.discover()  # not from the watchdog's first tick, which DDP's init can outrun
        except Exception as exc:  # noqa: BLE001 - the watchdog registers them on its next tick
            log.warn_once("discover", f"could not register the existing process groups: {exc!r}")
        self.watchdog.start()

    def stop(self) -> None:
        self.recorder.active = False
        self.watchdog.stop()
        self.patcher.restore()
        self.term.uninstall()
        self.abort.uninstall()
        self.exceptions.uninstall()
        try:  # nothing of ours may keep the job's groups or Works alive (Recorder.release: why)
            self.recorder.release()
        except Exception as exc:  # noqa: BLE001 - disable() must not fail the job
            log.warn_once("release", f"could not let go of the process groups: {exc!r}")

    def dump(self, reason: str, detail: str | None = None, on_demand: bool = False, **extra: Any) -> bool:
        """Write this rank's dump; False (with a warning) when the folder cannot take it. `on_demand`: asked
        for by `flightrec dump-now` (a snapshot taken by hand), so the periodic snapshots may replace it."""
        with self.dump_lock:
            self._dumping_thread = threading.get_ident()
            try:
                written = self._write(reason, detail, extra, on_demand)
            finally:
                self._dumping_thread = None
        self.term.run_deferred()  # a SIGTERM that arrived during the write: dump again and die
        return written

    def _on_uncaught(self, exc: BaseException, thread: str, frames: list[str], code: list[str | None]) -> None:
        """An exception nobody caught (main or any thread; errors of C++-issued collectives raised
        inside autograd end here): the process is about to die, so write the evidence first."""
        text = f"{type(exc).__name__}: {exc}"[:4000]
        self.crashed = True
        try:
            self.recorder.fail_cpp_ops(exc)  # a C++-issued op's error (DDP's Reducer) ends here, not in our wrapper
        except Exception as inner:  # noqa: BLE001 - the dump matters more
            log.warn_once("fail-cpp-ops", f"could not mark the C++-issued op that failed: {inner!r}")
        self.dump("exception", f"uncaught in thread {thread}: {text}",
                  exception={"type": type(exc).__name__, "message": str(exc)[:4000], "thread": thread,
                             "traceback": frames[-64:], "code": code[-64:]})

    def _write(self, reason: str, detail: str | None, extra: dict[str, Any] | None = None,
               on_demand: bool = False) -> bool:
        try:
            is_rank = joined() or self.recorder.ring.recorded > 0
            if process_rank()[0] < 0 and not is_rank:
                return False  # e.g. torchrun's agent process: it never joined a group
            if reason == "signal" and time.monotonic() - self.failure_dumped_at < FAILURE_DUMP_KEPT_S:
                return False  # the launcher stops us because we failed: our failure's dump says more
            if reason == SNAPSHOT and self.keeps_evidence():
                return False  # a snapshot never replaces a dump written for a reason
            if reason == RECOVERED and (self.keeps_evidence() or self.exiting):
                return False  # it replaces a hang dump only (a failure's or a user's dump stays)
            if self.watchdog.hang.dump_is_final:  # FLIGHTREC_ON_HANG=abort: the hang dump is the evidence (watch/on_hang.py)
                if reason == "signal":
                    self.watchdog.hang.abort()  # stopped within the grace period (a peer aborted first): end now, saying why
                return False
            whole = self.settings.dump_on_exit or self.settings.snapshot_s > 0  # snapshots asked for whole rings
            payload = build_dump(self.recorder, reason, detail, brief=reason == "exit" and not whole,
                                 recovered=self.watchdog.recoveries)
            payload.update(extra or {})
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
        if reason not in RUNNING:  # a snapshot says nothing about the ops in flight: their timeouts still fire
            self.watchdog.dumped_now()
        if reason not in RUNNING and not on_demand:  # a dump-now is a snapshot by hand: later snapshots replace it
            self.evidence_written, self.evidence_reason = True, reason
            self._recoveries_at_evidence = self.watchdog.recovered_count
        if reason in FAILURE_REASONS:
            self.failure_dumped_at = time.monotonic()
        return True

    def keeps_evidence(self) -> bool:
        """A dump written for a reason is in the folder and still tells what happened: not a hang dump
        whose stall has since recovered (its `recovered` records carry it into every later dump)."""
        superseded = (self.evidence_reason in HANG_DUMPS
                      and self.watchdog.recovered_count > self._recoveries_at_evidence)
        return self.evidence_written and not superseded

    def _on_failure(self, entry: Entry, in_calling_thread: bool) -> None:
        if self.watchdog.hang.dump_is_final:  # FLIGHTREC_ON_HANG=abort: a peer (the suspect) aborted first and
            if in_calling_thread:  # closed its connections: end, saying why, as on SIGTERM
                self.watchdog.discard_unused_stacks()
            self.watchdog.hang.peer_ended(launchers.known_rank(), block=in_calling_thread)
            return
        dumped = False
        if in_calling_thread:  # the exception may end the process: write before re-raising
            dumped = self.dump("op_failed", f"{entry.op} group={entry.group} seq={entry.seq}: {entry.error}")
        self.watchdog.notify_failure(entry, dumped)


_state: _Armed | None = None
_lock = threading.Lock()
_fork_hook_installed = False


def _before_fork() -> None:
    """The held-GIL timer must not run across a fork: the child would deadlock cancelling it (watch/gil_watch.py)."""
    armed = _state
    if armed is not None:
        try:
            armed.watchdog.before_fork()
        except Exception:  # noqa: BLE001 - a fork must never fail because of us
            pass


def _after_fork_in_parent() -> None:
    armed = _state
    if armed is not None:
        try:
            armed.watchdog.after_fork_in_parent()
        except Exception:  # noqa: BLE001
            pass


def _after_fork_in_child() -> None:
    global _state
    armed = _state
    if armed is None:
        return
    armed.recorder.active = False  # children record nothing into a copy of our buffer
    armed.term.after_fork_in_child()
    armed.abort.uninstall()
    armed.exceptions.uninstall()  # a DataLoader worker's crash must not dump as the rank
    _state = None


class ExceptionHooks:
    """Chains into sys.excepthook and threading.excepthook, calling `on_uncaught` before the hook
    that was there (whatever it is when the exception arrives: a hook set after ours still runs)."""

    def __init__(self, on_uncaught: Any) -> None:
        self._on_uncaught = on_uncaught
        self._sys_previous: Any = None
        self._thread_previous: Any = None
        self.active = True

    def install(self) -> None:
        self._sys_previous, sys.excepthook = sys.excepthook, self._sys_hook
        self._thread_previous, threading.excepthook = threading.excepthook, self._thread_hook

    def uninstall(self) -> None:
        # A hook installed after ours (torch's `[rankN]:` one, set by init_process_group) keeps calling
        # ours, which then only passes on: it must not keep the recorder (and its groups) alive.
        self.active = False
        self._on_uncaught = None
        if sys.excepthook == self._sys_hook:
            sys.excepthook = self._sys_previous
        if threading.excepthook == self._thread_hook:
            threading.excepthook = self._thread_previous

    def _report(self, exc: BaseException | None, tb: TracebackType | None, thread: str) -> None:
        on_uncaught = self._on_uncaught
        if exc is None or not isinstance(exc, Exception) or not self.active or on_uncaught is None:
            return  # SystemExit, KeyboardInterrupt: not a crash of the job's code
        try:
            summary = traceback.extract_tb(tb)
            frames = [f"{f.filename}:{f.lineno} in {f.name}" for f in summary]
            on_uncaught(exc, thread, frames, [(f.line or None) for f in summary])
        except Exception as inner:  # noqa: BLE001 - never mask the job's own exception
            log.warn_once("excepthook", f"could not dump on an uncaught exception: {inner!r}")

    def _sys_hook(self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        self._report(exc, tb, threading.current_thread().name)
        (self._sys_previous or sys.__excepthook__)(kind, exc, tb)

    def _thread_hook(self, args: Any) -> None:
        name = args.thread.name if args.thread is not None else "?"
        self._report(args.exc_value, args.exc_traceback, name)
        (self._thread_previous or threading.__excepthook__)(args)


def _at_exit() -> None:
    """Leave the exit record (or the full dump if asked), then quiesce: past atexit no thread of
    ours may run Python or C++ calls."""
    armed = _state
    if armed is None:
        return
    try:
        armed.exiting = True
        armed.recorder.poll_works()  # a device op found done only by a poll: the watchdog may not have ticked since
        armed.watchdog.check_recovery(dump=False)  # a stall that ended just before the exit: the exit record tells it
        if armed.crashed:
            pass  # its exception dump is the evidence: an exit dump must not replace it
        elif armed.settings.dump_on_exit:
            armed.dump("exit", "normal interpreter exit")
        elif not armed.keeps_evidence():
            # the exit record: a rank leaving cleanly while others may still wait for it says so; a
            # dump this process already wrote (a hang, a request, flightrec.dump()) is never replaced by
            # it, unless that hang recovered (a `recovered` dump, whose records the exit record keeps)
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
            os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                               after_in_child=_after_fork_in_child)
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
    from .format.names import dump_filename
    from .identity import restart_attempt

    ok = armed.dump("api" if reason == "api" else f"api:{reason}", reason)
    return os.path.join(armed.settings.dir, dump_filename(process_rank()[0], restart_attempt())) if ok else None


def current() -> _Armed | None:
    return _state
