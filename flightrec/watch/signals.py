"""Dump when the launcher terminates us, even while the main thread is blocked in C++.

A Python signal handler only runs when the main thread returns to the interpreter, which a rank
blocked inside a collective never does. So SIGTERM also goes through `signal.set_wakeup_fd`: the
interpreter's C handler writes the signal number to a pipe at once, and the watchdog thread, which
reads that pipe, writes the dump and then lets the signal take its default course.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from .. import log

_SIG_DFL_PTR = 0


def _libc() -> Any:
    """libc with `signal()` typed, to set C-level handlers from any thread (Python's needs the main one)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal.restype = ctypes.c_void_p
    return libc


class TermHandler:
    def __init__(self, dump: Callable[[str], None], dumping_here: Callable[[], bool] = lambda: False) -> None:
        self._dump = dump
        # True while the calling thread is itself writing a dump: a Python signal handler runs in
        # the main thread between two bytecodes, possibly inside that dump (an op that failed in the
        # main thread dumps there, and the launcher's SIGTERM follows within milliseconds). Dumping
        # again from the handler would wait for a lock its own thread holds, forever.
        self._dumping_here = dumping_here
        self._deferred: tuple[int, Any] | None = None
        self.before_death: Callable[[], None] = lambda: None  # last words before dying of the signal (arming.py)
        self._previous: Any = None
        self._installed = False
        self._owns_wakeup = False
        self.read_fd = -1
        self._write_fd = -1
        self._done = threading.Event()
        self._lock = threading.Lock()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warn_once("sigterm-thread", "not armed from the main thread: no dump on SIGTERM")
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous in (signal.SIG_IGN, None):
            return
        self._previous = previous
        signal.signal(signal.SIGTERM, self._on_signal)
        self._installed = True
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        old = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        if old != -1:  # someone (asyncio) owns the wakeup fd: give it back, rely on the handler
            signal.set_wakeup_fd(old)
            os.close(read_fd)
            os.close(write_fd)
            return
        self.read_fd, self._write_fd = read_fd, write_fd
        self._owns_wakeup = True

    def uninstall(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if self._installed and signal.getsignal(signal.SIGTERM) == self._on_signal:
            signal.signal(signal.SIGTERM, self._previous)
        self._installed = False
        if self._owns_wakeup:
            signal.set_wakeup_fd(-1)
            self._owns_wakeup = False
            for fd in (self.read_fd, self._write_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.read_fd = self._write_fd = -1

    def after_fork_in_child(self) -> None:
        """A forked child (DataLoader worker) must not write into our pipe or dump as us."""
        if self._owns_wakeup:
            try:
                signal.set_wakeup_fd(-1)
            except (ValueError, OSError):
                pass
        if self._installed:
            try:
                signal.signal(signal.SIGTERM, self._previous)
            except (ValueError, OSError):
                pass
        self._installed = self._owns_wakeup = False

    def drain(self) -> bool:
        """Watchdog side: True when a SIGTERM arrived since the last call."""
        got = False
        while self.read_fd >= 0:
            try:
                data = os.read(self.read_fd, 512)
            except (BlockingIOError, OSError):
                break
            if not data:
                break
            got = got or signal.SIGTERM in data
        return got

    def dump_once(self) -> None:
        with self._lock:
            if self._done.is_set():
                return
            try:
                self._dump("signal")
            finally:
                self._done.set()

    def handle_from_watchdog(self) -> None:
        """Dump, then die of SIGTERM as the process would have without us.

        Only while our handler is the installed one: a handler set after ours (torchrun's agent
        stopping its workers, a training loop's graceful exit) owns the signal and runs in the
        main thread; killing the process from here would pre-empt it.
        """
        self.dump_once()
        if not self.owns_signal():
            return
        if self._previous in (signal.SIG_DFL,):
            try:
                _libc().signal(signal.SIGTERM, _SIG_DFL_PTR)
            except Exception:  # noqa: BLE001
                pass
            self._last_words()
            os.kill(os.getpid(), signal.SIGTERM)
        # a Python handler of the user's runs when the main thread gets back to Python

    def owns_signal(self) -> bool:
        """Whether SIGTERM still goes to our handler (any thread may ask)."""
        try:
            return self._installed and signal.getsignal(signal.SIGTERM) == self._on_signal
        except Exception:  # noqa: BLE001 - cannot tell: leave the process alone
            return False

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._dumping_here():
            self._deferred = (signum, frame)  # handled as soon as that dump is written: run_deferred
            return
        self._handle(signum, frame)

    def run_deferred(self) -> None:
        """After a dump: a SIGTERM that arrived while this thread was writing it is handled now."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self._handle(*deferred)

    def _handle(self, signum: int, frame: Any) -> None:
        self.dump_once()
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._last_words()
        os.kill(os.getpid(), signal.SIGTERM)

    def _last_words(self) -> None:
        try:
            self.before_death()
        except Exception:  # noqa: BLE001 - the process dies of the signal either way
            pass


class AbortHandler:
    """Dump when the process aborts (gloo's `EnforceNotMet` on a size mismatch calls std::terminate).

    abort() raises SIGABRT in the failing C++ thread and the process dies as soon as the handler
    returns, so the handler is a C function (through ctypes) that writes the dump before returning.
    A 10 s alarm with SIGALRM at its default bounds it: a dump that cannot finish (the abort came
    from inside the allocator, say) still ends in the process's death, never in a hang.
    """

    def __init__(self, dump: Callable[[str], None]) -> None:
        self._dump = dump
        self._callback: Any = None
        self._libc: Any = None
        self._fired = False

    def install(self) -> None:
        import faulthandler

        if faulthandler.is_enabled() or signal.getsignal(signal.SIGABRT) not in (signal.SIG_DFL, None):
            return  # someone else handles aborts: leave them be
        try:
            libc = _libc()
            callback = ctypes.CFUNCTYPE(None, ctypes.c_int)(self._on_abort)
            libc.signal(signal.SIGABRT, ctypes.cast(callback, ctypes.c_void_p))
        except Exception as exc:  # noqa: BLE001
            log.warn_once("sigabrt", f"no dump on abort: {exc!r}")
            return
        self._libc, self._callback = libc, callback

    def uninstall(self) -> None:
        if self._libc is not None:
            self._libc.signal(signal.SIGABRT, _SIG_DFL_PTR)
        self._libc = self._callback = None

    def _on_abort(self, signum: int) -> None:
        libc = self._libc
        if libc is None or self._fired:
            return
        self._fired = True
        try:
            libc.signal(signal.SIGALRM, _SIG_DFL_PTR)
            libc.alarm(10)
            self._dump("abort")
        except BaseException:  # noqa: BLE001 - dying anyway; say nothing
            pass
        libc.signal(signal.SIGABRT, _SIG_DFL_PTR)
