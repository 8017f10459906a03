"""The trace's tracks: a process per host, a thread per rank, and a thread per extra lane of a rank
whose ops overlap in time (docs/timeline.md).

Why apart: which track a rank gets, and what the track is called, is decided from the dumps and the
root causes alone, before any op is placed; the ops, markers and arrows only look up pid and tid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ..analysis import Analysis
from ..constants import MAX_RANKS

LANE_STRIDE = MAX_RANKS  # tid of a rank's k-th extra lane (ops overlapping in time): rank + k * LANE_STRIDE
UNKNOWN_HOST = "host unknown"

Tid = TypeVar("Tid", int, np.ndarray)


@dataclass(frozen=True)
class Tracks:
    """The ranks drawn (every rank of the wait graph or with a dump), the hosts in track order, each
    rank's process id (its host's) and its track's name."""

    ranks: list[int]
    hosts: list[str]
    pid: dict[int, int]
    thread_name: dict[int, str]


def tracks(a: Analysis, root_causes: list[dict[str, Any]]) -> Tracks:
    """The tracks of `a`: hosts in the order of their lowest rank (the unknown host last), ranks named
    with their root-cause kinds and what is wrong with their dump."""
    ranks = sorted(set(a.graph.nodes) | set(a.dumps))
    host_of = {r: _host(a, r) for r in ranks}
    hosts = _hosts(ranks, host_of)
    pid_of_host = {h: i + 1 for i, h in enumerate(hosts)}
    kinds = _cause_kinds(root_causes)
    missing, unreadable, stale = set(a.missing), set(a.unreadable), set(a.stale)
    names = {}
    for r in ranks:
        name = f"rank {r}"
        if r in kinds:
            name += f" — root cause: {', '.join(kinds[r])}"
        if r in missing:
            name += " (no dump)"
        elif r in unreadable:
            name += " (dump unreadable)"
        elif r in stale:
            name += " (stale dump)"
        names[r] = name
    return Tracks(ranks=ranks, hosts=hosts, pid={r: pid_of_host[host_of[r]] for r in ranks}, thread_name=names)


def tid(rank: Tid, lane: Tid) -> Tid:
    """The thread id of a rank's lane (lane 0: the rank itself); works on arrays too."""
    return rank + lane * LANE_STRIDE


def track_events(t: Tracks, lanes: dict[int, int]) -> list[dict[str, Any]]:
    """The metadata events that name and order the tracks; `lanes`: a rank's highest lane (0 if absent)."""
    out: list[dict[str, Any]] = []
    for i, host in enumerate(t.hosts):
        pid = i + 1
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": host}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": i}})
    for r in t.ranks:
        pid = t.pid[r]
        for lane in range(lanes.get(r, 0) + 1):
            name = t.thread_name[r] if lane == 0 else f"rank {r} (overlapping ops, lane {lane + 1})"
            thread = tid(r, lane)
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": thread, "args": {"name": name}})
            out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": thread, "args": {"sort_index": r}})
    return out


def track_event_count(t: Tracks, lanes: dict[int, int]) -> int:
    """How many events `track_events` gives, without building them."""
    return len(t.hosts) * 2 + sum((lanes.get(r, 0) + 1) * 2 for r in t.ranks)


def _host(a: Analysis, rank: int) -> str:
    host = a.dumps[rank].meta.get("host") if rank in a.dumps else None
    return str(host) if host not in (None, "") else UNKNOWN_HOST


def _hosts(ranks: list[int], host_of: dict[int, str]) -> list[str]:
    """Hosts in the order of their lowest rank; the unknown one last."""
    hosts: list[str] = []
    for r in ranks:
        if host_of[r] != UNKNOWN_HOST and host_of[r] not in hosts:
            hosts.append(host_of[r])
    if UNKNOWN_HOST in host_of.values():
        hosts.append(UNKNOWN_HOST)
    return hosts


def _cause_kinds(root_causes: list[dict[str, Any]]) -> dict[int, list[str]]:
    """Each rank's root-cause kinds, in report order, each once."""
    kinds: dict[int, list[str]] = {}
    for c in root_causes:
        for r in c["ranks"]:
            if c["kind"] not in kinds.setdefault(r, []):
                kinds[r].append(c["kind"])
    return kinds
