"""Dump folders on shared storage: any fsspec URL (`s3://`, `gs://`, `memory://`, `file://`).

Why a separate path from local folders: remote reads are latency-bound, so files are fetched by a
thread pool (the decode still runs under the GIL, but the waits overlap), and worker processes could
not see an in-process filesystem such as `memory://` anyway. Local paths and `file://` URLs never
come here: they keep the process-pool reader of `loader.py`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .gil_stacks import KIND as GIL_STACKS
from .rankdump import FileProblem, RankDump, SharedMembers, SideFile
from .read import read_with, summary_of

FETCH_THREADS = 16  # requests in flight; object stores answer in tens of ms each


def is_url(folder: object) -> bool:
    """True for `proto://...` strings other than `file://` (those are read as local paths)."""
    return isinstance(folder, str) and "://" in folder and not folder.startswith("file://")


def local_path(folder: str) -> str:
    """`file:///data/dumps` -> `/data/dumps`; anything else unchanged."""
    return folder[len("file://"):] if folder.startswith("file://") else folder


def discover(url: str) -> tuple[Any, list[str]]:
    """The filesystem and the dump candidates in `url` (non-hidden plain files, no temp files).

    Raises FileNotFoundError / NotADirectoryError / ValueError, which the loader turns into
    UnusableInput with its usual wording.
    """
    import fsspec  # optional dependency: only needed for URLs

    fs, root = fsspec.core.url_to_fs(url)
    if not fs.exists(root):
        raise FileNotFoundError(url)
    if not fs.isdir(root):
        raise NotADirectoryError(url)
    files = []
    for info in fs.ls(root, detail=True):
        name = posixpath.basename(str(info["name"]).rstrip("/"))
        if info.get("type") == "file" and not name.startswith(".") and not name.endswith(".tmp"):
            files.append(str(info["name"]))
    return fs, sorted(files)


def read_one(fs: Any, path: str, lazy: bool = False, summary: bool = False) -> RankDump | FileProblem:
    """One file of `fs`, fetched and parsed here. `summary`: of a flightrec dump, only its summary
    member is fetched and read (read.summary_of)."""

    def fetch() -> bytes:
        if not summary:
            return fs.cat_file(path)
        with fs.open(path, "rb") as fh:
            return summary_of(fh)

    result = read_with(posixpath.basename(path), fetch, lazy)
    if isinstance(result, SideFile) and result.kind == GIL_STACKS:
        result.written_ns = _mtime_ns(fs, path)
    return result


def _mtime_ns(fs: Any, path: str) -> int | None:
    """The object's modification time where the filesystem says it (local, most object stores), else None."""
    try:
        info = fs.info(path)
    except Exception:  # noqa: BLE001 - any backend's error: the time is then unknown
        return None
    value = info.get("mtime", info.get("LastModified", info.get("last_modified")))
    if hasattr(value, "timestamp"):
        value = value.timestamp()
    try:
        return int(float(value) * 1e9) if value is not None else None
    except (TypeError, ValueError):
        return None


def read_url(url: str, lazy: bool = False, summary: bool = False) -> RankDump | FileProblem:
    """One file named by its fsspec URL, fetched where this runs (a Dask worker, `--dask`)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    return read_one(fs, path, lazy, summary)


def read_all(fs: Any, paths: list[str], progress: Callable[[int], None] | None = None,
             threads: int = FETCH_THREADS, summary: bool = False) -> list[RankDump | FileProblem]:
    """Fetch and parse every file with a thread pool; results in the order of `paths`. `summary`: see read_one."""

    def one(path: str) -> RankDump | FileProblem:
        return read_one(fs, path, summary=summary)

    shared = SharedMembers()
    out: list[RankDump | FileProblem] = []
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(paths)))) as pool:
        for result in pool.map(one, paths):
            out.append(shared(result))
            if progress is not None:
                progress(1)
    return out
