"""Per-process-group bookkeeping: membership, sequence numbers, C++-issued op detection.

Collective sequence numbers are counted here rather than taken from the backend, because gloo's
backend counter also advances on p2p ops, which only the two peers see; counting collectives only
keeps the number identical on every member. Collectives that never pass through Python (DDP's C++
Reducer, functional collectives) still advance the backend counter: a jump of that counter that no
recorded op explains is one or more C++ collectives.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


def _no_sequence_number() -> int:
    return -1


class GroupState:
    __slots__ = (
        "pg", "name", "desc", "backend", "ranks", "rank_in_group", "coll_seq", "sent", "received",
        "last_pg_seq", "busy", "read_seq",
    )

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
        self.read_seq = pg._get_sequence_number_for_group  # the hot path calls this directly
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

    def global_rank(self, group_rank: int) -> int:
        if 0 <= group_rank < len(self.ranks):
            return self.ranks[group_rank]
        return -1

    def table_row(self) -> dict[str, object]:
        return {
            "name": self.name,
            "desc": self.desc,
            "backend": self.backend,
            "ranks": list(self.ranks),
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
    """Groups keyed by ProcessGroup object; non-members are remembered as None."""

    def __init__(self) -> None:
        self.by_pg: dict[Any, GroupState | None] = {}

    def get(self, pg: Any) -> GroupState | None:
        try:
            return self.by_pg[pg]
        except KeyError:
            state = describe_group(pg)
            self.by_pg[pg] = state
            return state

    def known(self) -> list[GroupState]:
        return [g for g in list(self.by_pg.values()) if g is not None]

    def discover(self) -> None:
        """Register every group this process created (C++ ops can run on groups Python never used)."""
        try:
            pgs = list(dist.distributed_c10d._world.pg_map.keys())
        except Exception:  # noqa: BLE001 - changing under us; next tick
            return
        for pg in pgs:
            if pg not in self.by_pg:
                self.get(pg)

    def live(self) -> list[GroupState]:
        """Known groups that still exist (a destroyed group must not be asked for its counter)."""
        try:
            alive = dist.distributed_c10d._world.pg_map
        except Exception:  # noqa: BLE001
            return []
        return [g for g in self.known() if g.pg in alive]

    def clear(self) -> None:
        self.by_pg.clear()
