"""`flightrec export DIR --trace FILE`: the dumps as a timeline in the Chrome trace-event format.

Why: Perfetto (ui.perfetto.dev), chrome://tracing and Chrome DevTools' Performance panel open this
JSON and let people scroll, zoom and search the ops of thousands of ranks; the analyzer's
conclusions (which op blocks, whom it waits for, which rank is the root cause) are drawn on them.

Layout (docs/timeline.md): a process per host, a thread per rank, a complete event per op. Only
measured times are drawn: an op is a slice from its measured start to its measured end, or to its
rank's dump time when it was still pending then; an op whose end was not recorded is an instant at
its start; an op without a measured start (a C++-issued op whose times were only polled by the
watchdog, which the analyzer does not keep) is left out and counted in the metadata. Times are each
rank's own wall clock, as everywhere in the analyzer: hosts' clocks are not corrected.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from ..analysis import Analysis
from ..constants import MAX_RANKS, PENDING_STATES
from ..keys import first_rows, group_ids, is_value
from ..textutil import plural, ranges
from . import postmortem as pm

try:  # optional (flightrec[fast]); the ops are template text either way, this serialises the rest
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

TRACE_SCHEMA = "flightrec-trace/1"
LANE_STRIDE = MAX_RANKS  # tid of a rank's k-th extra lane (ops overlapping in time): rank + k * LANE_STRIDE
CHUNK = 100_000  # events serialised per write: bounded memory at millions of ops
UNKNOWN_HOST = "host unknown"
CLOCK_TEXT = ("each rank's own wall clock (its monotonic entry times plus the wall-minus-monotonic offset its dump "
              "recorded; PyTorch's recorder stamps wall-clock times); hosts' clocks are not corrected, see "
              "clock_offsets_ms for the analyzer's estimate of how far apart they are")
# Chrome's reserved colour names (Perfetto colours by name and ignores them); completed ops keep the per-name colour.
CNAMES = {pm.ST_BLOCKING: "terrible", pm.ST_PENDING: "yellow", pm.ST_FAILED: "black", pm.ST_MISMATCH: "bad",
          pm.ST_UNKNOWN: "grey"}
ROOT_CAUSE_CNAME = "terrible"
NAMED_STATUSES = (pm.ST_BLOCKING, pm.ST_PENDING, pm.ST_FAILED, pm.ST_MISMATCH)  # "all_reduce (blocking)"
END_PENDING = "the rank's dump time: the op was still pending when the rank dumped"
END_NOT_RECORDED = "not recorded in this dump: start only"
END_PENDING_UNDATED = "still pending when the rank dumped; the dump does not say when that was: start only"
END_NOTES = (END_PENDING, END_NOT_RECORDED, END_PENDING_UNDATED)
# Columns an op's event template is made of (the rest of its args are per op); ARG_ORDER: as the args list them.
TEMPLATE_COLUMNS = ("op", "kind", "group", "state", "status", "api", "reduce_op", "in_shapes", "out_shapes",
                    "in_dtypes", "out_dtypes", "site")
ARG_ORDER = ("group", "group_desc", "state", "status", "api", "reduce_op", "in_shapes", "out_shapes", "in_dtypes", "out_dtypes",
             "site")


@dataclass
class TraceWritten:
    """What `write_trace` wrote: the file and its event counts (metadata events included in `events`)."""

    path: Path
    events: int
    slices: int
    pending: int
    instants: int
    left_out: int
    ranks: int
    hosts: int
    flows: int = 0
    markers: int = 0
    older: int = 0
    last_ops: int | None = None

    def line(self) -> str:
        """The one-line account the CLI prints."""
        left = f"; {plural(self.left_out, 'op')} without a measured start left out" if self.left_out else ""
        if self.older:
            left += f"; {plural(self.older, 'older op')} left out (--trace-last {self.last_ops})"
        size = self.path.stat().st_size / 1e6
        return (f"wrote {plural(self.events, 'trace event')} to {self.path} ({size:.1f} MB): {plural(self.ranks, 'rank')} on "
                f"{plural(self.hosts, 'host')}, {plural(self.slices + self.pending, 'op slice')} "
                f"({self.pending} pending at dump time), {plural(self.instants, 'start-only op')}, "
                f"{plural(self.markers, 'root-cause marker')}, {plural(self.flows, 'wait arrow')}{left}")


@dataclass
class _Ops:
    """The drawn ops, one row each, in output order, with positions back into the entry table."""

    row: np.ndarray  # position in pm.entries(a)
    rank: np.ndarray
    ts: np.ndarray  # ns since t0
    dur: np.ndarray  # ns; 0 for instants
    instant: np.ndarray  # bool
    lane: np.ndarray
    end_note: np.ndarray  # object: None, END_PENDING, END_NOT_RECORDED or END_PENDING_UNDATED


def write_trace(a: Analysis, out: str | os.PathLike[str], last_ops: int | None = None) -> TraceWritten:
    """Write the timeline of `a` to `out` (gzip-compressed when its name ends with `.gz`); `last_ops`:
    only each rank's N most recent entries (a hang is at the end; a 1,024-rank job's whole rings are
    ~650 MB of JSON, more than chrome://tracing and a browser tab of Perfetto hold)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    built = _Builder(a, last_ops)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with _open(tmp, gzipped=path.name.endswith(".gz")) as fh:
            fh.write(b'{"displayTimeUnit":"ms","metadata":')
            fh.write(_dumps(built.metadata()))
            fh.write(b',"traceEvents":[')
            for chunk in built.chunks():
                fh.write(chunk)
            fh.write(b"]}\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # no half-written trace left behind (disk full, Ctrl-C)
        raise
    return built.written(path)


def trace_dict(a: Analysis, last_ops: int | None = None) -> dict[str, Any]:
    """The trace as a dict, parsed back from the very text `write_trace` writes (tests, notebooks)."""
    built = _Builder(a, last_ops)
    events = json.loads(b"[" + b"".join(built.chunks()) + b"]")
    return {"displayTimeUnit": "ms", "metadata": built.metadata(), "traceEvents": events}


class _Builder:
    """Tracks, ops, markers and flows of one analysis, computed column-wise once; events on demand."""

    def __init__(self, a: Analysis, last_ops: int | None = None) -> None:
        self.a = a
        self.last_ops = last_ops
        self.rep = a.report()
        self.df = pm.entries(a)
        self._tracks()
        self._ops()
        self._markers()
        self._flows()

    # --- tracks: a process per host, a thread per rank -------------------------------------------

    def _tracks(self) -> None:
        a = self.a
        self.ranks = sorted(set(a.graph.nodes) | set(a.dumps))
        host_of = {r: _host(a, r) for r in self.ranks}
        hosts: list[str] = []
        for r in self.ranks:  # hosts in the order of their lowest rank; the unknown one last
            if host_of[r] != UNKNOWN_HOST and host_of[r] not in hosts:
                hosts.append(host_of[r])
        if UNKNOWN_HOST in host_of.values():
            hosts.append(UNKNOWN_HOST)
        self.hosts = hosts
        pid_of_host = {h: i + 1 for i, h in enumerate(hosts)}
        self.pid = {r: pid_of_host[host_of[r]] for r in self.ranks}
        kinds: dict[int, list[str]] = {}
        for c in self.rep["root_causes"]:
            for r in c["ranks"]:
                if c["kind"] not in kinds.setdefault(r, []):
                    kinds[r].append(c["kind"])
        self.cause_kinds = kinds
        missing, unreadable, stale = set(a.missing), set(a.unreadable), set(a.stale)
        names = {}
        for r in self.ranks:
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
        self.thread_name = names

    # --- ops: measured times only ----------------------------------------------------------------

    def _ops(self) -> None:
        df = self.df
        rank = df["rank"].to_numpy().astype(np.int64)
        start, has_start = _ints(df["t_enqueue_wall_ns"])
        end, has_end = _ints(df["t_complete_wall_ns"])
        has_end &= has_start & (end >= start)
        pending = np.logical_or.reduce([is_value(df["state"], state) for state in PENDING_STATES])
        dump_at = np.zeros(max(self.ranks, default=-1) + 1, dtype=np.int64)
        dated = np.zeros(len(dump_at), dtype=bool)
        for r, d in self.a.dumps.items():
            t = d.meta.get("dump_time_ns")
            if isinstance(t, int) and not isinstance(t, bool) and t > 0:
                dump_at[r], dated[r] = t, True
        self.dump_at = {r: int(dump_at[r]) for r in np.flatnonzero(dated).tolist()}
        pend_slice = pending & has_start & ~has_end & dated[rank] & (dump_at[rank] >= start)
        recent = np.ones(len(df), dtype=bool)
        if self.last_ops is not None:  # each rank's newest entries (the table keeps each rank's in record order)
            recent = (df.groupby("rank", sort=False).cumcount(ascending=False) < self.last_ops).to_numpy()
        self.older = int((~recent).sum())
        closed = has_end & has_start & recent
        pend_slice &= recent
        drawn = has_start & recent
        instant = drawn & ~closed & ~pend_slice
        unmeasured = ~has_start & recent
        self.no_start = int(unmeasured.sum())
        self.no_wall = int((unmeasured & df["t_enqueue_ns"].notna().to_numpy()).sum())
        self.left_out_ranks = sorted(set(np.unique(rank[unmeasured]).tolist()))
        stop = np.where(closed, end, np.where(pend_slice, dump_at[rank], start))
        # t0: the earliest drawn time, or of a marker (dump times) when nothing else is dated
        candidates = [int(start[drawn].min())] if drawn.any() else []
        candidates += list(self.dump_at.values())
        self.t0 = min(candidates) if candidates else 0
        rows = np.flatnonzero(drawn)
        note = np.full(len(df), None, dtype=object)
        note[pend_slice] = END_PENDING
        note[instant & pending] = END_PENDING_UNDATED
        note[instant & ~pending] = END_NOT_RECORDED
        ts = start[rows] - self.t0
        dur = stop[rows] - start[rows]
        lane = _lanes(rank[rows], ts, dur, instant[rows])
        order = np.lexsort((-dur, ts))  # by start, the longer first: a viewer nests nothing wrongly
        rows = rows[order]
        self.ops = _Ops(row=rows, rank=rank[rows], ts=ts[order], dur=dur[order], instant=instant[rows],
                        lane=lane[order], end_note=note[rows])
        self.n_slices = int((closed & drawn).sum())
        self.n_pending = int(pend_slice.sum())
        self.n_instants = int(instant.sum())
        self.tid = self.ops.rank + self.ops.lane * LANE_STRIDE
        self.lanes = {int(r): int(k) for r, k in pd.Series(self.ops.lane).groupby(self.ops.rank).max().items()}
        blocking = df["blocking"].to_numpy()[rows]
        kind = np.asarray(_strings(df["kind"], rows), dtype=object)
        self.wait_start: dict[int, int] = {}  # rank -> start (ns since t0) of its earliest drawn blocking op
        self.blocking_at: dict[int, tuple[int, int, str]] = {}  # rank -> (ts, tid, cat) of its earliest blocking slice
        for i in np.flatnonzero(blocking).tolist():  # in start order
            r = int(self.ops.rank[i])
            self.wait_start.setdefault(r, int(self.ops.ts[i]))
            if not self.ops.instant[i]:
                self.blocking_at.setdefault(r, (int(self.ops.ts[i]), int(self.tid[i]), kind[i]))
        spans = np.flatnonzero(~self.ops.instant)
        last_ranks, at = np.unique(self.ops.rank[spans][::-1], return_index=True)
        last = spans[len(spans) - 1 - at]  # each rank's latest-starting slice
        self.last_at = {int(r): (int(self.ops.ts[i]), int(self.tid[i]), kind[i])
                        for r, i in zip(last_ranks.tolist(), last.tolist(), strict=True)}

    # --- the analysis drawn on top: root causes and waits ----------------------------------------

    def _markers(self) -> None:
        """An instant on each root-cause rank at its last known moment: its dump time, else its last
        recorded time, else (no record at all) where the first rank waiting for it began to wait."""
        ops = self.ops
        last = {}
        if len(ops.row):
            stop = ops.ts + ops.dur
            last = {int(r): int(t) for r, t in pd.Series(stop).groupby(ops.rank).max().items()}
        waiters: dict[int, list[int]] = {}
        for w in self.rep["waits"]:
            for m in w["waits_for"]:
                waiters.setdefault(m, []).append(w["rank"])
        self.markers: list[dict[str, Any]] = []
        seen: set[tuple[int, str]] = set()
        for c in self.rep["root_causes"]:
            for r in c["ranks"]:
                if (r, c["kind"]) in seen:
                    continue
                seen.add((r, c["kind"]))
                if r in self.dump_at:
                    at, how = self.dump_at[r] - self.t0, "the rank's dump time (its last known moment)"
                elif r in last:
                    at, how = last[r], "the rank's last recorded time (the dump does not say when it was taken)"
                else:
                    starts = [self.wait_start[w] for w in waiters.get(r, []) if w in self.wait_start]
                    if not starts:
                        continue
                    at, how = min(starts), "no record of this rank: placed where the first rank waiting for it began to wait"
                args = {"kind": c["kind"], "detail": c["detail"], "time": how}
                for key in ("op", "group", "group_desc", "seq", "site", "last_op", "host", "pid", "local_rank"):
                    if c.get(key) not in (None, ""):
                        args[key] = c[key]
                if c["ranks"] != [r]:
                    args["ranks"] = ranges(c["ranks"])
                if c["victims"]:
                    args["victims"] = f"{plural(len(c['victims']), 'rank')}: {ranges(c['victims'])}"
                self.markers.append({"name": f"root cause: {c['kind']}", "cat": "root_cause", "ph": "i", "s": "t",
                                     "ts": _us(at), "pid": self.pid[r], "tid": r, "cname": ROOT_CAUSE_CNAME,
                                     "args": args})
        self.marker_at = {m["tid"]: m["ts"] for m in self.markers}

    def _flows(self) -> None:
        """A flow arrow from each waiting rank's blocking op to each rank it waits for: to that rank's own
        blocking op, else its latest op, else its root-cause marker. Both ends sit at the start of the
        slice they belong to and carry the waiter's op kind as category (DevTools binds a flow only to
        an event of the same time and category; Perfetto and chrome://tracing to the enclosing slice).
        A wait whose waiting op is not drawn as a slice has no arrow."""
        self.flows: list[dict[str, Any]] = []
        self.waits_text: dict[int, str] = {}
        n = 0
        for w in self.rep["waits"]:
            targets = w["waits_for"]
            self.waits_text[w["rank"]] = f"rank{'s' if len(targets) > 1 else ''} {ranges(targets)}" if targets else ""
            src = self.blocking_at.get(w["rank"])
            if src is None:
                continue
            for m in targets:
                anchor = self.blocking_at.get(m) or self.last_at.get(m)
                if anchor is not None:
                    ts, tid = _us(anchor[0]), anchor[1]
                elif m in self.marker_at:
                    ts, tid = self.marker_at[m], m
                else:
                    continue
                n += 1
                common = {"name": "waits for", "cat": src[2], "id": n}
                self.flows.append({**common, "ph": "s", "ts": _us(src[0]), "pid": self.pid[w["rank"]], "tid": src[1]})
                self.flows.append({**common, "ph": "f", "bp": "e", "ts": ts, "pid": self.pid[m], "tid": tid})
        self.n_flows = n

    # --- output ---------------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        """The file's `metadata` object (docs/timeline.md)."""
        rep = self.rep
        left_note = ("ops without a measured start are not drawn: C++-issued ops (DDP's Reducer, functional "
                     "collectives) recorded without PyTorch's recorder have only the times the watchdog's polling "
                     "saw them, which are not measurements")
        return {
            "schema": TRACE_SCHEMA,
            "folder": str(self.a.folder),
            "verdict": rep["verdict"],
            "summary": rep["summary"],
            "clock": CLOCK_TEXT,
            "t0_wall_ns": self.t0,
            "ts": "microseconds since t0_wall_ns",
            "clock_offsets_ms": rep["clock_offsets_ms"],
            "ranks": len(self.ranks),
            "hosts": self.hosts,
            "ops": {"slices": self.n_slices, "pending_slices": self.n_pending, "start_only": self.n_instants,
                    "left_out": self.no_start, "older": self.older},
            "last_ops": self.last_ops,
            "left_out": {"ops": self.no_start, "no_wall_clock": self.no_wall,
                         "ranks": ranges(self.left_out_ranks), "why": left_note} if self.no_start else {},
            "root_causes": [{"rank": c["rank"], "ranks": c["ranks"], "kind": c["kind"], "host": c.get("host")}
                            for c in rep["root_causes"]],
            "waits": len(rep["waits"]),
            "colours": {"blocking": CNAMES[pm.ST_BLOCKING], "pending": CNAMES[pm.ST_PENDING],
                        "failed": CNAMES[pm.ST_FAILED], "mismatch": CNAMES[pm.ST_MISMATCH],
                        "unknown": CNAMES[pm.ST_UNKNOWN], "root cause": ROOT_CAUSE_CNAME},
        }

    def chunks(self) -> Iterator[bytes]:
        """The `traceEvents` items as JSON text, comma-separated, in pieces of at most CHUNK ops:
        track names, the ops, then root-cause markers and wait flows."""
        yield _dumps(self._track_events())[1:-1]
        if len(self.ops.row):
            self._prepare_ops()
            for lo in range(0, len(self.ops.row), CHUNK):
                yield b"," + self._op_text(lo, min(lo + CHUNK, len(self.ops.row))).encode()
        if self.markers or self.flows:
            yield b"," + _dumps(self.markers + self.flows)[1:-1]

    def _track_events(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i, host in enumerate(self.hosts):
            pid = i + 1
            out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": host}})
            out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": i}})
        for r in self.ranks:
            pid = self.pid[r]
            for lane in range(self.lanes.get(r, 0) + 1):
                name = self.thread_name[r] if lane == 0 else f"rank {r} (overlapping ops, lane {lane + 1})"
                tid = r + lane * LANE_STRIDE
                out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
                out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": r}})
        return out

    def _prepare_ops(self) -> None:
        """Each op's event as a template shared by every op with the same name, group, shapes, dtypes,
        state, site (serialised once) plus its own numbers: at millions of ops, a dict per op and its
        serialisation cost ten times more than the template's text with a few numbers put in."""
        ops, df = self.ops, self.df
        rows = ops.row
        codes = {name: _codes(df[name], rows) for name in TEMPLATE_COLUMNS}
        note_code = np.zeros(len(rows), dtype=np.int64)
        for i, text in enumerate(END_NOTES, start=1):
            note_code[ops.end_note == text] = i
        template = group_ids([*codes.values(), ops.instant.astype(np.int64), note_code])
        firsts = first_rows(template)
        desc = dict(zip(self.a.groups["group"].astype(str), self.a.groups["desc"].astype(str), strict=True))
        values = {name: _strings(df[name], rows[firsts]) for name in TEMPLATE_COLUMNS}
        prefixes = []
        for j in range(len(firsts)):
            v = {name: values[name][j] for name in TEMPLATE_COLUMNS}
            name = v["op"] or "unknown"
            if v["status"] in NAMED_STATUSES:  # Perfetto colours by name and ignores cname: the name must differ
                name = f"{name} ({v['status']})"
            head: dict[str, Any] = {"name": name, "cat": v["kind"] or "", "ph": "X"}
            if ops.instant[firsts[j]]:
                head["ph"], head["s"] = "i", "t"
            cname = CNAMES.get(v["status"] or "")
            if cname:
                head["cname"] = cname
            v["group_desc"] = desc.get(v["group"], "") if v["group"] is not None else None
            if v["status"] == v["state"]:  # completed, failed: the analysis adds nothing to the entry's state
                v["status"] = None
            if v["api"] == v["op"]:
                v["api"] = None
            args = {key: v[key] for key in ARG_ORDER if v[key] is not None}
            if name != v["op"]:
                args = {"op": v["op"], **args}
            if note_code[firsts[j]]:
                args["end"] = END_NOTES[note_code[firsts[j]] - 1]
            text = _dumps({**head, "args": {**args, "seq": 0}}).decode()
            prefixes.append(text[: text.rindex("0}}")])  # ... "seq": | <seq><extras>}, "ts": ...
        self._template = template
        self._prefixes = prefixes
        self._seq = df["seq"].to_numpy()[rows]
        pid_of = np.zeros(max(self.ranks) + 1, dtype=np.int64)
        for r, pid in self.pid.items():
            pid_of[r] = pid
        self._pid = pid_of[ops.rank]
        self._extra = self._extras()

    def _extras(self) -> np.ndarray:
        """The args only some ops have (p2p peer, root, error, lateness, device times, whom a blocking op
        waits for), as JSON text per op ('' for most), built on those ops only."""
        ops, df = self.ops, self.df
        rows = ops.row
        extra = np.full(len(rows), "", dtype=object)

        def add(at: np.ndarray, key: str, values: list[Any]) -> None:
            for i, value in zip(at.tolist(), values, strict=True):
                extra[i] += f',"{key}":{_dumps(value).decode()}'

        p2p = np.flatnonzero(is_value(df["kind"], "p2p")[rows])
        add(p2p, "peer", df["peer"].to_numpy()[rows[p2p]].tolist())
        root = df["root"].to_numpy()[rows]
        add(np.flatnonzero(root >= 0), "root", root[root >= 0].tolist())
        error = df["error"].to_numpy(dtype=object)[rows]
        failed = np.flatnonzero(pd.notna(error))
        add(failed, "error", [str(e) for e in error[failed]])
        late, has_late = _ints(df["late_ns"].take(rows))
        add(np.flatnonzero(has_late), "late_ms", [round(v / 1e6, 3) for v in late[has_late].tolist()])
        offsets = np.zeros(max(self.ranks) + 1, dtype=np.int64)
        known = np.zeros(len(offsets), dtype=bool)
        for r, d in self.a.dumps.items():
            if isinstance(d.meta.get("wall_offset_ns"), int):
                offsets[r], known[r] = d.meta["wall_offset_ns"], True
        for name, key in (("t_dev_start_ns", "dev_start_us"), ("t_dev_end_ns", "dev_end_us")):
            values, has = _ints(df[name].take(rows))
            has &= known[ops.rank]
            add(np.flatnonzero(has), key, [_us(v) for v in (values[has] + offsets[ops.rank[has]] - self.t0).tolist()])
        blocking = np.flatnonzero(df["blocking"].to_numpy()[rows])
        text = [self.waits_text.get(r) for r in ops.rank[blocking].tolist()]
        keep = np.asarray([t is not None and t != "" for t in text], dtype=bool)
        add(blocking[keep], "waits_for", [t for t in text if t])
        return extra

    def _op_text(self, lo: int, hi: int) -> str:
        """Ops lo..hi as comma-separated JSON objects: template text plus each op's numbers."""
        ops = self.ops
        dur = [f',"dur":{d}' for d in (ops.dur[lo:hi] / 1000).tolist()]
        for i in np.flatnonzero(ops.instant[lo:hi]).tolist():
            dur[i] = ""
        prefixes = self._prefixes
        return ",".join(
            f'{prefixes[k]}{s}{x}}},"ts":{t}{d},"pid":{p},"tid":{th}}}'
            for k, s, x, t, d, p, th in zip(
                self._template[lo:hi].tolist(), self._seq[lo:hi].tolist(), self._extra[lo:hi].tolist(),
                (ops.ts[lo:hi] / 1000).tolist(), dur, self._pid[lo:hi].tolist(), self.tid[lo:hi].tolist(), strict=True)
        )

    def written(self, path: Path) -> TraceWritten:
        n_tracks = len(self.hosts) * 2 + sum((self.lanes.get(r, 0) + 1) * 2 for r in self.ranks)
        return TraceWritten(path=path, events=n_tracks + len(self.ops.row) + len(self.markers) + len(self.flows),
                            slices=self.n_slices, pending=self.n_pending, instants=self.n_instants,
                            left_out=self.no_start, ranks=len(self.ranks), hosts=len(self.hosts), flows=self.n_flows,
                            markers=len(self.markers), older=self.older, last_ops=self.last_ops)


def _host(a: Analysis, rank: int) -> str:
    host = a.dumps[rank].meta.get("host") if rank in a.dumps else None
    return str(host) if host not in (None, "") else UNKNOWN_HOST


def _ints(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A nullable integer column as (int64 values with 0 where null, mask of the non-null): no float
    on the way, wall-clock nanoseconds (~1.8e18) do not fit a float's 53 bits."""
    values = pd.array(column, dtype="Int64")
    present = ~values.isna()
    return values.to_numpy(dtype=np.int64, na_value=0), np.asarray(present, dtype=bool)


def _strings(column: pd.Series, rows: np.ndarray) -> list[Any]:
    """The values of a categorical (or object) column at `rows` as Python str (None where missing),
    through its codes: one str per category, not per row."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        table = np.asarray([*map(str, column.cat.categories), None], dtype=object)
        codes = column.cat.codes.to_numpy()[rows]
        return table[codes].tolist()  # code -1 picks the trailing None
    values = column.to_numpy(dtype=object)[rows]
    return [None if v is None or v != v else str(v) for v in values.tolist()]


def _codes(column: pd.Series, rows: np.ndarray) -> np.ndarray:
    """Integer codes of a categorical column at `rows` (-1 = missing); an object column is factorised."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy()[rows].astype(np.int64)
    return pd.factorize(column.to_numpy(dtype=object)[rows])[0].astype(np.int64)


def _lanes(rank: np.ndarray, ts: np.ndarray, dur: np.ndarray, instant: np.ndarray) -> np.ndarray:
    """A lane per op so that the slices of one lane never overlap: trace viewers nest slices of one
    thread by time, and two ops that overlap (async ops, a batch of isend/irecv, an op pending while
    the rank goes on) are not inside one another. Lane 0 where nothing overlaps (checked column-wise);
    first fit, in start order, on the ranks where something does. Instants stay in lane 0."""
    lane = np.zeros(len(rank), dtype=np.int64)
    spans = np.flatnonzero(~instant)
    if not len(spans):
        return lane
    order = spans[np.lexsort((-dur[spans], ts[spans], rank[spans]))]
    r, s = rank[order], ts[order]
    e = s + dur[order]
    reach = pd.Series(e).groupby(r).cummax().to_numpy()  # the latest end so far, per rank
    same = np.r_[False, r[1:] == r[:-1]]
    clash = same & (s < np.r_[0, reach[:-1]])
    for bad in np.unique(r[clash]).tolist():
        at = np.flatnonzero(r == bad)
        ends: list[int] = []
        for i, start, stop in zip(at.tolist(), s[at].tolist(), e[at].tolist(), strict=True):
            for k, busy_until in enumerate(ends):
                if start >= busy_until:
                    ends[k] = stop
                    lane[order[i]] = k
                    break
            else:
                ends.append(stop)
                lane[order[i]] = len(ends) - 1
    return lane


def _us(ns: int) -> float:
    """Nanoseconds as microseconds (the format's unit), exact to the nanosecond."""
    return ns / 1000


def _dumps(value: Any) -> bytes:
    if _orjson is not None:
        return _orjson.dumps(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _open(path: Path, gzipped: bool) -> IO[bytes]:
    if gzipped:
        return gzip.open(path, "wb", compresslevel=3)  # type: ignore[return-value]
    return open(path, "wb", buffering=1 << 20)
