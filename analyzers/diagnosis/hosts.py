"""Where each named rank runs: its host, from its own dump, else from a peer's on the same node.

Why: on-call drains machines. A rank that died without a dump names no host itself, but launchers that
number a node's ranks contiguously (torchrun and DeepSpeed's launcher: global rank = the node's first
rank + local rank) let a peer's dump place it: a peer with rank p, local rank l and a node of L ranks
(`local_world_size`) shares its host with ranks p - l .. p - l + L - 1. Other launchers (mpirun may
place ranks round-robin) are not inferred from: the host is then said to be unknown, with why.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from typing import Any

from ..textutil import ranges

CONTIGUOUS_LAUNCHERS = ("torchrun", "deepspeed")  # they number a node's ranks contiguously
FROM_DUMP, FROM_PEERS = "dump", "peers"
FIELDS = ("host", "local_rank", "pid", "node_rank")


class Hosts:
    """Each rank's place (`place`), from the dumps' metadata (`metas`: rank -> dump header)."""

    def __init__(self, metas: Mapping[int, Mapping[str, Any]]) -> None:
        self.metas = metas
        blocks: dict[int, tuple[int, int, Mapping[str, Any]]] = {}  # first rank of a node -> (size, peer, meta)
        for rank, meta in metas.items():
            block = _node_block(rank, meta)
            if block is not None and block[0] not in blocks:
                blocks[block[0]] = (block[1], rank, meta)
        self.starts = sorted(blocks)
        self.blocks = blocks

    def place(self, rank: int) -> dict[str, Any]:
        """`host`, `local_rank`, `pid`, `node_rank`, and where the host was read (`host_from`: `dump`,
        `peers`, or None when unknown, with why in `host_detail`)."""
        meta = self.metas.get(rank)
        if meta is not None and meta.get("host"):
            return {key: meta.get(key) for key in FIELDS} | {"host_from": FROM_DUMP, "host_detail": None}
        i = bisect.bisect_right(self.starts, rank) - 1
        if i >= 0:
            start = self.starts[i]
            size, peer, peer_meta = self.blocks[start]
            if rank < start + size:
                return {"host": peer_meta.get("host"), "local_rank": rank - start, "pid": None,
                        "node_rank": peer_meta.get("node_rank"), "host_from": FROM_PEERS,
                        "host_detail": f"its own dump is missing; rank {peer}'s dump says {peer_meta.get('launcher')} "
                                       f"ran ranks {ranges(range(start, start + size))} on that host"}
        return {key: None for key in FIELDS} | {"host_from": None, "host_detail": self._unknown_why(rank)}

    def _unknown_why(self, rank: int) -> str:
        if rank in self.metas:
            return "its dump does not name its host (PyTorch's recorder)"
        launchers = sorted({str(m.get("launcher")) for m in self.metas.values() if m.get("launcher")})
        if launchers and not set(launchers) & set(CONTIGUOUS_LAUNCHERS):
            return f"no dump of its own, and {'/'.join(launchers)} may place ranks on any node"
        return "no dump of its own, and no peer's dump places it on a node"

    def table(self, ranks: Iterable[int]) -> dict[str, dict[str, Any]]:
        """The `hosts` item of the report: each rank's place, keyed by rank (as text), lowest first."""
        return {str(r): self.place(r) for r in sorted(set(ranks))}


def _node_block(rank: int, meta: Mapping[str, Any]) -> tuple[int, int] | None:
    """(first rank, size) of the node `rank` ran on, where its launcher numbers a node's ranks contiguously."""
    local, size = meta.get("local_rank"), meta.get("local_world_size")
    if meta.get("launcher") not in CONTIGUOUS_LAUNCHERS or not meta.get("host"):
        return None
    if not isinstance(local, int) or not isinstance(size, int) or not 0 <= local < size or rank - local < 0:
        return None
    return rank - local, size
