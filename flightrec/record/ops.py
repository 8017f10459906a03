"""What each torch.distributed API is, and where its arguments live.

A spec turns `(args, kwargs)` of a call into the recorded facts (tensors, group, peer, root,
reduce op) without `inspect.signature().bind`, which would cost more than the whole record.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_MISSING = object()


@dataclass(frozen=True)
class OpSpec:
    """How to read one API's call; `kind` is `coll`, `p2p` or `composite` (records its inner ops)."""

    api: str
    op: str
    kind: str
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    peer: tuple[str, str] | None = None  # (global-rank param, group-rank param)
    root: tuple[str, str] | None = None
    reduce_op: str | None = None
    direction: str = ""  # p2p: "send" or "recv"
    is_async_api: bool = False  # isend / irecv: always async
    positions: dict[str, int] = field(default_factory=dict, compare=False)
    defaults: dict[str, Any] = field(default_factory=dict, compare=False)

    def bind_positions(self, fn: Callable[..., Any]) -> OpSpec:
        """Copy of this spec with parameter positions and defaults read from `fn`'s signature."""
        params = list(inspect.signature(fn).parameters.values())
        positions = {p.name: i for i, p in enumerate(params)}
        defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        return OpSpec(**{**self.__dict__, "positions": positions, "defaults": defaults})

    def read_names(self) -> tuple[str | None, ...]:
        """The seven parameters the hot path reads (None where the API has none): group, input,
        output, async_op, reduce op, and the peer's or root's global and group rank."""
        return ("group", self.inputs[0] if self.inputs else None, self.outputs[0] if self.outputs else None,
                "async_op", self.reduce_op, *(self.root or self.peer or (None, None)))

    def arg(self, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
        if name in kwargs:
            return kwargs[name]
        index = self.positions.get(name, -1)
        if 0 <= index < len(args):
            return args[index]
        return self.defaults.get(name)

    def reader(self, names: tuple[str | None, ...]) -> Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, ...]]:
        """A fast reader of exactly seven parameters (None for names the API does not take).

        Calls without keyword arguments, the common case, cost one tuple concatenation and one
        itemgetter call: the arguments followed by the seven defaults, picked by a getter made for
        that number of positional arguments (a generic reader's seven length checks would cost as
        much as the rest of the record).
        """
        if len(names) != 7:
            raise ValueError("reader() reads exactly seven parameters")
        indexes = [self.positions.get(n, -1) if n else -1 for n in names]
        defaults = tuple(self.defaults.get(n) if n else None for n in names)
        getters = tuple(operator.itemgetter(*[i if 0 <= i < count else count + k for k, i in enumerate(indexes)])
                        for count in range(max(indexes) + 2))
        arg = self.arg

        def read(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
            if kwargs or len(args) >= len(getters):
                return tuple(arg(args, kwargs, n) if n else None for n in names)
            return getters[len(args)](args + defaults)  # type: ignore[no-any-return]

        return read


def _coll(api: str, op: str | None = None, **kw: Any) -> OpSpec:
    return OpSpec(api=api, op=op or api, kind="coll", **kw)


def _composite(api: str) -> OpSpec:
    return OpSpec(api=api, op=api, kind="composite")


SPECS: tuple[OpSpec, ...] = (
    _coll("all_reduce", inputs=("tensor",), outputs=("tensor",), reduce_op="op"),
    _coll("all_gather", inputs=("tensor",), outputs=("tensor_list",)),
    _coll("all_gather_into_tensor", inputs=("input_tensor",), outputs=("output_tensor",)),
    _coll("all_gather_single", "all_gather_into_tensor", inputs=("input_tensor",), outputs=("output_tensor",)),
    _coll("_all_gather_base", "all_gather_into_tensor", inputs=("input_tensor",), outputs=("output_tensor",)),
    _coll("reduce", inputs=("tensor",), outputs=("tensor",), root=("dst", "group_dst"), reduce_op="op"),
    _coll("reduce_scatter", inputs=("input_list",), outputs=("output",), reduce_op="op"),
    _coll("reduce_scatter_tensor", inputs=("input",), outputs=("output",), reduce_op="op"),
    _coll("reduce_scatter_single", "reduce_scatter_tensor", inputs=("input",), outputs=("output",), reduce_op="op"),
    _coll("_reduce_scatter_base", "reduce_scatter_tensor", inputs=("input",), outputs=("output",), reduce_op="op"),
    _coll("broadcast", inputs=("tensor",), outputs=("tensor",), root=("src", "group_src")),
    _coll("scatter", inputs=("scatter_list",), outputs=("tensor",), root=("src", "group_src")),
    _coll("gather", inputs=("tensor",), outputs=("gather_list",), root=("dst", "group_dst")),
    _coll("all_to_all", inputs=("input_tensor_list",), outputs=("output_tensor_list",)),
    _coll("all_to_all_single", inputs=("input",), outputs=("output",)),
    _coll("barrier"),
    # deprecated, still served (gloo, NCCL) and still called by older DeepSpeed/ZeRO code: without a
    # wrapper their backend calls would read as C++-issued collectives with op 'unknown'
    _coll("all_reduce_coalesced", inputs=("tensors",), outputs=("tensors",), reduce_op="op"),
    _coll("all_gather_coalesced", inputs=("input_tensor_list",), outputs=("output_tensor_lists",)),
    _coll("monitored_barrier"),
    OpSpec("send", "send", "p2p", inputs=("tensor",), peer=("dst", "group_dst"), direction="send"),
    OpSpec("recv", "recv", "p2p", outputs=("tensor",), peer=("src", "group_src"), direction="recv"),
    OpSpec("isend", "send", "p2p", inputs=("tensor",), peer=("dst", "group_dst"), direction="send",
           is_async_api=True),
    OpSpec("irecv", "recv", "p2p", outputs=("tensor",), peer=("src", "group_src"), direction="recv",
           is_async_api=True),
    _composite("all_gather_object"),
    _composite("broadcast_object_list"),
    _composite("gather_object"),
    _composite("scatter_object_list"),
    _composite("send_object_list"),
    _composite("recv_object_list"),
    _composite("batch_isend_irecv"),
)

SPEC_BY_API = {spec.api: spec for spec in SPECS}


def as_tensors(value: Any) -> tuple[Any, ...]:
    """A tensor, a list of tensors (possibly nested one level) or None, as a flat tuple."""
    if value is None:
        return ()
    if hasattr(value, "shape"):
        return (value,)
    if isinstance(value, (list, tuple)):
        flat: list[Any] = []
        for item in value:
            if hasattr(item, "shape"):
                flat.append(item)
            elif isinstance(item, (list, tuple)):
                flat.extend(t for t in item if hasattr(t, "shape"))
        return tuple(flat)
    return ()
