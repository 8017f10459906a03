"""Stacks of a rank whose watchdog cannot run: faulthandler's C thread, re-armed by the watchdog.

Why: a rank stuck in C code that holds the GIL (a C extension's loop, a ctypes.PyDLL call) runs no
Python thread, so the watchdog never dumps and the rank reads as dead. faulthandler's "later" timer
is a C thread that writes every Python thread's stack without taking the GIL. The watchdog re-arms it
every quarter of its limit (and before it writes a dump, with the time a dump may take added), so it fires only when the watchdog has not run for most of the limit:
the GIL is held (or the process is stuck in C with every Python thread). It writes to
`rank-NNNNN.stacks.txt` beside the rank's dump, opened once (the C thread allocates nothing); its
first line (written here, when the file is opened) says what the file is; the file's modification
time is the time of faulthandler's last write. `repeat=True`: while the hold lasts, a block is added
every limit, so the last write is recent. A process stopped (SIGSTOP) or dead writes nothing.

faulthandler has one process-wide "later" slot: a call of the user's to `dump_traceback_later` while
armed is seen (the module's two functions are wrapped) and wins until the user cancels it. A timer the
user set before flightrec was armed cannot be seen and is replaced (FLIGHTREC_GIL_WATCH=0: leave
faulthandler alone). `fork` while the timer runs would leave the child a timer state it deadlocks on
(CPython cancels by joining a thread the child does not have): the timer is cancelled before a fork
and re-armed after it in the parent.
"""

from __future__ import annotations

import faulthandler
import os
import threading
import time
from typing import Any, TextIO

from .. import log
from ..format.names import stacks_filename

MAGIC = "# flightrec-stacks/1"  # the file's first bytes: the analyzer recognises it by them
LONGEST_LIMIT_S = 30.0  # fire after at most this long without a watchdog tick, whatever FLIGHTREC_TIMEOUT is
SHORTEST_LIMIT_S = 3.0  # C code holding the GIL for a second (an import, a big copy) on a loaded host is ordinary


def limit_for(timeout_s: float, tick_s: float) -> float:
    """Seconds without a watchdog tick after which the stacks are written: the op timeout, at most
    LONGEST_LIMIT_S, and never so short that ordinary work (a second of C code holding the GIL on a busy
    host, 4 ticks) could trip it: a stacks file in a healthy job would be a false alarm."""
    return max(min(timeout_s, LONGEST_LIMIT_S), SHORTEST_LIMIT_S, 4 * tick_s)


class GilWatch:
    """Owns faulthandler's "later" slot for flightrec while no one else uses it."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._file: TextIO | None = None
        self._path: str | None = None
        self._header_len = 0
        self._armed = False  # our timer is in faulthandler's slot
        self._user_owns = False  # the job called dump_traceback_later itself: hands off until it cancels
        self._last_arm = -1e18
        self._graced = False
        self._lock = threading.RLock()  # re-entrant: a SIGTERM handler in the same thread may stop() (arming.py)
        self._originals: tuple[Any, Any] | None = None
        self._off = False

    # ------------------------------------------------------------------ the module's functions
    def install(self) -> None:
        """Wrap faulthandler's two "later" functions, so a job's own use of them is seen and wins."""
        later, cancel = faulthandler.dump_traceback_later, faulthandler.cancel_dump_traceback_later
        self._originals = (later, cancel)

        def dump_traceback_later(*args: Any, **kwargs: Any) -> None:
            with self._lock:
                self._user_owns, self._armed = True, False
                later(*args, **kwargs)

        def cancel_dump_traceback_later() -> None:
            with self._lock:
                was_user = self._user_owns
                self._user_owns = False
                if was_user or not self._armed:
                    cancel()  # ours stays armed: the job cancelled nothing of its own

        dump_traceback_later.__wrapped__ = later  # type: ignore[attr-defined]
        cancel_dump_traceback_later.__wrapped__ = cancel  # type: ignore[attr-defined]
        faulthandler.dump_traceback_later = dump_traceback_later  # type: ignore[assignment]
        faulthandler.cancel_dump_traceback_later = cancel_dump_traceback_later  # type: ignore[assignment]

    def open(self, folder: str, dump_name: str, rank: int, attempt: int = 0) -> None:
        """Create the stacks file and write its header line (once, from Python; faulthandler appends)."""
        path = os.path.join(folder, stacks_filename(dump_name))
        os.makedirs(folder, exist_ok=True)
        handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 - faulthandler keeps writing to it
        main = threading.main_thread().ident or 0
        header = (f"{MAGIC} rank={rank} attempt={attempt} pid={os.getpid()} main=0x{main:016x} watchdog=0x{threading.get_ident():016x} "
                  f"limit_s={self.limit_s:g} opened_unix_s={time.time():.3f}\n"
                  f"# written by faulthandler when flightrec's watchdog thread did not run for {self.limit_s:g} s "
                  "(the GIL held, or the process stuck in C); the file's modification time is the time of the last "
                  "write\n")
        handle.write(header)
        handle.flush()
        self._file, self._path, self._header_len = handle, path, len(header.encode())

    @property
    def opened(self) -> bool:
        return self._file is not None

    # ------------------------------------------------------------------ the watchdog's calls
    def tick(self, grace_s: float = 0.0) -> None:
        """Re-arm when a quarter of the limit has passed since the last arming (or `grace_s` is asked:
        the watchdog is about to make a call that may block that long). Off the training thread."""
        if self._file is None or self._off:
            return
        now = time.monotonic()
        if grace_s <= 0 and not self._graced and now - self._last_arm < self.limit_s / 4:
            return
        with self._lock:
            if self._user_owns or self._originals is None:
                return
            try:
                self._originals[0](self.limit_s + grace_s, repeat=True, file=self._file)
            except (OSError, ValueError, RuntimeError) as exc:  # a closed file, no thread: give up quietly
                self._off = True
                log.warn_once("gil-watch", f"cannot watch for a held GIL: {exc!r}")
                return
            self._armed, self._last_arm, self._graced = True, now, grace_s > 0  # graced: back to the limit next tick

    def before_fork(self) -> None:
        """Cancel our timer: a forked child must not inherit a running one (see the module's docstring)."""
        with self._lock:
            if self._armed and self._originals is not None:
                self._originals[1]()
                self._armed = False
                self._last_arm = -1e18  # re-armed after the fork by the next tick

    def stop(self) -> None:
        """Cancel our timer, give the job back faulthandler's functions, and remove the file when
        nothing was written to it beyond its header."""
        with self._lock:
            if self._originals is not None:
                if self._armed:
                    self._originals[1]()
                    self._armed = False
                later, cancel = self._originals
                if getattr(faulthandler.dump_traceback_later, "__wrapped__", None) is later:
                    faulthandler.dump_traceback_later = later  # type: ignore[assignment]
                if getattr(faulthandler.cancel_dump_traceback_later, "__wrapped__", None) is cancel:
                    faulthandler.cancel_dump_traceback_later = cancel  # type: ignore[assignment]
                self._originals = None
            handle, path, self._file = self._file, self._path, None
        if handle is None or path is None:
            return
        try:
            handle.close()
            if os.path.getsize(path) <= self._header_len:
                os.unlink(path)
        except OSError:
            pass
