"""Load a dump folder: find the files, read them in parallel, pick one dump per rank, build one table.

Why processes: decompressing gzip and decoding JSON/pickle hold the GIL, so threads do not overlap
them; a process pool does. Starting workers costs more than reading a handful of small files, so
small folders stay on a serial fast path (thresholds measured, see `PARALLEL_MIN_FILES`).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..constants import FMT_FLIGHTREC, FMT_TORCH_JSON, FMT_TORCH_PICKLE
from ..memory import release_free_memory, reuse_freed_memory
from ..textutil import ranges
from . import read_torch_fr, sources, torch_fr_p2p
from .attempts import NoSuchAttempt, split_attempts
from .cluster import client_for
from .columns import Columns, Templated, concat_columns, expand_batch, slim, take_rows, to_frame
from .gil_stacks import KIND as GIL_STACKS
from .jobs import split_jobs
from .rankdump import FileProblem, RankDump, SharedMembers, SideFile
from .read import rank_from_name, read_path
from .sample import sample
from .sites import to_user_sites
from .table_builder import TableBuilder

# Below these, a pool's start-up (forking, pickling frames back) costs more than it saves.
PARALLEL_MIN_FILES = 8
PARALLEL_MIN_BYTES = 4 << 20
BATCH_MIN_FILES, BATCH_MAX_FILES = 8, 256  # files per reader task (see Batch)
READ_MODES = ("full", "summary", "sampled", "auto")
AUTO_SUMMARY_FILES = 2048  # from here on a full read takes tens of seconds and gigabytes; a summary read, seconds
AUTO_SAMPLED_FILES = 32768  # from here on every entry would not fit in memory (~0.4 GB per 1,000 ranks of 2,000)
PARALLEL_MIN_SUMMARIES = 256  # a summary costs a file's opening and a few KB: the pool pays off by file count
FORMAT_PREFERENCE = {FMT_FLIGHTREC: 0, FMT_TORCH_PICKLE: 1, FMT_TORCH_JSON: 2}


class UnusableInput(Exception):
    """The folder cannot be analyzed at all (missing, empty, or no readable dump)."""


class AttemptNotFound(UnusableInput):
    """The restart attempt asked for has no dump in the folders (the message lists those present)."""


@dataclass
class Dataset:
    """Everything read from one folder (or several read as one job), before any analysis."""

    folder: Path | str  # a str for fsspec URLs (kept as given) and for several folders (joined by spaces)
    dumps: dict[int, RankDump]
    entries: pd.DataFrame
    problems: list[FileProblem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    jobs: dict[str, Any] | None = None  # the report's `jobs`: the analysed job and the ignored ones (jobs.py)
    attempts: dict[str, Any] | None = None  # the report's `attempts`: restart attempt analysed, the others (attempts.py)
    folders: list[str] = field(default_factory=list)  # every folder read, as given
    # flightrec's held-GIL stacks files that fired, by rank (gil_stacks.py): the stacks of a rank whose
    # watchdog could not run; of the analysed restart attempt only
    gil_stacks: dict[int, SideFile] = field(default_factory=dict)

    @property
    def unreadable_ranks(self) -> set[int]:
        """Ranks that have a file but no usable dump."""
        return {p.rank for p in self.problems if p.rank is not None} - set(self.dumps)


def discover(folder: Path) -> list[Path]:
    """Dump candidates: non-hidden entries directly in `folder` but folders (recorder temp files skipped);
    links, pipes and devices are listed so that the reader can say why it skips them."""
    if not folder.exists():
        raise UnusableInput(f"{folder}: no such folder")
    if not folder.is_dir():
        raise UnusableInput(f"{folder}: not a folder")
    files = [p for p in sorted(folder.iterdir()) if not p.is_dir() and not p.name.startswith(".") and not p.name.endswith(".tmp")]
    if not files:
        raise UnusableInput(f"{folder}: empty folder, no dump files")
    return files


Progress = Callable[[int], None]  # called with the number of files just read


@dataclass
class Batch:
    """What a reader process sends back for a batch of files: every file's result, and the entries
    of its readable dumps as one table (dump i's rows are `spans[i]`, in the order of `results`).

    Why batches: one table per batch crosses the process boundary as a few large arrays, where one
    per rank (16,384 of them, each ~30 small arrays) cost the parent ~1 ms each to unpickle and
    then to merge: at scale, the parent was the bottleneck while the readers waited.
    """

    results: list[RankDump | FileProblem]
    table: Columns | None = None  # until the loader's TableBuilder takes it: `spans` are then its rows
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # index in results -> rows


def read_batch(names: list[str], mode: str = "full") -> Batch:
    """Read `names` (in a worker process) and merge their entries into one table. `mode`: "full",
    "summary" (flightrec dumps' summaries only) or "sampled" (sample.py: recent and sampled rows)."""
    shared = SharedMembers(keep_ranges=True)
    results = [shared(read_path(n, lazy=True, summary=mode == "summary") if "://" not in n
                      else sources.read_url(n, lazy=True, summary=mode == "summary")) for n in names]
    parts: list[Columns | Templated] = []
    spans: dict[int, tuple[int, int]] = {}
    start = 0
    for i, result in enumerate(results):
        if isinstance(result, RankDump):
            rows = len(result.entries) if isinstance(result.entries, Templated) else len(result.entries["id"])
            spans[i] = (start, start + rows)
            start += rows
            parts.append(result.entries)
            result.entries = {}
    if not parts:
        return Batch(results, None, spans)
    if all(isinstance(p, Templated) for p in parts):  # flightrec dumps: templates taken on at once
        table = expand_batch(parts)  # type: ignore[arg-type]
    else:  # other formats among them: each expanded alone, rows kept in file order
        table = concat_columns([expand_batch([p]) if isinstance(p, Templated) else p for p in parts], consume=True, trim=False)
    if mode == "sampled":
        table, spans = _sampled(table, spans, results)
    return Batch(results, slim(table), spans)  # a worker's heap is short-lived


def _sampled(table: Columns, spans: dict[int, tuple[int, int]], results: list[RankDump | FileProblem]
             ) -> tuple[Columns, dict[int, tuple[int, int]]]:
    """A batch's rows cut to each ring's recent ops and a timing sample (sample.py). A dump without
    `recent` (another format, an older writer) keeps every row, all taken as recent."""
    recent = np.ones(len(table["rank"]), dtype=bool)
    ids = np.asarray(table["id"])
    for i, (a, b) in spans.items():
        dump = results[i]
        if not isinstance(dump, RankDump):
            continue
        wanted = dump.meta.pop("recent_ids", None)
        if wanted is not None:
            recent[a:b] = np.isin(ids[a:b], wanted)
            dump.meta["summary_only"] = True  # the diagnosis sees its recent ops, as from a summary
            dump.meta["first_id"] = int(wanted[0]) if len(wanted) else None
    table, keep = sample(table, recent)
    before = np.concatenate([[0], np.cumsum(keep)])
    return table, {i: (int(before[a]), int(before[b])) for i, (a, b) in spans.items()}


def read_files(paths: list[Path], builder: TableBuilder, workers: int | None = None, progress: Progress | None = None,
               full_names: bool = False, mode: str = "full") -> list[Batch]:
    """Read every file, in a process pool when the folder is big enough to pay for one.
    `builder`: the pool's batch tables are appended to it as they arrive (table_builder.py), in
    rank order (serially read dumps keep their own entries). `full_names`: each result's `file` is
    its path as given, not its name (files of several folders). `mode`: see read_batch."""
    cpus = os.cpu_count() or 1
    if workers is None:
        worth = (len(paths) >= PARALLEL_MIN_SUMMARIES if mode == "summary" else
                 len(paths) >= PARALLEL_MIN_FILES and sum(_size(p) for p in paths) >= PARALLEL_MIN_BYTES)
        workers = min(cpus, len(paths)) if worth else 1
    names = sorted(map(str, paths), key=_rank_order)  # batches in rank order: the merged table needs no reordering
    tick = progress or (lambda n: None)
    if workers <= 1 and mode == "sampled":  # rows are cut per batch: one batch, read here
        return _collect([names], [read_batch(names, mode)], builder, tick, full_names)
    if workers <= 1:
        shared = SharedMembers()
        out = []
        for n in names:
            out.append(_named(shared(read_path(n, summary=mode == "summary")), n, full_names))
            tick(1)
        return [Batch(out)]  # entries stay with their dumps: nothing to send across processes
    ctx = multiprocessing.get_context("fork") if sys.platform.startswith("linux") else None
    batches = _batches(names, workers)
    builder.expect(len(batches))
    paused = gc.isenabled()
    if paused:  # each batch unpickles ~10^4 containers: collections would rescan every earlier batch's
        gc.disable()
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=reuse_freed_memory) as pool:
            return _collect(batches, pool.map(partial(read_batch, mode=mode), batches), builder, tick, full_names)
    finally:
        if paused:
            gc.enable()


def read_on_cluster(client: Any, names: list[str], builder: TableBuilder, progress: Progress | None = None,
                    full_names: bool = False, mode: str = "full") -> list[Batch]:
    """`read_files` with the batches read as Dask tasks (`--dask`): each worker reads its files itself
    (local paths on a filesystem the workers share, or fsspec URLs), and only the batches' tables, a
    sampled or summary read's bounded rows, come back to this process."""
    names = sorted(names, key=_rank_order)
    workers = max(1, len(client.scheduler_info().get("workers", {})))
    batches = _batches(names, workers)
    builder.expect(len(batches))
    futures = client.map(read_batch, batches, mode=mode, pure=False)
    results = (future.result() for future in futures)
    try:
        return _collect(batches, results, builder, progress or (lambda n: None), full_names)
    finally:
        client.cancel(futures)


def _batches(names: list[str], workers: int) -> list[list[str]]:
    """A few batches per worker keep all busy to the end and the progress bar moving."""
    size = max(BATCH_MIN_FILES, min(BATCH_MAX_FILES, len(names) // (workers * 8) or 1))
    return [names[i:i + size] for i in range(0, len(names), size)]


def _collect(batches: list[list[str]], results: Any, builder: TableBuilder, tick: Progress, full_names: bool) -> list[Batch]:
    """Each batch's table appended to `builder` as it arrives, in order; the per-file results kept."""
    shared = SharedMembers()
    out = []
    for names_read, batch in zip(batches, results, strict=True):
        for n, result in zip(names_read, batch.results, strict=True):
            _named(shared(result), n, full_names)
        if batch.table is not None:
            start, _ = builder.append(batch.table)
            batch.table = None
            batch.spans = {i: (a + start, b + start) for i, (a, b) in batch.spans.items()}
        out.append(batch)
        tick(len(batch.results))
    return out


def _named(result: RankDump | FileProblem | SideFile, path: str, full: bool) -> RankDump | FileProblem | SideFile:
    if full:
        result.file = path
    return result


def merge_batches(batches: list[Batch], chosen: dict[int, RankDump], builder: TableBuilder) -> pd.DataFrame:
    """The entry table of the chosen dumps, rows ordered by rank (stable: each dump's own order):
    the rows `read_files` appended to `builder`, then the entries serially read dumps kept."""
    keep_ids = {id(d) for d in chosen.values()}
    parts: list[Columns] = []
    from_builder = builder.rows > 0
    if from_builder:
        built = builder.finish()
        spans = [(span, id(b.results[i]) in keep_ids) for b in batches for i, span in b.spans.items()]
        if not all(kept for _, kept in spans):  # another dump of the same rank was preferred, another job's, an older attempt's
            rows = [np.arange(a, b) for (a, b), kept in spans if kept]
            built = take_rows(built, np.concatenate(rows) if rows else np.empty(0, dtype=np.int64))
        parts.append(built)
    for batch in batches:
        for result in batch.results:
            if isinstance(result, RankDump) and result.entries and id(result) in keep_ids:
                parts.append(result.entries)
        batch.results = []
    # the builder's table alone (the usual case) is the table: joining it would copy it once more
    table = parts[0] if len(parts) == 1 and from_builder else concat_columns(parts, consume=True)
    ranks = table["rank"]
    if len(ranks) > 1 and bool((ranks[1:] < ranks[:-1]).any()):
        table = take_rows(table, np.argsort(ranks, kind="stable"))  # files not named in rank order
    return to_frame(torch_fr_p2p.renumber_anchored_pairs(table))


Folders = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


@dataclass
class _Source:
    """One folder to read: its files (local) or its filesystem and object names (an fsspec URL)."""

    given: str  # as the caller wrote it
    path: Path | str
    files: list[Path] = field(default_factory=list)
    fs: Any = None
    names: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.names) if self.fs is not None else len(self.files)


def _sources(folder: Folders) -> list[_Source]:
    """Every folder given, each once, discovered (raises UnusableInput naming a missing or empty one)."""
    given = [folder] if isinstance(folder, (str, os.PathLike)) else list(folder)
    if not given:
        raise UnusableInput("no folder given")
    out: list[_Source] = []
    seen: set[str] = set()
    for f in given:
        if sources.is_url(f):
            key = str(f).rstrip("/")
            if key not in seen:
                seen.add(key)
                fs, names = _discover_url(str(f))
                out.append(_Source(str(f), str(f), fs=fs, names=names))
            continue
        path = Path(sources.local_path(f) if isinstance(f, str) else f)
        key = os.path.realpath(path)
        if key not in seen:  # the same folder twice would make every rank a duplicate of itself
            seen.add(key)
            out.append(_Source(os.fspath(f), path, files=discover(path)))
    return out


def load_folder(folder: Folders, workers: int | None = None, progress: Progress | None = None,
                on_count: Callable[[int], None] | None = None, attempt: int | None = None,
                read: str = "full", dask: str | None = None) -> Dataset:
    """Read a dump folder (a local path or any fsspec URL), or several read as one job (one per
    node's local disk, say), into a Dataset.

    Raises UnusableInput when a folder is missing or empty, or nothing can be analyzed. `attempt`
    picks a torchelastic restart attempt (default: the latest; attempts.py). `on_count` is told the
    number of files before reading starts and `progress` after each one (the CLI's progress bar).
    With several folders, files are named by their path (the same name may be in two folders).
    `read`: "full"; "summary": only the summary of each flightrec dump (its counters, threads and recent
    ops: flightrec/format/dump_file.py), other formats whole; "sampled": every file whole, keeping of each flightrec
    ring its recent ops and a timing sample (sample.py); "auto": summaries from AUTO_SUMMARY_FILES files on.
    `dask`: the address of a Dask scheduler; the files are then read as tasks on its workers (cluster.py).
    """
    if read not in READ_MODES:
        raise ValueError(f"read must be one of {', '.join(READ_MODES)}, not {read!r}")
    found = _sources(folder)
    mode = "summary" if read == "auto" and sum(s.count for s in found) >= AUTO_SUMMARY_FILES else (
        "full" if read == "auto" else read)
    several = len(found) > 1
    if on_count is not None:
        on_count(sum(s.count for s in found))
    local = [p for s in found if s.fs is None for p in s.files]
    builder = TableBuilder()
    if dask is not None:  # every file, local or remote, read by the cluster's workers
        names = [str(p) for p in local] + [s.fs.unstrip_protocol(n) for s in found if s.fs is not None for n in s.names]
        with client_for(dask) as client:
            batches = read_on_cluster(client, names, builder, progress, full_names=several, mode=mode)
        found = [s for s in found if s.fs is None]
    else:
        batches = read_files(local, builder, workers, progress, full_names=several, mode=mode) if local else []
    for s in found:
        if s.fs is not None:  # read in this process: entries stay per dump
            results = sources.read_all(s.fs, s.names, progress, summary=mode == "summary")
            if several:
                base = s.given.rstrip("/")
                for name, result in zip(s.names, results, strict=True):
                    result.file = f"{base}/{name.rstrip('/').rsplit('/', 1)[-1]}"
            batches.append(Batch(results))
    where = str(found[0].path) if not several else " ".join(s.given for s in found)
    everything = [r for b in batches for r in b.results]
    problems = [r for r in everything if isinstance(r, FileProblem)]
    try:  # a restart attempt's dumps first: a restart is the same job, armed later (attempts.py)
        tried = split_attempts([r for r in everything if isinstance(r, RankDump)], attempt)
    except NoSuchAttempt as exc:
        raise AttemptNotFound(f"{where}: {exc}") from None
    split = split_jobs(tried.kept)  # another job's dumps: set aside, named
    dumps, notes = _one_per_rank(split.kept)
    for d in dumps.values():
        d.meta.pop("recent_ids", None)  # a sampled read has used them
    notes = split.notes + notes
    sides = [r for r in everything if isinstance(r, SideFile)]
    problems += _attach_side_files([r for r in sides if r.kind != GIL_STACKS], dumps)
    held = _gil_stacks([r for r in sides if r.kind == GIL_STACKS], dumps)
    if not dumps:
        lines = "; ".join(p.line() for p in problems[:5]) + ("; ..." if len(problems) > 5 else "")
        raise UnusableInput(f"{where}: no readable dump ({lines})")
    notes += _version_notes(dumps)
    notes += _merge_notes(dumps)
    entries = to_user_sites(merge_batches(batches, dumps, builder), dumps)
    for d in dumps.values():
        d.entries = {}  # the table owns the rows now; keep per-rank records light
    release_free_memory()  # what reading left free in the heap (batches unpickled, per-file objects)
    return Dataset(folder=found[0].path if not several else where, dumps=dumps, entries=entries, problems=problems,
                   notes=notes, jobs=split.jobs, attempts=tried.report, folders=[s.given for s in found], gil_stacks=held)


def _gil_stacks(files: list[SideFile], dumps: dict[int, RankDump]) -> dict[int, SideFile]:
    """The held-GIL stacks files that fired, of the restart attempt the dumps are from; the newest per rank.
    One that never fired (the rank's watchdog always ran) is no evidence and is left unsaid."""
    attempt = max((int(d.meta.get("attempt") or 0) for d in dumps.values()), default=0)
    out: dict[int, SideFile] = {}
    for f in files:
        if f.rank is None or not f.threads or int(f.meta.get("attempt") or 0) != attempt:
            continue
        if f.rank not in out or (f.written_ns or 0) > (out[f.rank].written_ns or 0):
            out[f.rank] = f
    return out


def _attach_side_files(sides: list[SideFile], dumps: dict[int, RankDump]) -> list[FileProblem]:
    """Give each rank's dump the thread stacks of its side file (torch_npu's `_py_traceback`); a side file
    whose rank has no dump, or whose rank's dump already has stacks, is reported rather than dropped."""
    problems: list[FileProblem] = []
    for side in sides:
        dump = dumps.get(side.rank) if side.rank is not None else None
        if dump is None:
            problems.append(FileProblem(side.file, "Python-stack file of a rank with no readable dump", side.rank))
        elif dump.threads:
            problems.append(FileProblem(side.file, f"ignored: {dump.file} already has thread stacks", side.rank))
        else:
            dump.threads = side.threads
            dump.notes = [n for n in dump.notes if n != read_torch_fr.NOTE_NO_STACKS]
    return problems


def _discover_url(url: str) -> tuple[object, list[str]]:
    try:
        fs, names = sources.discover(url)
    except FileNotFoundError:
        raise UnusableInput(f"{url}: no such folder") from None
    except NotADirectoryError:
        raise UnusableInput(f"{url}: not a folder") from None
    except (ImportError, ValueError, OSError) as exc:
        raise UnusableInput(f"{url}: cannot open ({type(exc).__name__}: {exc})") from None
    if not names:
        raise UnusableInput(f"{url}: empty folder, no dump files")
    return fs, names


def _one_per_rank(dumps: list[RankDump]) -> tuple[dict[int, RankDump], list[str]]:
    by_rank: dict[int, list[RankDump]] = defaultdict(list)
    for d in dumps:
        by_rank[d.rank].append(d)
    chosen: dict[int, RankDump] = {}
    notes: list[str] = []
    for rank, cands in by_rank.items():
        cands.sort(key=lambda d: (FORMAT_PREFERENCE.get(d.fmt, 9), d.file))
        chosen[rank] = cands[0]
        if len(cands) > 1:
            others = ", ".join(c.file for c in cands[1:])
            notes.append(f"rank {rank}: several dumps; used {cands[0].file}, ignored {others}")
    return chosen, notes


def _version_notes(dumps: dict[int, RankDump]) -> list[str]:
    versions: dict[str, list[int]] = defaultdict(list)
    for rank, d in dumps.items():
        versions[str(d.meta.get("version"))].append(rank)
    if len(versions) <= 1:
        return []
    parts = "; ".join(f"{v}: ranks {ranges(r)}" for v, r in sorted(versions.items()))
    return [f"mismatched dump versions ({parts}): fields may not mean the same on every rank"]


def _merge_notes(dumps: dict[int, RankDump]) -> list[str]:
    """Per-file notes, each stated once with the ranks it applies to."""
    seen: dict[str, list[int]] = defaultdict(list)
    for rank, d in sorted(dumps.items()):
        for note in d.notes:
            seen[note].append(rank)
    return [f"{note} (ranks {ranges(r)})" for note, r in seen.items()]


def _rank_order(name: str) -> tuple[bool, int, str]:
    """Files by the rank their name ends in (`nccl_trace_rank_10` after `_9`), unnamed ones last."""
    rank = rank_from_name(os.path.basename(name))
    return (rank is None, rank or 0, name)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0

