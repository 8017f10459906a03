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

Naming the suspect: every member of the group a confirmed hang is in appends where it is in that group
(`rank:entered;`, its count of the group's collectives entered) to one store key per hang position, once,
when it learns of the hang (its own timeout or a peer's request). A member that has not entered the op
the others wait in, or that never answered, is a suspect; nobody is a suspect when every member answered
and had entered it (then the abort line says "suspect unknown"). Ties are never broken: every suspect is
named. A rank that is not a suspect, while a suspect that answered (alive, so it aborts on its own) is
still up, holds its exit up to HOLD_FOR_SUSPECT_S past its grace period: the suspect exits first, so
torchrun's "Root Cause (first observed failure)" is the suspect (torchrun stops the others with SIGTERM,
which ends them at once with the same line; an op of theirs that fails because the suspect's connections
closed waits AFTER_SUSPECT_S first, for the same reason). Each rank also writes its abort line into torchrun's error
file (TORCHELASTIC_ERROR_FILE) so the root-cause section shows it, suspect named, whichever rank it is.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass

from .. import log
from ..identity import process_rank
from ..settings import Settings

ABORT_EXIT_CODE = 75  # EX_TEMPFAIL ("try again later"); torchrun counts any non-zero exit as a failed worker
HANG_REQUEST = "timeout on rank"  # how a peer request caused by a timeout begins (watchdog._ask_peers)
UNCONFIRMED_REQUEST = "possible hang on rank"  # a timeout that may be a long compute phase: never aborts
FLUSH_BOUND_S = 2.0  # a stream blocked on a full pipe must not keep a hung process alive
POSITIONS_KEY = "flightrec/hang-position"  # + /<restart attempt>/<group>/<seq>: the members' answers
# An innocent rank whose op fails because the suspect exited (its connections closed) waits this long
# before it exits: the launcher (torchrun polls every 0.1 s by default) sees the suspect's exit alone
# first, then stops this rank with SIGTERM, which ends it at once.
AFTER_SUSPECT_S = 1.0
HOLD_FOR_SUSPECT_S = 2.0  # past the grace period: a suspect's own deadline, one store poll later, plus the launcher's poll
_PEER = re.compile(r"^(?:timeout|possible hang) on rank (\S+): (.*)$", re.S)


def peer_what(request: str) -> str:
    """'timeout on rank 0: all_reduce ... incomplete after 2.1s' -> 'all_reduce ... incomplete after 2.1s on rank 0'."""
    m = _PEER.match(request)
    return f"{m.group(2)} on rank {m.group(1)}" if m else request


def _rank() -> str:
    rank = process_rank()[0]
    return str(rank) if rank >= 0 else "?"


def position_key(attempt: int, group: str, seq: int) -> str:
    return f"{POSITIONS_KEY}/{attempt}/{group}/{seq}"


def parse_answers(text: str) -> dict[int, int]:
    """'0:3;2:2;' -> {0: 3, 2: 2} (rank -> collectives of the group it entered); bad items are skipped."""
    out: dict[int, int] = {}
    for item in text.split(";"):
        rank, _, entered = item.partition(":")
        if rank.strip().isdigit() and entered.strip().lstrip("-").isdigit():
            out[int(rank)] = int(entered)
    return out


@dataclass
class Suspects:
    """Who holds the op a hang was declared at (group, seq), from the members' answers in the store."""

    group: str
    seq: int
    behind: list[int]  # answered, and has not entered the op
    silent: list[int]  # a member that did not answer (dead, or its watchdog cannot run); empty: members unknown

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self.behind) | set(self.silent))

    def text(self, me: int | None) -> str:
        """'suspect: rank 2 (not in group=0 seq=3 yet; this rank)'; '' when no one is suspected."""
        parts = []
        if self.behind:
            parts.append(f"{_ranks(self.behind)} (not in group={self.group} seq={self.seq} yet)")
        if self.silent:
            parts.append(f"{_ranks(self.silent)} (did not answer the dump request)")
        if not parts:
            return ""
        mine = "; this rank" if me is not None and me in self.ranks else ""
        head = "suspect" if len(self.ranks) == 1 else "suspects"
        return f"{head}: {', '.join(parts)}{mine}"


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, sorted(ranks)))}"


def find_suspects(group: str, seq: int, answers: dict[int, int], members: list[int] | None) -> Suspects:
    """Members behind the op, and members that never answered (only when this rank knows the members)."""
    behind = sorted(r for r, entered in answers.items() if entered < seq and (members is None or r in members))
    silent = sorted(set(members) - set(answers)) if members else []
    return Suspects(group, seq, behind, silent)


class HangAction:
    """Told of every hang dump by the watchdog; logs the hang once and, with `abort`, ends the process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.folder = os.path.abspath(settings.dir)
        self.abort_at: float | None = None  # monotonic time the process exits at; None: no abort due
        self.what = ""
        self.dump_written = False  # a hang dump of this rank is in the folder
        self._said: set[bool] = set()  # which lines were logged: confirmed (True), unconfirmed (False)
        self.position: tuple[str, int, list[int] | None] | None = None  # (group, seq, members) of `what`
        self.suspects: Suspects | None = None  # read from the store while the abort is due (watchdog)
        self.held = False  # this rank's exit was put off once for a suspect to exit first

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
        """The op the hang was declared for completed (watch/recovery.py): a later hang is told again."""
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

    def hold(self, me: int | None) -> bool:
        """At the deadline: put the exit off once, by the grace period and HOLD_FOR_SUSPECT_S, when this
        rank is not a suspect and a suspect answered (it is alive and aborts on its own deadline), so that
        the suspect's exit is the launcher's first failure. True when put off."""
        sus = self.suspects
        if self.held or sus is None or not sus.behind or me is None or me in sus.ranks:
            return False
        self.held = True
        self.abort_at = time.monotonic() + self.settings.abort_grace_s + HOLD_FOR_SUSPECT_S
        return True

    def peer_ended(self, me: int | None, block: bool) -> None:
        """An op failed while this rank's hang dump is final: a peer ended (the suspect, or a rank at its own
        deadline). Exit, AFTER_SUSPECT_S later when this rank is not a suspect and a suspect answered, so
        that the launcher's first failure is the suspect. `block`: wait and exit here (the op's calling
        thread, never returns); else bring the watchdog's deadline forward."""
        sus = self.suspects
        innocent = me is not None and sus is not None and bool(sus.behind) and me not in sus.ranks
        wait = AFTER_SUSPECT_S if innocent else 0.0
        if block:
            time.sleep(wait)  # a SIGTERM meanwhile ends the process from the watchdog thread
            self.abort()
        self.held = True
        now = time.monotonic()
        self.abort_at = min(self.abort_at if self.abort_at is not None else now + wait, now + wait)

    def suspect_text(self) -> str:
        """Who the abort line names; never a guess: 'suspect unknown' when the answers do not tell."""
        named = self.suspects.text(_known_rank()) if self.suspects is not None else ""
        return named or f"suspect unknown: run flightrec analyze {self.folder}"

    def abort_line(self) -> str:
        return (f"flightrec: aborting rank {_rank()}: hung in {self.what}; {self.suspect_text()}; "
                f"dumps in {self.folder} on {socket.gethostname()}; FLIGHTREC_ON_HANG=abort (exit code {ABORT_EXIT_CODE})")

    def abort(self) -> None:
        """Flush what the job printed, say why on stderr and in the launcher's error file, and exit
        non-zero (never returns)."""
        _flush_bounded()
        message = self.abort_line()
        try:
            os.write(2, (message + "\n").encode("utf-8", "replace"))  # no lock a stuck thread could hold
        except OSError:
            pass
        write_error_file(message)
        os._exit(ABORT_EXIT_CODE)


def _known_rank() -> int | None:
    rank = process_rank()[0]
    return rank if rank >= 0 else None


def write_error_file(message: str, env: dict[str, str] | None = None) -> None:
    """torchrun's error file (TORCHELASTIC_ERROR_FILE), in the layout its ErrorHandler writes: the
    "Root Cause" section then shows our line instead of "To enable traceback see ...". Its timestamp
    is when we exit, so a rank stopped after the suspect exited never reads as the earlier failure.
    An existing file (the job's own @record) is left alone."""
    path = (os.environ if env is None else env).get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    data = {"message": {"message": message, "extraInfo": {"py_callstack": message, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
    except OSError:
        pass  # the line on stderr says the same


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
