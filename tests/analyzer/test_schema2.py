"""Schemas 2 (dictionary-encoded columns), 3 (distinct ops once in `templates`) and 4 (the recorder's:
integer columns packed) read exactly as schema 1."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

import analyzers
from fixtures import builders
from fixtures.builders import Job


def _load(folder: Path) -> analyzers.Analysis:
    return analyzers.load(folder, workers=1)


def _report(a: analyzers.Analysis) -> dict:
    report = a.report()
    report.pop("folder", None)
    report.pop("folders", None)
    return report


@pytest.mark.parametrize("schema", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("name", sorted(builders.SCENARIOS))
def test_every_scenario_reads_the_same_in_every_schema(name: str, schema: int, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    one = _load(builders.SCENARIOS[name](tmp_path / "v1"))
    monkeypatch.setattr(builders, "DEFAULT_SCHEMA", schema)
    folder = builders.SCENARIOS[name](tmp_path / f"v{schema}")
    some = json.loads(gzip.decompress(next(folder.glob("rank-*.json.gz")).read_bytes()))
    assert some["schema_version"] == schema and ("templates" in some) == (schema >= 3)
    assert (some["entries"]["id"].get("encoding") == "delta") if schema >= 4 else isinstance(some["entries"]["id"], list)
    if schema >= 4:  # ids step by 1: schemas 5 and 6 pack them in one byte each, schema 4 in four
        assert some["entries"]["id"]["dtype"] == ("<i1" if schema >= 5 else "<i4")
        assert ("start" in some["entries"]["id"]) == (schema >= 6)
    other = _load(folder)
    pd.testing.assert_frame_equal(one.entries, other.entries)
    assert _report(one) == _report(other)


def _v2_job(tmp_path: Path) -> tuple[Job, Path]:
    job = Job(2, schema=2)
    for _ in range(3):
        job.collective("0", "all_reduce")
    return job, job.write(tmp_path / "d")


def _reason(folder: Path) -> str:
    report = _load(folder).report()
    return {u["file"]: u["reason"] for u in report["unreadable_files"]}["rank-00001.json.gz"]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda cols: cols["op"]["codes"].__setitem__(0, 7), "bad entries: column 'op' has codes outside its 1 values"),
        (lambda cols: cols["op"]["codes"].append(0), "bad entries: column 'op' has 4 codes for 3 entries"),
        (lambda cols: cols["state"].pop("codes"), "entries column(s) state are not arrays or {values, codes} objects"),
        (lambda cols: cols["group"]["codes"].__setitem__(1, "x"), "bad entries:"),
    ],
)
def test_damaged_coded_columns_are_named(tmp_path: Path, damage, expected: str) -> None:  # noqa: ANN001
    job, folder = _v2_job(tmp_path)
    dump = job.dump(1)
    damage(dump["entries"])
    (folder / "rank-00001.json.gz").write_bytes(gzip.compress(json.dumps(dump).encode()))
    assert _reason(folder).startswith(expected)


def test_null_in_values_and_left_out_columns(tmp_path: Path) -> None:
    job, folder = _v2_job(tmp_path)
    dump = job.dump(1)
    cols = dump["entries"]
    assert "error" not in cols and "stack" not in cols  # all null: left out, as the recorder does
    cols["reduce_op"] = {"values": [None, "SUM"], "codes": [0, 1, -1]}
    (folder / "rank-00001.json.gz").write_bytes(gzip.compress(json.dumps(dump).encode()))
    entries = _load(folder).entries
    reduce_ops = entries.loc[entries["rank"] == 1, "reduce_op"]
    assert reduce_ops.isna().tolist() == [True, False, True] and reduce_ops.iloc[1] == "SUM"
    assert entries["error"].isna().all() and entries["t_dev_start_ns"].isna().all()


def test_columns_left_out_at_their_default_read_as_the_default(tmp_path: Path) -> None:
    job, folder = _v2_job(tmp_path)
    cols = job.dump(1)["entries"]
    assert not {"peer", "root", "unit", "is_async"} & set(cols)  # collectives only: all at the default
    entries = _load(folder).entries
    assert (entries["peer"] == -1).all() and (entries["root"] == -1).all() and (entries["unit"] == -1).all()
    assert not entries["is_async"].any() and len(entries) == 6


def _v3_job(tmp_path: Path) -> tuple[Job, Path]:
    job = Job(2, schema=3)
    for _ in range(3):
        job.collective("0", "all_reduce", site="train.py:7 in step")
    job.collective("0", "broadcast", root=1, site="train.py:9 in step")
    return job, job.write(tmp_path / "d")


def test_templates_hold_each_distinct_op_once(tmp_path: Path) -> None:
    job, folder = _v3_job(tmp_path)
    dump = job.dump(1)
    assert dump["entries"]["template"] == [0, 0, 0, 1] and dump["templates"]["op"]["values"] == ["all_reduce", "broadcast"]
    assert "op" not in dump["entries"] and "seq" not in dump["templates"]
    entries = _load(folder).entries
    assert entries.loc[entries["rank"] == 1, "op"].tolist() == ["all_reduce"] * 3 + ["broadcast"]
    assert entries.loc[entries["rank"] == 1, "root"].tolist() == [-1, -1, -1, 1]


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda d: d["entries"]["template"].__setitem__(0, 7), "bad entries: column 'template' has codes outside its 2 templates"),
        (lambda d: d["entries"].pop("template"), "bad entries: entries have no `template` column"),
        (lambda d: d["entries"].__setitem__("op", d["templates"]["op"]), "bad entries: column(s) op both in entries and in templates"),
        (lambda d: d["templates"]["op"]["codes"].append(0), "bad entries: template columns have different lengths"),
        (lambda d: d.pop("templates"), "`templates` is not an object of columns"),
        (lambda d: d["templates"].__setitem__("op", 3), "templates column(s) op are not arrays or {values, codes} objects"),
    ],
)
def test_damaged_templates_are_named(tmp_path: Path, damage, expected: str) -> None:  # noqa: ANN001
    job, folder = _v3_job(tmp_path)
    dump = job.dump(1)
    damage(dump)
    (folder / "rank-00001.json.gz").write_bytes(gzip.compress(json.dumps(dump).encode()))
    assert _reason(folder).startswith(expected)


def test_evenly_spaced_members_are_written_as_a_range_and_read_back(tmp_path: Path) -> None:
    from flightrec.members import compact_ranks

    assert compact_ranks(range(0, 16384)) == {"start": 0, "stop": 16384, "step": 1}
    assert compact_ranks(range(3, 3 + 32 * 20, 32)) == {"start": 3, "stop": 643, "step": 32}
    assert compact_ranks([0, 1, 2, 3]) == [0, 1, 2, 3]  # short lists stay lists
    uneven = [*range(20), 25]
    assert compact_ranks(uneven) == uneven
    job = Job(20, schema=3)
    job.group("1", list(range(0, 20, 2)), "dp")
    job.group("2", list(range(1, 20, 2)) + [0], "odd")
    job.collective("0", "all_reduce")
    folder = job.write(tmp_path / "d")
    dump = job.dump(4)
    assert {g["name"]: g["ranks"] for g in dump["groups"]}["0"] == {"start": 0, "stop": 20, "step": 1}
    members = _load(folder).groups.set_index("group")["ranks"]
    assert members["0"] == tuple(range(20)) and members["1"] == tuple(range(0, 20, 2))
    assert members["2"] == (*range(1, 20, 2), 0)


@pytest.mark.parametrize("ranks", [{"start": 0, "stop": 4, "step": 0}, {"start": -3, "stop": 4, "step": 1},
                                   {"start": 0, "stop": "4"}, {"start": 5, "stop": 5, "step": 1}])
def test_bad_member_ranges_are_named(tmp_path: Path, ranks: dict) -> None:
    job, folder = _v3_job(tmp_path)
    dump = job.dump(1)
    dump["groups"][0]["ranks"] = ranks
    (folder / "rank-00001.json.gz").write_bytes(gzip.compress(json.dumps(dump).encode()))
    assert "member" in _reason(folder)


def _v4_folder(tmp_path: Path, damage) -> Path:  # noqa: ANN001
    job = Job(2, schema=4)
    for _ in range(3):
        job.collective("0", "all_reduce")
    folder = job.write(tmp_path / "d")
    path = folder / "rank-00001.json.gz"
    dump = json.loads(gzip.decompress(path.read_bytes()))
    damage(dump["entries"])
    path.write_bytes(gzip.compress(json.dumps(dump).encode()))
    return folder


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda cols: cols["seq"].__setitem__("dtype", "<f8"),
         "bad entries: column 'seq' is packed with dtype '<f8' (expected one of <i1, <i2, <i4, <i8) or without hex data"),
        (lambda cols: cols["seq"].__setitem__("data", "not hex!"), "bad entries: column 'seq' has packed data that is not hex"),
        (lambda cols: cols["seq"].__setitem__("data", "010000"), "bad entries: column 'seq' has 3 packed bytes, not a whole number of 4-byte values"),
        (lambda cols: cols["seq"].__setitem__("nulls", [99]), "bad entries: column 'seq' lists nulls that are not positions among its 3 values"),
        (lambda cols: cols["seq"].__setitem__("data", "0100000001000000"), "bad entries: entry columns have different lengths [2, 3]"),
        (lambda cols: cols["state"]["codes"].__setitem__("data", "070000000000000000000000"), "bad entries: column 'state' has codes outside its 1 values"),
        (lambda cols: cols["seq"].__setitem__("start", "7"), "bad entries: column 'seq' has a packed start '7' that is not a 64-bit integer"),
        (lambda cols: cols["seq"].__setitem__("start", 2**63), "bad entries: column 'seq' has a packed start '9223372036854775808' that is not"),
        (lambda cols: cols.__setitem__("seq", {"encoding": "zstd", "data": ""}),
         "entries column(s) seq are not arrays, packed arrays or {values, codes} objects"),
    ],
)
def test_damaged_packed_columns_name_the_column(tmp_path: Path, damage, expected: str) -> None:  # noqa: ANN001
    assert _reason(_v4_folder(tmp_path, damage)).startswith(expected), _reason(_v4_folder(tmp_path / "again", damage))


def test_packed_columns_round_trip_nulls_and_64_bit_values() -> None:
    from analyzers.columns import unpack
    from flightrec.packed import pack, plain

    for values in ([], [7], [None, 5, None, 2**40, -3, None], [1_700_000_000_000_000_000, None, 1_700_000_000_000_000_001]):
        packed = pack(values)
        assert plain(packed) == values
        decoded = unpack(packed, "x") if values else []
        assert [None if pd.isna(v) else int(v) for v in decoded] == values
    assert pack([2**63 - 1, -(2**63)]) == [2**63 - 1, -(2**63)]  # a difference past 64 bits: left plain
    assert pack([2**63 + 5, 2**63 + 6]) == [2**63 + 5, 2**63 + 6]  # a start past 64 bits: left plain too


@pytest.mark.parametrize(("step", "dtype"), [(1, "<i1"), (-128, "<i1"), (127, "<i1"), (128, "<i2"), (-129, "<i2"),
                                             (32767, "<i2"), (40_000, "<i4"), (-(2**31), "<i4"), (2**31, "<i8")])
def test_schema5_packs_each_column_in_its_narrowest_type(step: int, dtype: str) -> None:
    from analyzers.columns import unpack
    from flightrec.packed import pack, plain

    values = [5, 5 + step, 5 + 2 * step, None, 5 + 3 * step]  # differences: 5 (the first), then `step`
    packed = pack(values)
    assert packed["dtype"] == dtype and len(packed["data"]) == 2 * 5 * int(dtype[-1])
    assert plain(packed) == values
    assert [None if pd.isna(v) else int(v) for v in unpack(packed, "x")] == values
    assert pack(values, narrow=False)["dtype"] == ("<i8" if dtype == "<i8" else "<i4")  # schema 4's widths


@pytest.mark.parametrize("first", [0, 10**6, 89_860_805_673, -(2**40)])
def test_schema6_counts_differences_from_the_first_value(first: int) -> None:
    """A large first value (a timestamp, an id in the millions) no longer widens its column: schema 5
    counted the first difference from 0."""
    from analyzers.columns import unpack
    from flightrec.packed import pack, plain

    values = [None, first, first + 3, None, first + 40_000, first - 2]
    packed = pack(values)
    assert packed["start"] == first and packed["dtype"] == "<i4" and packed["data"][:8] == "00000000"
    assert plain(packed) == values
    assert [None if pd.isna(v) else int(v) for v in unpack(packed, "x")] == values
    old = pack(values, start=False)  # schema 5: no start, the first difference is the first value
    assert "start" not in old and old["dtype"] == ("<i4" if abs(first) < 2**31 - 40_000 else "<i8")
    assert [None if pd.isna(v) else int(v) for v in unpack(old, "x")] == values


@pytest.mark.parametrize("schema", [5, 6])
def test_the_documented_plain_reader_reads_what_the_recorder_writes(tmp_path: Path, schema: int) -> None:
    """docs/dump-format.md's standard-library snippet, run as written on a schema 6 dump (and a 5)."""
    import re

    from tests.helpers import columns

    text = (Path(__file__).parents[2] / "docs" / "dump-format.md").read_text()
    snippet = re.search(r"```python\n(import itertools.*?)```", text, re.S)
    assert snippet, "the plain-reader snippet is gone from docs/dump-format.md"
    job = Job(3, schema=schema)
    for _ in range(4):
        job.collective("0", "all_reduce")
    job.send("0", 0, 1)
    folder = job.write(tmp_path / "d")
    dump = json.loads(gzip.decompress((folder / "rank-00001.json.gz").read_bytes()))
    namespace = {"dump": dump, "pandas": pd}
    exec(snippet.group(1), namespace)  # noqa: S102 - our own documentation
    expected = columns(dump)
    assert {k: v for k, v in namespace["cols"].items() if k != "template"} == {k: expected[k] for k in namespace["cols"] if k != "template"}
