"""Each root-cause kind in words, in one place: what it means, and how a report's first line names it.

Why one table: the report's one-line `summary` (analysis.py), the text report's headline and its
root-cause lines (reporting/render.py) all name the first root cause. Each spelled the kinds out in an
if-chain of its own, so a kind added or reworded in one view drifted from the others. Here each kind is
one row; a view picks the row and a variant, and fills in the slots from its own data.

The summary is the terse form (the kind's code: `rank 1 mismatch in all_reduce (group 0, seq 3)`,
which scripts and tests search for), where the code alone does not mislead; the headline says the same
in plain words, with the position as the text report writes it (`all_reduce #3 of group 0 [0-3] (world)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..constants import COMM_STUCK, CRASHED, EXITED, KIND_DEADLOCK, MISMATCH, MISSING_DUMP, NOT_ENTERED
from ..textutil import ranges

# The summary's terse form: the kind's code, and the position (variant "no_op": a cause without an op).
TERSE = {"": "{me} {kind} in {op} (group {group}, seq {seq})", "no_op": "{me} {kind}"}


@dataclass(frozen=True)
class KindWords:
    """One root-cause kind's words. Templates take `str.format` slots: `me` (`rank 3`), `who` (the ranks a
    cause names), `at` (its position, as the view writes it), `op`, `group`, `seq`, and those a variant
    names. Variant "" is the usual case."""

    meaning: str  # the text report's root-cause line: `root cause: rank 5 — <meaning> [not_entered]`
    headline: dict[str, str]  # variant -> the text report's first line, after `HANG: `
    summary: dict[str, str] = field(default_factory=lambda: TERSE)  # variant -> the JSON summary, after `hang: `
    victims: str = "waiting on it"  # the ranks it holds up, counted: `3 ranks waiting on it`
    waiters: str = "for it"  # the ranks waiting directly, named: `rank 0 waits for it`


CAUSE_WORDS: dict[str, KindWords] = {
    NOT_ENTERED: KindWords(
        meaning="never reached the op its peers wait in",
        headline={"": "{me} never reached {at}",
                  "alive": "{me} is alive, not answering: holding the GIL at {frame}; it never reached {at}"},
    ),
    MISSING_DUMP: KindWords(
        meaning="left no usable dump",
        headline={"": "{me} left no usable dump, and its peers wait for it in {at}"},
    ),
    MISMATCH: KindWords(
        meaning="called an op its peers did not",
        headline={"": "{me} entered an op its peers did not, at {where}",
                  "op": "{me} called {mine} where its peers called {theirs}, at {where}",
                  "field": "{me}'s {op} at {where} has {field} {mine} where its peers have {theirs}",
                  # no majority, and the op streams cannot tell who diverged (or a p2p pair): all are named
                  "undecided": "{who} disagree at {at}, and the dumps cannot tell which one diverged"},
        summary={**TERSE, "undecided": "{who} disagree in {op} (group {group}, seq {seq}) and the evidence cannot "
                                      "tell which one diverged"},
    ),
    COMM_STUCK: KindWords(
        meaning="every member entered the op, and it never completed (suspect the link or device)",
        headline={"": "every member of group {group_name} entered {op_at} and it never completed: suspect the "
                      "link or device of {who}"},
    ),
    KIND_DEADLOCK: KindWords(
        meaning="waits in a cycle",
        headline={"": "{who} wait for each other: {inside}"},
        waiters="behind them",
    ),
    CRASHED: KindWords(
        meaning="crashed",
        headline={"": "{me} crashed{exception}"},
        summary={"": "{me} crashed (awaited in {op}, group {group}, seq {seq})", "no_op": "{me} crashed"},
        victims="failed, were stopped or wait after it",
    ),
    EXITED: KindWords(
        meaning="exited while its peers still wait for it",
        headline={"": "{me} exited while its peers still wait for it in {at}",
                  # peers that went on without it failed on the connection it closed
                  "deserted": "{me} exited while its peers still ran {at}; {failed} then failed on the lost connection"},
        summary={"": "{me} exited normally before {op} (group {group}, seq {seq})", "no_op": "{me} exited normally"},
    ),
}


def words(kind: str) -> KindWords:
    """A kind's row; a kind the table does not know is named by its code."""
    return CAUSE_WORDS.get(kind) or KindWords(meaning=kind, headline={})


def summary_words(kind: str, rank: int, ranks: list[int], op: str | None, group: str | None, seq: int | None) -> str:
    """The first root cause as the JSON summary names it: `rank 1 mismatch in all_reduce (group 0, seq 3)`."""
    undecided = kind == MISMATCH and len(ranks) > 1  # never one rank picked by its number
    variant = "undecided" if undecided else "" if op else "no_op"
    return words(kind).summary[variant].format(me=f"rank {rank}", who=f"ranks {ranges(ranks)}", kind=kind, op=op,
                                               group=group, seq=seq)


def headline_words(kind: str, variant: str = "", **slots: object) -> str:
    """The first root cause as the text report's headline names it (render.headline fills the slots)."""
    return words(kind).headline[variant].format(**slots)
