"""The shape and dtype signature of a collective under its op family's rules.

Why rules per family: ranks of one all_gather pass different outputs than inputs (output = input x
group size), a reduce_scatter the other way round, a scatter or gather only one side's tensors; two
ranks agree when their signatures are equal, so each family's signature keeps exactly what its members
must agree on. Computed once per distinct (op, shapes, dtypes, group size) combination (positions.py).
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..constants import (
    ALL_GATHER_OPS,
    GATHER_OPS,
    LOOSE_SHAPE_OPS,
    NO_PAYLOAD_OPS,
    REDUCE_SCATTER_OPS,
    SCATTER_OPS,
)


def signature(op: str, ins: Any, outs: Any, in_dt: Any, out_dt: Any, size: int) -> tuple[str, str]:
    """Shape and dtype signatures under each op family's rules (computed per distinct combination)."""
    if op in NO_PAYLOAD_OPS:
        return "", ""
    i, o = _shapes(ins), _shapes(outs)
    idt, odt = _text(in_dt), _text(out_dt)
    coalesced = len(i) == len(o) > 1  # one input and one output tensor per op of the block: each op by itself
    if op in ALL_GATHER_OPS:
        if coalesced:
            outs = [_numel([s]) for s in o]
            bad = [k for k, (a, b) in enumerate(zip(i, outs, strict=True)) if b != _numel([a]) * size]
            rule = f" (output != input x group size {size} for tensor(s) {bad})" if bad else ""
            return f"in {_fmt(i)}, out numel {outs}{rule}", f"{idt}->{odt}"
        total_in, total_out = _numel(i), _numel(o)
        rule = "" if total_out == total_in * size else f" (output != input x group size {size})"
        return f"in {_fmt(i)}, out numel {total_out}{rule}", f"{idt}->{odt}"
    if op in REDUCE_SCATTER_OPS:
        if coalesced:
            ins = [_numel([s]) for s in i]
            bad = [k for k, (a, b) in enumerate(zip(ins, o, strict=True)) if a != _numel([b]) * size]
            rule = f" (input != output x group size {size} for tensor(s) {bad})" if bad else ""
            return f"in numel {ins}, out {_fmt(o)}{rule}", f"{idt}->{odt}"
        total_in, total_out = _numel(i), _numel(o)
        rule = "" if total_in == total_out * size else f" (input != output x group size {size})"
        return f"in numel {total_in}, out {_fmt(o)}{rule}", f"{idt}->{odt}"
    if op in SCATTER_OPS:
        return f"out {_fmt(o)}", odt
    if op in GATHER_OPS:
        return f"in {_fmt(i)}", idt
    if op in LOOSE_SHAPE_OPS:
        return f"{len(i)} -> {len(o)} tensors", f"{idt}->{odt}"
    if op == "broadcast":
        return _fmt(i or o), idt or odt
    return f"{_fmt(i)} -> {_fmt(o)}", f"{idt}->{odt}"


def _shapes(text: Any) -> list[list[int]]:
    if not isinstance(text, str) or not text:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return [list(s) for s in value if isinstance(s, list)] if isinstance(value, list) else []


def _numel(shapes: list[list[int]]) -> int:
    return sum(math.prod(s) for s in shapes)


def _fmt(shapes: list[list[int]]) -> str:
    return "[" + ", ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes) + "]"


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""
