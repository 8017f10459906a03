"""The dump's column layout (docs/dump-format.md): templates, dictionary-encoded and packed columns,
member ranges; what is damaged in each is named; packing round-trips."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import analyzers
from fixtures.builders import Job
from flightrec.format.packed import pack, pack_array, plain


def _load(folder: Path) -> analyzers.Analysis:
    return analyzers.load(folder, workers=1)


def _reason(folder: Path) -> str:
    report = _load(folder).report()
    return {u["file"]: u["reason"] for u in report["unreadable_files"]}["rank-00001.json.gz"]


def _damaged(job: Job, folder: Path, damage: Callable[[dict[str, Any]], Any]) -> Path:
    dump = job.dump(1)
    damage(dump)
    (folder / "rank-00001.json.gz").write_bytes(gzip.compress(json.dumps(dump).encode()))
    return folder


def _repacked(column: dict[str, Any], edit: Callable[[list[Any]], Any]) -> None:
    """Edit a packed column's values (in place) and pack them again."""
    values = plain(column)
    edit(values)
    column.clear()
    column.update(pack(values))


def _job(tmp_path: Path) -> tuple[Job, Path]:
    job = Job(2)
    for _ in range(3):
        job.collective("0", "all_reduce", site="train.py:7 in step")
    job.collective("0", "broadcast", root=1, site="train.py:9 in step")
    return job, job.write(tmp_path / "d")


def test_templates_hold_each_distinct_op_once(tmp_path: Path) -> None:
    job, folder = _job(tmp_path)
    dump = job.dump(1)
    assert plain(dump["entries"]["template"]) == [0, 0, 0, 1]
    assert dump["templates"]["op"]["values"] == ["all_reduce", "broadcast"]
    assert "op" not in dump["entries"] and "seq" not in dump["templates"]
    entries = _load(folder).entries
    assert entries.loc[entries["rank"] == 1, "op"].tolist() == ["all_reduce"] * 3 + ["broadcast"]
    assert entries.loc[entries["rank"] == 1, "root"].tolist() == [-1, -1, -1, 1]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda d: d["templates"]["op"]["codes"].__setitem__(0, 7), "bad entries: column 'op' has codes outside its 2 values"),
        (lambda d: _repacked(d["entries"]["state"]["codes"], lambda v: v.append(0)),
         "bad entries: column 'state' has 5 codes for 4 entries"),
        (lambda d: d["entries"]["state"].pop("codes"),
         "entries column(s) state are not arrays, packed arrays or {values, codes} objects"),
        (lambda d: d["templates"]["group"]["codes"].__setitem__(1, "x"), "bad entries:"),
        (lambda d: _repacked(d["entries"]["template"], lambda v: v.__setitem__(0, 7)),
         "bad entries: column 'template' has codes outside its 2 templates"),
        (lambda d: d["entries"].pop("template"), "bad entries: entries have no `template` column"),
        (lambda d: d["entries"].__setitem__("op", d["templates"]["op"]), "bad entries: column(s) op both in entries and in templates"),
        (lambda d: d["templates"]["op"]["codes"].append(0), "bad entries: template columns have different lengths"),
        (lambda d: d.pop("templates"), "`templates` is not an object of columns"),
        (lambda d: d["templates"].__setitem__("op", 3), "templates column(s) op are not arrays, packed arrays or {values, codes} objects"),
    ],
)
def test_damaged_coded_columns_and_templates_are_named(tmp_path: Path, damage, expected: str) -> None:  # noqa: ANN001
    job, folder = _job(tmp_path)
    assert _reason(_damaged(job, folder, damage)).startswith(expected)


def test_null_in_values_and_left_out_columns(tmp_path: Path) -> None:
    job = Job(2)
    for site in ("a.py:1 in f", "b.py:2 in g", "c.py:3 in h"):  # three templates
        job.collective("0", "all_reduce", site=site)
    folder = job.write(tmp_path / "d")
    dump = job.dump(1)
    assert "error" not in dump["entries"] and "stack" not in dump["entries"]  # all null: left out, as the recorder does
    dump["templates"]["reduce_op"] = {"values": [None, "SUM"], "codes": [0, 1, -1]}
    (folder / "rank-00001.json.gz").write_bytes(gzip.compress(json.dumps(dump).encode()))
    entries = _load(folder).entries
    reduce_ops = entries.loc[entries["rank"] == 1, "reduce_op"]
    assert reduce_ops.isna().tolist() == [True, False, True] and reduce_ops.iloc[1] == "SUM"
    assert entries["error"].isna().all() and entries["t_dev_start_ns"].isna().all()


def test_columns_left_out_at_their_default_read_as_the_default(tmp_path: Path) -> None:
    job = Job(2)
    for _ in range(3):
        job.collective("0", "all_reduce")
    folder = job.write(tmp_path / "d")
    dump = job.dump(1)
    assert not {"peer", "root", "is_async"} & set(dump["templates"]) and "unit" not in dump["entries"]  # all at the default
    entries = _load(folder).entries
    assert (entries["peer"] == -1).all() and (entries["root"] == -1).all() and (entries["unit"] == -1).all()
    assert not entries["is_async"].any() and len(entries) == 6


def test_evenly_spaced_members_are_written_as_a_range_and_read_back(tmp_path: Path) -> None:
    from flightrec.format.members import compact_ranks

    assert compact_ranks(range(0, 16384)) == {"start": 0, "stop": 16384, "step": 1}
    assert compact_ranks(range(3, 3 + 32 * 20, 32)) == {"start": 3, "stop": 643, "step": 32}
    assert compact_ranks([0, 1, 2, 3]) == [0, 1, 2, 3]  # short lists stay lists
    uneven = [*range(20), 25]
    assert compact_ranks(uneven) == uneven
    job = Job(20)
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
    job, folder = _job(tmp_path)
    assert "member" in _reason(_damaged(job, folder, lambda d: d["groups"][0].__setitem__("ranks", ranks)))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda cols: cols["seq"].__setitem__("dtype", "<f8"),
         "bad entries: column 'seq' is packed with dtype '<f8' (expected one of <i1, <i2, <i4, <i8) or without hex data"),
        (lambda cols: cols["seq"].__setitem__("data", "not hex!"), "bad entries: column 'seq' has packed data that is not hex"),
        (lambda cols: cols["seq"].update(dtype="<i4", data="010000"),
         "bad entries: column 'seq' has 3 packed bytes, not a whole number of 4-byte values"),
        (lambda cols: cols["seq"].__setitem__("nulls", [99]), "bad entries: column 'seq' lists nulls that are not positions among its 4 values"),
        (lambda cols: cols["seq"].update(dtype="<i4", data="0100000001000000"), "bad entries: entry columns have different lengths [2, 4]"),
        (lambda cols: cols["state"]["codes"].__setitem__("data", "07000000"), "bad entries: column 'state' has codes outside its 1 values"),
        (lambda cols: cols["seq"].__setitem__("start", "7"), "bad entries: column 'seq' has a packed start '7' that is not a 64-bit integer"),
        (lambda cols: cols["seq"].__setitem__("start", 2**63), "bad entries: column 'seq' has a packed start '9223372036854775808' that is not"),
        (lambda cols: cols.__setitem__("seq", {"encoding": "zstd", "data": ""}),
         "entries column(s) seq are not arrays, packed arrays or {values, codes} objects"),
    ],
)
def test_damaged_packed_columns_name_the_column(tmp_path: Path, damage, expected: str) -> None:  # noqa: ANN001
    job, folder = _job(tmp_path)
    assert _reason(_damaged(job, folder, lambda d: damage(d["entries"]))).startswith(expected)


def test_packed_columns_round_trip_nulls_and_64_bit_values() -> None:
    from analyzers.reading.dump_columns import unpack

    for values in ([], [7], [None, 5, None, 2**40, -3, None], [1_700_000_000_000_000_000, None, 1_700_000_000_000_000_001]):
        packed = pack(values)
        assert plain(packed) == values
        decoded = unpack(packed, "x") if values else []
        assert [None if pd.isna(v) else int(v) for v in decoded] == values
    assert pack([2**63 - 1, -(2**63)]) == [2**63 - 1, -(2**63)]  # a difference past 64 bits: left plain
    assert pack([2**63 + 5, 2**63 + 6]) == [2**63 + 5, 2**63 + 6]  # a start past 64 bits: left plain too


@pytest.mark.parametrize(("step", "dtype"), [(1, "<i1"), (-128, "<i1"), (127, "<i1"), (128, "<i2"), (-129, "<i2"),
                                             (32767, "<i2"), (40_000, "<i4"), (-(2**31), "<i4"), (2**31, "<i8")])
def test_each_column_is_packed_in_its_narrowest_type(step: int, dtype: str) -> None:
    from analyzers.reading.dump_columns import unpack

    values = [5, 5 + step, 5 + 2 * step, None, 5 + 3 * step]  # differences from the first value: 0, then `step`
    packed = pack(values)
    assert packed["dtype"] == dtype and len(packed["data"]) == 2 * 5 * int(dtype[-1])
    assert plain(packed) == values
    assert [None if pd.isna(v) else int(v) for v in unpack(packed, "x")] == values


@pytest.mark.parametrize("first", [0, 10**6, 89_860_805_673, -(2**40)])
def test_differences_are_counted_from_the_first_value(first: int) -> None:
    """A large first value (a timestamp, an id in the millions) does not widen its column."""
    from analyzers.reading.dump_columns import unpack

    values = [None, first, first + 3, None, first + 40_000, first - 2]
    packed = pack(values)
    assert packed["start"] == first and packed["dtype"] == "<i4" and packed["data"][:8] == "00000000"
    assert plain(packed) == values
    assert [None if pd.isna(v) else int(v) for v in unpack(packed, "x")] == values


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-(2**62), 2**62)), max_size=40))
def test_the_numpy_packer_writes_what_the_recorder_writes(values: list[int | None]) -> None:
    """fixtures/synth.py packs its columns with `pack_array`; they must be the recorder's columns."""
    packed = pack(values)
    if not isinstance(packed, dict) or not any(v is not None for v in values):
        return  # left plain (differences past 64 bits), or nothing to pack: the synthetic writer never meets these
    nulls = np.asarray([v is None for v in values], dtype=bool)
    array = np.asarray([0 if v is None else v for v in values], dtype=np.int64)
    assert pack_array(array, nulls if nulls.any() else None) == packed


def test_the_documented_plain_reader_reads_what_the_recorder_writes(tmp_path: Path) -> None:
    """docs/dump-format.md's standard-library snippet, run as written on a dump."""
    import re

    from tests.helpers import columns

    text = (Path(__file__).parents[2] / "docs" / "dump-format.md").read_text()
    snippet = re.search(r"```python\n(import itertools.*?)```", text, re.S)
    assert snippet, "the plain-reader snippet is gone from docs/dump-format.md"
    job = Job(3)
    for _ in range(4):
        job.collective("0", "all_reduce")
    job.send("0", 0, 1)
    folder = job.write(tmp_path / "d")
    dump = json.loads(gzip.decompress((folder / "rank-00001.json.gz").read_bytes()))
    namespace = {"dump": dump, "pandas": pd}
    exec(snippet.group(1), namespace)  # noqa: S102 - our own documentation
    expected = columns(dump)
    assert {k: v for k, v in namespace["cols"].items() if k != "template"} == {k: expected[k] for k in namespace["cols"] if k != "template"}
