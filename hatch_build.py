"""Build hook: compile the optional C parts (the recorder's hot path flightrec/record/_fastpath.c, the
analyzer's pickle reader analyzers/_pickle_columns.c), and place the analyzer, the notebook and the
demo's job inside the package of a (non-editable) wheel (`BUNDLED`).

Why a hook and not setuptools: the package is otherwise pure Python and built by hatchling; one C
file needs only the compiler and Python's headers. A missing compiler or a failed build is not an
error: the wheel is then pure Python; the recorder records the same entries, a few µs slower per
collective (docs/overhead.md), and the analyzer reads PyTorch's pickles with the Python unpickler, ~3x
slower per file (docs/scale.md). `FLIGHTREC_BUILD_C=0` skips the build.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # benchmarks/gpu_check.py builds in place with `compile_extension` where hatchling is absent
    BuildHookInterface = object  # type: ignore[assignment,misc]

# each C source, and where its extension lives in the source tree and in a (non-editable) wheel
EXTENSIONS = {
    os.path.join("flightrec", "record", "_fastpath.c"): (os.path.join("flightrec", "record"), "flightrec/record"),
    os.path.join("analyzers", "_pickle_columns.c"): ("analyzers", "flightrec/analyzers"),
}
# What the wheel ships inside the package although the source tree keeps it at the top: a wheel must
# not install top-level `analyzers` or `fixtures` packages (PyPI has both names). flightrec/cli/components.py
# finds each in either place. Editable installs map nothing: they expose `flightrec` alone
# (pyproject.toml: dev-mode-exact) and cli/components.py finds these next to it.
BUNDLED = {
    "analyzers": "flightrec/analyzers",
    "notebooks/postmortem.ipynb": "flightrec/notebooks/postmortem.ipynb",
    "fixtures/launch.py": "flightrec/_demo/launch.py",  # `flightrec demo`: the bounded torchrun launcher
    "fixtures/jobs/train.py": "flightrec/_demo/jobs/train.py",  # ... and the job it runs
}


def compile_extension(root: str, source: str, out_dir: str) -> str | None:
    """The built extension's path, or None (with the reason on stderr) when it cannot be built."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    name = os.path.splitext(os.path.basename(source))[0]
    target = os.path.join(out_dir, name + suffix)
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not compiler or shutil.which(compiler[0]) is None:
        print(f"flightrec: no C compiler ({compiler[:1]}): {source} not built, Python used instead", file=sys.stderr)
        return None
    command = [*compiler, "-O2", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
               os.path.join(root, source), "-o", target]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"flightrec: could not build {source} ({exc}): Python used instead", file=sys.stderr)
        return None
    if done.returncode != 0:
        print(f"flightrec: could not build {source}: Python used instead\n{done.stderr}", file=sys.stderr)
        return None
    return target


class FastPathHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        if version != "editable":
            for source, target in BUNDLED.items():
                build_data["force_include"][os.path.join(self.root, source)] = target
        if os.environ.get("FLIGHTREC_BUILD_C") == "0":
            return
        for source, (tree_dir, wheel_dir) in EXTENSIONS.items():
            if version == "editable":  # imported from the source tree: build next to the sources
                built = compile_extension(self.root, source, os.path.join(self.root, tree_dir))
            else:
                built = compile_extension(self.root, source, tempfile.mkdtemp(prefix="flightrec-build-"))
                if built is not None:
                    build_data["force_include"][built] = f"{wheel_dir}/{os.path.basename(built)}"
            if built is not None:
                build_data["pure_python"] = False
                build_data["infer_tag"] = True
