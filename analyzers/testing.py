"""The analyzer's test seams, in one place: what a test may switch, and nothing a user sets.

Read at call time (`testing.X`), so that `monkeypatch.setattr(testing, ...)` / `setenv` reach them.
"""

from __future__ import annotations

import os

# "1" in the environment (tests/analyzer/conftest.py sets it): an exception other than a DumpError
# propagates out of a reader instead of turning its file into "unreadable", so that a reader bug
# fails the test that hit it.
STRICT_READERS_ENV = "FLIGHTREC_STRICT_READERS"

# True: every pickle takes the Python unpickler's path, not the C column reader's (reading/pickle_columns.py).
PYTHON_UNPICKLER_ONLY = False


def strict_readers() -> bool:
    return os.environ.get(STRICT_READERS_ENV) == "1"
