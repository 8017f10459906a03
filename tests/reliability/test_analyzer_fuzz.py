"""Fuzzing the analyzer with mutated real dumps: it reports or rejects every file, never crashes or hangs.

Seeds are the golden folders (real recorder runs, flightrec and PyTorch-recorder formats). Each
example mutates one to three files (cut bytes, wrong types, missing keys, huge numbers, unicode,
duplicate ranks, two dumps claiming one rank, a pickle that would run code) and runs the whole
`flightrec analyze` command on the folder: exit 0 with a report, or exit 2 with a one-line reason.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import pickle
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from analyzers.cli import analyze_command
from analyzers.reading import safe_pickle

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden"
EXAMPLES = int(os.environ.get("FLIGHTREC_FUZZ_EXAMPLES", "250"))
HANG_S = 10
MARKER = Path(tempfile.gettempdir()) / f"flightrec-fuzz-pwned-{os.getpid()}"  # created only if a pickle ran code


class Hang(Exception):
    pass


class Evil:
    """Unpickled with pickle.load, this would create the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))

    def __deepcopy__(self, memo: dict[int, Any]) -> Evil:
        return self  # copy.deepcopy would otherwise call __reduce__'s os.system


def _decode(path: Path) -> tuple[Any, str]:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        return json.loads(gzip.decompress(data)), "gzip"
    if data[:1] == b"\x80":
        return safe_pickle.loads(data), "pickle"
    return json.loads(data), "json"


def _encode(obj: Any, how: str) -> bytes:
    if how == "pickle":
        return pickle.dumps(obj, protocol=2)
    text = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return gzip.compress(text) if how == "gzip" else text


SEEDS = {
    folder.name: {p.name: _decode(p) for p in sorted(folder.iterdir()) if p.is_file()}
    for folder in sorted(GOLDEN.iterdir()) if folder.is_dir()
}

ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.sampled_from([0, -1, 2**31, 2**63, -(2**63) - 1, 10**30, 10**400 // 10**370]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.sampled_from(["\u202e\u0000rank", "🏖️" * 50, "x" * 10_000, "[[1,2],[3]]", "float32,bfloat16"]),
    st.lists(st.integers(-5, 10**12), max_size=4), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)

# what a rank number or a size can be in a broken or hostile file: ranges over these must not run
BIG = st.sampled_from([2**31, 2**40, 10**12, 2**63, -(2**63), 2**64 + 1])


def _containers(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths to every dict and list inside `obj` (depth-limited: dumps are shallow)."""
    yield path
    if len(path) > 6:
        return
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in list(items)[:40]:
        if isinstance(value, (dict, list)):
            yield from _containers(value, (*path, key))


def _at(obj: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        obj = obj[key]
    return obj


@st.composite
def mutated_folder(draw: st.DrawFn) -> tuple[str, dict[str, bytes], list[str]]:
    """A golden folder with 1-3 mutations applied; returns (seed name, files, what was done)."""
    seed = draw(st.sampled_from(sorted(SEEDS)))
    objs = {name: (copy.deepcopy(obj), how) for name, (obj, how) in SEEDS[seed].items()}
    raw: dict[str, bytes] = {}
    done: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(objs)))
        obj, how = objs[name]
        kind = draw(st.sampled_from(["set", "set", "key", "key", "huge", "delete", "truncate", "flip", "duplicate",
                                     "claim", "evil"]))
        done.append(f"{kind} {name}")
        if kind in ("set", "delete"):
            paths = list(_containers(obj))
            target = _at(obj, draw(st.sampled_from(paths)))
            if not target:
                continue
            key = draw(st.sampled_from(sorted(target, key=str) if isinstance(target, dict) else range(len(target))))
            if kind == "delete":
                del target[key]
            else:
                target[key] = draw(ODD_VALUES)
        elif kind == "key" and isinstance(obj, dict):  # the fields the analyzer leans on
            target = obj
            if draw(st.booleans()) and isinstance(obj.get("groups"), list) and obj["groups"]:
                target = draw(st.sampled_from(obj["groups"]))
            elif draw(st.booleans()) and isinstance(obj.get("entries"), dict) and obj["entries"]:
                target = obj["entries"]
                column = draw(st.sampled_from(sorted(target)))
                if isinstance(target[column], list) and target[column]:
                    target = target[column]
                    target[draw(st.integers(0, len(target) - 1))] = draw(st.one_of(BIG, ODD_VALUES))
                    continue
            if isinstance(target, dict) and target:
                key = draw(st.sampled_from(sorted(target) + ["rank", "world_size", "ranks", "size"]))
                value = draw(st.one_of(BIG, ODD_VALUES))
                target[key] = [0, value] if key == "ranks" and draw(st.booleans()) else value
        elif kind == "huge" and isinstance(obj, dict):  # huge numbers where the analyzer counts ranks
            where = draw(st.sampled_from(["rank", "world_size", "capacity", "dropped", "recorded", "group"]))
            if where == "group" and isinstance(obj.get("groups"), list) and obj["groups"]:
                draw(st.sampled_from(obj["groups"]))["ranks"] = [0, draw(BIG)]
            else:
                obj[where] = draw(BIG)
        elif kind == "claim" and isinstance(obj, dict):  # two dumps claim one rank
            other = draw(st.sampled_from(sorted(objs)))
            if isinstance(objs[other][0], dict) and "rank" in objs[other][0]:
                obj["rank"] = objs[other][0]["rank"]
        elif kind == "duplicate":
            objs[draw(st.sampled_from(["copy-of-" + name, "rank-00009.json.gz", "nccl_trace_rank_1"]))] = (
                copy.deepcopy(obj), how)
        elif kind == "evil" and isinstance(obj, dict):
            obj[draw(st.sampled_from(["entries", "pg_status", "hook"]))] = Evil(str(MARKER))
            objs[name] = (obj, "pickle")
        elif kind in ("truncate", "flip"):
            data = raw.get(name) or _encode(obj, how)
            cut = draw(st.integers(0, max(0, len(data) - 1)))
            data = data[:cut] if kind == "truncate" else data[:cut] + bytes([draw(st.integers(0, 255))]) + data[cut + 1:]
            raw[name] = data
            continue
        raw.pop(name, None)
    files = {name: raw.get(name) or b"" for name in objs}
    for name, (obj, how) in objs.items():
        if name not in raw:
            files[name] = _encode(obj, how)
    return seed, files, done


@contextmanager
def _time_bound(seconds: float) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        raise Hang(f"no answer within {seconds}s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# derandomized (the same examples on every CI run) and without shrinking: a hang found would
# otherwise be re-run, HANG_S at a time, for as long as shrinking takes
@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(case=mutated_folder(), fmt=st.sampled_from(["text", "json"]))
def test_mutated_dumps_are_reported_or_rejected_never_a_crash(case: tuple[str, dict[str, bytes], list[str]],
                                                             fmt: str) -> None:
    seed, files, done = case
    with tempfile.TemporaryDirectory() as tmp:
        folder, marker = Path(tmp) / "dumps", MARKER
        marker.unlink(missing_ok=True)
        folder.mkdir()
        for name, data in files.items():
            (folder / name).write_bytes(data)
        with _time_bound(HANG_S):
            result = CliRunner().invoke(analyze_command, [str(folder), "--format", fmt, "--workers", "1"])
        context = f"seed {seed}, mutations {done}"
        assert not marker.exists(), f"a pickle ran code: {context}"
        assert result.exit_code in (0, 2), f"{context}: exit {result.exit_code}\n{result.output[-2000:]}"
        if isinstance(result.exception, SystemExit) or result.exception is None:
            pass
        else:
            raise AssertionError(f"{context}: {result.exception!r}") from result.exception
        assert "Traceback" not in result.output, context
        if result.exit_code == 2:  # rejected: one line that says why
            assert result.stderr.startswith("flightrec: ") and result.stderr.count("\n") == 1, result.stderr
        elif fmt == "json":
            report = json.loads(result.stdout)
            assert report["verdict"] and isinstance(report["unreadable_files"], list)
