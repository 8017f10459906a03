"""Build hook: compile the recorder's optional C hot path (flightrec/_fastpath.c), and place the
analyzer, the notebook and the demo's job inside the package of a (non-editable) wheel (`BUNDLED`).

Why a hook and not setuptools: the package is otherwise pure Python and built by hatchling; one C
file needs only the compiler and Python's headers. A missing compiler or a failed build is not an
error: the wheel is then pure Python and the recorder records the same entries, a few µs slower per
collective (docs/overhead.md). `FLIGHTREC_BUILD_C=0` skips the build.
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

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = os.path.join("flightrec", "_fastpath.c")
# What the wheel ships inside the package although the source tree keeps it at the top: a wheel must
# not install top-level `analyzers` or `fixtures` packages (PyPI has both names). flightrec/parts.py
# finds each in either place. Editable installs map nothing: they expose `flightrec` alone
# (pyproject.toml: dev-mode-exact) and parts.py finds these next to it.
BUNDLED = {
    "analyzers": "flightrec/analyzers",
    "notebooks/postmortem.ipynb": "flightrec/notebooks/postmortem.ipynb",
    "fixtures/launch.py": "flightrec/_demo/launch.py",  # `flightrec demo`: the bounded torchrun launcher
    "fixtures/jobs/train.py": "flightrec/_demo/jobs/train.py",  # ... and the job it runs
}


def compile_fastpath(root: str, out_dir: str) -> str | None:
    """The built extension's path, or None (with the reason on stderr) when it cannot be built."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = os.path.join(out_dir, "_fastpath" + suffix)
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not compiler or shutil.which(compiler[0]) is None:
        print(f"flightrec: no C compiler ({compiler[:1]}): the recorder stays pure Python", file=sys.stderr)
        return None
    command = [*compiler, "-O2", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
               os.path.join(root, SOURCE), "-o", target]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"flightrec: could not build the C hot path ({exc}): the recorder stays pure Python", file=sys.stderr)
        return None
    if done.returncode != 0:
        print(f"flightrec: could not build the C hot path: the recorder stays pure Python\n{done.stderr}",
              file=sys.stderr)
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
        if version == "editable":  # imported from the source tree: build next to the sources
            built = compile_fastpath(self.root, os.path.join(self.root, "flightrec"))
        else:
            built = compile_fastpath(self.root, tempfile.mkdtemp(prefix="flightrec-build-"))
            if built is not None:
                build_data["force_include"][built] = f"flightrec/{os.path.basename(built)}"
        if built is not None:
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
