"""What a rank does once the job is known to be hung (FLIGHTREC_ON_HANG): say so once, and with
`abort` end the process after a grace period, so that the launcher (torchrun, a scheduler) restarts
the job instead of every GPU waiting for PyTorch's watchdog or gloo's 30-minute timeout.

Why the watchdog thread ends the process, with `os._exit`: the main thread is blocked in C++ (the hung
collective) or in the stalled code and never comes back to Python, so no exception or `sys.exit`
would reach it. The grace period lets the other ranks, asked through the store, write their dumps
first. Once this rank's hang dump is written and the abort is due, that dump is final: the failures
our own exit causes on the others (gloo's "connection closed", the launcher's SIGTERM) must not
replace the evidence of the hang. A SIGTERM within the grace period (torchrun stopping the other
workers once the first one exited) ends the process at once the same way, with the same message.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import threading
import time

from . import log
from .dumper import process_rank
from .settings import Settings

ABORT_EXIT_CODE = 75  # EX_TEMPFAIL ("try again later"); torchrun counts any non-zero exit as a failed worker
HANG_REQUEST = "timeout on rank"  # how a peer request caused by a timeout begins (watchdog._ask_peers)
UNCONFIRMED_REQUEST = "possible hang on rank"  # a timeout that may be a long compute phase: never aborts
FLUSH_BOUND_S = 2.0  # a stream blocked on a full pipe must not keep a hung process alive
_PEER = re.compile(r"^(?:timeout|possible hang) on rank (\S+): (.*)$", re.S)


def peer_what(request: str) -> str:
    """'timeout on rank 0: all_reduce ... incomplete after 2.1s' -> 'all_reduce ... incomplete after 2.1s on rank 0'."""
    m = _PEER.match(request)
    return f"{m.group(2)} on rank {m.group(1)}" if m else request


def _rank() -> str:
    rank = process_rank()[0]
    return str(rank) if rank >= 0 else "?"


class HangAction:
    """Told of every hang dump by the watchdog; logs the hang once and, with `abort`, ends the process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.folder = os.path.abspath(settings.dir)
        self.abort_at: float | None = None  # monotonic time the process exits at; None: no abort due
        self.what = ""
        self.dump_written = False  # a hang dump of this rank is in the folder
        self._said: set[bool] = set()  # which lines were logged: confirmed (True), unconfirmed (False)

    @property
    def dump_is_final(self) -> bool:
        """An abort is due and this rank's hang dump is written: control refuses any later dump, which
        could only show the failures our exit causes (a peer's closed connection, the launcher's SIGTERM)."""
        return self.abort_at is not None and self.dump_written

    def hung(self, what: str, written: bool, confirmed: bool = True) -> None:
        """A hang dump was taken (`written`: it is in the folder). `confirmed` False: the timeout cannot
        tell a hang from a long compute phase (a C++-issued op whose completion cannot be observed)."""
        abort = confirmed and self.settings.on_hang == "abort"
        self.dump_written = self.dump_written or written
        if confirmed not in self._said:
            self._said.add(confirmed)
            log.warn(self._line(what, written, confirmed, abort))
        if abort and self.abort_at is None:
            self.what = what
            self.abort_at = time.monotonic() + self.settings.abort_grace_s

    def recovered(self) -> None:
        """The op the hang was declared for completed (recovery.py): a later hang is told again."""
        self._said.clear()
        self.dump_written = False

    def _line(self, what: str, written: bool, confirmed: bool, abort: bool) -> str:
        where = f"{self.folder} on {socket.gethostname()}" if written else f"{self.folder} (this rank's dump could not be written)"
        head = "the job is hung" if confirmed else "the job may be hung (or computing for longer than FLIGHTREC_TIMEOUT)"
        if abort:
            then = (f"FLIGHTREC_ON_HANG=abort: this rank exits in {self.settings.abort_grace_s:g} s, once the others "
                    "have written their dumps, so that the launcher can restart the job")
        elif confirmed:
            then = "FLIGHTREC_ON_HANG=wait: the job stays up until it is stopped (FLIGHTREC_ON_HANG=abort ends it)"
        elif self.settings.on_hang == "abort":
            then = ("FLIGHTREC_ON_HANG=abort does not end the job on this: PyTorch's recorder (TORCH_FR_BUFFER_SIZE) "
                    "would tell a hang from a long compute phase")
        else:
            then = "the job stays up"
        return f"{head}: {what}; dumps in {where}; see `flightrec analyze {self.folder}`; {then}"

    def due(self) -> bool:
        return self.abort_at is not None and time.monotonic() >= self.abort_at

    def abort(self) -> None:
        """Flush what the job printed, say why on stderr, and exit non-zero (never returns)."""
        _flush_bounded()
        message = (f"flightrec: aborting rank {_rank()}: hung in {self.what}; dumps in {self.folder}; "
                   f"FLIGHTREC_ON_HANG=abort (exit code {ABORT_EXIT_CODE})\n")
        try:
            os.write(2, message.encode("utf-8", "replace"))  # no lock a stuck thread could hold
        except OSError:
            pass
        os._exit(ABORT_EXIT_CODE)


def _flush_bounded() -> None:
    """Flush stdout, stderr and the logging handlers, giving up after FLUSH_BOUND_S (a full pipe)."""

    def flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except Exception:  # noqa: BLE001 - closed or broken: nothing to save
                pass
        for ref in list(getattr(logging, "_handlerList", [])):
            handler = ref() if callable(ref) else None
            try:
                if handler is not None:
                    handler.flush()
            except Exception:  # noqa: BLE001
                pass

    worker = threading.Thread(target=flush, name="flightrec-abort-flush", daemon=True)
    worker.start()
    worker.join(FLUSH_BOUND_S)
