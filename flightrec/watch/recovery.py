"""A stall that ends: the op a hang dump was written for completes after all.

A rank checkpointing for longer than FLIGHTREC_TIMEOUT while its peers wait in a collective makes
every rank dump and say "the job is hung"; then the checkpoint ends, the collective completes and
the job goes on. Left alone, the folder would keep the hang dumps and read as a hang forever. So
once a hang was declared on this rank (its own timeout, or a peer's request naming the op it timed
out on), the watchdog watches for that op to complete:

- the rank whose own op timed out (a waiter) watches that op;
- a rank asked by a peer watches the position the peer named (group, seq): its own op there if it
  is in flight (a waiter too), else its first op at or past that position to complete (the rank
  that held the others: it was elsewhere, e.g. writing the checkpoint); a rank outside that group,
  its first op to complete in any group (it moved on: its dump must not stay the hang's).

When it completes, the rank logs once that it recovered, keeps a `recovered` record (what stalled,
how long this rank waited in it, the hang dump it caused) that every later dump carries, and the
watchdog rewrites its dump with reason `recovered`: a dump of a running job, which the exit record
or a later hang dump replaces. Checked only while a hang is declared: the hot path pays nothing.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from ..record.entry import Entry, format_site
from ..settings import DEFAULT_TIMEOUT_S

KEPT = 16  # records kept per process: the latest ones
_POSITION = re.compile(r"\bgroup=(\S+) seq=(-?\d+)")


@dataclass
class Stall:
    """What a declared hang waits on here, and the dump it caused."""

    group: str  # "": any group
    seq: int
    limit_s: float  # this rank's watchdog limit for the group
    reason: str  # `timeout` (this rank's own op) or `peer_request`
    detail: str
    entry: Entry | None = None  # this rank's op at the position, when it was in flight
    entry_id: int = -1
    after_id: int = 0  # else: the first op of the group at or past `seq` recorded from this id on


def position_of(detail: str) -> tuple[str, int] | None:
    """('0', 11) from a hang detail `barrier group=0 seq=11 at ... incomplete after 2.1s on rank 1`."""
    m = _POSITION.search(detail)
    return (m.group(1), int(m.group(2))) if m else None


def watch(entry: Entry | None, group: str, seq: int, limit_s: float, reason: str, detail: str,
          recorded: int) -> Stall:
    return Stall(group, seq, limit_s, reason, detail, entry,
                 entry.id if entry is not None else -1, recorded)


def settled(stall: Stall, ring_entries: Any) -> tuple[Entry | None, bool]:
    """(the op that completed, False) once the stall is over; (None, True) when its op failed (the
    failure's own dump is the evidence); (None, False) while it lasts. `ring_entries` is called only
    when the watched op is not this rank's own (a ring snapshot)."""
    e = stall.entry
    if e is not None and e.id == stall.entry_id:  # entries are reused once settled: an id that changed is gone
        if e.state == "completed":
            return e, False
        if e.state == "failed":
            return None, True
        if e.state != "unknown":
            return None, False
    for item in ring_entries():
        if (item.id >= stall.after_id and item.group == (stall.group or item.group) and item.state == "completed"
                and (item.kind == "p2p" or item.seq >= stall.seq)):
            return item, False
    return None, False


def record(stall: Stall, done: Entry, hang_dump_wall_ns: int | None) -> dict[str, Any]:
    """The dump's `recovered` item (docs/dump-format.md)."""
    wall_minus_mono = time.time_ns() - time.monotonic_ns()
    measured = done.t_complete_ns is not None and done.t_enqueue_ns > 0
    return {
        "id": int(done.id), "group": done.group, "seq": int(done.seq), "op": done.op, "kind": done.kind,
        "site": format_site(done.site) or None,
        "waited_s": round((done.t_complete_ns - done.t_enqueue_ns) / 1e9, 3) if measured else None,
        "completed_wall_ns": done.t_complete_ns + wall_minus_mono if done.t_complete_ns is not None else None,
        "timed_out": stall.entry is not None and done.id == stall.entry_id,
        "timeout_s": stall.limit_s,
        "hang_reason": stall.reason, "hang_detail": stall.detail[:1000],
        "hang_dump_ns": hang_dump_wall_ns,
    }


def line(item: dict[str, Any], folder: str, timeout_from: str = "FLIGHTREC_TIMEOUT") -> str:
    """The one log line of a recovery; `timeout_from` is `settings.timeout_from` (who set the limit)."""
    source = {"FLIGHTREC_TIMEOUT": "FLIGHTREC_TIMEOUT", "enable()": "flightrec.enable(timeout_s)"}.get(timeout_from) or (
        "flightrec's default" if item["timeout_s"] == DEFAULT_TIMEOUT_S else "flightrec's limit, from the group's timeout")
    where = f" at {item['site']}" if item.get("site") else ""
    op = f"{item['op']} #{item['seq']} (group {item['group']}){where}"
    waited, timeout = item.get("waited_s"), f"{item['timeout_s']:g} s"
    if item["timed_out"]:
        head = (f"recovered after {waited:.1f} s in {op}" if waited is not None else f"recovered: {op} completed"
                ) + f": it outlived the {timeout} timeout ({source})"
    else:
        done, dumped = item.get("completed_wall_ns"), item.get("hang_dump_ns")
        after = f" {(done - dumped) / 1e9:.1f} s after the hang dump" if done and dumped and done > dumped else ""
        head = (f"recovered: {op}, where the peers waited past the {timeout} timeout ({source}), "
                f"completed here{after}")
    return (f"{head}; the hang reported above was a false alarm and the job goes on; the dump in {folder} "
            "records the stall as recovered")
