"""Read one file of any supported kind: sniff the bytes, decode safely, hand off to the right parser.

Why content sniffing rather than names: dumps get renamed, copied and mixed in one folder; the
gzip/pickle/JSON magic and the decoded top level decide what a file is. Every failure becomes a
`DumpError` whose text is the one-line reason shown to the user: this function never lets a
traceback escape for a bad file, and a pickle can never run code (see safe_pickle).
"""

from __future__ import annotations

import gc
import gzip
import json
import os
import pickle
import re
import stat
import zlib
from collections.abc import Callable
from typing import Any, BinaryIO

from flightrec.format.names import DUMP_NAME

from .. import testing
from ..constants import FMT_TORCH_JSON, FMT_TORCH_PICKLE, MAX_RANKS
from . import gil_stacks, pickle_columns, read_flightrec, read_torch_fr, safe_pickle, torch_fr_meta
from .rankdump import DumpError, FileProblem, RankDump, SideFile

try:  # optional: 2-3x faster than the standard library on big dumps; same results
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

SUMMARY_CHUNK = 1 << 14  # a summary is a few KB compressed
TRAILING_RANK = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle)?(?:\.gz)?$")


def rank_from_name(name: str) -> int | None:
    """`rank-00003.json.gz` / `rank-00003.attempt-2.json.gz` -> 3, `nccl_trace_rank_3` / `comm_lib_trace_rank_3.json` -> 3,
    `hccl_trace_rank_3_py_traceback` -> 3, else None."""
    name = name.removesuffix(torch_fr_meta.PY_TRACEBACK_SUFFIX)
    if name.startswith("rank-"):  # flightrec's own names; `rank-unknown-<pid>` names no rank
        m = DUMP_NAME.match(name)
    else:
        m = TRAILING_RANK.search(name)
    rank = int(m.group(1)) if m else None
    return rank if rank is not None and rank < MAX_RANKS else None  # a date or an id, not a rank


def read_path(path: str, lazy: bool = False, summary: bool = False) -> RankDump | FileProblem | SideFile:
    """Read and normalise one local file; a problem (never an exception) when it cannot be used.
    `lazy`: a flightrec dump's entries may come back as `columns.Templated` (see read_flightrec.parse).
    `summary`: of a flightrec dump, read only its summary member (flightrec/format/dump_file.py), its `recent`
    ops standing for its entries; any other file is read whole."""
    result = read_with(os.path.basename(path), (lambda: _summary_bytes(path)) if summary else (lambda: _file_bytes(path)), lazy)
    if isinstance(result, SideFile) and result.kind == gil_stacks.KIND:
        try:
            result.written_ns = os.stat(path).st_mtime_ns  # faulthandler's last write: the file says no time
        except OSError:
            pass
    return result


def read_with(name: str, fetch: Callable[[], bytes], lazy: bool = False) -> RankDump | FileProblem | SideFile:
    """Normalise the bytes `fetch` returns (a local file, an fsspec object); problems become FileProblem.
    torch_npu's `_py_traceback` text files come back as a SideFile for the loader to pair with their rank."""
    hint = rank_from_name(name)
    if name.endswith(torch_fr_meta.PY_TRACEBACK_SUFFIX):
        return _side_file(name, fetch, hint)
    paused = gc.isenabled()
    if paused:  # decoding makes ~10^5 containers per dump: the cyclic GC would rescan them all, twice as slow
        gc.disable()
    try:
        return _read(fetch, name, hint, lazy)
    except DumpError as exc:
        return FileProblem(file=name, reason=str(exc), rank=hint)
    except MemoryError:
        return FileProblem(file=name, reason="file too large to load", rank=hint)
    except Exception as exc:  # noqa: BLE001 - a malformed dump must never stop the other ranks
        if testing.strict_readers():
            raise  # the test suite: a reader's own bug must fail the test, not read as a bad file
        return FileProblem(file=name, reason=f"unreadable (reader error {type(exc).__name__}: {_short(exc)})", rank=hint)
    finally:
        if paused:
            gc.enable()


def _side_file(name: str, fetch: Callable[[], bytes], hint: int | None) -> SideFile | FileProblem:
    """A torch_npu Python-stack file: plain text, read as such (never decoded as a dump)."""
    try:
        text = fetch().decode("utf-8", errors="replace")
    except OSError as exc:
        return FileProblem(file=name, reason=f"cannot read file ({exc.strerror or exc})", rank=hint)
    except DumpError as exc:
        return FileProblem(file=name, reason=str(exc), rank=hint)
    threads = torch_fr_meta.parse_py_traceback(text)
    if not threads:
        return FileProblem(file=name, reason="torch_npu Python-stack file with no thread stacks in it", rank=hint)
    return SideFile(file=name, rank=hint, threads=threads)


def _check_regular(path: str) -> None:
    mode = os.stat(path).st_mode  # follows links; a FIFO would block and /dev/zero never ends: never opened
    if not stat.S_ISREG(mode):
        kind = "named pipe" if stat.S_ISFIFO(mode) else "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "special file"
        raise DumpError(f"not a regular file ({kind}); not read")


def _file_bytes(path: str) -> bytes:
    _check_regular(path)
    with open(path, "rb") as fh:
        return fh.read()


def _summary_bytes(path: str) -> bytes:
    _check_regular(path)
    with open(path, "rb") as fh:
        return summary_of(fh)


def summary_of(fh: BinaryIO) -> bytes:
    """A dump's summary as one JSON object: its first gzip member inflated, the object closed. A file of
    one member (a dump written whole, another format) or one that is not gzip comes back whole."""
    magic = fh.read(2)
    if magic != b"\x1f\x8b":
        return magic + fh.read()
    inflate = zlib.decompressobj(31)  # stops at the end of the first member
    parts = [inflate.decompress(magic)]
    while not inflate.eof:
        chunk = fh.read(SUMMARY_CHUNK)
        if not chunk:
            break
        parts.append(inflate.decompress(chunk))
    head = b"".join(parts).rstrip()
    if inflate.eof and head.endswith(b","):
        return head[:-1] + b"}"
    fh.seek(0)
    return fh.read()


def _read(fetch: Callable[[], bytes], name: str, hint: int | None, lazy: bool) -> RankDump | SideFile:
    try:
        data = fetch()
    except OSError as exc:
        raise DumpError(f"cannot read file ({exc.strerror or exc})") from None
    if not data:
        raise DumpError("empty file")
    if gil_stacks.is_stacks(data):
        return gil_stacks.parse(data, name, hint)
    obj, how = _decode(data)
    if read_flightrec.is_flightrec(obj):
        return read_flightrec.parse(obj, name, hint, lazy)
    if read_torch_fr.is_torch_fr(obj):
        return read_torch_fr.parse(obj, name, hint, FMT_TORCH_PICKLE if how == "pickle" else FMT_TORCH_JSON, lazy)
    if isinstance(obj, dict) and "format" in obj:
        raise DumpError(f"foreign {how} file (format {str(obj['format'])[:40]!r}, expected 'flightrec-dump')")
    raise DumpError(f"foreign {how} file: neither a flightrec dump nor a PyTorch flight-recorder dump")


def _decode(data: bytes) -> tuple[Any, str]:
    how = "JSON"
    if data[:2] == b"\x1f\x8b":
        how = "gzip JSON"
        try:
            data = gzip.decompress(data)
        except EOFError:
            raise DumpError("truncated gzip stream (file cut short)") from None
        except (OSError, zlib.error) as exc:
            raise DumpError(f"corrupt gzip data ({_short(exc)})") from None
        if not data.strip():
            raise DumpError("empty after gunzip")
    if data[:1] == b"\x80":
        fast = pickle_columns.decode(data, read_torch_fr.TEMPLATE_FIELDS)
        if fast is not None and read_torch_fr.is_torch_fr(fast):
            return fast, "pickle"
        try:
            return safe_pickle.loads(data), "pickle"
        except safe_pickle.UnsafePickleError as exc:
            raise DumpError(f"refused pickle: {exc}") from None
        except (pickle.UnpicklingError, EOFError, ValueError, IndexError, KeyError, TypeError) as exc:
            raise DumpError(f"truncated or corrupt pickle ({type(exc).__name__}: {_short(exc)})") from None
    head = data.lstrip()[:1]
    if head not in (b"{", b"["):
        raise DumpError("not a dump: neither gzip, pickle nor JSON")
    if _orjson is not None:
        try:
            return _orjson.loads(data), how
        except (ValueError, TypeError, RecursionError):
            pass  # NaN, huge ints, odd encodings: let the standard library decide and explain
    try:
        return json.loads(data), how
    except UnicodeDecodeError:
        raise DumpError(f"{how} is not UTF-8") from None
    except json.JSONDecodeError as exc:
        cut = exc.pos >= len(data.rstrip()) - 1
        reason = "truncated" if cut else "invalid"
        raise DumpError(f"{reason} {how} ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise DumpError(f"{how} nested too deeply") from None


def _short(exc: BaseException, limit: int = 120) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
