"""Where the parts of flightrec beyond the recorder live: the analyzer, the post-mortem notebook and
the demo's job.

Why a module for it: the source tree keeps them at the top (`analyzers/`, `notebooks/`, `fixtures/`),
but an installed wheel must not add top-level `analyzers` or `fixtures` packages to a user's
environment (both names exist on PyPI). The wheel therefore ships them inside the package
(hatch_build.py, `BUNDLED`): `flightrec.analyzers`, `flightrec/notebooks/postmortem.ipynb`,
`flightrec/_demo/`. The functions here find them in either place: inside the package when it was
installed from a wheel, else next to it in a source checkout (an editable install exposes only
`flightrec`). Nothing here imports pandas or torch until asked for the analyzer itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PACKAGE = Path(__file__).resolve().parents[1]  # flightrec/, this module being flightrec/cli/components.py
CHECKOUT = PACKAGE.parent  # a source checkout's root, when `PACKAGE` is its flightrec/ folder
# the modules of the `analyze` extra (pyproject.toml; tests/test_packaging.py checks the two agree)
ANALYZE_MODULES = ("numpy", "pandas", "pyarrow", "networkx", "fsspec")
ANALYZE_INSTALL = "pip install 'flightrec[analyze]'"
# wheel path (inside the package) -> source checkout path; hatch_build.BUNDLED maps the same files
_IN_WHEEL = {"analyzers": "analyzers", "notebooks/postmortem.ipynb": "notebooks/postmortem.ipynb",
             "_demo/launch.py": "fixtures/launch.py", "_demo/jobs/train.py": "fixtures/jobs/train.py"}


class MissingDependency(ImportError):
    """The analyzer's third-party modules are not installed; the message says what to install."""


def _is_checkout() -> bool:
    return (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "analyzers" / "__init__.py").is_file()


def _installed() -> bool:
    """True when the package carries its parts (a wheel install), False in a source checkout."""
    return (PACKAGE / "analyzers" / "__init__.py").is_file()


def path(part: str) -> Path:
    """The file or folder of `part` (a key of `_IN_WHEEL`), inside the package or in the checkout.

    Raises FileNotFoundError naming both places when neither holds it (a broken install).
    """
    if _installed():
        found = PACKAGE / part
    elif _is_checkout():
        found = CHECKOUT / _IN_WHEEL[part]
    else:
        found = None
    if found is None or not found.exists():
        raise FileNotFoundError(f"flightrec's {part} is missing: neither {PACKAGE / part} (installed package) nor "
                                f"{CHECKOUT / _IN_WHEEL[part]} (source checkout) exists; reinstall flightrec")
    return found


def analyzer_present() -> bool:
    """Whether the analyzer's code is here (its third-party modules may still be missing)."""
    return _installed() or _is_checkout()


def missing_analyze_modules() -> list[str]:
    """The modules of the `analyze` extra that cannot be imported here (found without importing them)."""
    return [name for name in ANALYZE_MODULES if importlib.util.find_spec(name) is None]


def analyzer(submodule: str = "") -> ModuleType:
    """The analyzer package, or one of its submodules (`analyzer("reporting.postmortem")`).

    Installed: `flightrec.analyzers`. Source checkout: the checkout's `analyzers/`, under its own name
    `analyzers` (the name the tests, benchmarks and fixtures import it by, so there is one copy).
    Raises MissingDependency (naming the install command) when the `analyze` extra is not installed.
    """
    missing = missing_analyze_modules()
    if missing:
        raise MissingDependency(f"the analyzer needs {', '.join(missing)}, not installed here: {ANALYZE_INSTALL}")
    if _installed():
        package = importlib.import_module("flightrec.analyzers")
    elif _is_checkout():
        package = _checkout_analyzer()
    else:
        raise ImportError(f"flightrec's analyzer is missing: no {PACKAGE / 'analyzers'}; reinstall flightrec")
    return importlib.import_module(f"{package.__name__}.{submodule}") if submodule else package


def _checkout_analyzer() -> ModuleType:
    """The checkout's analyzers/ as the top-level package `analyzers`, imported once from its path
    (the checkout root need not be on sys.path: an editable install exposes only `flightrec`)."""
    init = CHECKOUT / "analyzers" / "__init__.py"
    loaded = sys.modules.get("analyzers")
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == init:
            return loaded
        raise ImportError(f"another package named analyzers ({getattr(loaded, '__file__', loaded)}) is already "
                          f"imported; the checkout's analyzer ({init.parent}) cannot be loaded under that name")
    spec = importlib.util.spec_from_file_location("analyzers", init, submodule_search_locations=[str(init.parent)])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the analyzer from {init}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["analyzers"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("analyzers", None)
        raise
    return module


def demo_launcher() -> ModuleType:
    """fixtures/launch.py (the bounded torchrun launcher), loaded from its file: in the wheel it is
    a data file of the demo, not a package of its own."""
    name = "flightrec._demo_launch"
    if name in sys.modules:
        return sys.modules[name]
    source = path("_demo/launch.py")
    spec = importlib.util.spec_from_file_location(name, source)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the demo's launcher from {source}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
