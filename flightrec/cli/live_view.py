"""`flightrec watch`: a running job seen live, from the pace every rank publishes in the job's store
(watch/pace.py), or from a dump folder's newest dumps (FLIGHTREC_SNAPSHOT_S, hang dumps).

Read-only: against the store it only checks and gets flightrec's own keys (`flightrec/pace/...`), never
sets, adds or deletes one, and it writes nothing to the job's disk. What protects the store is not
flightrec: c10d's TCPStore has no authentication, so anyone who can reach its port can already read and
change every key of the job (docs/live.md).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from ..watch import pace
from ..watch.dump_requests import read_keys

MAX_ATTEMPTS = 64  # restart attempts looked for (the newest with a rank-0 record wins)
NOT_ANSWERING_ROUNDS = 3  # a record older than this many publishing rounds: the rank stopped answering


def connect(address: str, timeout_s: float = 5.0) -> Any:
    """A client of the job's TCPStore at HOST:PORT (torch imported here only)."""
    import torch.distributed as dist

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT (the job's MASTER_ADDR:MASTER_PORT)")
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def read_records(store: Any) -> tuple[int, dict[int, dict[str, Any]]]:
    """(attempt, records by rank) of the newest attempt that published."""
    attempt = next((a for a in reversed(range(MAX_ATTEMPTS)) if store.check([pace.pace_key(a, 0)])), None)
    if attempt is None:
        return -1, {}
    first = pace.parse_records({0: read_keys(store, [pace.pace_key(attempt, 0)]).get(pace.pace_key(attempt, 0))})
    world = int(first.get(0, {}).get("world", 1))
    keys = {r: pace.pace_key(attempt, r) for r in range(max(world, 1))}
    raw = read_keys(store, list(keys.values()))
    return attempt, pace.parse_records({r: raw.get(k) for r, k in keys.items()})


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5' (the analyzer's helper, without importing it; dump-now and watch)."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and spans[-1][1] == r - 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def screen(records: Mapping[int, Mapping[str, Any]], window_s: float, share: float, now: float | None = None,
           title: str = "") -> str:
    """The text `flightrec watch` shows: per group, progress and who the others wait for; the slowest
    ranks by cost over the window; ranks that stopped answering."""
    now = time.time() if now is None else now
    if not records:
        return f"{title}\nno rank has published its pace yet (FLIGHTREC_STRAGGLER_WINDOW_S=0 turns it off)"
    world = max(int(r.get("world", -1)) for r in records.values())
    stale = sorted(r for r, rec in records.items()
                   if now - float(rec.get("time", now)) > NOT_ANSWERING_ROUNDS * max(float(rec.get("every_s", 0)), 1.0))
    lines = [f"{title}{len(records) - len(stale)} of {world if world > 0 else '?'} ranks answering, "
             f"{time.strftime('%H:%M:%S')}"]
    groups = sorted({g for rec in records.values() for g in rec.get("groups", {})}, key=lambda g: (len(g), g))
    for group in groups:
        members = {r: rec["groups"][group] for r, rec in records.items() if group in rec.get("groups", {})}
        done = {r: int(m.get("done", 0)) for r, m in members.items()}
        waiting = {r: m["in"] for r, m in members.items() if m.get("in")}
        head = f"group {group} ({len(members)} ranks): done up to seq {min(done.values())}"
        if max(done.values()) != min(done.values()):
            head += f"..{max(done.values())}"
        lines.append(head)
        if waiting:
            seq = max(int(w[0]) for w in waiting.values())
            inside = sorted(r for r, w in waiting.items() if int(w[0]) == seq)
            longest = max(float(w[1]) for r, w in waiting.items() if int(w[0]) == seq)
            behind = sorted(r for r in members if r not in inside and done[r] < seq)
            who = f"rank {inside[0]} waits" if len(inside) == 1 else f"ranks {rank_ranges(inside)} wait"
            held = ""
            if behind:
                them = f"rank {behind[0]} is" if len(behind) == 1 else f"ranks {rank_ranges(behind)} are"
                held = (f"; {them} not in it (done up to seq {rank_ranges(sorted({done[r] for r in behind}))}): "
                        f"{'it holds' if len(behind) == 1 else 'they hold'} the group")
            lines.append(f"  {who} in seq {seq} for {longest:.1f} s{held}")
    found = pace.score(records, window_s, share)
    if found:
        lines.append(f"slowest by cost (last {window_s:g} s):")
        lines += [f"  {s.line().removeprefix('straggler: ')}" for s in found[:10]]
    else:
        lines.append(f"no rank held a group back by {100 * share:g}% of the last {window_s:g} s")
    missing = sorted(set(range(world)) - set(records)) if world > 0 else []
    for r in stale:
        lines.append(f"rank {r} ({records[r].get('host', '?')}) stopped answering: its last pace is "
                     f"{now - float(records[r]['time']):.0f} s old")
    if missing:
        lines.append(f"rank(s) {rank_ranges(missing)} never published (not started, or no recorder)")
    return "\n".join(lines)
