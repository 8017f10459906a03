"""The installed package fits into any environment (issue 23): the wheel and the editable install add
no top-level `fixtures` or `analyzers` package (both exist on PyPI), the training image needs only
torch and click, and the analyzer, the notebook and the demo's job are reachable from an install.

The install tests build the real wheel with pip (hatchling from the package index), install it into a
fresh venv next to a distribution named `fixtures` (PyPI's, or a minimal stand-in built here when no
index answers) and run the installed `flightrec` from a folder outside the checkout.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from flightrec.cli import components
from flightrec.cli.commands import main

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "fixtures" / "golden" / "compute_hang"
NO_INDEX = re.compile(r"(No matching distribution|Could not find a version).*(hatchling|editables)", re.S)
CHECK_WHEEL = r"""
import importlib.util, json, sys
import fixtures, flightrec
from flightrec.cli import components
an = components.analyzer()
print(json.dumps({"fixtures": fixtures.__file__, "fixture_cls": hasattr(fixtures, "Fixture"),
                  "repo_fixtures": importlib.util.find_spec("fixtures.builders") is not None,
                  "flightrec": flightrec.__file__, "analyzer": an.__name__, "analyzer_file": an.__file__,
                  "notebook": str(components.path("notebooks/postmortem.ipynb")),
                  "launch": str(components.path("_demo/launch.py")), "job": str(components.path("_demo/jobs/train.py"))}))
"""
CHECK_EDITABLE = r"""
import importlib.util, json, sys
import flightrec
from flightrec.cli import components
print(json.dumps({"flightrec": flightrec.__file__, "path": sys.path,
                  "fixtures": importlib.util.find_spec("fixtures") is not None,
                  "analyzers": importlib.util.find_spec("analyzers") is not None,
                  "present": components.analyzer_present(), "notebook": str(components.path("notebooks/postmortem.ipynb"))}))
"""


def _env() -> dict[str, str]:
    """This environment minus anything that would put the checkout on sys.path or arm the recorder."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("FLIGHTREC")}
    env.update(PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", FLIGHTREC_BUILD_C="0")
    return env


def _run(command: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _pip(python: Path, *args: str, cwd: Path) -> None:
    """pip of this interpreter installing into `python`'s environment; skips when no index has the build backend."""
    done = _run([sys.executable, "-m", "pip", "--python", str(python), *args], cwd=cwd, timeout=240)
    if done.returncode != 0 and NO_INDEX.search(done.stdout + done.stderr):
        pytest.skip(f"no package index serves the build backend: {(done.stdout + done.stderr)[-300:]}")
    assert done.returncode == 0, done.stdout + done.stderr


def _venv(path: Path, system_site: bool) -> Path:
    command = [sys.executable, "-m", "venv", "--without-pip", str(path)]
    subprocess.run(command + (["--system-site-packages"] if system_site else []), check=True, timeout=60)
    return path / "bin" / "python"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _standin_fixtures(folder: Path) -> Path:
    """A wheel of a distribution named `fixtures` with a `Fixture` class, as PyPI's has."""
    files = {
        "fixtures/__init__.py": b'"""Stand-in for PyPI\'s fixtures (no index reachable)."""\n\n\nclass Fixture:\n    pass\n',
        "fixtures-0.0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: fixtures\nVersion: 0.0.1\n",
        "fixtures-0.0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: flightrec-tests\nRoot-Is-Purelib: true\n"
                                          b"Tag: py3-none-any\n",
    }
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    files["fixtures-0.0.1.dist-info/RECORD"] = (record + "fixtures-0.0.1.dist-info/RECORD,,\n").encode()
    wheel = folder / "fixtures-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def _fixtures_wheel(folder: Path) -> tuple[Path, str]:
    """PyPI's `fixtures` wheel, or the stand-in when no index answers within seconds; and which."""
    try:
        done = _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--timeout", "10",
                     "--retries", "0", "-d", str(folder), "fixtures"], cwd=folder, timeout=60)
    except subprocess.TimeoutExpired:
        done = None
    found = sorted(folder.glob("fixtures-*.whl"))
    if done is not None and done.returncode == 0 and found:
        return found[0], "PyPI"
    return _standin_fixtures(folder), "stand-in"


def test_core_dependencies_are_the_recorders_and_the_analyze_extra_is_what_parts_checks() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in requirements}

    assert names(project["dependencies"]) == {"torch", "click"}
    assert names(project["optional-dependencies"]["analyze"]) == set(components.ANALYZE_MODULES)
    assert "flightrec[analyze]" in project["optional-dependencies"]["notebook"]


def test_readme_demo_installs_no_test_tools_and_the_test_command_installs_the_test_extra() -> None:
    """The README opens with the demo and the test command; the test command is the script CI runs."""
    commands = [line[4:] for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("    ")]
    demo, test = commands[:2]
    assert "flightrec demo" in demo and "'.[analyze]'" in demo and "test" not in demo and "pytest" not in demo, demo
    assert test == ".ci/test", test
    script = (ROOT / ".ci" / "test").read_text()
    assert "pip install -q torch==2.13.0" in script and "pip install -q -e '.[test]'" in script, script
    assert script.index("torch==2.13.0") < script.index("'.[test]'")  # the CPU build before anything pulls torch
    assert "exec .ci/test" in (ROOT / ".ci" / "run").read_text()


def test_analysis_command_without_its_dependencies_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # an import of pyarrow now fails: "not installed"
    for command in ("analyze", "show", "export"):
        result = CliRunner().invoke(main, [command, str(GOLDEN)])
        assert result.exit_code == 1, result.output
        assert "pyarrow" in result.output and "pip install 'flightrec[analyze]'" in result.output, result.output


def test_wheel_installs_beside_a_package_named_fixtures(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    _pip(Path(sys.executable), "wheel", "--no-deps", "--timeout", "20", "--retries", "1", "-w", str(dist), str(ROOT),
         cwd=tmp_path)
    (wheel,) = dist.glob("flightrec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names} - {"flightrec", "flightrec.pth"}  # and one .dist-info folder
    assert len(top) == 1 and top.pop().endswith(".dist-info"), sorted({n.split("/")[0] for n in names})

    python = _venv(tmp_path / "venv", system_site=True)  # torch, pandas... from here; flightrec and fixtures its own
    fixtures_whl, which = _fixtures_wheel(dist)
    print(f"fixtures wheel: {fixtures_whl.name} ({which})")
    _pip(python, "install", "--no-deps", "--ignore-installed", str(fixtures_whl), cwd=tmp_path)  # first: the
    _pip(python, "install", "--no-deps", "--ignore-installed", str(wheel), cwd=tmp_path)  # wheel must not overwrite it
    work = tmp_path / "elsewhere"
    work.mkdir()
    done = _run([str(python), "-c", CHECK_WHEEL], cwd=work)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    site = Path(seen["flightrec"]).parents[1]
    assert site.is_relative_to(tmp_path / "venv"), seen
    assert Path(seen["fixtures"]) == site / "fixtures" / "__init__.py" and seen["fixture_cls"], seen
    assert not seen["repo_fixtures"], seen
    with zipfile.ZipFile(fixtures_whl) as archive:
        assert Path(seen["fixtures"]).read_bytes() == archive.read("fixtures/__init__.py")
    assert seen["analyzer"] == "flightrec.analyzers" and Path(seen["analyzer_file"]).is_relative_to(site), seen
    for key, source in (("launch", "fixtures/launch.py"), ("job", "fixtures/jobs/train.py")):
        assert Path(seen[key]).is_relative_to(site) and Path(seen[key]).read_bytes() == (ROOT / source).read_bytes()

    flightrec = str(python.parent / "flightrec")
    done = _run([flightrec, "--help"], cwd=work)
    assert done.returncode == 0 and "analyze" in done.stdout and "notebook" in done.stdout, done.stdout + done.stderr
    dumps = work / "dumps"
    shutil.copytree(GOLDEN, dumps)
    done = _run([flightrec, "analyze", str(dumps), "--format", "json", "--quiet"], cwd=work)
    assert done.returncode == 0, done.stderr
    import analyzers  # the checkout's copy: the installed one must say the same

    assert json.loads(done.stdout)["summary"] == analyzers.load(dumps).report()["summary"]

    done = _run([flightrec, "notebook", str(dumps), "--out", "pm.ipynb"], cwd=work)
    assert done.returncode == 0, done.stderr
    written = json.loads((work / "pm.ipynb").read_text())
    shipped = json.loads((ROOT / "notebooks" / "postmortem.ipynb").read_text())
    changed = [i for i, (a, b) in enumerate(zip(written["cells"], shipped["cells"], strict=True)) if a != b]
    assert len(changed) == 1 and "parameters" in written["cells"][changed[0]]["metadata"]["tags"]
    assert f"DUMP_DIR = {str(dumps.resolve())!r}" in "".join(written["cells"][changed[0]]["source"])


def test_editable_install_exposes_flightrec_alone(tmp_path: Path) -> None:
    python = _venv(tmp_path / "venv", system_site=False)  # nothing but what the editable install adds
    _pip(python, "install", "--no-deps", "--timeout", "20", "--retries", "1", "-e", str(ROOT), "editables",
         cwd=tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    done = _run([str(python), "-c", CHECK_EDITABLE], cwd=work)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert Path(seen["flightrec"]) == ROOT / "flightrec" / "__init__.py", seen
    assert str(ROOT) not in [str(Path(p).resolve()) for p in seen["path"] if p], seen["path"]
    assert not seen["fixtures"] and not seen["analyzers"], seen
    assert seen["present"] and Path(seen["notebook"]) == ROOT / "notebooks" / "postmortem.ipynb", seen
