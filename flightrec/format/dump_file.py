"""How a dump lies in its file: two gzip members that together are one JSON object.

Why: a hang verdict needs, per rank, only where it is (its progress counters, the ops in flight,
its last few ops), not the 2,000 entries of its ring. The first gzip member holds every top-level
field but `templates` and `entries` (so the summary, `recent` included); the second holds those
two. A reader after the summary inflates the first member alone (a few KB); any gzip reader
inflates both and gets the whole dump, one JSON document, as before. Standard library only: the
recorder and the fixtures' writer both use it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Sequence
from typing import Any

BODY = ("templates", "entries")  # the second member
RECENT_ENTRIES = 32  # the newest ops of the ring, in `recent`
RECENT_IN_FLIGHT = 256  # and at most this many older ops still in flight


def recent_positions(completed: Sequence[bool]) -> list[int]:
    """Positions (oldest first) of the ring's ops that go into `recent`: the newest RECENT_ENTRIES, and
    the newest RECENT_IN_FLIGHT of the older ones not completed (an async op the rank still waits on)."""
    n = len(completed)
    tail = max(0, n - RECENT_ENTRIES)
    older = [i for i in range(tail) if not completed[i]][-RECENT_IN_FLIGHT:]
    return older + list(range(tail, n))


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str).encode()


def encode(payload: dict[str, Any], level: int = 6, dumps: Callable[[Any], bytes] = _json) -> bytes:
    """The file's bytes: the summary member, then the body member (whose text closes the object).
    `dumps`: the JSON encoder (compact, to bytes)."""
    head = {k: v for k, v in payload.items() if k not in BODY}
    body = {k: payload[k] for k in BODY if k in payload}
    head_text = dumps(head)
    if not body:
        return gzip.compress(head_text, compresslevel=level, mtime=0)
    first = head_text[:-1] + (b"," if head else b"")  # '{"format":...,' : the object left open
    return (gzip.compress(first, compresslevel=level, mtime=0)
            + gzip.compress(dumps(body)[1:], compresslevel=level, mtime=0))
