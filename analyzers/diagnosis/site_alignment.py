"""An extra op that agrees in kind and size with the others' ops, found by aligning call sites.

Why a pass of its own: such an op leaves no field to disagree on, so neither the majority vote
(matching.py) nor the op-stream alignment (alignment.py) sees it; only the call sites (`site`) tell
the ops apart.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .mismatch import Mismatch, Shift, code_text

PENDING_UNIT_STATES = ("enqueued", "started", "failed")
MAX_SITE_CAMP = 256  # ranks waiting in one group beyond which the call-site alignment is not tried


def site_shifts(entries: pd.DataFrame, pos: pd.DataFrame, members: dict[str, tuple[int, ...]],
                settled: set[str]) -> tuple[list[Mismatch], list[Shift]]:
    """An extra op that agrees in kind and size with the others' ops, told apart by its call site.

    Why: rank 0 all-reducing one extra tensor of the usual shape leaves no field to disagree on; its
    later ops pair with the other rank's previous ones and its last one waits for an op never issued,
    which looks like the other rank not entering (what `fr_trace` reports). Tried only where a group's
    ranks split into two equal camps (no majority) whose last seqs differ by one, the camp ahead still
    waiting in its last op: there, if the call sites disagree at some position and agree everywhere
    once the camp ahead is shifted back by one from it, that camp issued an extra op. Unknown sites
    (C++-issued ops) never count as agreement on their own: at least one known pair must line up.
    """
    if "site" not in entries.columns or pos.empty:
        return [], []
    waiting = pos.loc[pos["state"].isin(PENDING_UNIT_STATES).to_numpy(), ["rank", "group"]]
    out: list[Mismatch] = []
    shifts: list[Shift] = []
    for group, ranks in waiting.groupby("group", observed=True)["rank"]:  # groups with a waiting rank
        n = ranks.nunique()
        if str(group) in settled or n > MAX_SITE_CAMP or 2 * n != len(members.get(str(group), ())):
            continue  # only half of the group waiting can be two equal camps
        found = _site_shift(entries, pos, str(group))
        if found is not None:
            out.append(found[0])
            shifts.append(found[1])
    return out, shifts


def _site_shift(entries: pd.DataFrame, pos: pd.DataFrame, group: str) -> tuple[Mismatch, Shift] | None:
    """The call-site alignment of `site_shifts` for one group (its two camps split by their last seq)."""
    mine = pos.loc[(pos["group"] == group).to_numpy(), ["rank", "seq", "state", "op"]]
    last = mine.groupby("rank")["seq"].max()
    ends = sorted(set(last.tolist()))
    if len(ends) != 2 or ends[1] != ends[0] + 1:
        return None
    ahead, behind = sorted(last.index[last == ends[1]].tolist()), sorted(last.index[last == ends[0]].tolist())
    if len(ahead) != len(behind):
        return None  # a majority: the usual rules apply
    tail = mine[(mine["seq"] == ends[1]).to_numpy()]
    if not tail["state"].isin(PENDING_UNIT_STATES).all():
        return None  # the camp ahead is not stuck in its last op
    ranks = np.array(ahead + behind, dtype=np.int64)
    rows = entries.loc[(entries["group"] == group).to_numpy() & (entries["kind"] == "coll").to_numpy()
                       & (entries["seq"] > 0).to_numpy(), ["rank", "seq", "id", "site"]]
    rows = rows[np.isin(rows["rank"].to_numpy(), ranks)].sort_values("id").drop_duplicates(["rank", "seq"])
    site = pd.Categorical(rows["site"])
    grid = np.full((len(ranks), ends[1] + 2), -1, dtype=np.int64)  # site code per (rank, seq); -1: unknown
    at = np.searchsorted(np.sort(ranks), rows["rank"].to_numpy())
    order = np.argsort(ranks)
    grid[order[at], rows["seq"].to_numpy().astype(np.int64)] = site.codes
    front, back = grid[: len(ahead)], grid[len(ahead):]
    ref = back[0]
    known = (back >= 0) & (ref >= 0)
    if ((back != ref) & known).any():
        return None  # the camp behind disagrees with itself
    both = (front >= 0) & (ref >= 0)
    differs = np.flatnonzero(((front != ref) & both).any(axis=0))
    if not len(differs):
        return None  # the streams agree where they overlap: nothing tells the camps apart
    p = int(differs[0])
    shifted, base = front[:, p + 1:], ref[p: -1]
    pairs = (shifted >= 0) & (base >= 0)
    if not pairs.any(axis=1).all() or ((shifted != base) & pairs).any():
        return None
    op_at = mine[(mine["rank"] == ahead[0]).to_numpy() & (mine["seq"] == p).to_numpy()]["op"]
    op = str(op_at.iloc[0]) if len(op_at) else "op"
    shift = Shift(group=group, seq=p, op=op, ranks=ahead, others=behind, last=ends[0])
    theirs, ours = code_text(site.categories, int(ref[p])), code_text(site.categories, int(front[0, p]))
    why = f"{shift.text()} (the ops agree in kind and size: their call sites tell them apart)"
    m = Mismatch(group=group, seq=p, field="site", ranks=list(ahead), values={theirs: list(behind), ours: list(ahead)},
                 expected=theirs, op=op, tie=True, shift=shift, extra={"alignment": why})
    return m, shift
