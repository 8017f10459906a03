"""Per-group progress counters for the dump, independent of the ring.

Why: a rank whose ring filled up with another group's ops keeps no entry of the group the others
wait in, yet it knows how far it got in every group. The counters are read at dump time from the
group state and the ops still in flight, so the hot path pays nothing for them. `counters` imports
no torch: the fixtures' dump writer applies the same rule to synthetic rings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .entry import Entry
    from .recorder import Recorder

OPEN_STATES = ("enqueued", "started", "unknown")  # an op in one of these holds its group's `completed` back


def counters(entered: int, open_seqs: list[tuple[int, str]]) -> dict[str, int]:
    """entered / started / completed from the last position entered and the (seq, state) of its open ops.

    Ops complete in order within one group (one stream, one gloo queue), so the first open op bounds
    what has completed; `started` is the newest op that is running (device ops may still be queued).
    """
    if not open_seqs:
        return {"entered": entered, "started": entered, "completed": entered}
    first = min(seq for seq, _ in open_seqs)
    running = [seq for seq, state in open_seqs if state in ("started", "failed")]
    return {"entered": entered, "started": max(running) if running else first - 1, "completed": first - 1}


def group_progress(rec: Recorder) -> list[dict[str, Any]]:
    """One row per group (collectives) and per (group, peer, direction) of point-to-point ops.

    `completed` only counts what was seen complete: a C++-issued op whose completion cannot be observed
    (state `unknown`), or that the process died of (`Recorder.fail_cpp_ops`), holds it back, and
    `unknown` counts the unobserved ones, so a reader can tell "not observed" from "stuck".
    """
    open_ops: dict[str, list[Entry]] = {}
    unknown: dict[str, int] = {}
    died_in = {id(e) for e in rec.cpp_failed}
    for e in rec.in_flight() + list(rec.cpp_open) + list(rec.cpp_failed):
        if (e.state in OPEN_STATES or id(e) in died_in) and e.seq > 0:
            open_ops.setdefault(e.group, []).append(e)
        if e.state == "unknown":
            unknown[e.group] = unknown.get(e.group, 0) + 1
    live = {id(g) for g in rec.groups.live()}
    rows: list[dict[str, Any]] = []
    for group in rec.groups.known() + list(rec.groups.retired.values()):
        pending = open_ops.get(group.name, [])
        colls = [(e.seq, e.state) for e in pending if e.kind == "coll"]
        row: dict[str, Any] = {"group": group.name, "kind": "coll", "live": id(group) in live,
                               **counters(group.coll_seq, colls)}
        if unknown.get(group.name):
            row["unknown"] = unknown[group.name]
        rows.append(row)
        for op, counts in (("send", group.sent), ("recv", group.received)):
            for peer, entered in sorted(counts.items()):
                mine = [(e.seq, e.state) for e in pending if e.kind == "p2p" and e.op == op and e.peer == peer]
                rows.append({"group": group.name, "kind": "p2p", "op": op, "peer": peer,
                             **counters(entered, mine)})
    return rows
