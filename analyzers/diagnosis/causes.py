"""The rank-dependency graph and its root causes.

Why a graph: a stall in one tensor-parallel group makes its data-parallel peers wait, which makes the
world group wait; every one of those ranks looks hung. Following wait edges to the ranks that are
waited on but wait for nobody names the one originating rank; the others are victims. Each wait
cycle (strongly connected component) is a deadlock. Positions where every member entered and
nobody finished are comm_stuck, one root cause per group instance, at the lowest member rank.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import pandas as pd

from .. import stackview
from ..constants import (
    COMM_STUCK,
    CPP_SITE,
    CRASHED,
    ENQUEUED,
    EXITED,
    KIND_DEADLOCK,
    MISMATCH,
    MISSING_DUMP,
    NOT_ENTERED,
    STARTED,
)
from ..reading.rankdump import RankDump, SideFile
from ..textutil import group_text, plural, ranges
from . import failures as fail
from .matching import MatchResult
from .mismatch import Shift
from .waits import HOW_INFERRED, R_MISMATCH, R_NO_DUMP, Wait, entered_seqs, left_in_flight, progress_counters

# Listing order of root causes: the kinds that decide the verdict (desync, deadlock) first.
CAUSE_ORDER = (MISMATCH, KIND_DEADLOCK, CRASHED, EXITED, NOT_ENTERED, MISSING_DUMP, COMM_STUCK)
OWED = {"send": "recv", "recv": "send"}
RECORDER_FRAME = re.compile(r"[/\\]flightrec[/\\](?:[A-Za-z_]+[/\\])*[A-Za-z_]+\.py:\d+ in ")


@dataclass
class Cause:
    """One root cause, as the report lists it."""

    rank: int
    kind: str
    group: str | None
    seq: int | None
    op: str | None
    detail: str
    ranks: list[int] = field(default_factory=list)
    site: str | None = None
    stack: list[str] = field(default_factory=list)
    victims: list[int] = field(default_factory=list)
    group_desc: str = ""
    source: list[str | None] = field(default_factory=list)  # each stack frame's source line, where known
    last_op: str | None = None  # the rank's newest recorded op, as text
    gil_stacks: dict[str, Any] | None = None  # alive, holding the GIL: its stacks file (reading/gil_stacks.py)
    threads: list[dict[str, Any]] = field(default_factory=list)  # its other busy threads (stackview.busy_threads)
    main_waits: bool = False  # its main thread waits on a lock, a queue or a join (stackview.waits_on_a_thread)

    def item(self) -> dict[str, Any]:
        """The report's `root_causes` item."""
        return {
            "rank": self.rank,
            "kind": self.kind,
            "group": self.group,
            "group_desc": self.group_desc,
            "seq": self.seq,
            "op": self.op,
            "detail": self.detail,
            "ranks": self.ranks or [self.rank],
            "site": self.site,
            "stack": self.stack,
            "source": self.source or [None] * len(self.stack),
            "victims": self.victims,
            "last_op": self.last_op,
            "gil_stacks": self.gil_stacks,
            "threads": self.threads,
            "main_waits_on_thread": self.main_waits,
        }


@dataclass
class CauseResult:
    """Root causes (sorted), wait cycles and evidence gaps."""

    causes: list[Cause]
    cycles: list[list[int]]
    notes: list[str]


def build_graph(ranks: set[int], dumps: dict[int, RankDump], absent: dict[int, str], waits: dict[int, Wait]) -> nx.DiGraph:
    """Node per rank (with or without a dump); edge r -> m when r waits for m."""
    graph = nx.DiGraph()
    for r in sorted(ranks | set(dumps) | set(absent)):
        status = absent.get(r) or ("idle" if r in dumps else R_NO_DUMP)  # absent: rank -> reason code
        graph.add_node(r, dumped=r in dumps, status=status)
    for w in waits.values():
        graph.nodes[w.rank]["status"] = "waiting" if w.targets else "stuck"
        graph.nodes[w.rank].update(group=w.group, seq=w.seq, op=w.op, state=w.state, evidence=w.how)
        for m, reason in w.targets.items():
            if m not in graph:
                graph.add_node(m, dumped=m in dumps, status=absent.get(m, R_NO_DUMP))
            graph.add_edge(w.rank, m, group=w.group, seq=w.seq, op=w.op, kind=w.kind, reason=reason)
    return graph


def find_causes(
    graph: nx.DiGraph,
    waits: dict[int, Wait],
    matched: MatchResult,
    dumps: dict[int, RankDump],
    absent: dict[int, str],
    entries: pd.DataFrame,
    groups: pd.DataFrame,
    failures: list[fail.Failure] | None = None,
    gil_stacks: dict[int, SideFile] | None = None,
) -> CauseResult:
    """Classify every rank that others wait for, directly or transitively, and that waits for nobody.

    `absent` maps ranks without a usable dump to the one-line reason (no file, or why it is unreadable).
    `gil_stacks`: held-GIL stacks files by rank (reading/gil_stacks.py): a rank without a dump whose file was
    written after its peers began waiting for it was alive then, holding the GIL.
    """
    ev = _Evidence.of(graph, waits, matched, dumps, absent, entries, groups, gil_stacks or {})
    cycles = wait_cycles(graph)
    causes = _deadlocks(ev, cycles)
    roots, stuck, notes = _chain_ends(ev, in_cycle={r for c in cycles for r in c})
    causes += roots + _comm_stuck_causes(ev, stuck)
    causes += _unhung_desyncs(ev, causes)
    causes = _drop_explained_by_shifts(causes, matched.shifts)
    _mismatch_sites(causes, entries)
    _other_threads(causes, dumps)
    deadlocked = {c.rank for c in causes if c.kind == KIND_DEADLOCK}
    causes, left_behind = _failure_causes(ev, causes, failures or [])
    _name_victims(ev, causes, failures or [], left_behind)
    causes.sort(key=_listing_key)
    # the cycles whose deadlock causes the failures' order set aside as a crash's victims (`_victims_only`)
    deadlocked -= {c.rank for c in causes if c.kind == KIND_DEADLOCK}
    victims = [cycle for cycle in cycles if set(cycle) <= deadlocked]
    notes += [_victims_note(cycle, causes) for cycle in victims]
    return CauseResult(causes=causes, cycles=[cycle for cycle in cycles if cycle not in victims], notes=notes)


def _victims_note(cycle: list[int], causes: list[Cause]) -> str:
    crashed = sorted(c.rank for c in causes if c.kind == CRASHED)
    after = f"rank{'s' if len(crashed) > 1 else ''} {ranges(crashed)} crashed" if crashed else "a crash"
    return (f"a wait cycle among ranks {ranges(cycle)} is not named a deadlock: it was read after {after}, and each "
            "of its ranks crashed or then lost its connection or was terminated")


@dataclass(frozen=True)
class _Evidence:
    """What find_causes was given, with the group tables every phase looks up (read once)."""

    graph: nx.DiGraph
    waits: dict[int, Wait]
    matched: MatchResult
    dumps: dict[int, RankDump]
    absent: dict[int, str]
    entries: pd.DataFrame
    desc: GroupNames
    size: dict[str, int]  # group -> its size
    members: dict[str, Any]  # group -> its member ranks
    gil_stacks: dict[int, SideFile]

    @classmethod
    def of(cls, graph: nx.DiGraph, waits: dict[int, Wait], matched: MatchResult, dumps: dict[int, RankDump],
           absent: dict[int, str], entries: pd.DataFrame, groups: pd.DataFrame,
           gil_stacks: dict[int, SideFile]) -> _Evidence:
        size = dict(zip(groups["group"].astype(str), groups["size"].astype(int), strict=True)) if len(groups) else {}
        members = dict(zip(groups["group"].astype(str), groups["ranks"], strict=True)) if len(groups) else {}
        return cls(graph=graph, waits=waits, matched=matched, dumps=dumps, absent=absent, entries=entries,
                   desc=GroupNames(groups), size=size, members=members, gil_stacks=gil_stacks)


def wait_cycles(graph: nx.DiGraph) -> list[list[int]]:
    """Every wait cycle (sorted), leaving out waits on a rank that entered the op incompatibly: such a
    wait is the desync, not one that could close a cycle (the mismatched rank may have got through the
    op and wait further on)."""
    waiting = nx.subgraph_view(graph, filter_edge=lambda u, v: graph.edges[u, v].get("reason") != R_MISMATCH)
    sccs = [sorted(c) for c in nx.strongly_connected_components(waiting)
            if len(c) > 1 or waiting.has_edge(next(iter(c)), next(iter(c)))]
    sccs.sort()
    return sccs


def _deadlocks(ev: _Evidence, cycles: list[list[int]]) -> list[Cause]:
    """A deadlock cause for every rank of every cycle: whatever ops close it, each rank in it is to blame."""
    return [c for comp in cycles for c in _deadlock(ev.graph, comp, ev.waits, ev.desc)]


def _chain_ends(ev: _Evidence, in_cycle: set[int]) -> tuple[list[Cause], dict[tuple[Any, ...], list[Wait]], list[str]]:
    """The ranks the wait chains end at (outside any cycle, waiting for nobody): a root cause where others
    wait for it; the op instance it is stuck in where it entered an op and waits for nobody (comm_stuck,
    one per instance); a note where the dumps cannot say whom it waits for."""
    graph = ev.graph
    culprit_at = {(str(g), int(q), int(r)) for g, q, r in ev.matched.culprits.itertuples(index=False)}
    culprit_ranks = set(ev.matched.culprits["rank"].astype(int)) if len(ev.matched.culprits) else set()
    causes: list[Cause] = []
    notes: list[str] = []
    stuck_instances: dict[tuple[Any, ...], list[Wait]] = defaultdict(list)
    for r in graph.nodes:
        if r in in_cycle or graph.out_degree(r) > 0:
            continue
        w = ev.waits.get(r)
        if w is not None and not w.targets:
            if w.unknown or w.how == HOW_INFERRED:
                if graph.in_degree(r):
                    notes.append(
                        f"the wait chain ends at rank {r}, which waits in {w.op} (group {w.group}, seq {w.seq}) "
                        "for ranks that cannot be identified from the dumps (see above)"
                    )
                continue
            if (w.group, w.seq, r) in culprit_at:
                causes.append(_mismatch_at(r, w.group, w.seq, w.op, ev.matched, ev.desc))
                continue
            stuck_instances[_instance_key(w)].append(w)
        elif graph.in_degree(r):
            causes.append(_waited_root(ev, r, culprit_ranks))
    return causes, stuck_instances, notes


def _waited_root(ev: _Evidence, r: int, culprit_ranks: set[int]) -> Cause:
    """Why rank `r`, which others wait for and which waits for nobody, holds them: it left no dump (or is
    alive, holding the GIL), entered an incompatible op, or never entered the op they wait in."""
    graph = ev.graph
    waited = _waited_positions(graph, r, ev.waits)
    reasons = {graph.edges[u, r]["reason"] for u in graph.predecessors(r)}
    if R_MISMATCH in reasons and r in culprit_ranks:  # show where it entered the wrong op
        waited = _waited_positions(graph, r, ev.waits, only=R_MISMATCH)
    g, s, op = _pick(waited, ev.size, ev.waits)
    op = OWED.get(op, op)  # a peer waiting in its send is owed a recv, and the other way round
    if r in ev.absent:
        held = ev.gil_stacks.get(r)
        alive = _holding_gil(r, g, s, op, held, waited, ev.waits, ev.desc) if held is not None else None
        return alive or _missing(r, g, s, op, ev.absent[r], waited, ev.desc, held)
    if R_MISMATCH in reasons and r in culprit_ranks:
        return _mismatch_at(r, g, s, op, ev.matched, ev.desc)
    return _not_entered(r, g, s, op, waited, ev.dumps[r], ev.entries, ev.desc)


def _comm_stuck_causes(ev: _Evidence, stuck: dict[tuple[Any, ...], list[Wait]]) -> list[Cause]:
    """One comm_stuck cause per op instance its members entered and none finished: the link or device,
    not a rank's code, is to suspect."""
    out = []
    for key, instance in stuck.items():
        group_members = list(ev.members.get(key[1], ())) if key[0] == "coll" else list(key[2])
        out.append(_comm_stuck(instance, group_members, ev.desc))
    return out


def _unhung_desyncs(ev: _Evidence, causes: list[Cause]) -> list[Cause]:
    """A mismatch cause for every mismatching rank no cause names yet: desyncs that did not (yet) hang
    anything are root causes too."""
    covered = {(c.rank, c.group, "coll") for c in causes if c.kind == MISMATCH}
    out = []
    for m in ev.matched.mismatches:
        for r in m.ranks:  # p2p: both sides; no majority and no alignment: every rank of the position
            if (r, m.group, m.kind) not in covered:
                covered.add((r, m.group, m.kind))
                out.append(_mismatch_at(r, m.group, m.seq, m.op, ev.matched, ev.desc, kind=m.kind))
    return out


def _drop_explained_by_shifts(causes: list[Cause], shifts: list[Shift]) -> list[Cause]:
    """Drop the not_entered causes an extra op explains: the others did not fail to enter, the shifted
    ranks wait past their last op."""
    for shift in shifts:
        causes = [c for c in causes if not (c.kind == NOT_ENTERED and c.group == shift.group and c.rank in shift.others
                                            and (c.seq or 0) > shift.last)]
    return causes


def _failure_causes(ev: _Evidence, causes: list[Cause],
                    failures: list[fail.Failure]) -> tuple[list[Cause], dict[int, list[int]]]:
    """The causes with the ranks' failures put in time order (_order_failures), and who each rank that
    left deserted (its victims): read once, for the causes and their victims."""
    groups: dict[str, tuple[int, ...]] = {}
    entered: dict[tuple[int, str], int] = {}
    left_behind: dict[int, list[int]] = {}
    if failures:  # who left while others still ran
        groups = {str(g): tuple(int(r) for r in ranks) for g, ranks in ev.members.items()}
        colls = progress_counters(ev.dumps)[0]
        entered = entered_seqs(ev.entries, colls)
        stranded = left_in_flight(colls, fail.exited_ranks(ev.dumps))
        left_behind = fail.deserters(failures, entered, groups, frozenset(stranded["rank"].astype(int)))
    causes = _order_failures(causes, failures, ev.dumps, ev.absent, ev.entries, ev.desc, groups, entered, left_behind)
    return causes, left_behind


def _name_victims(ev: _Evidence, causes: list[Cause], failures: list[fail.Failure],
                  left_behind: dict[int, list[int]]) -> None:
    """Each cause's victims: the ranks that wait on it, directly or through others (and, for a crash, the
    ranks that failed after it; for an exit, those that failed on the connection it closed), never
    another cause's rank."""
    cause_ranks = {r for c in causes for r in (c.ranks or [c.rank])}
    fallen = {f.rank for f in failures if f.kind != fail.EXITED}
    for c in causes:
        anc: set[int] = set()
        for r in c.ranks or [c.rank]:
            if r in ev.graph:
                anc |= nx.ancestors(ev.graph, r)
        if c.kind == CRASHED:
            anc |= fallen  # every rank that failed or was terminated after it went down with it
        if c.kind == EXITED:
            anc |= set(left_behind.get(c.rank, ()))  # they failed on the connection it closed
        c.victims = sorted(anc - cause_ranks)


_KIND_ORDER = {k: i for i, k in enumerate(CAUSE_ORDER)}


def _listing_key(c: Cause) -> tuple[int, int, str, int]:
    """Where a cause is listed: the kinds that decide the verdict first (CAUSE_ORDER), then by rank."""
    return (_KIND_ORDER.get(c.kind, 99), c.rank, c.group or "", c.seq or 0)


def _order_failures(causes: list[Cause], failures: list[fail.Failure], dumps: dict[int, RankDump],
                    absent: dict[int, str], entries: pd.DataFrame, desc: GroupNames,
                    groups: dict[str, tuple[int, ...]], entered: dict[tuple[int, str], int],
                    left_behind: dict[int, list[int]]) -> list[Cause]:
    """Put the ranks' failures in time order: the first own error (or, when peers only lost their
    connections, the ranks that left no dump) is `crashed`; a rank that exited cleanly is `exited`,
    also when nobody waits for it any more but peers that went on without it failed (`fail.deserters`);
    a rank whose only failure is a lost connection is a consequence, never a root cause."""
    if not failures:
        return causes
    causes = _deserted(causes, failures, absent, entries, desc, groups, entered, left_behind)
    own, silent = fail.crash_roots(failures, set(absent))
    if any(c.kind == MISMATCH for c in causes):
        own = []  # a collective that failed on mismatched sizes or types: the desync explains the error
    roots = {f.rank for f in own} | silent
    by_rank = {f.rank: f for f in failures}
    kept: list[Cause] = []
    for c in causes:
        f = by_rank.get(c.rank)
        if c.rank in roots and c.kind in (NOT_ENTERED, MISSING_DUMP, COMM_STUCK):
            c.kind, c.ranks = CRASHED, [c.rank]
            c.detail = fail.explain(c.rank, failures, own, silent)
            _attach_traceback(c, dumps.get(c.rank))
        elif f is not None and f.kind == fail.EXITED and c.kind == NOT_ENTERED:
            c.kind = EXITED
            last = _last_op(entries, c.rank, desc)
            c.last_op = last
            c.detail = (f"rank {c.rank} exited normally" + (f" after {last}" if last else "")
                        + f"; the others still wait for it in {_label(c.group, c.seq, c.op, desc)}")
        elif f is not None and f.kind in (fail.PEER_LOST, fail.TERMINATED) and roots and c.kind in (
                NOT_ENTERED, MISSING_DUMP, COMM_STUCK):
            continue  # a consequence of the crash, listed under `failures` (a mismatch of its own stays)
        elif c.kind == KIND_DEADLOCK and roots and _victims_only(c.ranks, roots, by_rank):
            continue  # the crash and its victims, read from op states after it broke their groups
        kept.append(c)
    named = {c.rank for c in kept}
    for r in sorted(roots - named):
        c = Cause(rank=r, kind=CRASHED, group=None, seq=None, op=None, detail=fail.explain(r, failures, own, silent))
        _attach_traceback(c, dumps.get(r))
        kept.append(c)
    return kept


def _victims_only(cycle: list[int], roots: set[int], by_rank: dict[int, fail.Failure]) -> bool:
    """Whether every rank of a wait cycle either crashed first (`roots`: it died of its own error, so its
    last ops froze pending and it waits for nobody) or then only lost its connection or was terminated:
    the waits were read after the crash broke their groups (on a device backend a failed op is retired as
    completed in PyTorch's recorder, so one rank's failed ops read done and another's pending, and they
    seem to wait on each other), so the cycle is the crash and its victims, not a deadlock. A rank that
    timed out, or exited cleanly, keeps the cycle."""
    return all(r in roots or (r in by_rank and by_rank[r].kind in (fail.PEER_LOST, fail.TERMINATED)) for r in cycle)


def _deserted(causes: list[Cause], failures: list[fail.Failure], absent: dict[int, str], entries: pd.DataFrame,
              desc: GroupNames, groups: dict[str, tuple[int, ...]], entered: dict[tuple[int, str], int],
              left_behind: dict[int, list[int]]) -> list[Cause]:
    """An `exited` cause for each rank that left while others still ran and failed without it, when no
    wait names it already (the others' last op may read completed: PyTorch's gloo recorder retires a
    failed op as completed) and no rank's own error or silent death explains the failures."""
    own, silent = fail.crash_roots(failures, set(absent))
    if own or silent:
        return causes
    named = {c.rank for c in causes}
    for rank, behind in sorted(left_behind.items()):
        if rank in named:
            continue
        last = _last_op(entries, rank, desc)
        mine = [g for g, ranks in groups.items() if rank in ranks and (rank, g) in entered
                and any(entered.get((m, g), -1) > entered[(rank, g)] for m in behind)]
        g = min(mine, key=lambda name: (len(groups[name]), name))
        seq = entered[(rank, g)] + 1
        at = entries.loc[entries["rank"].isin(behind) & (entries["group"] == g) & (entries["seq"] == seq)
                         & (entries["kind"] == "coll"), "op"]
        op = str(at.iloc[0]) if len(at) else None
        failed = {f.rank for f in failures if f.kind != fail.EXITED}
        then = ("then failed on the connection it closed" if set(behind) <= failed else
                "and left with them in flight: their streams waited for it" if not set(behind) & failed else
                "then failed on the connection it closed, or left with them in flight")
        detail = (f"rank {rank} exited normally" + (f" after {last}" if last else "")
                  + f" while rank{'s' if len(behind) > 1 else ''} {ranges(behind)} still ran collectives of group "
                  f"{g} with it (entered seq {seq} and later, which it never joined), {then}")
        causes.append(Cause(rank=rank, kind=EXITED, group=g, seq=seq, op=op, detail=detail,
                            group_desc=desc.get(g, ""), last_op=last))
    return causes


def _attach_traceback(c: Cause, dump: RankDump | None) -> None:
    """A crashed rank's own exception traceback is where to look first."""
    exc = dump.meta.get("exception") if dump is not None else None
    if isinstance(exc, dict) and exc.get("traceback"):
        frames = [str(f) for f in exc["traceback"]]
        c.stack, c.source = stackview.excerpt(frames, exc.get("code"))
        c.site = frames[-1]


def _instance_key(w: Wait) -> tuple[Any, ...]:
    if w.kind == "p2p":
        pair = tuple(sorted((w.rank, w.peer)))
        return ("p2p", w.group, pair, w.seq)
    return ("coll", w.group, w.seq)


def _waited_positions(
    graph: nx.DiGraph, r: int, waits: dict[int, Wait], only: str | None = None
) -> dict[tuple[str, int, str], list[int]]:
    out: dict[tuple[str, int, str], list[int]] = defaultdict(list)
    for u in graph.predecessors(r):
        e = graph.edges[u, r]
        if only is None or e["reason"] == only:
            out[(e["group"], e["seq"], e["op"])].append(u)
    return out


def _pick(waited: dict[tuple[str, int, str], list[int]], size: dict[str, int], waits: dict[int, Wait]) -> tuple[str, int, str]:
    """The position the root most plausibly owes first: smallest group, then the earliest waiter.

    Why: a stall that starts in a small (tensor-parallel) group spreads to the larger groups that
    contain it, and the ranks caught first in it entered their wait first.
    """

    def earliest(key: tuple[str, int, str]) -> int:
        times = [waits[r].t_wall_ns for r in waited[key] if r in waits and waits[r].t_wall_ns is not None]
        return min(times) if times else 1 << 62

    return min(waited, key=lambda k: (size.get(k[0], 1 << 30), earliest(k), -len(waited[k]), k[0], k[1]))


class GroupNames(dict[str, str]):
    """Group name -> its description (what a cause's `group_desc` holds), and how prose names it:
    `group 2 [1, 3] (dp)` (textutil.group_text)."""

    def __init__(self, groups: pd.DataFrame) -> None:
        rows = groups[["group", "desc", "ranks"]].itertuples(index=False) if len(groups) else []
        texts: dict[str, str] = {}
        for g, d, r in rows:
            self[str(g)] = str(d)
            texts[str(g)] = group_text(g, str(d), r)
        self.texts = texts

    def text(self, group: str | None) -> str:
        return self.texts.get(str(group), str(group))


def _label(group: str | None, seq: int | None, op: str | None, desc: GroupNames) -> str:
    """`all_reduce (group 2 [1, 3] (dp), seq 4)`."""
    return f"{op} (group {desc.text(group)}, seq {seq})"


def _awaited_by(waited: dict[tuple[str, int, str], list[int]], desc: GroupNames) -> str:
    parts = [
        f"{_label(g, s, op, desc)} by rank{'s' if len(rs) > 1 else ''} {ranges(rs)}" for (g, s, op), rs in sorted(waited.items())
    ]
    return "; ".join(parts)


def _missing(r: int, g: str, s: int, op: str, why: str, waited: dict[tuple[str, int, str], list[int]], desc: GroupNames,
             held: SideFile | None = None) -> Cause:
    detail = f"rank {r}: {why}; awaited in {_awaited_by(waited, desc)}"
    if held is not None:  # a stacks file that cannot say where the rank is now
        detail += (f"; its held-GIL stacks file {held.file} was written "
                   + ("at an unknown time" if held.written_ns is None else "before its peers began waiting for it")
                   + ": no evidence that it was alive while they waited")
    return Cause(rank=r, kind=MISSING_DUMP, group=g, seq=s, op=op, detail=detail, group_desc=desc.get(g, ""))


def _holding_gil(r: int, g: str, s: int, op: str, held: SideFile, waited: dict[tuple[str, int, str], list[int]],
                 waits: dict[int, Wait], desc: GroupNames) -> Cause | None:
    """A rank with no dump whose held-GIL stacks were written after its peers began waiting for it: it was
    alive then (a dead or SIGSTOPped process writes nothing), its watchdog thread unable to run. Its main
    thread's stack says where. None when the file's time is unknown or earlier than the waits."""
    began = [waits[u].t_wall_ns for rs in waited.values() for u in rs if u in waits and waits[u].t_wall_ns is not None]
    if held.written_ns is None or not began or held.written_ns < min(began):
        return None
    stack, source, innermost = _main_stack(held.threads)
    frames = next((t["stack"] for t in held.threads if t.get("is_main")), [])
    user = stackview.innermost_user(frames)
    where = user[0] if user is not None else innermost
    after = (held.written_ns - min(began)) / 1e9
    place = f"holding the GIL at {where} (the main thread's innermost frame of user code)" if user is not None else (
        f"holding the GIL at {where} (the main thread's innermost frame)" if where else "holding the GIL (no main-thread stack)")
    detail = (f"rank {r} is alive, not answering: {place}; it has not entered {_label(g, s, op, desc)}; awaited in "
              f"{_awaited_by(waited, desc)}; it wrote no dump (its watchdog thread could not run), but faulthandler "
              f"wrote its Python stacks to {held.file} {after:.1f} s after its peers began waiting for it "
              f"(the file's modification time; a dead or frozen process writes nothing)")
    return Cause(rank=r, kind=NOT_ENTERED, group=g, seq=s, op=op, detail=detail, site=where, stack=stack, source=source,
                 group_desc=desc.get(g, ""), gil_stacks={"file": held.file, "written_unix_s": held.written_ns / 1e9,
                                                          "at": where, "writes": held.meta.get("writes")})


def _not_entered(
    r: int, g: str, s: int, op: str, waited: dict[tuple[str, int, str], list[int]], dump: RankDump, entries: pd.DataFrame, desc: GroupNames
) -> Cause:
    stack, source, where = _main_stack(dump.threads)
    last = _last_op(entries, r, desc)
    parts = [f"rank {r} has not entered {_label(g, s, op, desc)}", f"awaited in {_awaited_by(waited, desc)}"]
    if last:
        parts.append(f"its last op: {last}")
    if where:
        parts.append(f"main thread now at {where}")
    else:
        parts.append("no thread stacks in its dump: where it is stuck is unknown")
    reason = dump.meta.get("reason")
    if reason:
        why = dump.meta.get("reason_detail")
        parts.append(f"its dump was written on {reason}" + (f" ({why})" if why else ""))
    return Cause(
        rank=r, kind=NOT_ENTERED, group=g, seq=s, op=op, detail="; ".join(parts), site=where, stack=stack,
        group_desc=desc.get(g, ""), source=source, last_op=last,
    )


def _main_stack(threads: list[dict[str, Any]]) -> tuple[list[str], list[str | None], str | None]:
    """The main thread's stack as the report keeps it (stackview.excerpt), its source lines, and its
    innermost frame."""
    main = next((t for t in threads if t.get("is_main")), None) or next((t for t in threads if t.get("name") == "MainThread"), None)
    frames = [str(f) for f in (main or {}).get("stack") or []]
    code = list((main or {}).get("code") or [None] * len(frames))
    if len(code) != len(frames):
        code = [None] * len(frames)
    while frames and RECORDER_FRAME.search(frames[-1]):  # the recorder writing this very dump
        frames.pop()
        code.pop()
    stack, source = stackview.excerpt(frames, code)
    return stack, source, (frames[-1] if frames else None)


def _other_threads(causes: list[Cause], dumps: dict[int, RankDump]) -> None:
    """Each cause's rank's busy threads besides the main one, and whether its main thread waits on one
    (a lock its checkpoint thread holds): the thread that holds the job up may not be the main one."""
    for c in causes:
        dump = dumps.get(c.rank)
        threads = [t for t in (dump.threads if dump is not None else []) if isinstance(t, dict)]
        if not threads and c.gil_stacks is not None:
            continue
        c.threads = stackview.busy_threads(threads)
        main = next((t for t in threads if t.get("is_main")), None)
        if main is not None:
            stack = [str(f) for f in main.get("stack") or []]
            code = main.get("code") if isinstance(main.get("code"), list) else None
            c.main_waits = stackview.waits_on_a_thread(stack, code)


def _last_op(entries: pd.DataFrame, r: int, desc: GroupNames) -> str | None:
    mine = entries.loc[entries["rank"] == r]
    if mine.empty:
        return None
    row = mine.loc[mine["id"].idxmax()]
    if isinstance(row["site"], str) and row["site"]:
        site = f" at {row['site']}"
    else:
        site = f", {CPP_SITE}" if row.get("source") == "c++" else ""
    return f"{row['op']} (group {desc.text(row['group'])}, seq {row['seq']}, {row['state']}){site}"


def _mismatch_at(r: int, g: str, s: int, op: str, matched: MatchResult, desc: GroupNames,
                 kind: str = "coll") -> Cause:
    """Rank `r`'s mismatch cause in group `g`, at seq `s` when it mismatches there (else its first).

    With no majority the culprit comes from aligning the op streams (its detail says which op is
    extra); when that cannot decide, the cause covers every rank of the position and says so, and a
    p2p payload mismatch covers sender and receiver: a tie is never broken by rank number.
    """
    found = [m for m in matched.mismatches if m.group == g and m.kind == kind and r in m.ranks]
    here = [m for m in found if m.seq == s] or found[:1]
    seq = here[0].seq if here else s
    op_here = here[0].op if here else op
    where = _label(g, seq, op_here, desc)
    more = len({m.seq for m in found}) - 1
    tail = f"; {plural(more, 'other mismatching position')} in this group" if more > 0 else ""
    if here and kind == "p2p":
        m = here[0]
        src, dst = m.extra.get("src"), m.extra.get("dst")
        sent = next((v for v in m.values if v.startswith("send ")), "send ?")[5:]
        got = next((v for v in m.values if v.startswith("recv ")), "recv ?")[5:]
        detail = (f"rank {src} sent {m.field} {sent!r} to rank {dst} (group {g}, p2p seq {seq}), and rank {dst} "
                  f"posted a receive of {got!r}: sender and receiver disagree, and the dumps cannot tell which side "
                  f"is wrong (both are named){tail}")
        return Cause(rank=r, kind=MISMATCH, group=g, seq=seq, op=op_here, detail=detail, ranks=sorted(m.ranks),
                     group_desc=desc.get(g, ""))
    undecided = [m for m in here if m.undecided]
    if undecided:
        m = undecided[0]
        held = "; ".join(f"{m.field} {v!r} on {ranges(rs)}" for v, rs in m.values.items())
        detail = (f"ranks {ranges(m.ranks)} entered incompatible ops at {where} ({held}): no majority, and their op "
                  f"streams do not tell which one diverged (no single extra or missing op explains them): cannot "
                  f"decide, all are named{tail}")
        return Cause(rank=r, kind=MISMATCH, group=g, seq=seq, op=op_here, detail=detail, ranks=list(m.ranks),
                     group_desc=desc.get(g, ""))
    parts = []
    for m in here:
        mine = next((v for v, rs in m.values.items() if r in rs), "?")
        parts.append(f"{m.field} {mine!r} where the others have {m.expected!r}")
    shift = next((m.shift for m in here if m.shift is not None), None)
    why = f"{shift.text()}; " if shift is not None else ""
    detail = f"rank {r} entered an incompatible op at {where}: {why}{'; '.join(parts) or 'see mismatches'}{tail}"
    return Cause(rank=r, kind=MISMATCH, group=g, seq=seq, op=op_here, detail=detail, group_desc=desc.get(g, ""))


def _mismatch_sites(causes: list[Cause], entries: pd.DataFrame) -> None:
    """Give each single-rank collective mismatch cause the call site of its op: the line that issued the
    extra or wrong op is where to look (one lookup for all of them; there are few)."""
    todo = [c for c in causes if c.kind == MISMATCH and c.site is None and len(c.ranks or [c.rank]) == 1]
    if not todo or "site" not in entries.columns:
        return
    near = entries["rank"].isin({c.rank for c in todo}) & entries["seq"].isin({int(c.seq or 0) for c in todo})
    rows = entries.loc[near & (entries["kind"] == "coll"), ["rank", "group", "seq", "site"]]  # a few rows per cause
    sites = {(int(r), str(g), int(q)): st for r, g, q, st in rows.itertuples(index=False) if isinstance(st, str) and st}
    for c in todo:
        c.site = sites.get((c.rank, str(c.group), int(c.seq or 0)))


def _comm_stuck(stuck: list[Wait], group_members: list[int], desc: GroupNames) -> Cause:
    w0 = min(stuck, key=lambda w: w.rank)
    ranks = sorted(set(group_members) | {w.rank for w in stuck})
    states: dict[str, list[int]] = defaultdict(list)
    for w in stuck:
        states[w.state].append(w.rank)
    finished = sorted(set(ranks) - {w.rank for w in stuck})
    state_txt = "; ".join(f"{st} on {ranges(rs)}" for st, rs in sorted(states.items()))
    if finished:
        state_txt += f"; completed on {ranges(finished)}"
    detail = (
        f"every member of {_label(w0.group, w0.seq, w0.op, desc)} entered it and it has not completed ({state_txt}): "
        f"suspect the link or device of ranks {ranges(ranks)}"
    )
    queued, running = states.get(ENQUEUED, []), states.get(STARTED, [])
    if queued and running:  # NCCL-style states: a device that never reached the kernel holds the others
        ranks = sorted(queued)
        detail = (f"ranks {ranges(running)} started {_label(w0.group, w0.seq, w0.op, desc)} on their device and wait; "
                  f"on {ranges(queued)} it is still only scheduled (their GPU never reached the kernel: a stream "
                  f"blocked by earlier work, a hung kernel or a lost device): suspect rank{'s' if len(queued) > 1 else ''} "
                  f"{ranges(queued)}" + (f"; completed on {ranges(finished)}" if finished else ""))
    return Cause(
        rank=min(w.rank for w in stuck if w.rank in ranks) if any(w.rank in ranks for w in stuck) else min(ranks),
        kind=COMM_STUCK,
        group=w0.group,
        seq=w0.seq,
        op=w0.op,
        detail=detail,
        ranks=ranks,
        site=w0.site,
        group_desc=desc.get(w0.group, ""),
    )


def _deadlock(graph: nx.DiGraph, comp: list[int], waits: dict[int, Wait], desc: GroupNames) -> list[Cause]:
    sub = graph.subgraph(comp)
    try:
        cycle = [u for u, _ in nx.find_cycle(sub, source=comp[0])]
    except nx.NetworkXNoCycle:
        cycle = comp
    loop = " -> ".join(map(str, [*cycle, cycle[0]]))
    out = []
    for r in comp:
        w = waits[r]
        inside = sorted(m for m in w.targets if m in comp)
        detail = f"wait cycle {loop}: rank {r} waits in {_label(w.group, w.seq, w.op, desc)} for {ranges(inside)}"
        out.append(
            Cause(rank=r, kind=KIND_DEADLOCK, group=w.group, seq=w.seq, op=w.op, detail=detail, ranks=list(comp), site=w.site,
                  group_desc=desc.get(w.group, ""))
        )
    return out


