"""One recorded op, and its serialisation into the dump's columns.

The hot path stores raw objects (dtype, ReduceOp, frame tuples); turning them into JSON-friendly
values happens only when a dump is written. It keeps only tuples of plain values, which the garbage
collector stops tracking, and reuses the Entry it overwrites in the ring: a recorder that allocated
long-lived tracked objects per op would make every full collection of a large training process
slower, a cost paid on every op.
"""

from __future__ import annotations

from typing import Any

from .stacks import site_frame

STATES = ("enqueued", "started", "completed", "failed", "unknown")

COLUMNS = (
    "id", "group", "seq", "pg_seq", "kind", "op", "api", "peer", "root", "reduce_op",
    "in_shapes", "in_dtypes", "out_shapes", "out_dtypes", "is_async", "unit", "state", "error",
    "t_enqueue_ns", "t_complete_ns", "t_dev_start_ns", "t_dev_end_ns", "thread", "site", "stack",
    "source",
)


class Entry:
    """Mutable record of one op; the watchdog and completion callbacks update `state` in place."""

    __slots__ = (
        "id", "group", "seq", "pg_seq", "kind", "op", "api", "peer", "root", "reduce_op",
        "inputs", "outputs", "is_async", "unit", "state", "error", "t_enqueue_ns", "t_complete_ns",
        "t_dev_start_ns", "t_dev_end_ns", "thread", "site", "stack", "source", "work", "device",
    )

    def __init__(self, record_id: int, group: str, kind: str, op: str, api: str) -> None:
        self.reset(record_id, group, kind, op, api)

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


_DERIVED = {
    "reduce_op": lambda e: _reduce_op_name(e.reduce_op),
    "in_shapes": lambda e: _shapes(e.inputs),
    "in_dtypes": lambda e: _dtypes(e.inputs),
    "out_shapes": lambda e: _shapes(e.outputs),
    "out_dtypes": lambda e: _dtypes(e.outputs),
    "site": lambda e: format_site(e.site),
    "stack": lambda e: None if e.stack is None else [format_frame(f) for f in e.stack],
}


def to_columns(entries: list[Entry]) -> dict[str, list[Any]]:
    """Column-oriented table of `entries` (see docs/dump-format.md)."""
    columns: dict[str, list[Any]] = {}
    for name in COLUMNS:
        derive = _DERIVED.get(name)
        if derive is None:
            columns[name] = [getattr(e, name) for e in entries]
        else:
            columns[name] = [derive(e) for e in entries]
    return columns
