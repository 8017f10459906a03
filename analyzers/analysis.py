"""The `Analysis` object returned by `analyzers.load`: tables first, conclusions on demand.

Why lazy: `show` and notebook users often only want `.entries`; the matching, the wait graph and
the report are computed on first access to `.graph` or `.report()` and then cached.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from functools import cached_property
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd

from . import stackview
from .constants import (
    CRASH,
    CRASHED,
    DEADLOCK,
    DESYNC,
    EXITED,
    HANG,
    HEALTHY,
    INCONCLUSIVE,
    MISMATCH,
    MISSING_DUMP,
    REPORT_SCHEMA,
    SLOW,
)
from .diagnosis import groups as groups_mod
from .diagnosis.cause_words import summary_words
from .diagnosis.cause_words import words as cause_words
from .diagnosis.causes import CauseResult, GroupNames, build_graph, find_causes
from .diagnosis.divergence import Divergence, find_divergence
from .diagnosis.divergence import line as divergence_line
from .diagnosis.failures import Failure, exited_ranks, failures_text, find_failures, unexplained
from .diagnosis.hosts import Hosts
from .diagnosis.matching import MatchResult, match
from .diagnosis.stalls import find_stalls, short_site
from .diagnosis.transfers import Transfers, pair_transfers
from .diagnosis.waits import (
    R_NO_DUMP,
    R_STALE,
    R_UNREADABLE,
    Wait,
    WaitResult,
    find_waits,
    left_in_flight,
    progress_counters,
    receives_left_open,
)
from .keys import first_rows, ids_within_ranks
from .memory import release_free_memory
from .reading import jobs as jobs_mod
from .reading.cluster import client_for, map_on
from .reading.columns import SAMPLE_COLUMNS
from .reading.loader import Dataset, Folders, Progress, load_folder
from .reading.rankdump import RankDump
from .reading.sample import SAMPLE_PER_CHANNEL
from .textutil import channel_text, plural, ranges, straggler_cost, straggler_pattern, who
from .timing.late_sites import late_at
from .timing.lateness import lateness_of_ops
from .timing.shifts import timing_shifts
from .timing.stragglers import SlowResult, find_slow

SNAPSHOT_REASON = "snapshot"  # flightrec.arming.SNAPSHOT (the analyzer does not import the recorder)
# flightrec.arming.RUNNING: dumps of a running job (a snapshot; a rank whose hang recovered, control.RECOVERED)
RUNNING_REASONS = (SNAPSHOT_REASON, "recovered")
# ... and a dump asked for by `flightrec dump-now` (a snapshot by hand): the job ran on after it
LIVE_REASONS = (*RUNNING_REASONS, "manual")

NO_DUMP_TEXT = "no dump file (crashed, killed, or frozen before it could dump)"


def load(folder: Folders, workers: int | None = None, progress: Progress | None = None,
         on_count: Callable[[int], None] | None = None, attempt: int | None = None, read: str = "full",
         dask: str | None = None) -> Analysis:
    """Read a dump folder (flightrec and/or PyTorch flight-recorder dumps) and return its Analysis.

    `folder` is a local path or any fsspec URL (`s3://bucket/dumps`, `memory://dumps`, `file://...`),
    or a list of them read as one job (one folder per node's local disk).
    Raises `analyzers.UnusableInput` when a folder is missing or empty, or none holds a readable dump.
    `attempt` analyses that torchelastic restart attempt (default: the latest; see analyzers/reading/attempts.py).
    `workers` forces the number of reader processes (default: chosen from the folder's size);
    `on_count(n_files)` and `progress(n_read)` report the reading (the CLI's progress bar).
    `read`: "full" (every entry), "summary" (each flightrec dump's summary: counters, threads, recent ops;
    enough for a hang verdict at any size, not for timing: see `Analysis.from_summaries`), "sampled" (the
    summaries and a bounded timing sample of every ring: reading/sample.py), or "auto" (summaries from
    loader.AUTO_SUMMARY_FILES files on).
    `dask`: a Dask scheduler's address: the files are read, and the timing pass run per group of
    collectives, as tasks on its workers (reading/cluster.py); the report is the same.
    Raises `ClusterUnavailable` when Dask is not installed or no scheduler answers.
    """
    return Analysis(load_folder(folder, workers, progress, on_count, attempt=attempt, read=read, dask=dask), dask=dask)


class Analysis:
    """Entries, groups, the rank-dependency graph and the report of one dump folder."""

    def __init__(self, data: Dataset, dask: str | None = None) -> None:
        self._data = data
        self._dask = dask
        self.folder = data.folder
        self.entries: pd.DataFrame = data.entries
        self.timing_entries: pd.DataFrame | None = None  # a sampled read's timing sample (reading/sample.py)
        if "weight" in data.entries.columns:
            table = data.entries
            self.timing_entries = table[table["weight"].to_numpy() > 0].reset_index(drop=True)
            self.entries = table[table["recent"].to_numpy(dtype=bool)].drop(columns=list(SAMPLE_COLUMNS)).reset_index(drop=True)
            data.entries = self.entries
            del table
        self.dumps: dict[int, RankDump] = data.dumps
        self.problems = data.problems
        member = groups_mod.resolve(data.dumps, data.entries, data.problems)
        self.members = member.members
        self._known_groups = member.known
        self.world_size = member.world_size
        self.groups: pd.DataFrame = member.table
        self._notes = [p.line() for p in data.problems] + data.notes + member.notes
        every = set(range(self.world_size)) | {r for ranks in self.members.values() for r in ranks}
        self.unreadable = sorted(data.unreadable_ranks)
        self.missing = sorted(every - set(self.dumps) - set(self.unreadable))
        self._absent_code = {r: R_NO_DUMP for r in self.missing} | {r: R_UNREADABLE for r in self.unreadable}
        reasons = {p.rank: p.line() for p in data.problems if p.rank is not None}
        self._absent_text = {r: NO_DUMP_TEXT for r in self.missing} | {
            r: f"its dump is unreadable ({reasons.get(r, 'unknown reason')})" for r in self.unreadable
        }
        self._ranks = every | set(self.dumps) | set(self.unreadable)
        stale = jobs_mod.find_stale(self.dumps)  # kept in `dumps` and `entries` (true history), never as current
        self.stale = sorted(stale.stale)
        self._notes += stale.notes
        self._absent_code |= {r: R_STALE for r in self.stale}
        self._absent_text |= {r: s.text() for r, s in stale.stale.items()}
        self.from_summaries = sorted(r for r, d in self.dumps.items() if d.meta.get("summary_only"))

    @property
    def _untimed(self) -> bool:
        """Read from summaries alone: no rank's timing to tell slow from healthy."""
        return bool(self.from_summaries) and self.timing_entries is None

    @property
    def dump_table(self) -> pd.DataFrame:
        """One row per rank with a usable dump: file, format, version, host, reason, dropped entries."""
        counts = self.entries["rank"].value_counts()
        rows = [
            {
                "rank": r,
                "file": d.file,
                "format": d.fmt,
                "version": d.meta.get("version"),
                "host": d.meta.get("host"),
                "pid": d.meta.get("pid"),
                "reason": d.meta.get("reason"),
                "dropped": d.dropped,
                "entries": int(counts.get(r, 0)),
            }
            for r, d in sorted(self.dumps.items())
        ]
        return pd.DataFrame(rows)

    @cached_property
    def _transfers(self) -> Transfers:
        """Sends joined to their receives, once: the payload check and the link timing both use it."""
        return pair_transfers(self.entries)

    @cached_property
    def _matched(self) -> MatchResult:
        result = match(self.entries, self.members, self._transfers)
        release_free_memory()  # the per-position temporaries: millions of rows at scale
        return result

    @cached_property
    def divergence(self) -> Divergence:
        """Per (group, op, call site), the ranks that issued a different number of collectives than their
        peers (diagnosis/divergence.py): where a stream went another way, not only where it broke."""
        current = self._current_entries
        result = find_divergence(current, exited_ranks(self.dumps), self._matched.shifts)
        if result.items:  # where timing can tell, when each one's arrivals moved (timing/shifts.py)
            timing_shifts(result.items, self.slow.lateness, current)
        return result

    @cached_property
    def _waits(self) -> WaitResult:
        m = self._matched
        result = find_waits(
            self._current_entries, m.positions, self.members, self.dumps, self._absent_code, m.culprits, self._known_groups,
            finished=exited_ranks(self.dumps),
        )
        _in_flight_at_snapshot(result, self.dumps)
        release_free_memory()
        return result

    @property
    def _current_entries(self) -> pd.DataFrame:
        """The entries of the ranks whose dump is current: a stale dump's pending op is not where the rank is now."""
        if not self.stale:
            return self.entries
        return self.entries[~np.isin(self.entries["rank"].to_numpy(), self.stale)]

    @cached_property
    def graph(self) -> nx.DiGraph:
        """Wait-for graph: a node per rank (dump or not), an edge r -> m when r waits for m."""
        return build_graph(self._ranks, self.dumps, self._absent_code, self._waits.waits)

    @cached_property
    def _causes(self) -> CauseResult:
        result = find_causes(self.graph, self._waits.waits, self._matched, self.dumps, self._absent_text,
                             self.entries, self.groups, self.failures, self._data.gil_stacks)
        # a mismatch that completed before anything blocked is a finding, listed after what hangs the job
        result.causes.sort(key=lambda c: c.kind == MISMATCH and (c.group, c.seq) not in self._deciding_positions)
        return result

    @cached_property
    def _deciding_positions(self) -> set[tuple[str | None, int | None]]:
        """Mismatched positions that can explain the state the job is in: all of them when nothing blocks,
        else those at or after a position ranks block in, in the same group, and the shifts of an extra or
        missing op. An earlier mismatch completed (a reduce-op disagreement gloo does not notice) and is
        not why the job stopped."""
        mismatches = self._matched.mismatches
        waits = self._waits.waits.values()
        if not waits:
            return {(m.group, m.seq) for m in mismatches}
        first_block: dict[str, int] = {}
        for w in waits:
            for _, g, seq, _, _ in w.positions:
                first_block[g] = min(first_block.get(g, seq), seq)
        return {(m.group, m.seq) for m in mismatches
                if m.shift is not None  # an extra or missing op: every later position of the group is off by one
                or (m.group in first_block and m.seq >= first_block[m.group])}

    @cached_property
    def failures(self) -> list[Failure]:
        """How ranks ended (own error, lost connection, terminated, exited), oldest first."""
        return find_failures(self.dumps)

    @cached_property
    def slow(self) -> SlowResult:
        """Stragglers, slow links, per-collective lateness and clock offsets (timing analysis)."""
        if self._untimed:  # a few recent ops per rank: noise, not a measurement
            return SlowResult(pd.DataFrame(), notes=[SUMMARY_NO_TIMING])
        sizes = dict(zip(self.groups["group"].astype(str), self.groups["size"].astype(int), strict=True))
        wall = {r: int(d.meta["wall_offset_ns"]) for r, d in self.dumps.items() if "wall_offset_ns" in d.meta}
        members = {str(g): list(r) for g, r in self.members.items()}
        entries = self.timing_entries if self.timing_entries is not None else self.entries
        transfers = pair_transfers(entries) if self.timing_entries is not None else self._transfers
        if self._dask is not None:  # every instance lies within one group: the groups' parts timed on the cluster
            with client_for(self._dask) as client:
                result = find_slow(entries, sizes, wall, members, transfers,
                                   run_parts=lambda parts, sizes: map_on(client, lateness_of_ops, parts, group_sizes=sizes))
        else:
            result = find_slow(entries, sizes, wall, members, transfers)
        if self.timing_entries is not None:
            result.notes.append(SAMPLED_TIMING)
        release_free_memory()
        return result

    @cached_property
    def recovered_stalls(self) -> list[dict[str, Any]]:
        """Long holds that ended: one rank kept the others of a collective waiting once (a checkpoint),
        past the timeout or far past the group's usual waits (diagnosis/stalls.py)."""
        return find_stalls(self.slow.lateness, self.entries, self.dumps)

    @property
    def verdict(self) -> str:
        """desync, deadlock, crash, hang, slow, inconclusive or healthy (see docs/report-format.md)."""
        if self._deciding_positions:
            return DESYNC
        if self._causes.cycles:
            return DEADLOCK
        if any(c.kind == CRASHED for c in self._causes.causes):
            return CRASH
        if self._waits.waits and self._only_unreadable:
            return INCONCLUSIVE
        if self._waits.waits or any(c.kind == EXITED for c in self._causes.causes):
            return HANG  # a rank that left while others still ran: they waited for it, or failed without it
        if self._unexplained_failures:
            return INCONCLUSIVE  # a rank raised, lost its connection or was stopped: never healthy
        if not self._left_in_flight.empty or not self._receives_left_open.empty:
            return INCONCLUSIVE  # ranks left with an op that could never complete in flight: never healthy
        if self._untimed:  # nobody waits; slow needs every rank's timing
            return INCONCLUSIVE
        if self.slow.stragglers:
            return SLOW
        if self._unknown_state:
            return INCONCLUSIVE
        return HEALTHY

    @property
    def _unexplained_failures(self) -> list[Failure]:
        """Ranks that raised, lost their connection, timed out or were stopped, when no root cause
        (a crash, a rank that left, a hang) explains them: the job did not end well, whatever the
        waits say, and the dumps cannot tell why."""
        return unexplained(self.failures)

    @cached_property
    def _progress(self) -> tuple[dict[tuple[int, str], tuple[int, int]], dict[tuple[int, str, str, int], tuple[int, int]]]:
        """Each rank's (entered, completed) counters per group and per p2p pair (diagnosis/waits.py)."""
        return progress_counters(self.dumps)

    @cached_property
    def _left_in_flight(self) -> pd.DataFrame:
        """Ranks that exited normally with a collective still in flight that a peer never entered
        (diagnosis/waits.py `left_in_flight`): the host of a device backend left before its stream
        could finish."""
        return left_in_flight(self._progress[0], exited_ranks(self.dumps))

    @cached_property
    def _receives_left_open(self) -> pd.DataFrame:
        """Receives in flight when their rank exited normally (diagnosis/waits.py `receives_left_open`)."""
        return receives_left_open(self._progress[1], exited_ranks(self.dumps))

    @property
    def _only_unreadable(self) -> list[int]:
        """Ranks the wait chain ends at when every one of them is a file that could not be read: a bad
        file, or a reader's bug, is no evidence that the rank is the culprit."""
        causes = self._causes.causes
        unreadable = set(self.unreadable)
        if causes and all(c.kind == MISSING_DUMP and c.rank in unreadable for c in causes):
            return sorted({c.rank for c in causes})
        return []

    @property
    def _unknown_state(self) -> dict[int, str]:
        """Expected ranks without a current dump (none, unreadable, stale) -> why.

        Why: nobody waiting on such a rank does not make it healthy: it may have died after its peers'
        last op, or be frozen before its next one; "healthy" needs every expected rank's own evidence.
        """
        expected = set(range(self.world_size)) | {r for ranks in self.members.values() for r in ranks}
        absent = (set(self.missing) | set(self.unreadable) | set(self.stale)) & expected  # not stray files' ranks
        return {r: self._absent_text[r] for r in sorted(absent)}

    def gaps(self) -> list[str]:
        """Evidence gaps, each a plain sentence: what could not be read, inferred, or told."""
        out = list(self._notes)
        if self._untimed:
            out.append(f"read from the dumps' summaries ({plural(len(self.from_summaries), 'rank')}): each rank's "
                       "progress counters, threads and last ops; timing and mismatches among older completed ops were "
                       "not analysed (--read full)")
        out += _wrap_notes(self.entries, {r: d for r, d in self.dumps.items() if not d.meta.get("summary_only")})
        out += self._matched.notes + self.divergence.notes + self._waits.notes + self._causes.notes
        if self.slow.stragglers or self.verdict not in (HANG, DEADLOCK, CRASH, DESYNC):
            out += self.slow.notes  # why slow ranks could not be told is noise on a hang report
        if self.missing:
            out.append(f"no dump for rank(s) {ranges(self.missing)}")
        seen: set[str] = set()
        return [g for g in out if not (g in seen or seen.add(g))]

    def report(self) -> dict[str, Any]:
        """The machine report (a JSON-ready dict; schema in docs/report-format.md)."""
        causes = self._causes.causes
        waits = sorted(self._waits.waits.values(), key=lambda w: w.rank)
        victims = sorted({v for c in causes for v in c.victims})
        return {
            "schema": REPORT_SCHEMA,
            "verdict": self.verdict,
            "read": "sampled" if self.timing_entries is not None else "summary" if self.from_summaries else "full",
            "summary": self.summary(),
            "folder": str(self.folder),
            "folders": list(self._data.folders) or [str(self.folder)],
            "ranks": {
                "expected": self.world_size,
                "dumped": sorted(self.dumps),
                "missing": self.missing,
                "unreadable": self.unreadable,
                "stale": self.stale,
                **self._evidence_age(),
            },
            "jobs": self._data.jobs or {"analysed": {}, "ignored": []},
            "attempts": self._data.attempts or {"analysed": 0, "others": []},
            "root_causes": [self._diverged_detail({**c.item(), **self._where(c.rank)}) for c in causes],
            "victims": victims,
            "hosts": self._hosts.table([r for c in causes for r in (c.ranks or [c.rank])] + [s["rank"] for s in self.slow.stragglers]
                                       + self.missing + self.unreadable),
            "waits": [{**w.item(), **self._waiter_place(w)} for w in waits],
            "cycles": self._causes.cycles,
            "failures": [f.item() for f in self.failures],
            "mismatches": [m.as_dict() for m in self._matched.mismatches],
            "divergence": self.divergence.items,
            "gaps": self.gaps(),
            "stragglers": [s | {"late_at": self._late_at.get(s["rank"], [])} for s in self.slow.stragglers],
            "recovered_stalls": self.recovered_stalls,
            "costs": self.slow.costs,
            "slow_links": self.slow.slow_links,
            "clock_offsets_ms": {str(r): v for r, v in sorted(self.slow.clock_offsets_ms.items())},
            "unreadable_files": [{"file": p.file, "rank": p.rank, "reason": p.reason} for p in self.problems],
            "groups": [
                {"group": g, "desc": d, "backend": b, "ranks": list(r), "membership": how}
                for g, d, b, r, how in self.groups[["group", "desc", "backend", "ranks", "membership"]].itertuples(index=False)
            ],
        }

    def _evidence_age(self) -> dict[str, Any]:
        """How old each rank's evidence is: seconds its dump was written before the job's newest dump
        (`evidence_age_s`, ranks whose dump has a time), and the ranks whose dump is of a running job
        (`running`: a snapshot, a dump-now, a stall that recovered), whose states are from those moments."""
        times = {r: d.meta.get("dump_time_ns") for r, d in self.dumps.items()}
        times = {r: t for r, t in times.items() if isinstance(t, int) and t > 0}
        newest = max(times.values(), default=0)
        running = sorted(r for r, d in self.dumps.items()
                         if str(d.meta.get("reason") or "").split(":", 1)[0] in LIVE_REASONS)
        return {"evidence_age_s": {str(r): round((newest - t) / 1e9, 3) for r, t in sorted(times.items())},
                "running": running}

    def _diverged_detail(self, cause: dict[str, Any]) -> dict[str, Any]:
        """A root cause's detail, with where its rank's stream diverged in that group (if it did)."""
        mine = [d for d in self.divergence.items if d["rank"] == cause.get("rank") and d["group"] == cause.get("group")]
        if not mine:
            return cause
        said = "; ".join(divergence_line(d, short=True) for d in mine[:3])
        return {**cause, "detail": f"{cause['detail']}; where its stream diverged: {said}" if cause.get("detail") else said}

    @cached_property
    def _hosts(self) -> Hosts:
        return Hosts({r: d.meta for r, d in self.dumps.items()})

    def _where(self, rank: int) -> dict[str, Any]:
        """Where to act on a rank: its host, local rank, pid and node rank (torchrun's GROUP_RANK), as
        its dump says, else as a peer's on its node says (diagnosis/hosts.py); None where neither does.
        Also why its dump was written (`dump_reason`, `dump_reason_detail`)."""
        meta = self.dumps[rank].meta if rank in self.dumps else {}
        return self._hosts.place(rank) | {"dump_reason": meta.get("reason"), "dump_reason_detail": meta.get("reason_detail")}

    @cached_property
    def _group_texts(self) -> dict[str, str]:
        """Group name -> `0 [0-3] (world)`, as root causes name groups (diagnosis/causes.py `GroupNames`)."""
        return GroupNames(self.groups).texts

    @cached_property
    def _late_at(self) -> dict[int, list[dict[str, Any]]]:
        """Slow rank -> the call sites of the collectives it held up (timing/late_sites.py)."""
        return late_at(self.slow.stragglers, self.entries)

    def _waiter_place(self, w: Wait) -> dict[str, Any]:
        """Where a waiting rank's program is: the call site of the op it waits in (`site`), and the
        innermost frame of its own code in the thread inside that op, else its main thread (`where`,
        with its source line `where_code`): e.g. `loss.backward()` for an op DDP issued from C++."""
        dump = self.dumps.get(w.rank)
        threads = [t for t in (dump.threads if dump is not None else []) if isinstance(t, dict)]
        thread = next((t for t in threads if t.get("in_op") is not None and t.get("in_op") in (w.id, -1)), None) \
            or next((t for t in threads if t.get("is_main")), None)
        found = None
        for stack, code in _program_stacks(thread, dump.meta.get("exception") if dump is not None else None):
            found = stackview.innermost_user(stack, code)
            if found is not None:
                break
        return {"site": w.site, "where": found[0] if found else None, "where_code": found[1] if found else None}

    def summary(self) -> str:
        """The verdict line: what is wrong, with whom, in one sentence."""
        line = self._summary()
        if self.recovered_stalls and self.verdict not in (HANG, DEADLOCK, CRASH, DESYNC):
            first = self.recovered_stalls[0]
            who = f"rank {first['rank']}" if first["rank"] is not None else "a rank"
            held = f" {first['held_s']:.1f} s" if first.get("held_s") is not None else ""
            at = f" at {first['op']} #{first['seq']}" + (f" ({short_site(first['site'])})" if first.get("site") else "")
            more = len(self.recovered_stalls) - 1
            line += (f"; {who} held the others{held}{at} and the job went on (a stall that recovered"
                     + (f", and {more} more" if more else "") + ")")
        return line

    def _summary(self) -> str:
        verdict = self.verdict
        causes = self._causes.causes
        n_wait = len([w for w in self._waits.waits.values() if w.targets])
        if verdict == SLOW:
            worst = self.slow.stragglers[0]
            more = len(self.slow.stragglers) - 1
            host = self._hosts.place(worst["rank"]).get("host")
            return (f"slow: rank {worst['rank']}" + (f" (host {host})" if host else "")
                    + f" cost the others {straggler_cost(worst)} ({straggler_pattern(worst)})"
                    + (f" on {channel_text(worst['channels'][0], self._group_texts)}" if worst.get("channels") else "")
                    + (f"; the whole {worst['scope']} is slow" if worst.get("scope", "rank") != "rank" else "")
                    + (f"; {plural(more, 'more slow rank')}" if more else ""))
        if verdict == HEALTHY:
            return f"healthy: no rank is waiting ({plural(len(self.dumps), 'rank')} dumped)"
        if verdict == INCONCLUSIVE and self._only_unreadable:
            ranks = self._only_unreadable
            return (f"inconclusive: ranks wait for rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}, whose dump "
                    f"could not be read ({self._absent_text[ranks[0]]}): whether {'they are' if len(ranks) > 1 else 'it is'}"
                    " the culprit cannot be told")
        if verdict == INCONCLUSIVE and self._unexplained_failures:
            failed = self._unexplained_failures
            return (f"inconclusive: nobody waits, but {failures_text(failed)}, and no rank's dump says what started "
                    "it (no own error before the failures, no rank missing, none that left early)")
        if verdict == INCONCLUSIVE and not self._left_in_flight.empty:
            first = self._left_in_flight.iloc[0]
            same = self._left_in_flight[(self._left_in_flight["group"] == first["group"])
                                        & (self._left_in_flight["entered"] == first["entered"])]
            group = str(first["group"])
            behind = sorted(r for (r, g), (e, _) in self._progress[0].items() if g == group and e < int(first["entered"]))
            return (f"inconclusive: the ranks exited, but {who(int(r) for r in same['rank'])} left collective "
                    f"#{int(first['entered'])} of group {self._group_texts.get(group, group)} in flight, which "
                    f"{who(behind)} never entered (after {int(first['behind'])}): that op never completed, so the "
                    "job did not end well (a skipped collective, or a rank that left early)")
        if verdict == INCONCLUSIVE and not self._receives_left_open.empty:
            table = self._receives_left_open
            ranks = sorted({int(r) for r in table["rank"]})
            first = table.iloc[0]
            return (f"inconclusive: the ranks exited, but {who(ranks)} left a receive in flight (rank {int(first['rank'])}: "
                    f"recv #{int(first['completed']) + 1} from rank {int(first['peer'])}, group "
                    f"{self._group_texts.get(str(first['group']), str(first['group']))}): that data never came, so "
                    "the job did not end well (two ranks that both receive first, or a send that was never posted)")
        if verdict == INCONCLUSIVE and self._untimed:
            return ("inconclusive: no rank is waiting; the dumps' summaries alone cannot tell a slow rank "
                    "(read them whole for the timing: --read full)")
        if verdict == INCONCLUSIVE:
            unknown = self._unknown_state
            why = "; ".join(f"rank {r}: {text}" for r, text in list(unknown.items())[:3])
            why += f"; and {plural(len(unknown) - 3, 'more rank')}" if len(unknown) > 3 else ""
            its = "its" if len(unknown) == 1 else "their"
            return (f"inconclusive: no rank is waiting, but {plural(len(unknown), 'expected rank')} "
                    f"({ranges(list(unknown))}) left no current dump, so {its} state is unknown ({why})")
        if verdict == DEADLOCK and not self._matched.mismatches:
            loops = "; ".join(ranges(c) for c in self._causes.cycles)
            return f"deadlock: wait cycle among ranks {loops}"
        if not causes:
            return f"{verdict}: {plural(len(self._waits.waits), 'rank')} waiting, root cause unknown (see gaps)"
        head = causes[0]
        first = summary_words(head.kind, head.rank, head.ranks, head.op, head.group, head.seq)
        if head.kind == MISMATCH and len(head.ranks) > 1:  # no majority, undecided (or a p2p pair): named once
            causes = [head] + [c for c in causes[1:] if (c.kind, c.ranks, c.group, c.seq) != (MISMATCH, head.ranks,
                                                                                             head.group, head.seq)]
        more = f" and {plural(len(causes) - 1, 'more root cause')}" if len(causes) > 1 else ""
        affected = cause_words(head.kind).victims
        # the first cause's own victims: crediting it with every cause's would blame it for the others
        tail = f"; {plural(len(head.victims), 'rank')} {affected}" if head.victims else (
            f"; {n_wait} waiting" if n_wait else "")
        return f"{verdict}: {first}{more}{tail}"


SAMPLED_TIMING = (f"timing from a sample: per rank and channel about {SAMPLE_PER_CHANNEL} instances spread over its ring "
                  "(every n-th, n a power of two), costs scaled by n; the diagnosis from each rank's counters and "
                  "recent ops (mismatches among older completed ops not checked)")
SUMMARY_NO_TIMING = "timing not analysed: read from the dumps' summaries (--read full for stragglers and slow links)"


def _wrap_notes(entries: pd.DataFrame, dumps: dict[int, RankDump]) -> list[str]:
    """Say, per rank whose ring wrapped, where its kept history of each group starts."""
    wrapped = sorted(r for r, d in dumps.items() if d.dropped > 0 or (d.meta.get("first_id") or 0) > 0)
    if not wrapped:
        return []
    groups = pd.Categorical(entries["group"])  # grouped by code: no string per entry
    rank = entries["rank"].to_numpy()
    is_wrapped = np.zeros(max(int(rank.max()) if len(rank) else 0, wrapped[-1]) + 1, dtype=bool)
    is_wrapped[wrapped] = True  # a lookup per row instead of isin's sort of 30 million ranks
    rows = is_wrapped[rank] & (entries["kind"] == "coll").to_numpy() & (groups.codes >= 0)
    rank, code, seq = rank[rows], groups.codes[rows].astype(np.int64), entries["seq"].to_numpy()[rows]
    ids = ids_within_ranks(rank, code, sort=True)  # one id per (rank, group), in rank then group order
    first_row = first_rows(ids)
    lowest = np.full(len(first_row), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(lowest, ids, seq.astype(np.int64))
    names = [str(c) for c in groups.categories]
    starts_of: dict[int, dict[str, int]] = defaultdict(dict)
    for rr, cc, s in zip(rank[first_row].tolist(), code[first_row].tolist(), lowest.tolist(), strict=True):
        starts_of[rr][names[cc]] = s  # one pass
    alike: dict[str, list[int]] = defaultdict(list)  # ranks that lost alike: one sentence (16,384 would be a page)
    for r in wrapped:
        d = dumps[r]
        alike[f"{d.dropped} entries dropped" if d.dropped else f"oldest record id kept is {d.meta.get('first_id')}"].append(r)
    out = []
    for lost, ranks in alike.items():
        starts = _history_starts([starts_of.get(r, {}) for r in ranks])
        who, its = (f"rank {ranks[0]}", "its") if len(ranks) == 1 else (f"ranks {ranges(ranks)}", "their")
        each = "" if len(ranks) == 1 else " each"
        out.append(f"{who}: ring wrapped ({lost}{each}); {its} history is partial ({starts or 'no collectives kept'}): "
                   f"earlier positions are compared without {'it' if len(ranks) == 1 else 'them'}")
    return out


def _history_starts(per_rank: list[dict[str, int]]) -> str:
    """Where the kept history of each group starts, over several ranks: groups starting alike are named
    together (`groups 1-128 from seq 45`), a start that differs between the ranks as a range."""
    span: dict[str, tuple[int, int]] = {}
    for starts in per_rank:
        for g, s in starts.items():
            lo, hi = span.get(g, (s, s))
            span[g] = (min(lo, s), max(hi, s))
    by_span: dict[tuple[int, int], list[str]] = defaultdict(list)
    for g, lo_hi in span.items():
        by_span[lo_hi].append(g)
    parts = []
    for (lo, hi), names in sorted(by_span.items(), key=lambda kv: _group_order(kv[1])):
        seq = f"seq {lo}" if lo == hi else f"seq {lo}-{hi}"
        parts.append(f"{_group_names(names)} from {seq}")
    return ", ".join(parts)


def _group_order(names: list[str]) -> tuple[int, str]:
    low = min(names, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n))
    return (int(low), "") if low.isdigit() else (1 << 62, low)


def _group_names(names: list[str]) -> str:
    if len(names) == 1:
        return f"group {names[0]}"
    if all(n.isdigit() for n in names):
        return f"groups {ranges(sorted(int(n) for n in names))}"
    shown = sorted(names)
    return "groups " + ", ".join(shown[:4]) + (f" and {len(shown) - 4} more" if len(shown) > 4 else "")


def _in_flight_at_snapshot(result: WaitResult, dumps: dict[int, RankDump]) -> None:
    """A periodic snapshot (FLIGHTREC_SNAPSHOT_S) catches a running job with ops in flight: one younger
    than the rank's own timeout is not a wait (had it outlived it, the watchdog would have written a
    `timeout` dump over the snapshot)."""
    young = []
    for rank, wait in list(result.waits.items()):
        meta = dumps[rank].meta if rank in dumps else {}
        if meta.get("reason") not in RUNNING_REASONS or wait.t_wall_ns is None:
            continue
        timeout_s = (meta.get("settings") or {}).get("timeout_s")
        age = (meta.get("dump_time_ns") or 0) - wait.t_wall_ns
        if isinstance(timeout_s, (int, float)) and age < timeout_s * 1e9:
            del result.waits[rank]
            young.append(rank)
    if young:
        result.notes.append(f"snapshots of a running job (or dumps of ranks whose stall recovered): the ops in flight on "
                            f"ranks {ranges(young)} were younger than their timeout when the dump was taken, so they are "
                            "not taken as waits")


def _program_stacks(thread: dict[str, Any] | None, exc: Any) -> list[tuple[list[str], list[str | None] | None]]:
    """The stacks that say where a waiting thread's program is, best first: the traceback of the exception
    it died of (its live stack is then the exception hook's, e.g. after DDP's all-reduce failed inside
    `loss.backward()`), then its stack when dumped."""
    out: list[tuple[list[str], list[str | None] | None]] = []
    if thread is None:
        return out
    if isinstance(exc, dict) and exc.get("thread") == thread.get("name") and isinstance(exc.get("traceback"), list):
        code = exc.get("code")
        out.append(([str(f) for f in exc["traceback"]], code if isinstance(code, list) else None))
    code = thread.get("code")
    out.append(([str(f) for f in thread.get("stack") or []], code if isinstance(code, list) else None))
    return out
