"""Small text helpers shared by the loader, the analysis and the renderers.

Why: rank lists on a 4,096-rank job must stay readable in one line ("0-2047, 2049-4095").
"""

from __future__ import annotations

from collections.abc import Iterable


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
