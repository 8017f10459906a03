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

This module writes the file (metadata, then the events in bounded chunks); what goes into it is
decided apart: `trace_tracks` (processes and threads), `trace_placement` (which ops are drawn, when,
in which lane), `trace_marks` (root-cause markers and wait arrows), `trace_op_text` (the ops' JSON
text), `trace_columns` (how they read the entry table).
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pandas as pd

from ..analysis import Analysis
from ..textutil import plural, ranges
from . import postmortem as pm
from .trace_marks import ROOT_CAUSE_CNAME, anchors, flows, markers, waits_text
from .trace_op_text import CNAMES, op_text
from .trace_placement import END_NOT_RECORDED, END_PENDING, END_PENDING_UNDATED, Placement, place_ops
from .trace_tracks import LANE_STRIDE, UNKNOWN_HOST, Tracks, track_event_count, track_events, tracks

try:  # optional (flightrec[fast]); the ops are template text either way, this serialises the rest
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = ["CNAMES", "END_NOT_RECORDED", "END_PENDING", "END_PENDING_UNDATED", "LANE_STRIDE", "ROOT_CAUSE_CNAME",
           "TRACE_SCHEMA", "UNKNOWN_HOST", "TraceWritten", "trace_dict", "write_trace"]

TRACE_SCHEMA = "flightrec-trace/1"
CHUNK = 100_000  # events serialised per write: bounded memory at millions of ops
CLOCK_TEXT = ("each rank's own wall clock (its monotonic entry times plus the wall-minus-monotonic offset its dump "
              "recorded; PyTorch's recorder stamps wall-clock times); hosts' clocks are not corrected, see "
              "clock_offsets_ms for the analyzer's estimate of how far apart they are")
LEFT_OUT_WHY = ("ops without a measured start are not drawn: C++-issued ops (DDP's Reducer, functional "
                "collectives) recorded without PyTorch's recorder have only the times the watchdog's polling "
                "saw them, which are not measurements")


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
class _Trace:
    """One analysis's trace, computed column-wise once (the file's parts are written from it on demand):
    tracks, placed ops, and the analysis drawn on them."""

    a: Analysis
    last_ops: int | None
    rep: dict[str, Any]
    df: pd.DataFrame
    tracks: Tracks
    placed: Placement
    markers: list[dict[str, Any]]
    flows: list[dict[str, Any]]
    waits_text: dict[int, str]


def write_trace(a: Analysis, out: str | os.PathLike[str], last_ops: int | None = None) -> TraceWritten:
    """Write the timeline of `a` to `out` (gzip-compressed when its name ends with `.gz`); `last_ops`:
    only each rank's N most recent entries (a hang is at the end; a 1,024-rank job's whole rings are
    ~650 MB of JSON, more than chrome://tracing and a browser tab of Perfetto hold)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    trace = _build(a, last_ops)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with _open(tmp, gzipped=path.name.endswith(".gz")) as fh:
            fh.write(b'{"displayTimeUnit":"ms","metadata":')
            fh.write(_dumps(_metadata(trace)))
            fh.write(b',"traceEvents":[')
            for chunk in _chunks(trace):
                fh.write(chunk)
            fh.write(b"]}\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # no half-written trace left behind (disk full, Ctrl-C)
        raise
    return _written(trace, path)


def trace_dict(a: Analysis, last_ops: int | None = None) -> dict[str, Any]:
    """The trace as a dict, parsed back from the very text `write_trace` writes (tests, notebooks)."""
    trace = _build(a, last_ops)
    events = json.loads(b"[" + b"".join(_chunks(trace)) + b"]")
    return {"displayTimeUnit": "ms", "metadata": _metadata(trace), "traceEvents": events}


def _build(a: Analysis, last_ops: int | None) -> _Trace:
    """Tracks first (from the dumps and the root causes), then the ops placed on them, then the
    markers and arrows that attach to those ops."""
    rep = a.report()
    df = pm.entries(a)
    t = tracks(a, rep["root_causes"])
    placed = place_ops(a, df, t.ranks, last_ops)
    where = anchors(df, placed)
    marks = markers(rep["root_causes"], rep["waits"], placed, where, t.pid)
    return _Trace(a=a, last_ops=last_ops, rep=rep, df=df, tracks=t, placed=placed, markers=marks,
                  flows=flows(rep["waits"], where, marks, t.pid), waits_text=waits_text(rep["waits"]))


def _metadata(t: _Trace) -> dict[str, Any]:
    """The file's `metadata` object (docs/timeline.md)."""
    rep, n = t.rep, t.placed.counts
    return {
        "schema": TRACE_SCHEMA,
        "folder": str(t.a.folder),
        "verdict": rep["verdict"],
        "summary": rep["summary"],
        "clock": CLOCK_TEXT,
        "t0_wall_ns": t.placed.t0,
        "ts": "microseconds since t0_wall_ns",
        "clock_offsets_ms": rep["clock_offsets_ms"],
        "ranks": len(t.tracks.ranks),
        "hosts": t.tracks.hosts,
        "ops": {"slices": n.slices, "pending_slices": n.pending, "start_only": n.instants,
                "left_out": n.left_out, "older": n.older},
        "last_ops": t.last_ops,
        "left_out": {"ops": n.left_out, "no_wall_clock": n.no_wall_clock,
                     "ranks": ranges(n.left_out_ranks), "why": LEFT_OUT_WHY} if n.left_out else {},
        "root_causes": [{"rank": c["rank"], "ranks": c["ranks"], "kind": c["kind"], "host": c.get("host")}
                        for c in rep["root_causes"]],
        "waits": len(rep["waits"]),
        "colours": {"blocking": CNAMES[pm.ST_BLOCKING], "pending": CNAMES[pm.ST_PENDING],
                    "failed": CNAMES[pm.ST_FAILED], "mismatch": CNAMES[pm.ST_MISMATCH],
                    "unknown": CNAMES[pm.ST_UNKNOWN], "root cause": ROOT_CAUSE_CNAME},
    }


def _chunks(t: _Trace) -> Iterator[bytes]:
    """The `traceEvents` items as JSON text, comma-separated, in pieces of at most CHUNK ops:
    track names, the ops, then root-cause markers and wait flows."""
    yield _dumps(track_events(t.tracks, t.placed.lanes))[1:-1]
    n = len(t.placed.ops.row)
    if n:
        text = op_text(t.a, t.df, t.placed, t.tracks.pid, t.waits_text, _dumps)
        for lo in range(0, n, CHUNK):
            yield b"," + text.text(lo, min(lo + CHUNK, n)).encode()
    if t.markers or t.flows:
        yield b"," + _dumps(t.markers + t.flows)[1:-1]


def _written(t: _Trace, path: Path) -> TraceWritten:
    """The account of what `_chunks` wrote, counted without reading the file back."""
    n = t.placed.counts
    events = track_event_count(t.tracks, t.placed.lanes) + len(t.placed.ops.row) + len(t.markers) + len(t.flows)
    return TraceWritten(path=path, events=events, slices=n.slices, pending=n.pending, instants=n.instants,
                        left_out=n.left_out, ranks=len(t.tracks.ranks), hosts=len(t.tracks.hosts),
                        flows=len(t.flows) // 2, markers=len(t.markers), older=n.older, last_ops=t.last_ops)


def _dumps(value: Any) -> bytes:
    """Compact JSON: orjson where installed (faster), else the standard library."""
    if _orjson is not None:
        return _orjson.dumps(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _open(path: Path, gzipped: bool) -> IO[bytes]:
    if gzipped:
        return gzip.open(path, "wb", compresslevel=3)  # type: ignore[return-value]
    return open(path, "wb", buffering=1 << 20)
