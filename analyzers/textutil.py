"""Small text helpers shared by the loader, the analysis and the renderers.

Why: rank lists on a 4,096-rank job must stay readable in one line ("0-2047, 2049-4095").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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


def channel_text(channel: str, groups: Mapping[str, str] | None = None) -> str:
    """A straggler's channel as read: 'group 0 [0-3] (world)' for a collective group (its `group_text`
    from `groups`, where given), '0 send to 3' as it is."""
    return channel if " " in channel else f"group {(groups or {}).get(channel, channel)}"


def rank_text(ranks: Iterable[int], limit: int = 72) -> str:
    """A rank list short enough for one line at any world size: `ranges` when it fits; a stride
    (`128 ranks: every 8th from 3 to 1019, except 515`) for a data-parallel slice; else its ends."""
    rs = sorted(set(ranks))
    text = ranges(rs)
    if len(text) <= limit or len(rs) < 4:
        return text
    step = min(b - a for a, b in zip(rs, rs[1:], strict=False))
    if step > 1:
        span = range(rs[0], rs[-1] + 1, step)
        outside = set(rs) - set(span)
        skipped = sorted(set(span) - set(rs))
        if not outside and len(skipped) <= 3:
            return (f"{len(rs)} ranks: every {ordinal(step)} from {rs[0]} to {rs[-1]}"
                    + (f", except {', '.join(map(str, skipped))}" if skipped else ""))
    head = ranges(rs[:6])
    return f"{len(rs)} ranks: {head}, ..., {rs[-1]}"


def who(ranks: Iterable[int], limit: int = 72) -> str:
    """`rank 3`, `ranks 0, 2-3`, or `127 ranks (every 8th from 3 to 1019, except 515)`: a subject for a sentence."""
    rs = sorted(set(ranks))
    if len(rs) == 1:
        return f"rank {rs[0]}"
    text = rank_text(rs, limit)
    if text.startswith(f"{len(rs)} ranks: "):
        return f"{len(rs)} ranks ({text.split(': ', 1)[1]})"
    return f"ranks {text}"


def ordinal(n: int) -> str:
    """2 -> '2nd', 8 -> '8th', 21 -> '21st'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# Group descriptions that say nothing about a group: torch's default for `new_group()` without one.
NO_DESC = ("", "undefined")
WORLD_DESCS = ("default_pg", "mesh_default")  # the default group; DeviceMesh's copy of it


def group_role(desc: str | None) -> str | None:
    """What a group is, from its description: `dp` for DeviceMesh's `mesh_dp`, `world` for the default
    group, the job's own `group_desc` as it is; None for torch's `undefined`."""
    text = str(desc or "").strip()
    if text in NO_DESC:
        return None
    if text in WORLD_DESCS:
        return "world"
    return text[len("mesh_"):] if text.startswith("mesh_") and len(text) > len("mesh_") else text


def members_text(ranks: Iterable[int] | None, limit: int = 24) -> str | None:
    """A group's members, short at any size: `[1, 3]`, `[0-7]`, `[128 ranks: every 8th from 3 to 1019]`."""
    if ranks is None:
        return None
    rs = sorted(set(int(r) for r in ranks))
    return f"[{rank_text(rs, limit)}]" if rs else None


def group_text(name: object, desc: str | None = None, ranks: Iterable[int] | None = None) -> str:
    """A group as read by people: `4 [1, 3] (dp)`, `0 [0-3] (world)`; its name alone where nothing more is known."""
    role = group_role(desc)
    members = members_text(ranks)
    return f"{name}" + (f" {members}" if members else "") + (f" ({role})" if role else "")
