"""Per-process-group bookkeeping: membership, sequence numbers, C++-issued op detection.

Collective sequence numbers are counted here rather than taken from the backend, because gloo's
backend counter also advances on p2p ops, which only the two peers see; counting collectives only
keeps the number identical on every member. Collectives that never pass through Python (DDP's C++
Reducer, functional collectives) still advance the backend counter: a jump of that counter that no
recorded op explains is one or more C++ collectives.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .. import log
from ..format.backends import WAIT_MEANS_DONE, device_backend
from ..format.members import compact_ranks
from . import cpp_reader, torch_compat
from .group_timeouts import GroupTimeout, group_timeout
from .native import c_base


def _no_sequence_number() -> int:
    return -1


class _PyStorage:
    """GroupState's fields as Python slots: the storage when the C hot path is not built."""

    __slots__ = (
        "pg", "name", "desc", "backend", "ranks", "rank_in_group", "coll_seq", "sent", "received",
        "last_pg_seq", "busy", "read_seq", "steps", "steps_gen",
    )


_Storage: type = c_base("GroupBase") or _PyStorage  # record/native.py: why the counters may live in C
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
        # The hot path calls this directly; the built torch reader (cpp_reader.py) skips pybind's dispatch.
        self.read_seq = cpp_reader.seq_reader(pg) or pg._get_sequence_number_for_group
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


def _attribute(pg: Any, attr: str) -> str:
    """A ProcessGroup's name or desc; "" where unset (a custom backend's group raises instead)."""
    try:
        return str(getattr(pg, attr, "") or "")
    except Exception:  # noqa: BLE001 - RuntimeError("ProcessGroup name not set") on Python-made groups
        return ""


def _registered_name(pg: Any) -> str:
    """The name c10d registered the group under (its `pg_names`), for groups that do not carry one."""
    try:
        return str(c10d._world.pg_names.get(pg) or "")
    except Exception:  # noqa: BLE001 - private API: absent on some versions
        return ""


class StreamGroupState(GroupState):  # type: ignore[misc]
    """A group whose backend returns from `Work.wait()` before the op is done (NCCL, HCCL, a custom
    backend): its ops complete when their Work does, never when the call or its wait returns. Its own
    type keeps the C hot path (which completes blocking CPU calls on return) off its ops."""

    __slots__ = ()


def describe_group(pg: Any) -> GroupState | None:
    """A GroupState for `pg`, or None when this rank is not a member (the API is then a no-op)."""
    if pg is None or pg is dist.GroupMember.NON_GROUP_MEMBER:
        return None
    rank_in_group = dist.get_rank(pg)
    if rank_in_group < 0:
        return None
    ranks = torch_compat.group_ranks(pg)  # torch 2.1: the default group's members are set late
    try:
        backend = str(dist.get_backend(pg))
    except Exception:  # noqa: BLE001
        backend = "unknown"
    name = _attribute(pg, "group_name") or _registered_name(pg)
    desc = _attribute(pg, "group_desc")
    kind = GroupState if device_backend(backend, "cpu") in WAIT_MEANS_DONE else StreamGroupState
    return kind(pg, name, desc, backend, ranks, rank_in_group)


class GroupRegistry:
    """Groups keyed by ProcessGroup object; non-members are remembered as None.

    A destroyed group is let go at once (`destroy_process_group` is wrapped): holding its
    ProcessGroup keeps its sockets open, and PyTorch reuses group names (hashed names of
    `use_local_synchronization`, or "0", "1", ... after a full re-init), so a kept-alive group makes
    the next group of that name hang in its rendezvous.

    When this rank next creates a group, the destroyed ones are renamed `<name>@<digest of its
    members>` (`.2`, `.3` when the same members reuse the name again), in their table rows and in the
    entries still in the ring, and a later group of the same name numbers from 1. Why: that group may
    have other members, and a member that never saw the old group can only count from 1; every member
    of the old group renames it alike (same name, members and history). Not at the destroy itself: a
    rank that leaves (`destroy_process_group()` before exit) must keep the names its hung peers still
    use. Creating a group is a call every rank makes (or, for `use_local_synchronization`, every
    member: the only ranks that can reuse its hashed name).
    """

    def __init__(self, max_retired: int = 1024, relabel: Callable[[str, str], None] | None = None) -> None:
        self.by_pg: dict[Any, GroupState | None] = {}
        self.retired: dict[str, GroupState] = {}  # by name (label once renamed), oldest first, at most max_retired
        self.unlabeled: list[GroupState] = []  # destroyed, not renamed yet
        self.max_retired = max_retired
        self.relabel = relabel  # (name, label): rename the ring's entries of a destroyed group
        self._incarnations: dict[tuple[str, str], int] = {}  # (name, digest) -> times retired
        # group name -> its timeout (record/group_timeouts.py), read when the group is registered and re-read by
        # `refresh_timeouts`; `timeouts_gen` changes with it, so the watchdog re-derives its limits only then
        self.timeouts: dict[str, GroupTimeout | None] = {}
        self.timeouts_gen = 0
        # taken only on a miss (a group seen for the first time) and by discover(): the training
        # thread and the watchdog must not both describe one group and retire a namesake twice
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
            if state is not None:  # a namesake: destroyed, whether we saw it go or not
                for other_pg, other in list(self.by_pg.items()):
                    if other is not None and other.name == state.name:
                        self._retire(other_pg)
                if any(g.name == state.name for g in self.unlabeled):
                    self.relabel_retired()
                self._read_timeout(state)  # after the relabelling: a namesake's timeout moved with it
            self.by_pg[pg] = state
            return state

    def _read_timeout(self, state: GroupState) -> None:
        value = group_timeout(state.pg, state.backend)  # never raises
        if self.timeouts.get(state.name, False) != value:
            self.timeouts[state.name] = value
            self.timeouts_gen += 1

    def refresh_timeouts(self) -> None:
        """Re-read the live groups' timeouts (`_set_pg_timeout` changes them) and forget destroyed ones'."""
        with self._lock:
            live = self.live()
            for state in live:
                self._read_timeout(state)
            kept = {g.name for g in live} | set(self.retired)
            for name in [n for n in self.timeouts if n not in kept]:
                del self.timeouts[name]
                self.timeouts_gen += 1

    def timeout_of(self, name: str) -> float | None:
        t = self.timeouts.get(name)
        return t.reported if t is not None else None

    def known(self) -> list[GroupState]:
        return [g for g in list(self.by_pg.values()) if g is not None]

    def table(self, referenced: set[str] | None = None) -> list[dict[str, object]]:
        """Rows of live groups, then of destroyed ones (only those `referenced` by entries, when given)."""
        live = self.known()
        retired = [g for g in list(self.retired.values()) if referenced is None or g.name in referenced]
        return [{**g.table_row(), "timeout_s": self.timeout_of(g.name)} for g in live + retired]

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
        self.unlabeled.append(state)
        del self.unlabeled[: -self.max_retired]
        while len(self.retired) > self.max_retired:
            del self.retired[next(iter(self.retired))]

    def relabel_retired(self) -> None:
        """Rename the groups destroyed since the last call (this rank is creating a group)."""
        with self._lock:
            for state in self.unlabeled:
                label = self._label(state)
                if self.relabel is not None:
                    try:
                        self.relabel(state.name, label)
                    except Exception as exc:  # noqa: BLE001 - a recorder bug must not break group creation
                        log.warn_once("relabel", f"could not rename the entries of destroyed group {state.name!r}: {exc!r}")
                if self.retired.get(state.name) is state:
                    del self.retired[state.name]
                if state.name in self.timeouts:
                    self.timeouts[label] = self.timeouts.pop(state.name)
                state.name = label
                self.retired[label] = state
            self.unlabeled.clear()

    def _label(self, state: GroupState) -> str:
        """`<name>@<digest of the members>`, `.k` from the k-th time these members retire this name."""
        digest = hashlib.sha1(",".join(map(str, state.ranks)).encode()).hexdigest()[:8]
        count = self._incarnations[(state.name, digest)] = self._incarnations.get((state.name, digest), 0) + 1
        return f"{state.name}@{digest}" + (f".{count}" if count > 1 else "")

    def live(self) -> list[GroupState]:
        """Known groups that still exist (a destroyed group must not be asked for its counter)."""
        try:
            alive = dist.distributed_c10d._world.pg_map
        except Exception:  # noqa: BLE001
            return []
        return [g for g in self.known() if g.pg in alive]

    def release_all(self) -> None:
        """Disarmed: drop every ProcessGroup (the keys of `by_pg` too), so `destroy_process_group()`
        after `flightrec.disable()` still ends the group there, not at interpreter exit. No lock: a
        watchdog tick that outlived its join must not make `disable()` wait."""
        for state in self.known():
            state.release()
        self.by_pg.clear()

    def clear(self) -> None:
        self.by_pg.clear()
        self.retired.clear()
        self.unlabeled.clear()
        self.timeouts.clear()
        self.timeouts_gen += 1
