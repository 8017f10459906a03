"""One recorded op, and its serialisation into the dump's columns.

The hot path stores raw objects (dtype, ReduceOp, frame tuples); turning them into JSON-friendly
values happens only when a dump is written. It keeps only tuples of plain values, which the garbage
collector stops tracking, and reuses the Entry it overwrites in the ring: a recorder that allocated
long-lived tracked objects per op would make every full collection of a large training process
slower, a cost paid on every op.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from ..format.columns import (
    CODED_COLUMNS,
    ENTRY_COLUMNS,
    OMITTED_AT_DEFAULT,
    OMITTED_WHEN_NULL,
    TEMPLATE_COLUMNS,
    TIME_COLUMNS,
)
from ..format.packed import pack, packable
from .native import c_base
from .stacks import site_frame

STATES = ("enqueued", "started", "completed", "failed", "unknown")

class _PyStorage:
    """Entry's fields as Python slots: the storage when the C hot path is not built."""

    __slots__ = (
        "id", "group", "seq", "pg_seq", "kind", "op", "api", "peer", "root", "reduce_op",
        "inputs", "outputs", "is_async", "unit", "state", "error", "t_enqueue_ns", "t_complete_ns",
        "t_dev_start_ns", "t_dev_end_ns", "thread", "site", "stack", "source", "work", "device",
        "events", "timed_start", "timed_end",
    )


_Storage: type = c_base("EntryBase") or _PyStorage  # record/native.py: why the fields may live in C
FIELDS = _PyStorage.__slots__


class Entry(_Storage):  # type: ignore[misc, valid-type]
    """Mutable record of one op; the watchdog and completion callbacks update `state` in place."""

    __slots__ = ()

    def __init__(self, record_id: int, group: str, kind: str, op: str, api: str) -> None:
        # a device op's start/end events (device, start, end), kept when the ring reuses the entry
        # (record/device_timing.py), and the ids of the ops whose start / end they hold now
        self.events: tuple[str, Any, Any] | None = None
        self.timed_start = self.timed_end = -1
        self.reset(record_id, group, kind, op, api)

    def take_events(self, dropped: Any) -> None:
        """The events of `dropped`, the entry whose ring slot this new one takes while its op is still
        pending (not settled, so not reused): no dump shows it again (dumps read the ring), so its
        events would time nothing; marked untimed, a late wait or read of it touches them no more. Why:
        a new pair per such op made every op of a job whose ops are never polled (the watchdog asleep)
        allocate two events. `_fastpath.c` does the same for the C hot path."""
        events = getattr(dropped, "events", None)
        if type(events) is tuple:
            dropped.timed_start = dropped.timed_end = -1
            dropped.events = None
            self.events = events

    def reset(self, record_id: int, group: str, kind: str, op: str, api: str) -> None:
        self.id = record_id
        self.group = group
        self.seq = -1
        self.pg_seq = -1
        self.kind = kind
        self.op = op
        self.api = api
        self.peer = -1
        self.root = -1
        self.reduce_op: Any = None
        self.inputs: Any = ()
        self.outputs: Any = ()
        self.is_async = False
        self.unit = -1
        self.state = "started"
        self.error: str | None = None
        self.t_enqueue_ns = 0
        self.t_complete_ns: int | None = None
        self.t_dev_start_ns: int | None = None
        self.t_dev_end_ns: int | None = None
        self.thread = ""
        self.site: Any = None  # (code, f_lasti) from stacks.call_site
        self.stack: list[tuple[str, int, str]] | None = None
        self.source = "python"
        self.work: Any = None  # the backend Work of an op that is not complete yet
        self.device = "cpu"

    @property
    def pending(self) -> bool:
        return self.state in ("enqueued", "started")


def format_frame(frame: tuple[str, int, str] | None) -> str:
    if frame is None:
        return ""
    return f"{frame[0]}:{frame[1]} in {frame[2]}"


def format_site(site: Any) -> str:
    """A call site as kept on the hot path (code, offset), as `file:line in function`."""
    return format_frame(site_frame(site))


def tensor_meta(tensors: Any) -> tuple[tuple[Any, Any], ...]:
    """(shape, dtype) of each tensor: the ring must never keep a tensor (or its memory) alive."""
    return tuple((tuple(t.shape), t.dtype) for t in tensors)


def _shapes(meta: Any) -> list[list[int]]:
    return [list(shape) for shape, _ in meta]


def _dtypes(meta: Any) -> list[str]:
    return [str(dtype).replace("torch.", "") for _, dtype in meta]


def _reduce_op_name(op: Any) -> str | None:
    if op is None:
        return None
    name = getattr(op, "name", None)
    if isinstance(name, str):
        return name
    text = str(op)
    return text.rsplit(".", 1)[-1]


def _frames(e: Entry) -> list[str] | None:
    return None if e.stack is None else [format_frame(f) for f in e.stack]


def _meta_key(meta: Any) -> Any:
    """A hashable key of a (shape, dtype) tuple; C++ entries carry lists (from PyTorch's recorder)."""
    return meta if type(meta) is tuple else tuple((tuple(shape), dtype) for shape, dtype in meta)


def _site_key(site: Any) -> Any:
    return None if site is None else (id(site[0]), site[1])  # the entry keeps the code object alive


# Columns stored dictionary-encoded: (key of a row, its value). The key is what the hot
# path kept (a tensor's Size and dtype, a code object and offset), so each distinct value is turned
# into text once per dump, not once per entry.
_CODED: dict[str, tuple[Callable[[Entry], Any], Callable[[Entry], Any]]] = {
    "group": (attrgetter("group"), attrgetter("group")),
    "kind": (attrgetter("kind"), attrgetter("kind")),
    "op": (attrgetter("op"), attrgetter("op")),
    "api": (attrgetter("api"), attrgetter("api")),
    "reduce_op": (lambda e: _reduce_op_name(e.reduce_op), lambda e: _reduce_op_name(e.reduce_op)),
    "in_shapes": (lambda e: _meta_key(e.inputs), lambda e: _shapes(e.inputs)),
    "in_dtypes": (lambda e: _meta_key(e.inputs), lambda e: _dtypes(e.inputs)),
    "out_shapes": (lambda e: _meta_key(e.outputs), lambda e: _shapes(e.outputs)),
    "out_dtypes": (lambda e: _meta_key(e.outputs), lambda e: _dtypes(e.outputs)),
    "state": (attrgetter("state"), attrgetter("state")),
    "error": (attrgetter("error"), attrgetter("error")),
    "thread": (attrgetter("thread"), attrgetter("thread")),
    "site": (lambda e: _site_key(e.site), lambda e: format_site(e.site)),
    "source": (attrgetter("source"), attrgetter("source")),
}
assert tuple(_CODED) == CODED_COLUMNS  # each coded column (format/columns.py) has its key and value here


def coded_column(entries: list[Entry], key: Callable[[Entry], Any], value: Callable[[Entry], Any]) -> dict[str, list[Any]]:
    """`{"values": [...distinct...], "codes": [...]}`: row i is `values[codes[i]]`, code -1 is null."""
    index: dict[Any, int] = {}
    values: list[Any] = []
    codes: list[int] = []
    for e in entries:
        k = key(e)
        code = index.get(k)
        if code is None:
            v = value(e)
            if v is None:
                code = -1
            else:
                code = len(values)
                values.append(v)
            index[k] = code
        codes.append(code)
    return {"values": values, "codes": codes}


def _template_key(e: Entry) -> tuple[Any, ...]:
    return (e.group, e.kind, e.op, e.api, e.peer, e.root, _reduce_op_name(e.reduce_op), _meta_key(e.inputs),
            _meta_key(e.outputs), e.is_async, e.thread, _site_key(e.site), e.source)


def _times(entries: list[Entry], name: str, measured: dict[int, bool]) -> list[int | None]:
    """A C++-issued op's times are the moments the watchdog's polling noticed it issued and completed,
    unless PyTorch's recorder measured them (`measured`: id -> completion measured too): those go to
    `t_seen_ns` / `t_seen_complete_ns`, and `t_enqueue_ns` / `t_complete_ns` hold only measurements."""
    seen = name.startswith("t_seen")
    enqueue = name in ("t_seen_ns", "t_enqueue_ns")
    out: list[int | None] = []
    for e in entries:
        value = e.t_enqueue_ns if enqueue else e.t_complete_ns
        if e.source == "python":
            out.append(None if seen else value)
            continue
        how = measured.get(e.id)
        is_measured = how is not None and (enqueue or how)
        out.append(value if is_measured != seen else None)
    return out


def _columns(entries: list[Entry], names: tuple[str, ...], packed: bool = False,
             measured: dict[int, bool] | None = None) -> dict[str, Any]:
    """Numbers as arrays, text and shape columns dictionary-encoded, optional columns left out when
    all null or all at their default. `packed`: integer arrays and codes as hex deltas from their first value, in their narrowest type (schema 6)."""
    columns: dict[str, Any] = {}
    for name in names:
        coded = _CODED.get(name)
        if coded is not None:
            column = coded_column(entries, *coded)
            if name in OMITTED_WHEN_NULL and not column["values"]:
                continue
            columns[name] = {**column, "codes": pack(column["codes"])} if packed else column
            continue
        if name == "stack":
            values = [_frames(e) for e in entries]
        elif name in TIME_COLUMNS:
            values = _times(entries, name, measured or {})
        else:
            values = [getattr(e, name) for e in entries]
        if name in OMITTED_WHEN_NULL and all(v is None for v in values):
            continue
        if name in OMITTED_AT_DEFAULT and values and values.count(OMITTED_AT_DEFAULT[name]) == len(values):
            continue
        columns[name] = pack(values) if packed and packable(values) else values
    return columns


def to_tables(entries: list[Entry], measured: dict[int, bool] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The dump's `entries` and `templates` (docs/dump-format.md).

    Why: a 2,000-entry ring repeats a few dozen distinct ops; written once each, the per-entry part
    is six short number columns, packed (flightrec/format/packed.py): one hex string each, not 2,000 numbers.
    """
    templates = coded_column(entries, _template_key, lambda e: e)  # the first entry of each distinct op
    columns = _columns(entries, ENTRY_COLUMNS, packed=True, measured=measured)
    columns["template"] = pack(templates["codes"])
    return columns, _columns(templates["values"], TEMPLATE_COLUMNS)
