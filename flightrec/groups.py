"""Per-process-group bookkeeping: membership, sequence numbers, C++-issued op detection.

Collective sequence numbers are counted here rather than taken from the backend, because gloo's
backend counter also advances on p2p ops, which only the two peers see; counting collectives only
keeps the number identical on every member. Collectives that never pass through Python (DDP's C++
Reducer, functional collectives) still advance the backend counter: a jump of that counter that no
recorded op explains is one or more C++ collectives.
"""

from __future__ import annotations

import threading
from typing import Any

import torch.distributed as dist

from . import peek
from .members import compact_ranks
from .storage import c_base


def _no_sequence_number() -> int:
    return -1


class _PyStorage:
    """GroupState's fields as Python slots: the storage when the C hot path is not built."""

    __slots__ = (
        "pg", "name", "desc", "backend", "ranks", "rank_in_group", "coll_seq", "sent", "received",
        "last_pg_seq", "busy", "read_seq", "steps", "steps_gen",
    )


_Storage: type = c_base("GroupBase") or _PyStorage  # storage.py: why the counters may live in C
FIELDS = _PyStorage.__slots__


class GroupState(_Storage):  # type: ignore[misc, valid-type]
    __slots__ = ()

    def __init__(self, pg: Any, name: str, desc: str, backend: str, ranks: list[int], rank_in_group: int):
        self.pg = pg
        self.name = name
        self.desc = desc
        self.backend = backend
        self.ranks = ranks
        self.rank_in_group = rank_in_group
        self.sent: dict[int, int] = {}
        self.received: dict[int, int] = {}
        self.busy = 0  # wrapped ops of this group in flight: their seq jumps are not C++ ops
        self.steps: dict[str, list[int]] = {}  # api -> [counter step per call, calls in a row] (recorder)
        self.steps_gen = 0  # bumped when a step in `steps` changes: the C hot path caches a trusted one
        # The hot path calls this directly; the built torch reader (peek.py) skips pybind's dispatch.
        self.read_seq = peek.seq_reader(pg) or pg._get_sequence_number_for_group
        self.last_pg_seq = self.backend_seq()
        # Ops the group ran before we saw it are assumed to be collectives.
        self.coll_seq = max(self.last_pg_seq, 0)

    def backend_seq(self) -> int:
        """The backend's own counter, or -1 where a backend does not keep one."""
        try:
            return int(self.read_seq())
        except Exception:  # noqa: BLE001 - custom backends may not implement it
            self.read_seq = _no_sequence_number
            return -1

    def continue_from(self, previous: GroupState) -> None:
        """A new group under a name PyTorch reused: number on from the destroyed one's counters."""
        self.coll_seq += previous.coll_seq
        for mine, theirs in ((self.sent, previous.sent), (self.received, previous.received)):
            for peer, count in theirs.items():
                mine[peer] = mine.get(peer, 0) + count

    def release(self) -> None:
        """Drop the ProcessGroup (destroyed): nothing of ours may keep its sockets alive."""
        self.pg = None
        self.read_seq = _no_sequence_number

    def global_rank(self, group_rank: int) -> int:
        if 0 <= group_rank < len(self.ranks):
            return self.ranks[group_rank]
        return -1

    def table_row(self) -> dict[str, object]:
        return {
            "name": self.name,
            "desc": self.desc,
            "backend": self.backend,
            "ranks": compact_ranks(self.ranks),
            "size": len(self.ranks),
            "rank_in_group": self.rank_in_group,
        }


def describe_group(pg: Any) -> GroupState | None:
    """A GroupState for `pg`, or None when this rank is not a member (the API is then a no-op)."""
    if pg is None or pg is dist.GroupMember.NON_GROUP_MEMBER:
        return None
    rank_in_group = dist.get_rank(pg)
    if rank_in_group < 0:
        return None
    ranks = list(dist.get_process_group_ranks(pg))
    try:
        backend = str(dist.get_backend(pg))
    except Exception:  # noqa: BLE001
        backend = "unknown"
    name = str(getattr(pg, "group_name", "") or "")
    desc = str(getattr(pg, "group_desc", "") or "")
    return GroupState(pg, name, desc, backend, ranks, rank_in_group)


class GroupRegistry:
    """Groups keyed by ProcessGroup object; non-members are remembered as None.

    A destroyed group is let go at once (`destroy_process_group` is wrapped): holding its
    ProcessGroup keeps its sockets open, and PyTorch reuses group names (hashed names of
    `use_local_synchronization`, or "0", "1", ... after a full re-init), so a kept-alive group makes
    the next group of that name hang in its rendezvous. What stays is its table row (for entries
    still in the ring) and its counters: a later group of the same name continues the numbering,
    so (group, seq) stays unique and identical on every member.
    """

    def __init__(self, max_retired: int = 1024) -> None:
        self.by_pg: dict[Any, GroupState | None] = {}
        self.retired: dict[str, GroupState] = {}  # by name, oldest first, at most max_retired
        self.max_retired = max_retired
        # taken only on a miss (a group seen for the first time) and by discover(): the training
        # thread and the watchdog must not both describe one group and inherit its counters twice
        self._lock = threading.RLock()

    def get(self, pg: Any) -> GroupState | None:
        try:
            return self.by_pg[pg]
        except KeyError:
            pass
        with self._lock:
            if pg in self.by_pg:
                return self.by_pg[pg]
            state = describe_group(pg)
            if state is not None:
                previous = self.retired.pop(state.name, None)
                if previous is not None:
                    state.continue_from(previous)
            self.by_pg[pg] = state
            return state

    def known(self) -> list[GroupState]:
        return [g for g in list(self.by_pg.values()) if g is not None]

    def table(self) -> list[dict[str, object]]:
        """Rows of live groups, then of destroyed ones whose entries may still be in the ring."""
        live = [g.table_row() for g in self.known()]
        names = {row["name"] for row in live}
        return live + [g.table_row() for g in list(self.retired.values()) if g.name not in names]

    def discover(self) -> None:
        """Register every group this process created (C++ ops can run on groups Python never used),
        and let go of the destroyed ones."""
        with self._lock:
            try:
                alive = dist.distributed_c10d._world.pg_map
                pgs = list(alive.keys())
            except Exception:  # noqa: BLE001 - changing under us; next tick
                return
            for pg in pgs:
                if pg not in self.by_pg:
                    try:
                        self.get(pg)
                    except Exception:  # noqa: BLE001 - destroyed while we looked: retired below
                        pass
            del pgs
            for pg in [pg for pg in list(self.by_pg) if pg not in alive]:
                self._retire(pg)

    def _retire(self, pg: Any) -> None:
        state = self.by_pg.pop(pg, None)
        if state is None:
            return
        state.release()
        self.retired.pop(state.name, None)
        self.retired[state.name] = state
        while len(self.retired) > self.max_retired:
            del self.retired[next(iter(self.retired))]

    def live(self) -> list[GroupState]:
        """Known groups that still exist (a destroyed group must not be asked for its counter)."""
        try:
            alive = dist.distributed_c10d._world.pg_map
        except Exception:  # noqa: BLE001
            return []
        return [g for g in self.known() if g.pg in alive]

    def clear(self) -> None:
        self.by_pg.clear()
        self.retired.clear()
