"""The reader of torch's C++ objects (`flightrec build-ext`): same values as torch's Python getters,
ignored when stale or switched off, and a build failure that says why."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from flightrec.cli.commands import main
from flightrec.record import cpp_reader
from tests.child import command, env_with_root, facts
from tests.helpers import run_ranks
from tests.recorder import workers


@pytest.fixture
def built() -> object:
    loaded = cpp_reader.load()
    if loaded is None:
        pytest.skip("the torch reader is not built (flightrec build-ext) or switched off")
    return loaded[0]


def test_torch_reader_is_built_where_a_compiler_is() -> None:
    """The README's set-up runs `flightrec build-ext`: a silent miss would cost ~2 µs per collective."""
    if shutil.which(cpp_reader.compiler()[0]) is None:
        pytest.skip("no C++ compiler: torch's getters are used here")
    assert cpp_reader.find() is not None, "no torch reader built for this torch: run `flightrec build-ext`"
    assert cpp_reader.load() is not None


def _tensors() -> list[torch.Tensor]:
    base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    return [
        torch.ones(16), torch.zeros(()), torch.empty(0, 5), base, base.transpose(0, 2), base[:, 1],
        torch.ones(3, requires_grad=True), torch.nn.Parameter(torch.ones(2, 2)), torch.ones(7).expand(3, 7),
        *(torch.zeros(2, 3, dtype=dtype) for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int8,
                                                        torch.uint8, torch.int32, torch.int64, torch.bool,
                                                        torch.complex64)),
    ]


def test_reads_what_torchs_getters_read(built: object) -> None:
    for tensor in _tensors():
        shape, dtype = built.shape_and_dtype(tensor)
        assert type(shape) is torch.Size and shape == tensor.shape and dtype is tensor.dtype, tensor


def test_leaves_subclasses_and_other_devices_to_torch(built: object) -> None:
    class Tagged(torch.Tensor):
        pass

    assert built.shape_and_dtype(torch.ones(3).as_subclass(Tagged)) is None  # may override .shape
    assert built.shape_and_dtype(torch.ones(3, device="meta")) is None  # not on the CPU
    assert built.shape_and_dtype([torch.ones(3)]) is None
    assert built.shape_and_dtype(3) is None


def test_counter_reader_matches_pybind(tmp_path: Path, built: object) -> None:
    run_ranks(workers.seq_readers, 2, str(tmp_path), timeout_s=60)
    for rank in range(2):
        result = json.loads((tmp_path / f"seq-{rank}.json").read_text())
        assert result["types"] == ["SeqReader", "SeqReader"]
        assert len(result["pairs"]) == 3
        for snapshot in result["pairs"]:
            for name, (ours, theirs) in snapshot.items():
                assert ours == theirs, (rank, name, result["pairs"])
        assert result["pairs"][-1]["world"][1] > result["pairs"][0]["world"][1]
        assert result["errors"] == {"reader": "RuntimeError", "pybind": "RuntimeError"}


def test_stale_build_is_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    key = cpp_reader.build_key()
    monkeypatch.setattr(cpp_reader.torch, "__version__", "0.0.0+other")
    assert cpp_reader.build_key() != key
    assert cpp_reader.find() is None


def test_switched_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpp_reader, "_loaded", cpp_reader._UNSET)
    monkeypatch.setenv("FLIGHTREC_TORCHPEEK", "0")
    assert cpp_reader.load() is None and cpp_reader.seq_reader(object()) is None and cpp_reader.fastpath_capsule() is None


def test_build_errors_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    with pytest.raises(cpp_reader.BuildError, match="no-such-c\\+\\+"):
        cpp_reader.build(tmp_path)
    compiler = shutil.which("c++")
    if compiler is None:
        return
    monkeypatch.setenv("CXX", compiler)
    broken = tmp_path / "_torchpeek.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(cpp_reader, "SOURCE", broken)
    with pytest.raises(cpp_reader.BuildError, match="_torchpeek.cpp"):
        cpp_reader.build(tmp_path / "out")
    assert not list((tmp_path / "out").iterdir())  # nothing half-built left behind
    result = CliRunner().invoke(main, ["build-ext", "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "compiling" in result.output and "error" in result.output


def test_fastpath_refuses_a_reader_of_another_version() -> None:
    """A torch reader whose calls the C hot path does not know is refused before anything changes."""
    import ctypes

    from flightrec.record import fastpath
    from flightrec.record.entry import Entry
    from flightrec.record.groups import GroupState
    from flightrec.record.recorder import ThreadState

    if fastpath._fastpath is None:
        pytest.skip("the C hot path is not built")
    api = (ctypes.c_int * 8)(99)  # version 99, then null function pointers
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype, new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    capsule = new_capsule(ctypes.addressof(api), b"flightrec.record._torchpeek.api", None)
    with pytest.raises(ValueError, match="version 99"):
        fastpath._fastpath.configure(Entry, GroupState, ThreadState, capsule)
    with pytest.raises(ValueError):  # not a torch reader's capsule at all
        fastpath._fastpath.configure(Entry, GroupState, ThreadState, new_capsule(ctypes.addressof(api), b"other", None))


def test_build_falls_back_to_the_next_writable_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only install folder: the build goes to the user's cache, where `find` looks next."""
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where a folder should be: mkdir fails
    cache = tmp_path / "cache"
    monkeypatch.setenv("CXX", "c++")
    monkeypatch.setattr(cpp_reader, "search_dirs", lambda: [blocked / "built", cache])

    def fake_compile(scratch: Path, target: Path) -> Path:
        target.write_bytes(b"built")
        return target

    monkeypatch.setattr(cpp_reader, "_compile", fake_compile)
    built = cpp_reader.build()
    assert built.parent == cache and built.name == cpp_reader.file_name()
    assert cpp_reader.find() == built


def test_a_job_armed_by_the_startup_hook_reads_through_the_torch_reader(built: object, tmp_path: Path) -> None:
    """`FLIGHTREC=1` arms the recorder half-way through `import torch` (before torch.nn exists): the
    reader must still be loaded, and the C hot path use it, once torch is whole."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC")}
    run = subprocess.run(command("tests.recorder.one_rank_jobs", "dump_one_op"), capture_output=True, text=True,
                         timeout=120, env=env_with_root(env, FLIGHTREC="1", FLIGHTREC_DIR=str(tmp_path)), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "torch reader" not in run.stderr, run.stderr
    dump = json.loads(gzip.decompress(Path(facts(run.stdout)["path"]).read_bytes()))
    assert dump["hot_path"] == {"c": True, "torch_reader": True}
