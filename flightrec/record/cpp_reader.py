"""The optional reader of torch's C++ objects (`_torchpeek.cpp`): built per torch release, found by key.

Why a build step of its own: it compiles against the installed torch's C++ headers and is valid for
that exact build only, so it cannot come in the wheel (built before torch is known) and a recorder
must never compile inside a training job (tens of seconds, on every rank at once). `flightrec
build-ext` builds it once per environment; its file name carries a key of everything it depends on
(torch's version and commit, Python's ABI, the source), so a torch upgrade simply finds no match and
the recorder reads the same values through torch's Python getters, ~2 µs slower per collective.
`FLIGHTREC_TORCHPEEK=0` ignores a built one.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .. import log

MODULE = "flightrec.record._torchpeek"
SOURCE = Path(__file__).with_name("_torchpeek.cpp")
_UNSET = object()
_loaded: Any = _UNSET  # (module, capsule) or None, once looked for
_when_loaded: list[Callable[[], None]] = []


class BuildError(RuntimeError):
    """The extension could not be built; the message holds the compiler's output."""


def build_key() -> str:
    """What a built file is valid for: this torch build, this Python ABI, this source."""
    digest = hashlib.sha256()
    for part in (torch.__version__, str(torch.version.git_version), sys.implementation.cache_tag,
                 str(sysconfig.get_config_var("EXT_SUFFIX")), platform.machine()):
        digest.update(part.encode() + b"\0")
    digest.update(SOURCE.read_bytes())
    digest.update(" ".join(pybind11_abi_flags()).encode())  # builds made without the tag are not found
    return digest.hexdigest()[:16]


def file_name() -> str:
    return f"_torchpeek-{build_key()}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def search_dirs() -> list[Path]:
    """Where built files live: next to the package when it is writable, else the user's cache."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flightrec"
    return [Path(__file__).with_name("_built"), cache]


def find() -> Path | None:
    name = file_name()
    for folder in search_dirs():
        if (folder / name).is_file():
            return folder / name
    return None


def load() -> tuple[ModuleType, Any] | None:
    """(module, the C hot path's capsule) when a build for this torch exists and loads; else None."""
    global _loaded
    if _loaded is not _UNSET:
        return _loaded
    if os.environ.get("FLIGHTREC_TORCHPEEK", "1") == "0":
        _loaded = None
        return None
    parameter = getattr(getattr(torch, "nn", None), "Parameter", None)
    if parameter is None:
        # `FLIGHTREC=1` arms the recorder while `import torch` is still running (torch imports
        # torch.distributed before torch.nn): decide at a later call, once torch is whole.
        return None
    _loaded = None
    try:
        path = find()
        if path is None:
            return None
        module = sys.modules.get(MODULE) or _import(path)
        capsule = module.configure(torch.Tensor, parameter, torch.Size, torch._C._distributed_c10d.ProcessGroup)
        _loaded = (module, capsule)
    except Exception as exc:  # noqa: BLE001 - a stale or foreign build: torch's getters still work
        log.warn_once("torchpeek", f"ignoring the built torch reader: {exc!r}")
    callbacks = _when_loaded[:]
    _when_loaded.clear()
    if _loaded is not None:
        for callback in callbacks:
            callback()
    return _loaded


def when_loaded(callback: Callable[[], None]) -> None:
    """Call `callback` when a later `load()` loads the reader, if the question is still open (torch
    was still importing at the first one): the C hot path is configured before any group exists,
    and every group's registration loads the reader."""
    if _loaded is _UNSET:
        _when_loaded.append(callback)


def _import(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    spec = importlib.util.spec_from_loader(MODULE, loader)
    if spec is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[MODULE] = module  # the C hot path keeps a pointer into it
    return module


def seq_reader(pg: Any) -> Any:
    """A faster `pg._get_sequence_number_for_group` (same result, same errors), or None."""
    loaded = load()
    if loaded is None:
        return None
    try:
        return loaded[0].seq_reader(pg)
    except Exception:  # noqa: BLE001
        return None


def fastpath_capsule() -> Any:
    loaded = load()
    return None if loaded is None else loaded[1]


def compiler() -> list[str]:
    """The C++ compiler command: `CXX`, else `c++`."""
    return shlex.split(os.environ.get("CXX") or "c++")


def pybind11_abi_flags() -> list[str]:
    """pybind11's ABI tag as torch was built with it (as torch's cpp_extension passes it): pybind11 keeps
    one type registry per tag, so a reader built with another compiler's tag (torch 2.1's wheels were
    built with GCC 9, `_cxxabi1011`) cannot see torch's ProcessGroup type, and its counter reader is off."""
    flags = []
    for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
        value = getattr(torch._C, f"_PYBIND11_{name}", None)
        if isinstance(value, str) and value:
            flags.append(f'-DPYBIND11_{name}="{value}"')
    return flags


def compile_command(source: Path, target: Path, std: str) -> list[str]:
    from torch.utils import cpp_extension  # build time only: it imports setuptools

    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libraries = cpp_extension.library_paths()
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return [*compiler(), "-O2", "-shared", "-fPIC", f"-std={std}", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *pybind11_abi_flags(), "-w", *(f"-I{path}" for path in includes), str(source), "-o", str(target),
            *(f"-L{path}" for path in libraries), *(f"-Wl,-rpath,{path}" for path in libraries),
            "-ltorch_python", "-ltorch_cpu", "-lc10"]


def build(out_dir: Path | None = None) -> Path:
    """Compile the extension for the installed torch; the built file's path. Raises BuildError."""
    folders = [out_dir] if out_dir is not None else search_dirs()
    command = compiler()
    if not command or shutil.which(command[0]) is None:
        raise BuildError(f"no C++ compiler: {command[:1]!r} is not on PATH (set CXX)")
    errors = []
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as scratch:
                return _compile(Path(scratch), folder / file_name())
        except OSError as exc:
            errors.append(f"{folder}: {exc}")
    raise BuildError("no writable folder for the build: " + "; ".join(errors))


def _compile(scratch: Path, target: Path) -> Path:
    output = ""
    for std in ("c++20", "c++17"):  # torch's headers need 17 (2.4) to 20 (2.10 on)
        partial = scratch / target.name
        done = subprocess.run(compile_command(SOURCE, partial, std), capture_output=True, text=True, timeout=900)
        if done.returncode == 0:
            os.replace(partial, target)  # atomic: a concurrent loader sees all of it or nothing
            return target
        output = done.stderr[-4000:]
    raise BuildError(f"compiling {SOURCE} failed:\n{output}")
