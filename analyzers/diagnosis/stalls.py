"""Stalls that recovered: one rank held every other member of a collective for a long time, once, and
the job went on (a checkpoint written by one rank while the others wait in a barrier).

Why a finding of its own: such a stall outlives FLIGHTREC_TIMEOUT, so every rank dumped and logged a
hang; the job then finished. The recorder rewrites each dump once the op completes (its `recovered`
records, flightrec/watch/recovery.py), so nobody waits in the dumps any more; this names who held whom, how
long, where, and that the timeout dump was a false alarm. Without a timeout dump (dumps at exit, a
timeout set higher than the stall) the same long hold is named when it stands far above the group's
usual waits, so that "healthy" never hides it.

A hold is the stragglers' raw lateness (timing/lateness.py): the longest member duration of a
complete blocking collective minus the member's own, local clocks only. An instance is a stall when
its longest hold is at least HOLD_MIN_S and
- at least the recorder's timeout (`settings.timeout_s`: the watchdog fired, or would have), or
- at least HOLD_RATIO times the 90th percentile of the longest holds of the group's other instances
  (a one-off among the usual waits), the holder's compute gap before it being known (a rank's first op
  is left out: its lateness may be start-up skew), or
- at a position a `recovered` record names (the recorder saw it time out and complete).
Its holders are the members that held it up by at least half its longest hold (two ranks checkpointing
together are both named; never one picked by number), its waiters the other members.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from ..reading.rankdump import RankDump

HOLD_MIN_S = 1.0  # never a stall below this: scheduling noise on a loaded host stays far under it
HOLD_RATIO = 20.0  # ... nor below this many times the group's usual longest hold (its 90th percentile)
HOLDER_SHARE = 0.5  # members holding up at least this share of the longest hold are its holders
TRANSFERS = ("send", "recv")


def recovered_records(dumps: dict[int, RankDump]) -> pd.DataFrame:
    """Every dump's `recovered` records (docs/dump-format.md), one row each with its rank."""
    rows = [{**item, "rank": rank} for rank, d in dumps.items() for item in d.meta.get("recovered") or []
            if isinstance(item, dict) and "group" in item and "seq" in item]
    return pd.DataFrame(rows)


def timeout_of(dumps: dict[int, RankDump]) -> float | None:
    """The shortest recorder timeout among the dumps (FLIGHTREC_TIMEOUT); None when none says."""
    found = [float(t) for d in dumps.values() if isinstance(t := (d.meta.get("settings") or {}).get("timeout_s"),
                                                               (int, float))]
    return min(found) if found else None


def find_stalls(lateness: pd.DataFrame, entries: pd.DataFrame, dumps: dict[int, RankDump]) -> list[dict[str, Any]]:
    """The report's `recovered_stalls` (docs/report-format.md), oldest position first."""
    records = recovered_records(dumps)
    timeout_s = timeout_of(dumps)
    found = _from_timing(lateness, records, timeout_s)
    seen = {(s["group"], s["seq"]) for s in found}
    found += _from_records(records, seen, timeout_s)
    sites = _sites(entries, found)
    for s in found:
        s["site"] = sites.get((s["rank"], s["group"], s["seq"], s["op"])) or s.get("site")
    found.sort(key=lambda s: (s["group"], s["seq"], s["rank"] if s["rank"] is not None else -1))
    return found


def _from_timing(lateness: pd.DataFrame, records: pd.DataFrame, timeout_s: float | None) -> list[dict[str, Any]]:
    """Stalls among the timed collectives. At scale the table has tens of millions of rows and a healthy
    job no hold over HOLD_MIN_S: one comparison, and nothing more is built."""
    if not len(lateness):
        return []
    late = lateness["late_ns"].to_numpy()
    if not (late >= HOLD_MIN_S * 1e9).any():  # one comparison: a healthy job ends here
        return []
    instance = lateness["instance"].to_numpy()
    longest = pd.Series(late, dtype=np.float64).groupby(instance).max().reindex(
        np.arange(int(instance.max()) + 1), fill_value=0.0).to_numpy()
    codes, names = pd.factorize(lateness["group"])
    group_of = np.full(len(longest), -1, dtype=np.int64)
    group_of[instance] = codes  # every row of an instance is in its group
    usual = _usual(longest, group_of)
    rows = np.flatnonzero(longest[instance] >= HOLD_MIN_S * 1e9)  # the rows of the long instances: a few
    part = lateness.iloc[rows]
    rows_late = late[rows].astype(np.float64)
    inst = instance[rows]
    is_holder = rows_late >= HOLDER_SHARE * longest[inst]
    transfer = part["op"].astype(str).isin(TRANSFERS).to_numpy()
    recorded = set()
    if len(records):
        recorded = set(zip(records["group"].astype(str), records["seq"].astype(np.int64).tolist(), strict=True))
    rank, seq, gap_known = part["rank"].to_numpy(), part["seq"].to_numpy(), part["gap_known"].to_numpy(dtype=bool)
    out = []
    for i in np.unique(inst):  # one pass per long instance
        mine = inst == i
        if transfer[mine].any():
            continue  # a stalled transfer holds one peer, not a group: the stragglers' slow links tell it
        group, position = str(names[group_of[i]]), int(seq[mine][0])
        holders = mine & is_holder
        hang_dump = (group, position) in recorded
        one_off = not (holders & ~gap_known).any() and longest[i] >= HOLD_RATIO * usual[i]
        past_timeout = timeout_s is not None and longest[i] >= timeout_s * 1e9
        if not (hang_dump or one_off or past_timeout):
            continue
        waiters = sorted(set(rank[mine].tolist()) - set(rank[holders].tolist()))
        out += [{"rank": int(rank[h]), "group": group, "seq": position, "op": str(part["op"].iat[int(h)]),
                 "held_s": round(float(rows_late[h]) / 1e9, 3), "site": None, "timeout_s": timeout_s,
                 "waiters": [int(w) for w in waiters], "hang_dump": hang_dump} for h in np.flatnonzero(holders)]
    return out


def _usual(longest: np.ndarray, group_of: np.ndarray) -> np.ndarray:
    """Per instance: the 90th percentile of the longest holds of its group's instances, the group's single
    longest left out (the one-off being judged); inf where fewer than two (one says nothing of the usual)."""
    usual = np.full(len(longest), np.inf)
    for g in np.unique(group_of[longest >= HOLD_MIN_S * 1e9]):  # only the groups with a long instance
        ids = np.flatnonzero(group_of == g)
        if len(ids) >= 2:
            usual[ids] = np.percentile(np.sort(longest[ids])[:-1], 90)
    return usual


def _from_records(records: pd.DataFrame, seen: set[tuple[str, int]], timeout_s: float | None) -> list[dict[str, Any]]:
    """Stalls the recorder saw recover whose instance has no timing here (a ring that wrapped past it):
    the waiters are the ranks whose own op timed out; the holder the one rank that recorded the
    position without waiting past its timeout, when exactly one did (else unknown: null)."""
    if not len(records):
        return []
    out = []
    for (group, seq), part in records.groupby([records["group"].astype(str), records["seq"].astype(np.int64)]):
        if (group, int(seq)) in seen:
            continue
        timed_out = part["timed_out"].fillna(False).astype(bool).to_numpy()
        waiters = sorted(int(r) for r in part["rank"].to_numpy()[timed_out])
        others = sorted({int(r) for r in part["rank"].to_numpy()[~timed_out]})
        waited = pd.to_numeric(part["waited_s"], errors="coerce").to_numpy()[timed_out]
        waited = waited[~np.isnan(waited)]
        if not waiters:
            continue
        out.append({"rank": others[0] if len(others) == 1 else None, "group": group, "seq": int(seq),
                    "op": str(part["op"].iloc[0]), "held_s": round(float(waited.max()), 1) if len(waited) else None,
                    "site": part["site"].dropna().iloc[0] if part["site"].notna().any() else None,
                    "timeout_s": timeout_s, "waiters": waiters, "hang_dump": True})
    return out


def _sites(entries: pd.DataFrame, stalls: list[dict[str, Any]]) -> dict[tuple[Any, str, int, str], str]:
    """The holders' call sites of their stalled ops (the user's line that issued them)."""
    if not stalls or not len(entries) or "site" not in entries.columns:
        return {}
    wanted = {(s["rank"], s["group"], s["seq"], s["op"]) for s in stalls if s["rank"] is not None}
    ranks = np.fromiter((w[0] for w in wanted), dtype=np.int64, count=len(wanted))
    seqs = np.fromiter((w[2] for w in wanted), dtype=np.int64, count=len(wanted))
    rows = np.flatnonzero(np.isin(entries["rank"].to_numpy(), ranks) & np.isin(entries["seq"].to_numpy(), seqs)
                          & entries["kind"].astype(str).eq("coll").to_numpy())  # the few rows of the stalls
    found: dict[tuple[Any, str, int, str], str] = {}
    part = entries.iloc[rows]
    for r, g, s, op, site in zip(part["rank"], part["group"].astype(str), part["seq"], part["op"].astype(str),
                                 part["site"], strict=True):
        if (int(r), g, int(s), op) in wanted and isinstance(site, str) and site:
            found[(int(r), g, int(s), op)] = site
    return found


_SITE = re.compile(r"(?:^|[/\\])([^/\\]+:\d+)(?: in .*)?$")


def short_site(site: str | None) -> str | None:
    """`/work/job/train.py:88 in main` -> `train.py:88`."""
    if not site:
        return None
    m = _SITE.search(site)
    return m.group(1) if m else site
