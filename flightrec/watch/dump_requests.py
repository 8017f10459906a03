"""Ways one process asks the others to dump: the job's c10d store, and a request file in the dump folder.

The store is reached through a client of our own, made in the watchdog thread, so a training
thread blocked inside a store call never holds a lock we need; every store error just means "no
news this tick".
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .. import log
from ..format.names import DUMP_NAME

REQUEST_KEY = "flightrec/dump-request"
REQUEST_FILE = ".flightrec-dump-request"
_RETRY_CONNECT_S = 30.0
STORE_TIMEOUT_S = 2.0
# a connect to a dead host takes up to 2.5 timeouts (c10d retries once after a random delay),
# then one call may take a timeout more
LONGEST_STORE_CALL_S = 3.5 * STORE_TIMEOUT_S


def _underlying_store(store: Any) -> Any:
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


def read_keys(store: Any, keys: list[str]) -> dict[str, str]:
    """The values of those of `keys` that are set in `store` (never waits for one that is not); a store
    error propagates."""
    present = [k for k in keys if store.check([k])]
    if not present:
        return {}
    values = store.multi_get(present) if hasattr(store, "multi_get") else [store.get(k) for k in present]
    return {k: bytes(v).decode("utf-8", "replace") for k, v in zip(present, values, strict=True)}


class StoreTrigger:
    """A counter in the store: each increment is one job-wide dump request."""

    def __init__(self, timeout_s: float = STORE_TIMEOUT_S) -> None:
        self._store: Any = None
        self._next_connect = 0.0
        self._timeout = timedelta(seconds=timeout_s)
        self.seen = -1

    def _connect(self) -> Any:
        if self._store is not None:
            return self._store
        import torch.distributed as dist  # here: `flightrec dump-now` imports this module and needs no torch

        if time.monotonic() < self._next_connect or not dist.is_initialized():
            return None
        self._next_connect = time.monotonic() + _RETRY_CONNECT_S
        try:
            base = _underlying_store(dist.distributed_c10d._get_default_store())
            if isinstance(base, dist.TCPStore):
                self._store = dist.TCPStore(base.host, base.port, is_master=False,
                                            timeout=self._timeout, wait_for_workers=False)
            else:
                self._store = base  # FileStore / HashStore: no shared client lock to fear
        except Exception as exc:  # noqa: BLE001
            log.warn_once("store-connect", f"cannot reach the job's store ({exc}); dumps stay local")
            self._store = None
        return self._store

    def poll(self) -> tuple[int, str] | None:
        """A new request (number, reason) made by another process since the last poll."""
        store = self._connect()
        if store is None:
            return None
        try:
            count = int(store.add(REQUEST_KEY, 0))
        except Exception as exc:  # noqa: BLE001 - store host gone: fall back to local triggers
            log.warn_once("store-poll", f"the job's store stopped answering ({exc}); dumps stay local")
            self._store = None
            return None
        if self.seen < 0:
            self.seen = count
            return None
        if count <= self.seen:
            return None
        self.seen = count
        try:
            reason = store.get(f"{REQUEST_KEY}/{count}").decode()
        except Exception:  # noqa: BLE001
            reason = "peer_request"
        return count, reason

    def request(self, reason: str) -> bool:
        store = self._connect()
        if store is None:
            return False
        try:
            count = int(store.add(REQUEST_KEY, 1))
            store.set(f"{REQUEST_KEY}/{count}", reason)
            self.seen = max(self.seen, count)
            return True
        except Exception as exc:  # noqa: BLE001
            log.warn_once("store-request", f"could not ask the other ranks to dump ({exc})")
            self._store = None
            return False

    def append(self, key: str, text: str) -> bool:
        """Append `text` to `key` (one call: every rank may append to the same key at once)."""
        return self._write(lambda store: store.append(key, text), "store-append",
                           "could not tell the other ranks where this rank is")

    def publish(self, key: str, text: str) -> bool:
        """Set `key` to `text` (this rank's own key: no other writer)."""
        return self._write(lambda store: store.set(key, text), "store-publish",
                           "could not publish this rank's pace; no live straggler alerts")

    def _write(self, call: Callable[[Any], object], warn_key: str, failed: str) -> bool:
        """One write to the store; a failure is said once (`failed`) and answered False."""
        store = self._connect()
        if store is None:
            return False
        try:
            call(store)
            return True
        except Exception as exc:  # noqa: BLE001
            log.warn_once(warn_key, f"{failed} ({exc})")
            return False

    def read_many(self, keys: list[str]) -> dict[str, str]:
        """The values of those of `keys` that are set; those that are not, or that the store cannot say, left out."""
        store = self._connect()
        if store is None:
            return {}
        try:
            return read_keys(store, keys)
        except Exception:  # noqa: BLE001 - no news this round
            return {}

    def read(self, key: str) -> str | None:
        """`key`'s value, "" when it is not set; None when the store cannot say (never waits for the key)."""
        store = self._connect()
        if store is None:
            return None
        try:
            if not store.check([key]):
                return ""
            return bytes(store.get(key)).decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - no news this tick
            return None


class FileTrigger:
    """`flightrec dump-now DIR` writes DIR/.flightrec-dump-request; each change is one request."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, REQUEST_FILE)
        self.seen = self._stamp()

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
            return (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            return None

    def poll(self) -> str | None:
        stamp = self._stamp()
        if stamp is None or stamp == self.seen:
            return None
        self.seen = stamp
        try:
            with open(self.path, encoding="utf-8") as handle:
                return str(json.load(handle).get("reason", "manual"))
        except (OSError, ValueError, AttributeError):
            return "manual"


def request_via_file(folder: str, reason: str = "manual") -> str:
    """Ask every rank dumping into `folder` to dump now (used by `flightrec dump-now`)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, REQUEST_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"reason": reason, "time_ns": time.time_ns(), "pid": os.getpid()}, handle)
    os.replace(tmp, path)
    return path




def dump_stamps(folder: str) -> dict[str, int]:
    """Dump file -> its modification time (ns), for telling which ranks answered a request."""
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    out = {}
    for name in names:
        if DUMP_NAME.match(name):
            try:
                out[name] = os.stat(os.path.join(folder, name)).st_mtime_ns
            except OSError:
                continue
    return out


def answered(folder: str, before: dict[str, int]) -> tuple[list[int], int | None]:
    """Ranks whose dump appeared or changed since `before`, and the world size one of them records."""
    ranks, world = set(), None
    for name, stamp in dump_stamps(folder).items():
        if before.get(name) == stamp:
            continue
        ranks.add(int(DUMP_NAME.match(name).group(1)))  # type: ignore[union-attr]
        if world is None:
            world = _world_size(os.path.join(folder, name))
    return sorted(ranks), world


def _world_size(path: str) -> int | None:
    """The `world_size` a dump records (stdlib only: this runs in `flightrec dump-now`)."""
    import gzip

    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        size = data.get("world_size")
        return int(size) if isinstance(size, int) and size > 0 else None
    except (OSError, ValueError, EOFError, AttributeError):
        return None  # still being written, or not ours
