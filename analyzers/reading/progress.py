"""The progress bar `flightrec analyze` draws on stderr while it reads thousands of dump files.

Why a separate object: the loader only calls two callbacks (`on_count` once, `progress` per file);
whether a bar is drawn is the CLI's decision: only on a terminal, never with `--quiet`, so logs and
pipes stay clean. click's bar is used (no extra dependency).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

import click

LABEL = "reading dumps"


class ReadProgress:
    """Callbacks for `analyzers.load`; draws a click progress bar when enabled."""

    def __init__(self, enabled: bool, stream: TextIO | None = None, force: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and (force or _isatty(self.stream))
        self.force = force
        self._bar: Any = None

    def on_count(self, total: int) -> None:
        """Told the number of files before reading starts."""
        if not self.enabled or total <= 0:
            return
        self._bar = click.progressbar(length=total, label=LABEL, file=self.stream, show_pos=True, show_eta=True)
        if self.force and hasattr(self._bar, "_is_atty"):
            self._bar._is_atty = True  # click draws only the label on non-terminals; a forced bar is drawn in full
        self._bar.__enter__()

    def progress(self, done: int) -> None:
        """Told after each file (or batch of files) is read."""
        if self._bar is not None:
            self._bar.update(done)

    def close(self) -> None:
        """Finish the bar's line (call once reading is over, also on errors)."""
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
