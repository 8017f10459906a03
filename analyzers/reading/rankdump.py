"""What a reader hands back for one file: a rank's normalised entries plus what the file says about it.

Why a separate type: readers run in worker processes; this small picklable record is the whole
interface between "a file on disk, in any supported format" and the analysis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .columns import Columns, Templated


class DumpError(Exception):
    """A file that cannot be used; the message is the one-line reason shown to the user."""


@dataclass
class GroupInfo:
    """One process group as one rank saw it. `ranks` is None when the dump does not say."""

    name: str
    desc: str = ""
    backend: str = ""
    ranks: tuple[int, ...] | range | None = None  # a range only until SharedMembers makes it a shared tuple


@dataclass
class RankDump:
    """One readable dump file, normalised."""

    rank: int
    file: str
    fmt: str
    entries: Columns | Templated  # normalised columns (see columns.py), or Templated from a lazy read; emptied once merged
    groups: list[GroupInfo] = field(default_factory=list)
    threads: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    pg_status: dict[str, dict[str, int]] | None = None
    # False when the format cannot observe completion (PyTorch 2.13 gloo: `retired` even on timeouts).
    completion_reliable: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def dropped(self) -> int:
        """Entries the ring overwrote before the dump (0 when unknown)."""
        return int(self.meta.get("dropped") or 0)


@dataclass
class SideFile:
    """A file that belongs beside a rank's dump rather than being one: torch_npu's `<prefix><rank>_py_traceback`
    (every thread's Python stack; the loader hands its `threads` to that rank's dump), or flightrec's
    held-GIL stacks file (`kind` "gil_stacks", gil_stacks.py: evidence for a rank that wrote no dump)."""

    file: str
    rank: int | None
    threads: list[dict[str, Any]] = field(default_factory=list)
    kind: str = "py_traceback"
    meta: dict[str, Any] = field(default_factory=dict)
    written_ns: int | None = None  # the file's modification time (wall clock, ns), where the reader can see it


@dataclass
class FileProblem:
    """A file that could not be used, with the rank its name implies (None when it names none)."""

    file: str
    reason: str
    rank: int | None = None

    def line(self) -> str:
        """The one-line message for the user."""
        return f"{self.file}: {self.reason}"


class SharedMembers:
    """Makes every dump's copy of a group's member list one shared tuple, as results arrive.

    Why: each rank records the world group's members; 16,384 dumps each holding 16,384 ints would
    take ~10 GB (ints above 256 are separate objects), one shared tuple takes 0.6 MB.
    """

    def __init__(self, keep_ranges: bool = False) -> None:
        self.keep_ranges = keep_ranges  # a reader process: ranges cross to the parent as three numbers
        self._seen: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._by_id: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # id -> (object, shared)
        self._ranges: dict[range, tuple[int, ...]] = {}

    def __call__(self, result: RankDump | FileProblem) -> RankDump | FileProblem:
        if isinstance(result, RankDump):
            for g in result.groups:
                if g.ranks is not None and not (self.keep_ranges and isinstance(g.ranks, range)):
                    g.ranks = self._share(g.ranks)
        return result

    def _share(self, ranks: tuple[int, ...] | range) -> tuple[int, ...]:
        """Dumps read by one worker already share their tuples: an object seen before is found by
        its id (held here, so the id cannot be reused), without hashing 16,384 ints per dump. A
        range (evenly spaced members, as dumps write them from 16 on) hashes in constant time."""
        if isinstance(ranks, range):
            shared = self._ranges.get(ranks)
            if shared is None:
                members = tuple(ranks)
                shared = self._ranges[ranks] = self._seen.setdefault(members, members)
            return shared
        known = self._by_id.get(id(ranks))
        if known is not None:
            return known[1]
        shared = self._seen.setdefault(ranks, ranks)
        self._by_id[id(ranks)] = (ranks, shared)
        return shared
