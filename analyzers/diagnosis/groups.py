"""Process-group membership and world size, from what the dumps record or, failing that, infer.

Why: every wait edge needs "who are the members of this group". flightrec records each group's
ranks; PyTorch's gloo recorder (2.13) records none. The default group holds every rank; any other
group is assumed to hold the ranks whose dumps used it, and each such assumption is stated as an
evidence gap instead of being made silently.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..constants import MAX_RANKS
from ..keys import distinct_rows, first_rows, ids_within_ranks
from ..reading.rankdump import FileProblem, RankDump
from ..textutil import ranges

DEFAULT_GROUP = "0"


@dataclass
class Membership:
    """Resolved groups: members per group name, the world size, and the table shown to users."""

    members: dict[str, tuple[int, ...]]
    world_size: int
    table: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    known: set[str] = field(default_factory=set)  # groups whose full membership is recorded, not guessed


def resolve(dumps: dict[int, RankDump], entries: pd.DataFrame, problems: list[FileProblem]) -> Membership:
    """Merge every rank's view of the groups; infer what is not recorded and say so."""
    notes: list[str] = []
    by_id: dict[str, Counter[int]] = defaultdict(Counter)  # counted by object: the loader shares equal lists
    lists: dict[int, tuple[int, ...]] = {}
    desc: dict[str, str] = {}
    backend: dict[str, str] = {}
    for d in dumps.values():
        for g in d.groups:
            if g.ranks:
                by_id[g.name][id(g.ranks)] += 1
                lists[id(g.ranks)] = g.ranks
            desc.setdefault(g.name, g.desc)
            if g.desc and not desc[g.name]:
                desc[g.name] = g.desc
            if g.backend:
                backend.setdefault(g.name, g.backend)

    recorded: dict[str, Counter[tuple[int, ...]]] = defaultdict(Counter)
    for name, counts in by_id.items():
        for key, n in counts.items():
            recorded[name][lists[key]] += n  # equal lists that were not shared still add up
    world, world_known = _world_size(dumps, recorded, problems, notes)
    users = _users(entries)
    names = sorted(set(desc) | set(recorded) | set(users), key=_group_sort_key)
    members: dict[str, tuple[int, ...]] = {}
    how: dict[str, str] = {}
    for name in names:
        label = f"group {name}" + (f" ({desc[name]})" if desc.get(name) else "")
        if recorded.get(name):
            (ranks, _), *others = recorded[name].most_common()
            members[name] = ranks
            how[name] = "recorded"
            if others:
                views = "; ".join(f"{ranges(r)} ({n} ranks)" for r, n in recorded[name].most_common())
                notes.append(f"{label}: ranks disagree about its members ({views}); used the most common view")
                how[name] = "conflict"
        elif name == DEFAULT_GROUP or desc.get(name) == "default_pg":
            members[name] = tuple(range(world))
            how[name] = "default"
            notes.append(f"{label}: membership not recorded; taken as the default group of all {world} ranks")
        else:
            seen = users.get(name, ())
            members[name] = tuple(seen)
            how[name] = "inferred"
            notes.append(
                f"{label}: membership not recorded; assumed to be ranks {ranges(seen)}, the ranks whose dumps "
                "used it (a member that never used it, or whose dump is missing, would not be noticed)"
            )
    table = pd.DataFrame(
        {
            "group": names,
            "desc": [desc.get(n, "") for n in names],
            "backend": [backend.get(n, "") for n in names],
            "ranks": [members[n] for n in names],
            "size": [len(members[n]) for n in names],
            "membership": [how[n] for n in names],
        }
    )
    known = {n for n in names if how[n] in ("recorded", "conflict") or (how[n] == "default" and world_known)}
    return Membership(members=members, world_size=world, table=table, notes=notes, known=known)


def _world_size(
    dumps: dict[int, RankDump], recorded: dict[str, Counter[tuple[int, ...]]], problems: list[FileProblem], notes: list[str]
) -> tuple[int, bool]:
    """The world size, and whether a dump recorded it (rather than it being inferred from names)."""
    sizes = {int(d.meta["world_size"]) for d in dumps.values()
             if isinstance(d.meta.get("world_size"), int) and 0 < d.meta["world_size"] < MAX_RANKS}
    if sizes:
        if len(sizes) > 1:
            notes.append(f"dumps disagree about the world size ({', '.join(map(str, sorted(sizes)))}); used the largest")
        return max(sizes), True
    if recorded.get(DEFAULT_GROUP):
        return len(recorded[DEFAULT_GROUP].most_common(1)[0][0]), True
    seen = set(dumps) | {p.rank for p in problems if p.rank is not None}
    for views in recorded.values():
        for ranks in views:
            seen.update(ranks)
    world = max(seen) + 1 if seen else 0
    notes.append(
        f"world size not recorded in the dumps; assumed {world} from the file names and groups "
        "(ranks above the highest file would not be noticed as missing)"
    )
    return world, False


def _users(entries: pd.DataFrame) -> dict[str, tuple[int, ...]]:
    if entries.empty:
        return {}
    groups = pd.Categorical(entries["group"])
    codes, ranks = groups.codes, entries["rank"].to_numpy()
    known = codes >= 0
    if not bool(known.all()):
        codes, ranks = codes[known], ranks[known]
    pairs = distinct_rows([ranks, codes])  # distinct (rank, group) pairs, through a table of flags
    if pairs is None:  # too many ranks x groups for one: hashed a slice of ranks at a time
        first = first_rows(ids_within_ranks(ranks, codes.astype(np.int64)))
        pairs = [ranks[first], codes[first].astype(np.int64)]
    order = np.lexsort((pairs[0], pairs[1]))  # by group then rank: a few pairs per rank, not every entry
    code_of, rank_of = pairs[1][order], pairs[0][order]
    bounds = np.flatnonzero(np.diff(code_of)) + 1
    out: dict[str, tuple[int, ...]] = {}
    for code, members in zip(code_of[np.r_[0, bounds]] if len(code_of) else [], np.split(rank_of, bounds), strict=False):
        out[str(groups.categories[code])] = tuple(int(r) for r in members)
    return out


def _group_sort_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)
