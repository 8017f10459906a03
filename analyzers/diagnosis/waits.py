"""Who waits for whom: each rank's blocking op and the members it is waiting on.

Why: a hang is a chain of waits. A rank's blocking ops are its oldest incomplete entry in each group
(with its whole coalescing unit): a rank blocked in one group with an async op still in flight in
another waits for both groups' missing members. A rank whose every incomplete op is async and whose
dump says no thread is inside an op is computing, not waiting. It waits in (group, seq) for every member that has not entered that position, that
has no dump, that entered an incompatible op there, or that entered it but is itself blocked on an
earlier op elsewhere (so waits chain across groups). For p2p, it waits for the peer that has not
posted the matching op (the k-th send a->b pairs with the k-th recv b<-a). A send whose receive
completed is delivered, whatever its sender recorded; an older async p2p op no thread is inside gives
way to the later op a thread is inside (pipelines post several transfers and wait on them in turn).

Two weaker kinds of evidence are used and labelled: a rank whose last op *failed* (e.g. timed out)
is taken as having been blocked there (at the oldest of its last failed ops), and on formats that
cannot observe completion (PyTorch's gloo recorder) a rank's last op counts as blocking when some
member never entered it. Members whose
history is lost (the ring wrapped past the group) are "unknown", never assumed either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from flightrec.format.backends import stream_ordered

from ..constants import COMPLETED, CPP_SITE, FAILED, PENDING_STATES, UNKNOWN
from ..keys import pack_keys
from ..reading.rankdump import RankDump

# Why a rank waits for a member (edge attribute `reason`).
R_NOT_ENTERED = "not_entered"
R_NO_DUMP = "no_dump"
R_UNREADABLE = "unreadable"
R_STALE = "stale"  # its dump is much older than its peers' (analyzers/reading/jobs.py): no current state
R_MISMATCH = "mismatch"
R_BLOCKED = "blocked_elsewhere"
R_EXITED = "exited"  # it entered the position (an async op) and then left the job cleanly

NOTES_PER_KIND = 10  # delivered-send notes listed one by one; the rest are counted

HOW_PENDING = "pending"
HOW_FAILED = "failed"
HOW_INFERRED = "inferred"

_COLS = ["rank", "id", "group", "seq", "kind", "op", "peer", "state", "unit", "pg_seq", "site", "t_enqueue_ns", "source",
         "is_async"]


@dataclass
class Wait:
    """One rank's blocking op and the ranks it waits for."""

    rank: int
    kind: str
    group: str
    seq: int
    op: str
    peer: int
    state: str
    how: str
    id: int
    site: str | None
    t_wall_ns: int | None
    positions: list[tuple[str, str, int, str, int]]  # (kind, group, seq, op, peer) of the unit
    targets: dict[int, str] = field(default_factory=dict)  # member -> reason
    unknown: dict[int, str] = field(default_factory=dict)  # member -> why it cannot be told
    async_only: bool = False  # every op it waits in is async (its thread may be elsewhere)

    def item(self) -> dict[str, object]:
        """The report's `waits` item."""
        out: dict[str, object] = {
            "rank": self.rank,
            "group": self.group,
            "seq": self.seq,
            "op": self.op,
            "waits_for": sorted(self.targets),
            "state": self.state,
            "evidence": self.how,
            "reasons": {str(k): v for k, v in sorted(self.targets.items())},
        }
        if self.kind == "p2p":
            out["peer"] = self.peer
        if self.unknown:
            out["unknown"] = sorted(self.unknown)
        return out


@dataclass
class WaitResult:
    """Blocking ops of every waiting or stuck rank, keyed by rank, plus evidence gaps."""

    waits: dict[int, Wait]
    notes: list[str]


@dataclass
class _Ctx:
    entries: pd.DataFrame
    positions: pd.DataFrame
    members: dict[str, tuple[int, ...]]
    dumps: dict[int, RankDump]
    absent: dict[int, str]
    culprits: set[tuple[str, int, int]]
    wrapped: set[int]
    notes: list[str]
    known: set[str]
    progress: dict[tuple[int, str], tuple[int, int]]  # (rank, group) -> (entered, completed), ring-independent
    p2p_progress: dict[tuple[int, str, str, int], tuple[int, int]]  # (rank, group, op, peer) -> same
    finished: set[int]  # ranks that exited cleanly


def find_waits(
    entries: pd.DataFrame,
    positions: pd.DataFrame,
    members: dict[str, tuple[int, ...]],
    dumps: dict[int, RankDump],
    absent: dict[int, str],
    culprits: pd.DataFrame,
    known_groups: set[str] | None = None,
    finished: set[int] | None = None,
) -> WaitResult:
    """Blocking op per rank and the members each one waits for.

    `known_groups`: groups whose membership is recorded (default: all). In any other group, a rank
    that finds every known member inside the position cannot conclude that nobody is missing.
    `finished`: ranks that exited normally (their exit record's open ops are not waits).
    """
    wrapped = {r for r, d in dumps.items() if d.dropped > 0 or (d.meta.get("first_id") or 0) > 0}
    culprit_set = {(str(g), int(s), int(r)) for g, s, r in culprits[["group", "seq", "rank"]].itertuples(index=False)}
    known = set(members) if known_groups is None else known_groups
    ctx = _Ctx(entries, positions, members, dumps, absent, culprit_set, wrapped, [], known, *progress_counters(dumps),
               finished or set())
    waits = {r: w for r, w in _blocking(ctx).items() if r not in ctx.finished}  # exited: waits for nobody
    for rank in [r for r, w in waits.items()
                 if w.how == HOW_PENDING and w.async_only and _computing(dumps[r]) and not _on_stream(dumps[r], w)]:
        del waits[rank]
        ctx.notes.append(f"rank {rank}: only async ops in flight and no thread inside an op (its dump says so): "
                         "it is computing, not waiting in them")
    _coll_targets(ctx, waits)
    _p2p_targets(ctx, waits)
    for rank in [r for r, w in waits.items() if w.how == HOW_INFERRED and R_NOT_ENTERED not in w.targets.values()]:
        del waits[rank]  # only a dumped member that never entered contradicts the recorded completion
    for w in waits.values():
        if w.how == HOW_INFERRED:
            ctx.notes.append(
                f"rank {w.rank}: its recorder cannot observe completion; {w.op} (group {w.group}, seq {w.seq}) is "
                f"its last op and rank(s) {_short({m for m, why in w.targets.items() if why == R_NOT_ENTERED})} "
                "never entered it, so it is taken as still waiting"
            )
        if w.unknown:
            why = "; ".join(sorted(set(w.unknown.values())))
            named = {m for m in w.unknown if m >= 0}
            who = f"cannot tell whether rank(s) {_short(named)} took part" if named else "cannot tell whom it waits for"
            ctx.notes.append(f"rank {w.rank} waits in {w.op} (group {w.group}, seq {w.seq}); {who}: {why}")
    return WaitResult(waits=waits, notes=ctx.notes)


def progress_counters(dumps: dict[int, RankDump]) -> tuple[dict[tuple[int, str], tuple[int, int]],
                                                     dict[tuple[int, str, str, int], tuple[int, int]]]:
    """Each rank's counters (entered, completed) per group, and per (group, op, peer) of its p2p ops:
    flightrec's `progress` rows, else PyTorch's `pg_status` (collectives) where it is keyed by a group
    name. They say how far a rank got even when its ring holds no entry of that group any more."""
    colls: dict[tuple[int, str], tuple[int, int]] = {}
    pairs: dict[tuple[int, str, str, int], tuple[int, int]] = {}
    for rank, d in dumps.items():
        rows = d.meta.get("progress")
        if isinstance(rows, list):
            for row in rows:
                if not isinstance(row, dict) or not isinstance(row.get("entered"), int):
                    continue
                counts = (int(row["entered"]), int(row.get("completed", -1)))
                if row.get("kind") == "coll":
                    colls[(rank, str(row.get("group")))] = counts
                elif row.get("kind") == "p2p" and isinstance(row.get("peer"), int):
                    pairs[(rank, str(row.get("group")), str(row.get("op")), int(row["peer"]))] = counts
            continue
        for pg, fields in (d.pg_status or {}).items():
            if "last_enqueued_collective" in fields:
                colls[(rank, pg)] = (fields["last_enqueued_collective"], fields.get("last_completed_collective", -1))
    return colls, pairs


def _lists_pairs(dump: RankDump | None) -> bool:
    """flightrec's `progress` has a row per (group, direction, peer) the rank ever posted an op with."""
    return dump is not None and isinstance(dump.meta.get("progress"), list)


# Collectives a member can complete only after every member has entered and contributed: one member's
# completion shows the others' part is done too.
SYMMETRIC_OPS = frozenset(("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                           "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier",
                           "all_reduce_coalesced", "all_gather_coalesced", "allreduce_coalesced"))


def _completed_by_a_member(e: pd.DataFrame, pending: pd.Series, ctx: _Ctx) -> pd.Series:
    """Pending C++-issued symmetric collectives (DDP's, FSDP's) that another member of the group has
    completed. Their state comes from PyTorch's recorder, which marks completion late (seen on torch
    2.15's gloo: `last_completed_collective` one behind a DDP all-reduce its peer had completed), so
    such an op is done, not where the rank hangs: read as pending it made the rank look stuck in an
    op its peers finished (comm_stuck) and hid the rank that never entered the next one. Ops the
    recorder saw return (Python-issued) keep their state."""
    candidates = pending & (e["source"] == "c++") & (e["kind"] == "coll") & e["op"].isin(SYMMETRIC_OPS)
    left_at = _left_at(ctx)
    if left_at:  # a member left the job before this position: nobody can have completed it
        candidates &= ~(e["seq"] > e["group"].astype(object).map(left_at).fillna(np.inf))
    if not candidates.any():
        return candidates
    done = e[(e["state"] == COMPLETED) & (e["kind"] == "coll")]
    best = done.groupby(["group", "rank"], observed=True)["seq"].max().astype("int64")
    counters = pd.Series({(g, r): c for (r, g), (_, c) in ctx.progress.items() if c > 0}, dtype="int64")
    if len(counters):
        counters.index = pd.MultiIndex.from_tuples(counters.index, names=["group", "rank"])
        best = pd.concat([best, counters]).groupby(level=[0, 1]).max()
    if best.empty:
        return candidates & False
    ranked = best.rename("seq").reset_index().sort_values(["group", "seq"], ascending=[True, False])
    top = ranked.groupby("group").head(2)  # the two members furthest ahead in each group
    first = top.groupby("group").nth(0).set_index("group")
    second = top.groupby("group").nth(1).set_index("group")["seq"]
    c = e.loc[candidates, ["rank", "group", "seq"]]
    groups = c["group"].astype(str)
    first_rank = groups.map(first["rank"])
    furthest = groups.map(first["seq"])
    runner_up = groups.map(second).fillna(-1)
    other = np.where(c["rank"].to_numpy() == first_rank.to_numpy(), runner_up.to_numpy(), furthest.fillna(-1).to_numpy())
    late = pd.Series(False, index=e.index)
    late.loc[c.index] = c["seq"].to_numpy() <= other
    for row in e.loc[late[late].index, ["rank", "group", "seq", "op"]].itertuples(index=False):
        ctx.notes.append(f"rank {row.rank}'s {row.op} (group {row.group}, seq {row.seq}), issued from C++, was still "
                         "running in PyTorch's recorder although another member had completed it: taken as completed "
                         "(that recorder marks completion late)")
    return late


def _left_at(ctx: _Ctx) -> dict[str, int]:
    """Group -> the last seq entered by a member that has since exited (the lowest such): no member can
    complete a collective past it. PyTorch's gloo recorder counts a failed op as completed, so another
    member's 'completed' there is no evidence."""
    if not ctx.finished:
        return {}
    out: dict[str, int] = {}
    for (_, group), seq in entered_seqs(ctx.entries, ctx.progress, ctx.finished).items():
        out[group] = min(out.get(group, seq), seq)
    return out


def entered_seqs(entries: pd.DataFrame, progress: dict[tuple[int, str], tuple[int, int]],
                 ranks: set[int] | None = None) -> dict[tuple[int, str], int]:
    """(rank, group) -> the last collective seq the rank entered: the larger of its ring's newest and its
    `progress` counter (`progress_counters`), which sees past a wrapped ring. `ranks`: only these."""
    coll = entries.loc[(entries["kind"] == "coll").to_numpy(), ["rank", "group", "seq"]]
    if ranks is not None:
        coll = coll[coll["rank"].isin(ranks).to_numpy()]
    out = {(int(r), str(g)): int(q) for (r, g), q in coll.groupby(["rank", "group"], observed=True)["seq"].max().items()}
    for (rank, group), (counted, _) in progress.items():
        if ranks is None or rank in ranks:
            out[(rank, group)] = max(out.get((rank, group), -1), int(counted))
    return out


def _delivered(e: pd.DataFrame, pending: pd.Series, ctx: _Ctx) -> pd.Series:
    """Pending sends whose receiver completed the matching receive (the k-th send a->b is the k-th
    receive b<-a): delivered, the transfer is over.

    Why: a send's Work can stay open after its bytes arrived: gloo's reads as running until its own
    rank waits on it, a coalesced batch's Works complete together, and pipeline schedules wait on their
    sends late (torch.distributed.pipelining's at the end of a step). Read as pending, it made a stage
    that went on to block in its next receive look stuck in a transfer its peer had finished
    (comm_stuck), and hid the stage it really waits for. The converse does not hold: a completed send
    says its bytes left the sender (a small NCCL send completes once they sit in the receiver's buffer),
    not that a receive took them, so a pending receive stays pending. The receiver's completion is read
    from its entry, or from its `progress` counters where its ring no longer holds the entry.
    """
    sends = pending & (e["kind"] == "p2p") & (e["op"] == "send") & (e["peer"] >= 0) & (e["seq"] > 0)
    if not sends.any():
        return sends
    mine = e.loc[sends, ["rank", "group", "peer", "seq"]].astype({"group": object})
    recvs = e.loc[(e["kind"] == "p2p") & (e["op"] == "recv") & (e["state"] == COMPLETED)
                  & e["rank"].isin(mine["peer"].unique()) & e["seq"].isin(mine["seq"].unique()),
                  ["rank", "group", "peer", "seq"]]
    recvs = recvs.astype({"group": object}).rename(columns={"rank": "peer", "peer": "rank"}).assign(received=True)
    joined = mine.reset_index().merge(recvs.drop_duplicates(), on=["rank", "group", "peer", "seq"], how="left")
    received = joined["received"].fillna(False).to_numpy(dtype=bool)
    counted = [(receiver, g, sender, done) for (receiver, g, op, sender), (_, done) in ctx.p2p_progress.items()
               if op == "recv" and done > 0]
    if counted:  # the receiver's own counters: its first `completed` receives from this rank are done
        table = pd.DataFrame(counted, columns=["peer", "group", "rank", "done"]).astype({"group": object})
        done = joined[["rank", "group", "peer"]].merge(table, on=["rank", "group", "peer"], how="left")["done"]
        received = received | (joined["seq"].to_numpy() <= done.fillna(0).to_numpy())
    out = pd.Series(False, index=e.index)
    out.loc[joined["index"].to_numpy()[received]] = True
    if received.any():
        _note_delivered(joined[received], ctx)
    return out


def _note_delivered(rows: pd.DataFrame, ctx: _Ctx) -> None:
    """One note per (rank, group, receiver) whose open sends were taken as delivered."""
    spans = rows.groupby(["rank", "group", "peer"])["seq"].agg(["min", "max", "size"])
    for (rank, group, peer), (low, high, n) in spans.head(NOTES_PER_KIND).iterrows():
        which = f"p2p seq {low}" if low == high else f"p2p seqs {low}-{high}"
        ctx.notes.append(f"rank {rank}'s send{'s' if n > 1 else ''} to rank {peer} (group {group}, {which}) still "
                         f"open in its recorder {'were' if n > 1 else 'was'} completed by the receiver: taken as "
                         "delivered (a send's Work can complete only when its rank waits on it, or with its batch)")
    if len(spans) > NOTES_PER_KIND:
        ctx.notes.append(f"... and {len(spans) - NOTES_PER_KIND} more (sender, receiver) pairs whose open sends were "
                         "completed by their receivers: taken as delivered")


def _first_of_failed_run(e: pd.DataFrame, ranks: pd.Series) -> pd.DataFrame:
    """Each of `ranks`' oldest op of the failed ones that end its record: where it stopped. On a device
    stream the ops queued behind the one that failed fail with it (the host had run ahead), so the
    newest failed op is not where the rank was held."""
    mine = e[e["rank"].isin(ranks)]
    failed = (mine["state"] == FAILED).to_numpy()
    last_ok = mine.loc[~failed].groupby("rank")["id"].max()
    trailing = mine[failed & (mine["id"] > mine["rank"].map(last_ok).fillna(-1)).to_numpy()]
    return trailing.loc[trailing.groupby("rank")["id"].idxmin()]


def _blocking(ctx: _Ctx) -> dict[int, Wait]:
    e = ctx.entries[_COLS]
    pending = e["state"].isin(PENDING_STATES)
    pending &= ~_completed_by_a_member(e, pending, ctx)
    pending &= ~_delivered(e, pending, ctx)
    unknown = e["state"] == UNKNOWN
    if unknown.any():  # a C++ op of unknown state blocks only as the rank's last op, per pg_status
        last = e["id"] == e.groupby("rank")["id"].transform("max")
        pending |= unknown & last & _pg_status_pending(e, ctx.dumps)
    chosen: list[pd.DataFrame] = []
    p = e[pending]
    if not p.empty:
        firsts = _held_instead(p, p.loc[p.groupby(["rank", "group"], observed=True)["id"].idxmin()], ctx.dumps)
        units = firsts.loc[firsts["unit"] >= 0, ["rank", "unit"]]
        in_unit = p.merge(units, on=["rank", "unit"]) if not units.empty else p.iloc[0:0]
        chosen.append(pd.concat([firsts[firsts["unit"] < 0], in_unit]).assign(how=HOW_PENDING))
    idle = e[~e["rank"].isin(p["rank"].unique())]
    if not idle.empty:
        lasts = idle.loc[idle.groupby("rank")["id"].idxmax()]
        failed = lasts["state"] == FAILED
        unreliable = lasts["rank"].map(lambda r: not ctx.dumps[int(r)].completion_reliable).astype(bool)
        # a C++-issued op whose completion nobody could observe (PyTorch's recorder off) may be where
        # the rank blocks (DDP's Reducer): inferred like a format that cannot see completion
        unobservable = (lasts["state"] == UNKNOWN).to_numpy()
        chosen.append(_first_of_failed_run(idle, lasts.loc[failed, "rank"]).assign(how=HOW_FAILED))
        chosen.append(lasts[~failed & (unreliable | unobservable)].assign(how=HOW_INFERRED))
    waits: dict[int, Wait] = {}
    if not chosen:
        return waits
    rows = pd.concat(chosen).sort_values(["rank", "id"])
    offsets = {r: d.meta.get("wall_offset_ns") for r, d in ctx.dumps.items()}
    fields = ["rank", "kind", "group", "seq", "op", "peer", "state", "how", "id", "site", "t_enqueue_ns", "source",
              "is_async"]
    for row in rows[fields].astype(object).itertuples(index=False):  # one row per blocking op
        rank = int(row.rank)
        position = (str(row.kind), str(row.group), int(row.seq), str(row.op), int(row.peer))
        if rank in waits:
            if position not in waits[rank].positions:
                waits[rank].positions.append(position)
            waits[rank].async_only &= bool(row.is_async)
            continue
        offset = offsets.get(rank)
        t = row.t_enqueue_ns
        waits[rank] = Wait(
            rank=rank,
            kind=position[0],
            group=position[1],
            seq=position[2],
            op=position[3],
            peer=position[4],
            state=str(row.state),
            how=str(row.how),
            id=int(row.id),
            site=_site(row.site, row.source),
            t_wall_ns=None if (pd.isna(t) or offset is None) else int(t) + int(offset),
            positions=[position],
            async_only=bool(row.is_async) and str(row.how) == HOW_PENDING,
        )
    return waits


def _held_instead(p: pd.DataFrame, firsts: pd.DataFrame, dumps: dict[int, RankDump]) -> pd.DataFrame:
    """Each (rank, group)'s blocking op: its oldest pending one, except where that is an async
    point-to-point op no thread of the rank is inside while a thread is inside a later pending op of the
    group (`threads[].in_op`): that op, where the rank is blocked.

    Why: p2p ops with different peers complete independently, and a pipeline posts several at once and
    waits on them one by one (or late, as torch.distributed.pipelining waits on its sends). A send
    posted earlier whose receiver has posted its receive and is not done with it (it computes) is not
    where the rank waits; naming it made the rank look stuck in a transfer (comm_stuck) while its
    thread waited for a receive its peer never sent. An older async collective still bounds the group
    (a group's collectives complete in order), so it stays.
    """
    held = [(rank, t["in_op"]) for rank, d in dumps.items() for t in d.threads
            if isinstance(t, dict) and isinstance(t.get("in_op"), int) and t["in_op"] >= 0]
    if not held:
        return firsts
    is_held = pd.MultiIndex.from_tuples(held, names=["rank", "id"])
    inside = p[pd.MultiIndex.from_frame(p[["rank", "id"]]).isin(is_held)]
    if inside.empty:
        return firsts
    inside = inside.loc[inside.groupby(["rank", "group"], observed=True)["id"].idxmin()]
    free = (firsts["is_async"].fillna(False).astype(bool) & (firsts["kind"] == "p2p")).to_numpy() & \
        ~pd.MultiIndex.from_frame(firsts[["rank", "id"]]).isin(is_held)
    swap = free & _pairs(firsts).isin(_pairs(inside))
    if not swap.any():
        return firsts
    instead = inside[_pairs(inside).isin(_pairs(firsts[swap]))]
    return pd.concat([firsts[~swap], instead]).sort_values(["rank", "id"])


def _pairs(frame: pd.DataFrame) -> pd.MultiIndex:
    """The rows' (rank, group) keys, comparable across frames (a categorical group as its name)."""
    return pd.MultiIndex.from_arrays([frame["rank"], frame["group"].astype(object)])


def _on_stream(dump: RankDump, wait: Wait) -> bool:
    """Whether the ops the rank waits in run on a stream (NCCL, HCCL, a backend like them): there, an
    op left in flight is where the stream waits, while the host thread may have run on to anything
    (a blocking call returns as soon as it is queued)."""
    backends = {g.name: g.backend for g in dump.groups}
    return any(stream_ordered(backends.get(group, "")) for _, group, *_ in wait.positions)


def _computing(dump: RankDump) -> bool:
    """The dump names, for every thread, the op it is inside (`in_op`), and no thread is inside one."""
    threads = dump.threads
    return bool(threads) and all(isinstance(t, dict) and "in_op" in t and t["in_op"] is None for t in threads)


def _site(site: object, source: object) -> str | None:
    if isinstance(site, str) and site:
        return site
    return CPP_SITE if source == "c++" else None


def _pg_status_pending(e: pd.DataFrame, dumps: dict[int, RankDump]) -> pd.Series:
    """`unknown`-state ops that the backend's own status (torch_fr pg_status) has not completed.

    pg_status is keyed by the backend's pg uid; flightrec entries carry group names, which equal the
    uid in the common case (groups created in the same order on every rank). The recorder already
    resolves most C++ ops itself, so this only decides the rare ones it left `unknown`.
    """
    last: dict[tuple[int, str], int] = {}
    for rank, d in dumps.items():
        for pg, fields in (d.pg_status or {}).items():
            if "last_completed_collective" in fields:
                last[(rank, pg)] = fields["last_completed_collective"]
    if not last:
        return pd.Series(False, index=e.index)
    keys = pd.MultiIndex.from_arrays([e["rank"], e["group"].astype(object)])
    done = pd.Series(last).reindex(keys).to_numpy(dtype=float)
    return pd.Series(~np.isnan(done) & (e["pg_seq"].to_numpy() > np.nan_to_num(done, nan=np.inf)), index=e.index)


def _states_at(positions: pd.DataFrame, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], dict[int, str]]:
    """Each member's state at the positions ranks are blocked in, selected in one pass by (group code,
    seq) (a merge with millions of positions on a categorical and an int cost ~0.3 s per million)."""
    if positions.empty:
        return {}
    groups = pd.Categorical(positions["group"])
    code_of = {str(c): i for i, c in enumerate(groups.categories)}
    keys = [(code_of[g], s) for g, s in wanted if g in code_of]
    if not keys:
        return {}
    seq = positions["seq"].to_numpy().astype(np.int64)
    codes = groups.codes.astype(np.int64)
    pair = np.asarray(keys, dtype=np.int64)
    packed = pack_keys([np.concatenate([codes, pair[:, 0]]), np.concatenate([seq, pair[:, 1]])])  # one radix for both
    if packed is None:  # seqs too far apart to pack: a superset, filtered below
        rows = np.flatnonzero(np.isin(codes, pair[:, 0]) & np.isin(seq, pair[:, 1]))
    else:
        rows = np.flatnonzero(np.isin(packed[:len(codes)], packed[len(codes):]))
    wanted_codes = set(keys)
    names = [str(c) for c in groups.categories]
    out: dict[tuple[str, int], dict[int, str]] = {}
    part = positions.iloc[rows]
    for code, s, rank, state in zip(codes[rows].tolist(), part["seq"].tolist(), part["rank"].tolist(),
                                    part["state"].tolist(), strict=True):
        if (code, s) in wanted_codes:
            out.setdefault((names[code], int(s)), {})[int(rank)] = state
    return out


def _coll_targets(ctx: _Ctx, waits: dict[int, Wait]) -> None:
    at: dict[tuple[str, int], list[int]] = {}
    for w in waits.values():
        for kind, g, s, _, _ in w.positions:
            if kind == "coll":
                at.setdefault((g, s), []).append(w.rank)
    if not at:
        return
    e = ctx.entries
    wanted = e["group"].isin({g for g, _ in at})  # only the groups someone is blocked in: a few of thousands
    coll = e.loc[(e["kind"] == "coll") & wanted, ["group", "rank", "seq"]]
    groups = pd.Categorical(coll["group"])  # grouped by integer code: no string per entry
    known = groups.codes >= 0
    hi = pd.Series(coll["seq"].to_numpy()[known]).groupby([groups.codes[known], coll["rank"].to_numpy()[known]]).max()
    code_of = {str(c): i for i, c in enumerate(groups.categories)}
    blocked_at = {(g, s): set(rs) for (g, s), rs in at.items()}
    blocked_ranks = np.fromiter(waits, dtype=np.int64)
    state_at = _states_at(ctx.positions, set(at))
    absent = np.fromiter(ctx.absent, dtype=np.int64)
    wrapped = np.fromiter(ctx.wrapped, dtype=np.int64)
    finished = np.fromiter(ctx.finished, dtype=np.int64)
    for (g, s), waiters in at.items():  # one iteration per distinct blocking position
        members = np.asarray(ctx.members.get(g, ()), dtype=np.int64)
        if s <= 0 or not len(members):
            for r in waiters:
                waits[r].unknown.update({-1: f"group {g} has no known members or seq"})
            continue
        try:
            hi_g = hi.loc[code_of[g]].reindex(members).to_numpy(dtype=float)
        except KeyError:
            hi_g = np.full(len(members), np.nan)
        if ctx.progress:  # ring-independent counters: how far each member got, wrapped or not
            counted = np.array([ctx.progress.get((int(m), g), (np.nan, np.nan)) for m in members], dtype=float)
            hi_g, finished_here = np.fmax(hi_g, counted[:, 0]), counted[:, 1] >= s
        else:
            finished_here = np.zeros(len(members), dtype=bool)
        is_absent = np.isin(members, absent)
        none = np.isnan(hi_g)
        is_wrapped = np.isin(members, wrapped)
        not_entered = ~is_absent & ((hi_g < s) | (none & ~is_wrapped))
        unknown = ~is_absent & none & is_wrapped
        entered = ~is_absent & ~none & (hi_g >= s)
        states_here = state_at.get((g, s), {})
        done = np.fromiter((states_here.get(int(m)) == COMPLETED for m in members[entered]), dtype=bool,
                           count=int(entered.sum())) | finished_here[entered]
        candidates = members[entered][~done]
        elsewhere = candidates[np.isin(candidates, blocked_ranks) & ~np.isin(candidates, list(blocked_at[(g, s)]))]
        left = candidates[np.isin(candidates, finished)]  # posted it (async), then exited without completing it
        if not_entered.any():  # ... only a cause when every member entered: else it waited for the same rank
            left = left[:0]
        reasons: dict[int, str] = {int(m): ctx.absent[int(m)] for m in members[is_absent]}
        reasons.update({int(m): R_NOT_ENTERED for m in members[not_entered]})
        reasons.update({int(m): R_BLOCKED for m in elsewhere})
        reasons.update({int(m): R_EXITED for m in left})
        culprits = {int(m) for m in members[entered] if (g, s, int(m)) in ctx.culprits}
        lost = {int(m): f"rank {int(m)}'s ring wrapped and holds no op of group {g}" for m in members[unknown]}
        for r in waiters:
            w = waits[r]
            w.targets.update({m: why for m, why in reasons.items() if m != r})
            if (g, s, r) not in ctx.culprits:
                w.targets.update({m: R_MISMATCH for m in culprits if m != r})
            w.unknown.update({m: why for m, why in lost.items() if m != r})
            if g not in ctx.known and not w.targets:
                w.unknown[-1] = (
                    f"group {g}'s membership is not recorded: every rank known to be in it entered seq {s}, "
                    "and a member that did not cannot be named"
                )


def _p2p_targets(ctx: _Ctx, waits: dict[int, Wait]) -> None:
    rows = [(w, p) for w in waits.values() for p in w.positions if p[0] == "p2p"]
    if not rows:
        return
    e = ctx.entries
    peers = {p[4] for _, p in rows if p[4] >= 0}  # only the peers' own entries are looked up
    p2p = e.loc[(e["kind"] == "p2p") & e["rank"].isin(peers), ["rank", "group", "op", "peer", "seq", "state", "id"]]
    p2p = p2p.assign(group=p2p["group"].astype(object), op=p2p["op"].astype(object))
    hi = p2p.groupby(["rank", "group", "op", "peer"])["seq"].max().to_dict()
    entry = p2p.set_index(["rank", "group", "op", "peer", "seq"])[["state", "id"]]
    entry = entry[~entry.index.duplicated()]
    co_waits: list[tuple[Wait, int, str]] = []
    for w, (_, g, k, op, peer) in rows:  # per blocked p2p op: bounded by ranks x unit size
        if peer < 0 or k <= 0:
            w.unknown[-1] = f"{op} from any source in group {g}: the peer is not known"
            continue
        if peer in ctx.absent:
            w.targets[peer] = ctx.absent[peer]
            continue
        other = "recv" if op == "send" else "send"
        top = hi.get((peer, g, other, w.rank))
        counted = ctx.p2p_progress.get((peer, g, other, w.rank))
        if counted is None and (peer, g) in ctx.progress and _lists_pairs(ctx.dumps.get(peer)):
            counted = (0, 0)  # its counters list every peer it ever posted to in the group: none to this one
        if counted is not None:  # the peer's own counters: how many it posted and completed, wrapped or not
            if counted[1] >= k:
                continue
            top = max(top or 0, counted[0])
        if top is None:
            if peer in ctx.wrapped:
                w.unknown[peer] = f"rank {peer}'s ring wrapped and holds no {other} with rank {w.rank}"
            else:
                w.targets[peer] = R_NOT_ENTERED
            continue
        if top < k:
            w.targets[peer] = R_NOT_ENTERED
            continue
        key = (peer, g, other, w.rank, k)
        state = str(entry.loc[key, "state"]) if key in entry.index else None
        if state == COMPLETED:
            continue
        mine = waits.get(peer)
        if mine is None:
            continue
        if any(p[0] == "p2p" and p[1] == g and p[2] == k and p[3] == other and p[4] == w.rank for p in mine.positions):
            co_waits.append((w, peer, g))
        else:
            w.targets[peer] = R_BLOCKED
    # A batch completes as one unit: the peer's matching op is stuck while its unit waits on someone.
    for w, peer, g in co_waits:
        mine = waits[peer]
        if sum(p[0] == "p2p" and p[1] == g for p in mine.positions) > 1 and mine.targets:
            w.targets[peer] = R_BLOCKED


def _short(ranks: dict[int, str] | set[int]) -> str:
    from ..textutil import ranges

    return ranges(r for r in ranks if r >= 0) or "?"


def left_in_flight(colls: dict[tuple[int, str], tuple[int, int]], finished: set[int]) -> pd.DataFrame:
    """Ranks that exited normally with a collective of theirs still in flight that a member of its
    group never entered: `[rank, group, entered, completed, behind]` (`behind`: the lowest count of
    collectives a member of the group entered), from the collective counters of `progress_counters`.

    Why: on a device backend (NCCL, HCCL) the host returns before the op runs, so a rank can reach its
    exit while its stream still waits in an op a peer skipped; the exit looks clean, the op never
    completed. Such a job did not end well, whatever the exit records say (never `healthy`).
    """
    columns = ["rank", "group", "entered", "completed", "behind"]
    if not finished:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame([(r, g, e, c) for (r, g), (e, c) in colls.items()], columns=columns[:4])
    if table.empty:
        return pd.DataFrame(columns=columns)
    table["behind"] = table.groupby("group")["entered"].transform("min")
    open_at_exit = (table["rank"].isin(list(finished)) & (table["completed"] >= 0)
                    & (table["completed"] < table["entered"]) & (table["behind"] < table["entered"]))
    return table.loc[open_at_exit, columns].reset_index(drop=True)


def receives_left_open(pairs: dict[tuple[int, str, str, int], tuple[int, int]], finished: set[int]) -> pd.DataFrame:
    """Receives still in flight when their rank exited normally: `[rank, group, peer, entered, completed]`,
    from the p2p counters of `progress_counters`.

    Why: as with `left_in_flight`, a device backend's host can leave while its stream still waits for a
    transfer (two stages that both receive first); a receive that never completed is data that never
    came, so such a job did not end well."""
    columns = ["rank", "group", "peer", "entered", "completed"]
    if not finished:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame([(r, g, p, e, c) for (r, g, op, p), (e, c) in pairs.items() if op == "recv"], columns=columns)
    if table.empty:
        return table
    open_at_exit = table["rank"].isin(list(finished)) & (table["completed"] >= 0) & (table["completed"] < table["entered"])
    return table.loc[open_at_exit].reset_index(drop=True)
