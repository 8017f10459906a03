"""How ranks ended: crashed with an error, failed because a peer went away, terminated, exited.

Why: when one rank dies, its peers fail one after another with "connection closed by peer" (or are
terminated by the launcher), and each of those dumps looks like a failure of its own. Ordering the
failures in time and telling a rank's own error from a consequence of a peer's death names the one
rank that started it; a rank that left no dump while its peers report lost connections died first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..reading.rankdump import RankDump

# Errors a rank gets because another process went away: consequences, never a root cause.
PEER_ERROR = re.compile(
    r"connection (closed|reset) by peer|broken pipe|connection refused|socket closed|end of file|"
    r"remote (process|worker|peer) (exited|closed|died)|peer .*(closed|exited|died)|"
    r"NCCL communicator was aborted|ProcessGroup.*abort|HCCL.*(link|socket).*(down|fail)",
    re.IGNORECASE,
)
# Errors a rank gets because a collective did not finish in time: a symptom of a hang elsewhere.
TIMEOUT_ERROR = re.compile(r"timed out|timeout|deadline exceeded", re.IGNORECASE)
PEER_ADDRESS = re.compile(r"\[((?:\d{1,3}\.){3}\d{1,3}|[0-9a-fA-F]*:[0-9a-fA-F:]+)\]:(\d{2,5})")

ERROR = "error"  # the rank's own exception: a crash
PEER_LOST = "peer_error"
TIMED_OUT = "timeout"
TERMINATED = "terminated"
EXITED = "exited"
FAILING_REASONS = ("exception", "op_failed", "abort")


@dataclass
class Failure:
    """One rank's end (or failure) as its dump tells it; `t_wall_ns` is when it was seen."""

    rank: int
    kind: str
    t_wall_ns: int | None
    text: str
    peer_address: str | None = None

    def item(self) -> dict[str, Any]:
        """The report's `failures` item."""
        out: dict[str, Any] = {"rank": self.rank, "kind": self.kind, "time_ns": self.t_wall_ns, "text": self.text}
        if self.peer_address:
            out["peer_address"] = self.peer_address
        return out


def classify(text: str) -> str:
    """error, peer_error or timeout, from an exception's text."""
    if PEER_ERROR.search(text):
        return PEER_LOST
    if TIMEOUT_ERROR.search(text):
        return TIMED_OUT
    return ERROR


def _error_text(d: RankDump) -> str:
    exc = d.meta.get("exception")
    if isinstance(exc, dict) and exc.get("message") is not None:
        return f"{exc.get('type', 'Exception')}: {exc.get('message')}"
    return str(d.meta.get("reason_detail") or d.meta.get("reason") or "")


def find_failures(dumps: dict[int, RankDump]) -> list[Failure]:
    """Every rank whose dump says it failed, was terminated or exited, oldest first (unknown times last)."""
    out: list[Failure] = []
    for rank, d in dumps.items():
        reason = str(d.meta.get("reason") or "")
        when = d.meta.get("dump_time_ns") if isinstance(d.meta.get("dump_time_ns"), int) else None
        if reason in FAILING_REASONS:
            text = _error_text(d)
            kind = classify(text)
            address = PEER_ADDRESS.search(text) if kind == PEER_LOST else None
            out.append(Failure(rank, kind, when, text[:600], f"{address.group(1)}:{address.group(2)}" if address else None))
        elif reason == "signal":
            out.append(Failure(rank, TERMINATED, when, str(d.meta.get("reason_detail") or "terminated by signal")))
        elif reason == "exit":
            out.append(Failure(rank, EXITED, when, "exited normally"))
    out.sort(key=lambda f: (f.t_wall_ns is None, f.t_wall_ns or 0, f.rank))
    return out


def exited_ranks(dumps: dict[int, RankDump]) -> set[int]:
    """Ranks whose dump was written as they exited normally: they wait for nobody."""
    return {r for r, d in dumps.items() if d.meta.get("reason") == "exit"}


def _first_peer_error(failures: list[Failure]) -> int | None:
    times = [f.t_wall_ns for f in failures if f.kind == PEER_LOST and f.t_wall_ns is not None]
    return min(times) if times else None


def _consequences_text(failures: list[Failure], skip: set[int]) -> str:
    """'ranks 0, 2 then lost their connection (Connection closed by peer [127.0.0.1]:63143); rank 3 was terminated'."""
    from ..textutil import ranges

    lost = [f for f in failures if f.kind == PEER_LOST and f.rank not in skip]
    parts = []
    if lost:
        addresses = sorted({f.peer_address for f in lost if f.peer_address})
        named = f" (they name peer address{'es' if len(addresses) > 1 else ''} {', '.join(addresses)})" if addresses else ""
        parts.append(f"rank{'s' if len(lost) > 1 else ''} {ranges(f.rank for f in lost)} then failed with a lost "
                     f"connection{named}")
    for kind, verb in ((TIMED_OUT, "timed out"), (TERMINATED, "terminated (by the launcher)")):
        ended = [f for f in failures if f.kind == kind and f.rank not in skip]
        if ended:
            parts.append(f"rank{'s' if len(ended) > 1 else ''} {ranges(f.rank for f in ended)} "
                         f"{'were' if len(ended) > 1 else 'was'} {verb} afterwards")
    return "; ".join(parts)


def crash_roots(failures: list[Failure], absent: set[int]) -> tuple[list[Failure], set[int]]:
    """The failures that started it: the ranks' own errors raised before any lost connection (in time
    order), and, when peers lost their connections but no rank reported an error of its own, the
    ranks that left no dump (they died first, without a word: killed, segfault, os._exit, OOM).
    Returns (own errors that are root causes, ranks without a dump that crashed)."""
    first_lost = _first_peer_error(failures)
    own = [f for f in failures if f.kind == ERROR
           and (first_lost is None or f.t_wall_ns is None or f.t_wall_ns <= first_lost)]
    silent = set(absent) if not own and any(f.kind == PEER_LOST for f in failures) else set()
    return own, silent


def deserters(failures: list[Failure], entered: dict[tuple[int, str], int],
              members: dict[str, tuple[int, ...]], stranded: frozenset[int] = frozenset()) -> dict[int, list[int]]:
    """Ranks that left cleanly while others still ran: an `exited` rank that entered fewer ops of a group
    than a member that then failed (a lost connection, a timeout), or that exited with a collective still
    in flight (`stranded`: on a device backend its host left while its stream still waited). That member
    issued ops the leaver never joined, so they could not complete: it left one op early (a skipped
    backward, uneven data) and took the others down. Returns leaver -> the ranks it left behind.
    `entered`: (rank, group) -> the last seq the rank entered (its progress counters)."""
    failed = {f.rank for f in failures if f.kind in (PEER_LOST, TIMED_OUT)} | set(stranded)
    out: dict[int, list[int]] = {}
    for f in failures:
        if f.kind != EXITED:
            continue
        left = {m for g, ranks in members.items() if f.rank in ranks and (f.rank, g) in entered
                for m in ranks if m in failed and entered.get((m, g), -1) > entered[(f.rank, g)]}
        if left:
            out[f.rank] = sorted(left)
    return out


def unexplained(failures: list[Failure]) -> list[Failure]:
    """Failures other than a clean exit: a rank raised, lost its connection, timed out or was stopped."""
    return [f for f in failures if f.kind != EXITED]


def failures_text(failures: list[Failure], limit: int = 3) -> str:
    """'ranks 0-1, 3 failed with a lost connection; rank 2 was terminated' (kinds in time order)."""
    from ..textutil import ranges

    kinds: dict[str, list[int]] = {}
    for f in failures:
        kinds.setdefault(f.kind, []).append(f.rank)
    parts = [f"rank{'s' if len(rs) > 1 else ''} {ranges(rs)} {ended_words(k, len(rs))}" for k, rs in list(kinds.items())[:limit]]
    return "; ".join(parts)


def ended_words(kind: str, count: int) -> str:
    """How a failure kind reads after 'rank 3' / 'ranks 0-2'."""
    were = "were" if count > 1 else "was"
    return {ERROR: "raised an error", PEER_LOST: "failed with a lost connection", TIMED_OUT: "timed out",
            TERMINATED: f"{were} stopped by a signal", EXITED: "exited normally"}.get(kind, kind)


def explain(rank: int, failures: list[Failure], own: list[Failure], silent: set[int]) -> str:
    """The detail line of a `crashed` root cause."""
    from ..textutil import ranges

    mine = next((f for f in own if f.rank == rank), None)
    if mine is not None:
        head = f"rank {rank} crashed with {mine.text}"
    else:
        head = (f"rank {rank} died without leaving a dump (killed, segfault, os._exit or out of memory) while its "
                "peers lost their connections to it")
        if len(silent) > 1:
            head += f"; ranks {ranges(silent)} all left no dump: which of them died first cannot be told"
    tail = _consequences_text(failures, skip={rank})
    return head + (f"; {tail}" if tail else "")
