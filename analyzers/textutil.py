"""Small text helpers shared by the loader, the analysis and the renderers.

Why: rank lists on a 4,096-rank job must stay readable in one line ("0-2047, 2049-4095").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    spans: list[list[int]] = []
    for r in sorted(set(ranks)):
        if spans and spans[-1][1] == r - 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def plural(n: int, word: str, many: str | None = None) -> str:
    """plural(1, 'rank') -> '1 rank'; plural(3, 'rank') -> '3 ranks'."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def straggler_cost(s: dict[str, Any]) -> str:
    """'752.8 ms (42.2% of the window)' for a report's straggler item."""
    pct = s.get("cost_pct")
    return f"{s.get('cost_ms', 0.0):.1f} ms" + (f" ({pct:.1f}% of the analysed window)" if pct is not None else "")


def straggler_pattern(s: dict[str, Any]) -> str:
    """'periodic, every 4th collective, 30.0 ms each time' and the like."""
    pattern, share = s.get("pattern") or "persistent", s.get("late_share")
    when = f"{s.get('late_ms_when_late', s.get('late_ms_median', 0.0)):.1f} ms each time"
    if pattern == "periodic" and s.get("period"):
        return f"periodic, every {s['period']} collectives, {when}"
    if pattern == "intermittent" and share is not None:
        return f"intermittent, in {100 * share:.0f}% of its collectives, {when}"
    return f"{pattern}, {when}"


def channel_text(channel: str) -> str:
    """A straggler's channel as read: 'group 0' for a collective group, '0 send to 3' as it is."""
    return channel if " " in channel else f"group {channel}"
