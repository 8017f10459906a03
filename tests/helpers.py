"""Bounded multi-process gloo jobs for tests: a hang fails the test, and no process outlives it."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import pickle
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

from fixtures.launch import free_port, kill_tree
from flightrec.format.columns import COLUMNS, default_of
from flightrec.format.names import dump_filename
from flightrec.format.packed import plain


class JobFailed(AssertionError):
    pass


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 60.0,
              allow_failure: bool = False) -> list[int | None]:
    """Run `fn(rank, world_size, port, *args)` in `world_size` spawned processes; returns exit codes."""
    port = free_port()
    ctx = mp.start_processes(fn, args=(world_size, port, *args), nprocs=world_size, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if all(not p.is_alive() for p in ctx.processes):
                break
            time.sleep(0.05)
        else:
            raise JobFailed(f"job did not finish within {timeout_s}s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                kill_tree(p.pid)
            p.join(5)
    codes = [p.exitcode for p in ctx.processes]
    try:
        if not allow_failure and any(code != 0 for code in codes):
            raise JobFailed(f"ranks exited with {codes}\n{_tracebacks(ctx)}")
    finally:
        for name in _error_files(ctx):
            with contextlib.suppress(OSError):
                os.unlink(name)
    return codes


def _error_files(ctx: Any) -> list[str]:
    """Where spawned workers pickle their tracebacks; torch before 2.3 queues them (`error_queues`) instead."""
    return list(getattr(ctx, "error_files", ()))


def _tracebacks(ctx: Any) -> str:
    """The ranks' own tracebacks: spawned workers pickle them to a file instead of printing them."""
    texts = []
    for rank, queue in enumerate(getattr(ctx, "error_queues", ())):
        with contextlib.suppress(Exception):  # torch < 2.3: the traceback text is on a queue
            if not queue.empty():
                texts.append(f"--- rank {rank} ---\n{queue.get(timeout=1)}")
    for rank, name in enumerate(_error_files(ctx)):
        try:
            with open(name, "rb") as handle:
                texts.append(f"--- rank {rank} ---\n{pickle.load(handle)}")
        except (OSError, EOFError, pickle.UnpicklingError):  # that rank raised nothing
            pass
    return "\n".join(texts)


def init_rank(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def read_dump(path: str | Path) -> dict[str, Any]:
    """One dump file as its JSON object (the analyzer has its own tolerant reader)."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def load_dump(folder: str | Path, rank: int) -> dict[str, Any]:
    """Rank `rank`'s dump in `folder`."""
    return read_dump(Path(folder) / dump_filename(rank))


def columns(dump: dict[str, Any]) -> dict[str, list[Any]]:
    """The entry columns as plain lists, decoded the way docs/dump-format.md tells any reader to:
    `{"values", "codes"}` columns expanded, `templates` taken onto each entry through
    `entries.template`, left-out columns as their default (null for most)."""
    cols = {k: plain(v) for k, v in dump["entries"].items()}  # packed arrays unpacked
    n = len(cols["id"])
    templates = {k: plain(v) for k, v in (dump.get("templates") or {}).items()}
    which = cols.get("template", [])
    out: dict[str, list[Any]] = {}
    for name in COLUMNS:
        raw = cols.get(name, templates.get(name))
        if isinstance(raw, dict):
            values = raw["values"]
            raw = [values[c] if c >= 0 else None for c in raw["codes"]]
        if raw is None:
            raw = [default_of(name)] * n
        elif name in templates:
            raw = [raw[t] for t in which]
        out[name] = raw
    return out


def entries(dump: dict[str, Any]) -> list[dict[str, Any]]:
    """Column-oriented entries as a list of row dicts, for readable assertions."""
    cols = columns(dump)
    n = len(cols["id"])
    return [{k: v[i] for k, v in cols.items()} for i in range(n)]


def wait_for(predicate: Callable[[], bool], timeout_s: float, step_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


def terminate(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
