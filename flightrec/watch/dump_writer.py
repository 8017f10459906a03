"""Build a rank's dump and write it atomically.

The temporary file lives in the target folder so `os.replace` is a same-filesystem rename: a
process killed mid-write leaves the previous dump intact and at worst a hidden `.tmp` file, which
the next dump of that rank removes (unless its writer still runs) and the analyzer never reads.
"""

from __future__ import annotations

import glob
import os
import platform
import socket
import time
from typing import Any

import torch
import torch.distributed as dist

from .. import log
from ..format.dump_file import encode, recent_positions
from ..format.names import dump_filename
from ..format.schema import FORMAT, SCHEMA_VERSION, __version__
from ..identity import launch as _launch
from ..identity import process_rank
from ..record import cpp_reader, fastpath, torch_compat, torch_recorder
from ..record.entry import Entry, to_tables
from ..record.group_progress import group_progress
from ..record.recorder import Recorder
from ..record.stacks import all_thread_stacks


def _store_address() -> str | None:
    """The rendezvous address every rank of one job shares (MASTER_ADDR:MASTER_PORT), if the launcher set it."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{host}:{port}" if host and port else None


def _enrich_cpp_entries(entries: list[Entry], fr: dict[str, Any] | None, wall_minus_mono_ns: int) -> dict[int, bool]:
    """Fill op names, sizes and times of C++-issued collectives from PyTorch's recorder, and their
    state. Returns {id: completion time measured too} for the entries whose enqueue time is now a
    measurement (PyTorch's recorder stamps an op where it is issued), not when our polling saw it."""
    measured: dict[int, bool] = {}
    if fr is None:
        return measured
    names = torch_recorder.uid_to_group_name(fr)
    completed = {names.get(uid, uid): seq for uid, seq in torch_recorder.completed_seqs(fr).items()}
    by_position: dict[tuple[str, int], dict[str, Any]] = {}
    for item in fr.get("entries") or []:
        pg = item.get("process_group")
        if isinstance(pg, (list, tuple)) and pg and not item.get("is_p2p"):
            by_position[(str(pg[0]), int(item.get("collective_seq_id", -1)))] = item
    for entry in entries:
        if entry.source != "c++":
            continue
        item = by_position.get((entry.group, entry.seq))
        if item is not None:
            entry.op = torch_recorder.op_name(str(item.get("profiling_name", "unknown")))
            entry.inputs = torch_recorder.tensor_meta(item.get("input_sizes"), item.get("input_dtypes"))
            entry.outputs = torch_recorder.tensor_meta(item.get("output_sizes"), item.get("output_dtypes"))
        last_done = completed.get(entry.group)
        if last_done is not None and entry.state in ("unknown", "started"):  # "started": as of the last poll
            entry.state = "completed" if entry.pg_seq <= last_done else "started"
        if item is not None:
            taken = _take_fr_times(entry, item, wall_minus_mono_ns)
            if taken is not None:
                measured[entry.id] = taken
    return measured


def _take_fr_times(entry: Entry, item: dict[str, Any], wall_minus_mono_ns: int) -> bool | None:
    """PyTorch's recorder stamps an op in wall-clock ns (ours are monotonic) when it is created and,
    on backends that see it, when it was found completed. None: no measured time at all."""
    created = item.get("time_created_ns")
    if not isinstance(created, int) or created <= 0:
        return None
    entry.t_enqueue_ns = created - wall_minus_mono_ns
    done = item.get("time_discovered_completed_ns")
    if isinstance(done, int) and done > 0 and entry.state == "completed":
        entry.t_complete_ns = done - wall_minus_mono_ns
        return True
    return False


def _hot_path(rec: Recorder) -> dict[str, bool]:
    """Which hot path recorded (docs/dump-format.md): the C one, and whether it read through the torch reader."""
    c = fastpath.available() and not rec.settings.stacks
    return {"c": c, "torch_reader": fastpath.uses_torch_reader() if c else cpp_reader.load() is not None}


BRIEF_ENTRIES = 16  # the exit record keeps the last few ops: "exited normally after <op> seq N"


def build_dump(rec: Recorder, reason: str, detail: str | None = None, brief: bool = False,
               recovered: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The dump (docs/dump-format.md). `brief`: the exit record of a rank leaving cleanly, which
    keeps the progress counters and its last few ops (and those of `recovered` stalls, which the
    analyzer times) but no thread stacks. `recovered`: the watchdog's records of stalls that ended."""
    rank, world_size = process_rank()
    rec.poll_works()
    rec.groups.discover()
    rec.scan_cpp_ops()
    entries = rec.entries()
    if brief:
        stalled = {int(r["id"]) for r in recovered or ()}
        entries = [e for e in entries[:-BRIEF_ENTRIES] if e.id in stalled] + entries[-BRIEF_ENTRIES:]
    kept = {e.id for e in entries}
    lost = [e for e in rec.in_flight() if e.id not in kept]  # pushed out of the ring while still running
    if lost:
        entries = sorted(lost + entries, key=lambda e: e.id)
    rec.device_timing.resolve(entries)
    wall_ns, mono_ns = time.time_ns(), time.monotonic_ns()
    hang = reason in torch_recorder.HANG_REASONS  # carries PyTorch's recorder entries too (torch_recorder.summary)
    fr = torch_recorder.read(include_entries=hang or any(e.source == "c++" for e in entries))
    measured = _enrich_cpp_entries(entries, fr, wall_ns - mono_ns)
    groups = rec.groups.table(referenced={e.group for e in entries})
    columns, templates = to_tables(entries, measured)
    recent_columns, recent_templates = to_tables(
        [entries[i] for i in recent_positions([e.state == "completed" for e in entries])], measured)
    launch = _launch()
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "rank": rank,
        "world_size": world_size,
        "local_rank": launch.local_rank,
        "node_rank": launch.node_rank,
        "local_world_size": launch.local_world_size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "launcher": launch.launcher,
        "job_id": launch.job_id,
        "attempt": launch.attempt,
        "store": _store_address(),
        "armed_wall_ns": rec.armed_wall_ns,
        "torch_version": str(torch.__version__),
        "not_recorded": torch_compat.not_recorded(),
        "python_version": platform.python_version(),
        "flightrec_version": __version__,
        "backends": sorted({str(g["backend"]) for g in groups}),
        "reason": reason,
        "reason_detail": detail,
        "dump_time_ns": wall_ns,
        "graph_captured_ops": rec.device_timing.captured,
        "clock": {"wall_ns": wall_ns, "mono_ns": mono_ns},
        "settings": rec.settings.as_dict(),
        "hot_path": _hot_path(rec),
        "capacity": rec.ring.capacity,
        "recorded": rec.ring.recorded,
        "dropped": max(0, rec.ring.recorded - len(entries)),
        "exit_record": brief,
        "groups": groups,
        "progress": group_progress(rec),
        "recent": {"templates": recent_templates, "entries": recent_columns},
        "templates": templates,
        "entries": columns,
        "threads": [] if brief else _with_ops(all_thread_stacks(), rec),
        "torch_fr": torch_recorder.summary(fr, hang),
        "recorder_errors": list(log.errors),
        **({"recovered": list(recovered)} if recovered else {}),
    }


def _with_ops(threads: list[dict[str, Any]], rec: Recorder) -> list[dict[str, Any]]:
    """Each thread record says which recorded op the thread is inside (`in_op`, None: none): a rank
    whose threads are all outside ops is computing, whatever async ops it has in flight."""
    inside = rec.threads_in_ops()
    for t in threads:
        t["in_op"] = inside.get(int(t["ident"]))
    return threads


def write_dump(payload: dict[str, Any], folder: str, replace: bool = True) -> str | None:
    """Write `payload` as folder/rank-NNNNN.json.gz (`dump_filename`) via a temporary file and a rename.

    `replace=False` never overwrites an existing dump (returns None instead): a process that never
    joined a group (a spawned DataLoader worker inheriting RANK) must not replace the rank's real one.
    The file is synced before the rename, so the name never points at data still in flight.
    """
    os.makedirs(folder, exist_ok=True)
    name = dump_filename(int(payload.get("rank", -1)), int(payload.get("attempt") or 0))
    final = os.path.join(folder, name)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    for stale in glob.glob(os.path.join(glob.escape(folder), f".{name}.*.tmp")):
        if stale != tmp and not _writer_alive(stale):
            try:
                os.unlink(stale)
            except OSError:
                pass
    data = encode(payload)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, final)
        else:
            try:
                os.link(tmp, final)  # atomic "create if absent"
            except FileExistsError:
                return None
            finally:
                os.unlink(tmp)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return final


def _writer_alive(tmp: str) -> bool:
    """A temporary file whose writer (pid in its name) still runs belongs to a dump in progress."""
    try:
        pid = int(tmp.rsplit(".", 2)[-2])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except OSError:
        return True  # exists, but not ours to signal
    return pid != os.getpid()


def joined() -> bool:
    """This process has joined a process group (is a rank, not just a process that inherited RANK)."""
    try:
        return bool(dist.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def warn_write_failed(folder: str, exc: BaseException) -> None:
    log.warn_once(f"write-{folder}",
                  f"could not write a dump into {folder!r}: {exc}; training continues, a later dump will retry")
