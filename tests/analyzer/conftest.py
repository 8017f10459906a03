"""Shared fixtures of the analyzer tests: scenario folders written by fixtures.builders."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from analyzers import testing  # noqa: E402
from fixtures import builders  # noqa: E402

GOLDEN = ROOT / "fixtures" / "golden"


@pytest.fixture
def scenario(tmp_path: Path) -> Callable[[str], Path]:
    """scenario("cascade") -> a folder holding that scenario's dumps."""

    def make(name: str) -> Path:
        return builders.SCENARIOS[name](tmp_path / name)

    return make


@pytest.fixture(autouse=True)
def _no_recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLIGHTREC", raising=False)
    monkeypatch.setenv(testing.STRICT_READERS_ENV, "1")  # a reader bug fails the test (analyzers/testing.py)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
