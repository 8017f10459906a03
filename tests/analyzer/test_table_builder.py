"""TableBuilder: the table grown batch by batch must be exactly the one concatenating the batches gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import analyzers
from analyzers.reading.codes import Coded
from analyzers.reading.columns import ENTRY_COLUMNS, AllNull, concat_columns, finish_columns, slim, to_frame
from analyzers.reading.table_builder import TableBuilder
from fixtures import synth


def _batch(rng: np.random.Generator, rank0: int, n: int, cats: list[str], *, null_times: bool, errors: bool) -> dict:
    """One batch as a reader sends it (slim: 32-bit ints, small codes, all-null columns as lengths)."""
    m = n
    cols = finish_columns({"id": np.arange(m, dtype=np.int64) + (1 << 33 if rank0 == 8 else 0),  # one batch needs 64 bits
                           "seq": rng.integers(1, 1000, m), "op": list(rng.choice(cats, m)),
                           "group": [str(g) for g in rng.integers(0, 3, m)],
                           "is_async": rng.random(m) < 0.3,
                           "t_enqueue_ns": None if null_times else [int(x) for x in rng.integers(1, 10**15, m)],
                           "error": [("boom" if i % 7 == 0 else None) for i in range(m)] if errors else None}, 0)
    cols["rank"] = np.repeat(np.arange(rank0, rank0 + 4, dtype=np.int64), n // 4)
    return slim(cols)


def test_batches_built_in_place_equal_the_concatenated_table() -> None:
    rng = np.random.default_rng(7)
    many = [f"op{i}" for i in range(300)]  # past what 8-bit codes hold: the codes widen mid-way
    specs = [(0, 40, ["all_reduce", "send"], True, False),
             (4, 40, ["recv", "all_reduce"], False, True),  # other categories, in another order
             (8, 400, many, False, False),  # ten times the first batch: the columns grow
             (12, 40, ["broadcast"], True, True)]
    batches = [_batch(rng, *spec[:3], null_times=spec[3], errors=spec[4]) for spec in specs]
    expected = to_frame(concat_columns([dict(b) for b in batches]))
    builder = TableBuilder()
    builder.expect(len(batches))
    spans = [builder.append(b) for b in batches]
    assert spans == [(0, 40), (40, 80), (80, 480), (480, 520)]
    built = builder.finish()
    assert isinstance(built["op"], Coded) and built["op"].codes.dtype == np.int16
    assert isinstance(built["state"], Coded) and built["state"].codes.dtype == np.int8
    assert built["id"].dtype == np.int64 and isinstance(built["t_dev_start_ns"], AllNull)  # never a value: no array
    assert isinstance(built["t_enqueue_ns"], pd.arrays.IntegerArray)
    pd.testing.assert_frame_equal(to_frame(built), expected)
    assert list(to_frame(TableBuilder().finish() or finish_columns({}, 0)).columns) == list(ENTRY_COLUMNS)


def test_an_unexpected_piece_turns_its_column_into_pieces() -> None:
    """A column whose batches the builder cannot copy into one array (here flags sent as bools by one
    batch and as integers by another) still ends up as concat_columns makes it."""
    rng = np.random.default_rng(3)
    first = _batch(rng, 0, 8, ["all_reduce"], null_times=False, errors=False)
    second = _batch(rng, 4, 8, ["all_reduce"], null_times=False, errors=False)
    second["is_async"] = second["is_async"].astype(np.int8)  # not bools this time
    expected = to_frame(concat_columns([dict(first), dict(second)]))
    builder = TableBuilder()
    builder.expect(2)
    builder.append(first)
    builder.append(second)
    pd.testing.assert_frame_equal(to_frame(builder.finish()), expected)


@pytest.mark.parametrize("fmt", ["flightrec", "torch"])
def test_pool_loading_with_duplicate_ranks_equals_serial(tmp_path: Path, fmt: str) -> None:
    """Rows of a dump that is not chosen (another dump of the same rank) leave the built table."""
    folder = synth.write_folder(tmp_path / "d", 32, 60, "stall", fmt)
    other = synth.write_folder(tmp_path / "o", 32, 60, "stall", "torch" if fmt == "flightrec" else "flightrec")
    extra = sorted(other.iterdir())[5]
    (folder / extra.name).write_bytes(extra.read_bytes())  # one rank twice, in both formats
    serial = analyzers.load(folder, workers=1)
    parallel = analyzers.load(folder, workers=2)
    # the same rows and values; a dropped dump's categories may stay listed (unused), as before
    pd.testing.assert_frame_equal(_as_values(serial.entries), _as_values(parallel.entries))
    assert serial.report() == parallel.report()
    assert any("several dumps" in n for n in parallel.report()["gaps"])


def _as_values(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.astype({c: object for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)})


def test_all_null_batches_stay_a_length() -> None:
    builder = TableBuilder()
    builder.expect(2)
    a, b = slim(finish_columns({"seq": [1, 2]}, 0)), slim(finish_columns({"seq": [3]}, 1))
    assert isinstance(a["stack"], AllNull)
    builder.append(a)
    builder.append(b)
    built = builder.finish()
    assert isinstance(built["stack"], AllNull) and len(built["stack"]) == 3
    assert built["rank"].tolist() == [0, 0, 1] and built["seq"].tolist() == [1, 2, 3]
