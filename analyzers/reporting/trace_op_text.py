"""The placed ops as trace-event JSON text: a template per distinct op plus each op's own numbers.

Why templates: at millions of ops, a dict per op and its serialisation cost ten times more than the
template's text with a few numbers put in. Each op's event is a template shared by every op with the
same name, group, shapes, dtypes, state and site (serialised once), then its `seq`, the args only
some ops have, its time, duration, pid and tid.

The JSON serialiser is the caller's (`dumps`): trace_events.py chooses orjson or the standard
library once for the whole file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..analysis import Analysis
from ..keys import first_rows, group_ids, is_value
from . import postmortem as pm
from .trace_columns import codes, ints, strings, us
from .trace_placement import END_NOTES, Ops, Placement

Dumps = Callable[[Any], bytes]

# Chrome's reserved colour names (Perfetto colours by name and ignores them); completed ops keep the per-name colour.
CNAMES = {pm.ST_BLOCKING: "terrible", pm.ST_PENDING: "yellow", pm.ST_FAILED: "black", pm.ST_MISMATCH: "bad",
          pm.ST_UNKNOWN: "grey"}
NAMED_STATUSES = (pm.ST_BLOCKING, pm.ST_PENDING, pm.ST_FAILED, pm.ST_MISMATCH)  # "all_reduce (blocking)"
# Columns an op's event template is made of (the rest of its args are per op); ARG_ORDER: as the args list them.
TEMPLATE_COLUMNS = ("op", "kind", "group", "state", "status", "api", "reduce_op", "in_shapes", "out_shapes",
                    "in_dtypes", "out_dtypes", "site")
ARG_ORDER = ("group", "group_desc", "state", "status", "api", "reduce_op", "in_shapes", "out_shapes", "in_dtypes", "out_dtypes",
             "site")


@dataclass
class OpText:
    """Per placed op: its template, seq, extra args' text and pid; `text` writes any run of them."""

    ops: Ops
    template: np.ndarray  # index into prefixes
    prefixes: list[str]  # a template's event text up to its seq: ... "seq":
    seq: np.ndarray
    extra: np.ndarray  # object: the op's own args as JSON text, each starting with a comma ('' for most)
    pid: np.ndarray

    def text(self, lo: int, hi: int) -> str:
        """Ops lo..hi as comma-separated JSON objects: template text plus each op's numbers."""
        ops = self.ops
        dur = [f',"dur":{d}' for d in (ops.dur[lo:hi] / 1000).tolist()]
        for i in np.flatnonzero(ops.instant[lo:hi]).tolist():
            dur[i] = ""
        prefixes = self.prefixes
        return ",".join(
            f'{prefixes[k]}{s}{x}}},"ts":{t}{d},"pid":{p},"tid":{th}}}'
            for k, s, x, t, d, p, th in zip(
                self.template[lo:hi].tolist(), self.seq[lo:hi].tolist(), self.extra[lo:hi].tolist(),
                (ops.ts[lo:hi] / 1000).tolist(), dur, self.pid[lo:hi].tolist(), ops.tid[lo:hi].tolist(), strict=True)
        )


def op_text(a: Analysis, df: pd.DataFrame, placed: Placement, pid: dict[int, int], waits_text: dict[int, str],
            dumps: Dumps) -> OpText:
    """The text parts of the ops placed from the entry table `df` of `a`; `pid`: each rank's process,
    `waits_text`: whom each waiting rank waits for, in words. There is at least one op."""
    ops = placed.ops
    template, prefixes = _templates(a, df, ops, dumps)
    size = max(pid) + 1
    pid_of = np.zeros(size, dtype=np.int64)
    for r, p in pid.items():
        pid_of[r] = p
    return OpText(ops=ops, template=template, prefixes=prefixes, seq=df["seq"].to_numpy()[ops.row],
                  extra=_extras(a, df, placed, size, waits_text, dumps), pid=pid_of[ops.rank])


def _templates(a: Analysis, df: pd.DataFrame, ops: Ops, dumps: Dumps) -> tuple[np.ndarray, list[str]]:
    """Each op's template (numbered by first appearance) and each template's text up to its seq."""
    rows = ops.row
    columns = {name: codes(df[name], rows) for name in TEMPLATE_COLUMNS}
    note_code = np.zeros(len(rows), dtype=np.int64)
    for i, text in enumerate(END_NOTES, start=1):
        note_code[ops.end_note == text] = i
    template = group_ids([*columns.values(), ops.instant.astype(np.int64), note_code])
    firsts = first_rows(template)
    desc = dict(zip(a.groups["group"].astype(str), a.groups["desc"].astype(str), strict=True))
    values = {name: strings(df[name], rows[firsts]) for name in TEMPLATE_COLUMNS}
    prefixes = []
    for j, first in enumerate(firsts.tolist()):
        v = {name: values[name][j] for name in TEMPLATE_COLUMNS}
        end = END_NOTES[note_code[first] - 1] if note_code[first] else None
        text = dumps(_template_event(v, bool(ops.instant[first]), end, desc)).decode()
        prefixes.append(text[: text.rindex("0}}")])  # ... "seq": | <seq><extras>}, "ts": ...
    return template, prefixes


def _template_event(v: dict[str, Any], instant: bool, end: str | None, desc: dict[str, str]) -> dict[str, Any]:
    """A template's event with seq 0: name (with its status where Perfetto must colour it), category,
    phase, colour, and the args the template's columns give."""
    name = v["op"] or "unknown"
    if v["status"] in NAMED_STATUSES:  # Perfetto colours by name and ignores cname: the name must differ
        name = f"{name} ({v['status']})"
    head: dict[str, Any] = {"name": name, "cat": v["kind"] or "", "ph": "X"}
    if instant:
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
    if end is not None:
        args["end"] = end
    return {**head, "args": {**args, "seq": 0}}


def _extras(a: Analysis, df: pd.DataFrame, placed: Placement, size: int, waits_text: dict[int, str],
            dumps: Dumps) -> np.ndarray:
    """The args only some ops have (p2p peer, root, error, lateness, device times, whom a blocking op
    waits for), as JSON text per op ('' for most), built on those ops only; `size`: ranks + 1."""
    ops = placed.ops
    rows = ops.row
    extra = np.full(len(rows), "", dtype=object)

    def add(at: np.ndarray, key: str, values: list[Any]) -> None:
        for i, value in zip(at.tolist(), values, strict=True):
            extra[i] += f',"{key}":{dumps(value).decode()}'

    p2p = np.flatnonzero(is_value(df["kind"], "p2p")[rows])
    add(p2p, "peer", df["peer"].to_numpy()[rows[p2p]].tolist())
    root = df["root"].to_numpy()[rows]
    add(np.flatnonzero(root >= 0), "root", root[root >= 0].tolist())
    error = df["error"].to_numpy(dtype=object)[rows]
    failed = np.flatnonzero(pd.notna(error))
    add(failed, "error", [str(e) for e in error[failed]])
    late, has_late = ints(df["late_ns"].take(rows))
    add(np.flatnonzero(has_late), "late_ms", [round(v / 1e6, 3) for v in late[has_late].tolist()])
    offsets, known = _wall_offsets(a, size)
    for name, key in (("t_dev_start_ns", "dev_start_us"), ("t_dev_end_ns", "dev_end_us")):
        values, has = ints(df[name].take(rows))
        has &= known[ops.rank]
        add(np.flatnonzero(has), key, [us(v) for v in (values[has] + offsets[ops.rank[has]] - placed.t0).tolist()])
    blocking = np.flatnonzero(df["blocking"].to_numpy()[rows])
    text = [waits_text.get(r) for r in ops.rank[blocking].tolist()]
    keep = np.asarray([t is not None and t != "" for t in text], dtype=bool)
    add(blocking[keep], "waits_for", [t for t in text if t])
    return extra


def _wall_offsets(a: Analysis, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's wall-minus-monotonic offset (ns) by rank, and whether its dump gives one: device
    times are on the monotonic clock."""
    offsets = np.zeros(size, dtype=np.int64)
    known = np.zeros(size, dtype=bool)
    for r, d in a.dumps.items():
        if isinstance(d.meta.get("wall_offset_ns"), int):
            offsets[r], known[r] = d.meta["wall_offset_ns"], True
    return offsets, known
