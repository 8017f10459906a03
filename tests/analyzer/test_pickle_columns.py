"""The C pickle reader (analyzers/_pickle_columns.c) gives what the restricted Python unpickler gives.

Every file it takes must decode to the same values, and every verdict must be the same with and without
it; everything it does not take (code-running opcodes, corrupt or odd streams) must come back as None so
that the Python unpickler decides and explains. Real PyTorch dumps (fixtures/golden/torch_fr_gloo, written
by PyTorch's C++ pickler) and the foreign-format folders are among the inputs.
"""

from __future__ import annotations

import json
import os
import pickle
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import analyzers
from analyzers import testing
from analyzers.reading import pickle_columns, read_torch_fr, safe_pickle
from analyzers.reading.read import read_path
from fixtures import sim

from .conftest import ROOT

pytestmark = pytest.mark.skipif(pickle_columns._c is None, reason="the C reader is not built here")

OPS = read_torch_fr.TEMPLATE_FIELDS


def pickles() -> list[Path]:
    roots = [ROOT / "fixtures" / "foreign", ROOT / "fixtures" / "golden"]
    return sorted(p for r in roots for p in r.rglob("*") if p.is_file() and p.read_bytes()[:1] == b"\x80")


def rebuilt(top: dict[str, Any]) -> dict[str, Any]:
    """The decoded dict with its columnar entries turned back into records."""
    entries = top.get("entries")
    if isinstance(entries, pickle_columns.ColumnarEntries):
        cols = {n: entries.column(n).tolist() for n in entries.names}
        top = {**top, "entries": [{n: cols[n][i] for n in entries.names} for i in range(entries.n)]}
    return top


def as_columns(top: Any) -> Any:
    """The Python unpickler's result as the columns see it: a field absent from a record reads as None."""
    entries = top.get("entries") if isinstance(top, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return top
    names = list(dict.fromkeys(k for e in entries for k in e))
    return {**top, "entries": [{n: e.get(n) for n in names} for e in entries]}


def same_as_python(data: bytes) -> bool:
    """True when the C reader took `data` (and then its values must equal the Python unpickler's)."""
    got = pickle_columns.decode(data, OPS)
    if got is None:
        return False
    assert rebuilt(got) == as_columns(safe_pickle.loads(data))
    return True


def test_real_and_foreign_pickles_decode_to_the_same_values() -> None:
    files = pickles()
    assert len(files) >= 10
    taken = [f for f in files if same_as_python(f.read_bytes())]
    assert taken == files  # every pickle a recorder writes is taken, none left to the slow path


def record(i: int, **extra: Any) -> dict[str, Any]:
    return {"record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": i + 1,
            "profiling_name": "nccl:all_reduce", "state": "completed", "input_sizes": [[4]], "retired": True,
            "time_created_ns": 10**18 + i, "frames": [{"name": "f", "filename": "t.py", "line": 3}], **extra}


def dump(entries: list[Any]) -> dict[str, Any]:
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {}, "entries": entries}


ODD = [
    dump([record(0), record(1, state="scheduled", time_discovered_completed_ns=None), record(2, retired=False)]),
    dump([record(i, collective_seq_id=str(i)) for i in range(3)]),  # seq ids as strings (PyTorch's tests)
    dump([record(2), record(0), record(1)]),  # record ids out of order
    dump([record(0), {"record_id": 1, "state": "started"}, record(2, extra_field=1.5)]),  # uneven records
    dump([record(0, duration_ms=1.5), record(1, duration_ms=None), record(2, duration_ms=3)]),
    dump([record(0, retired=1), record(1, retired=True)]),  # ints and bools in one field
    dump([record(0, profiling_name=""), record(1, profiling_name="nccl:send 0->1", is_p2p=True)]),
    dump([record(0, time_created_ns=-(2**63)), record(1, time_created_ns=2**63 - 1)]),
    dump([]),
    {"version": "2.13", "pg_config": {}, "pg_status": {}},  # an empty ring without `entries`
    dump([record(0, frames=[{"name": "\udcff", "filename": "x", "line": 1.0}])]),
]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("case", range(len(ODD)))
def test_odd_but_plain_pickles_decode_to_the_same_values(case: int, protocol: int) -> None:
    assert same_as_python(pickle.dumps(ODD[case], protocol=protocol))


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_bytes_decode_to_the_same_values(protocol: int) -> None:
    assert same_as_python(pickle.dumps(dump([record(0, frames=b"\x00raw")]), protocol=protocol))


class Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.getpid, ())


def cyclic() -> dict[str, Any]:
    loop: list[Any] = []
    loop.append(loop)
    return dump([record(0, frames=loop)])


def deep() -> dict[str, Any]:
    nested: Any = 0
    for _ in range(100):
        nested = [nested]
    return dump([record(0, input_sizes=nested)])


DECLINED = {
    "a global": pickle.dumps(dump([record(0, frames=Evil())]), protocol=2),
    "protocol 0 text opcodes": pickle.dumps(dump([record(0)]), protocol=0),
    "an int past 64 bits": pickle.dumps(dump([record(0, time_created_ns=2**64)]), protocol=2),
    "bytes in protocol 2 (a codecs global)": pickle.dumps(dump([record(0, frames=b"x")]), protocol=2),
    "a set": pickle.dumps(dump([record(0, frames={1, 2})]), protocol=4),
    "a cycle": pickle.dumps(cyclic(), protocol=2),
    "nesting deeper than the limit": pickle.dumps(deep(), protocol=2),
    "a truncated stream": pickle.dumps(dump([record(0)]), protocol=2)[:-40],
    "no STOP": pickle.dumps(dump([record(0)]), protocol=2)[:-1],
    "a list as a dict key": b"\x80\x02}(]N" + b"u.",
    "entries that are not records": pickle.dumps(dump([1, 2]), protocol=2),
    "a memo slot past the file's length": b"\x80\x02Nr\x00\x00\x00\x10.",
    "a frame longer than the file": b"\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00N.",
}


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_declines_what_it_does_not_take(name: str) -> None:
    assert pickle_columns.decode(DECLINED[name], OPS) is None


@pytest.mark.parametrize("name", ["a global", "a truncated stream", "a cycle", "entries that are not records"])
def test_declined_files_are_explained_as_before(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(DECLINED[name])
    with_c = read_path(str(path))
    monkeypatch.setattr(testing, "PYTHON_UNPICKLER_ONLY", True)
    assert repr(with_c) == repr(read_path(str(path)))


def mutations(data: bytes, count: int, seed: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    for _ in range(count):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            if rng.random() < 0.7:
                b[i] = rng.randrange(256)
            else:
                del b[i : i + rng.randint(1, 8)]
        yield bytes(b)


def test_corrupted_pickles_are_declined_or_read_exactly() -> None:
    """Random byte flips and cuts of a real PyTorch dump: the C reader never raises or crashes, and
    whatever it takes the Python unpickler reads to the same values (never more lenient)."""
    seed = (ROOT / "fixtures" / "golden" / "torch_fr_gloo").glob("comm_lib_trace_rank_*")
    data = min(seed).read_bytes()
    taken = declined = 0
    for variant in mutations(data, 600, seed=20):
        got = pickle_columns.decode(variant, OPS)
        try:
            expected = safe_pickle.loads(variant)
        except Exception:  # noqa: BLE001 - whatever the unpickler refuses, the C reader must refuse
            assert got is None
            declined += 1
            continue
        if got is not None:
            assert rebuilt(got) == as_columns(expected)
            taken += 1
    assert taken > 20 and declined > 20  # the corruptions exercised both sides


REPORT_CLOCK = ("analysis_s", "generated_at", "analyzer_version")


def report(folder: Path) -> str:
    out = analyzers.load(folder).report()
    for key in REPORT_CLOCK:
        out.pop(key, None)
    return json.dumps(out, sort_keys=True, default=str)


@pytest.mark.parametrize("seed", range(1, len(sim.FAULT_KINDS)))  # every fault kind (seed 0 is healthy: no dumps)
def test_same_report_with_and_without_the_c_reader(tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = sim.write(sim.scenario(seed), tmp_path / "job", fmt="torch")
    with_c = report(folder)
    monkeypatch.setattr(testing, "PYTHON_UNPICKLER_ONLY", True)
    assert with_c == report(folder)


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "fixtures" / "foreign").iterdir() if p.is_dir()))
def test_same_foreign_verdicts_with_and_without_the_c_reader(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = ROOT / "fixtures" / "foreign" / name
    with_c = report(folder)
    monkeypatch.setattr(testing, "PYTHON_UNPICKLER_ONLY", True)
    assert with_c == report(folder)


def test_ranks_with_equal_ops_share_columns_but_never_unequal_ones(tmp_path: Path) -> None:
    """Two TP groups running the same ops share their sizes/dtypes columns (the same objects, finished
    once per batch); a digest match with other values (forced here) must not hand over the columns."""
    ops = read_torch_fr.TEMPLATE_FIELDS
    a = pickle_columns.decode(pickle.dumps(dump([record(0, process_group=("1", "tp0"))]), protocol=4), ops)
    b = pickle_columns.decode(pickle.dumps(dump([record(0, process_group=("2", "tp1"))]), protocol=4), ops)
    c = pickle_columns.decode(pickle.dumps(dump([record(0, process_group=("3", "tp2"), input_sizes=[[8]])]),
                                           protocol=4), ops)
    assert a is not None and b is not None and c is not None
    read_torch_fr._SHARED.clear()
    ra, rb = (read_torch_fr.parse(d, "x", 0, "pickle", lazy=True).entries.templates for d in (a, b))
    assert ra["in_shapes"] is rb["in_shapes"] and ra["group"] is not rb["group"]
    assert list(rb["group"]) == ["2"]
    c["entries"].op_digests = dict(a["entries"].op_digests)  # a collision of every digest, on purpose
    rc = read_torch_fr.parse(c, "x", 0, "pickle", lazy=True).entries.templates
    assert rc["in_shapes"] is not ra["in_shapes"] and rc["in_shapes"].cats == ["[[8]]"]
