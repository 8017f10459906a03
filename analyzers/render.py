"""Human renderings: the short text report, the per-rank entry table, and the DOT wait graph.

Why separate from the analysis: the JSON report is the contract; these are views of it (plus the
graph) and may change wording freely.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import networkx as nx
import pandas as pd

from .textutil import channel_text, plural, ranges, straggler_cost, straggler_pattern

MAX_CHAIN_LINES = 20
MAX_LIST = 20
SHOW_COLUMNS = ["id", "group", "seq", "kind", "op", "peer", "state", "in_shapes", "out_shapes", "in_dtypes", "reduce_op", "site"]


def text_report(report: dict[str, Any], graph: nx.DiGraph | None = None) -> str:
    """Verdict on the first line, then root causes, a compact wait chain, mismatches and evidence gaps."""
    lines = [report["summary"]]
    r = report["ranks"]
    lines.append(
        f"ranks: {r['expected']} expected, {len(r['dumped'])} dumped"
        + (f", missing {ranges(r['missing'])}" if r["missing"] else "")
        + (f", unreadable {ranges(r['unreadable'])}" if r["unreadable"] else "")
        + (f", stale {ranges(r['stale'])}" if r.get("stale") else "")
    )
    lines += _warnings(report)
    if report["root_causes"]:
        lines += ["", "root causes:"]
        for c in report["root_causes"]:
            group = f"group {c['group']}" + (f" ({c['group_desc']})" if c.get("group_desc") else "")
            lines.append(f"  rank {c['rank']}  {c['kind']}  {group}  {c['op']}  seq {c['seq']}")
            if c.get("host"):
                lines.append(f"    on host {c['host']}" + (f", node {c['node_rank']}" if c.get("node_rank") is not None else "")
                             + (f", local rank {c['local_rank']}" if c.get("local_rank") is not None else "")
                             + (f", pid {c['pid']}" if c.get("pid") is not None else ""))
            lines.append(f"    {c['detail']}")
            if c.get("site"):
                lines.append(f"    call site: {c['site']}")
            if c.get("stack"):
                lines.append("    stack (innermost last):")
                lines += [f"      {f}" for f in c["stack"]]
            if c.get("victims"):
                lines.append(f"    victims: {ranges(c['victims'])}")
    chain = _chain(report, graph)
    if chain:
        lines += ["", "wait chain (waiters -> awaited):"] + chain
    if report["mismatches"]:
        lines += ["", f"mismatches ({len(report['mismatches'])}):"]
        for m in report["mismatches"][:MAX_LIST]:
            vals = "; ".join(f"{v!s} on {ranges(rs)}" for v, rs in m["values"].items())
            lines.append(f"  group {m['group']} seq {m['seq']} {m['op']}: {m['field']} differs on rank(s) {ranges(m['ranks'])} ({vals})")
        if len(report["mismatches"]) > MAX_LIST:
            lines.append(f"  ... {len(report['mismatches']) - MAX_LIST} more (--format json lists all)")
    if report.get("stragglers"):
        lines += ["", "stragglers (by what they cost the others, most first):"]
        lines += [f"  rank {s['rank']}: cost {straggler_cost(s)}, {straggler_pattern(s)}, "
                  f"on {', '.join(channel_text(c) for c in (s.get('channels') or s['groups'])) or '-'}"
                  + (f"; the whole {s['scope']} is slow" if s.get("scope", "rank") != "rank" else "")
                  for s in report["stragglers"]]
    if report.get("slow_links"):
        lines += ["", "slow links:"] + [f"  {k['src']} -> {k['dst']}: {k['transfer_ms_median']:.2f} ms "
                                          f"({k['ratio']:.1f}x the other links)" for k in report["slow_links"]]
    if report["gaps"]:
        lines += ["", "evidence gaps:"] + [f"  - {g}" for g in report["gaps"]]
    return "\n".join(lines)


def _warnings(report: dict[str, Any]) -> list[str]:
    """Evidence that changes what the verdict is about, stated before it is read: other jobs' dumps set
    aside, stale dumps taken as unknown (the details are in the gaps)."""
    out = []
    for job in (report.get("jobs") or {}).get("ignored", []):
        name = f'job "{job["job_id"]}"' if job.get("job_id") else "another job"
        out.append(f"warning: this folder also holds dumps of {name} (world size {job.get('world_size') or '?'}): "
                   f"rank(s) {ranges(job['ranks'])} ignored; only the newest job is analysed (see gaps)")
    stale = report["ranks"].get("stale")
    if stale:
        out.append(f"warning: the dump(s) of rank(s) {ranges(stale)} are stale (much older than the others'): "
                   "taken as no current state (see gaps)")
    return out


def _chain(report: dict[str, Any], graph: nx.DiGraph | None) -> list[str]:
    """Waits grouped by (position, awaited ranks): smallest group first, then nearest to a root cause."""
    waits = [w for w in report["waits"] if w["waits_for"]]
    if not waits:
        return []
    depth: dict[int, int] = {}
    if graph is not None:
        roots = {r for c in report["root_causes"] for r in c["ranks"]}
        rev = graph.reverse(copy=False)
        for root in roots:
            if root in rev:
                for node, d in nx.single_source_shortest_path_length(rev, root).items():
                    depth[node] = min(depth.get(node, d), d)
    rows: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for w in waits:
        rows[(w["group"], w["seq"], w["op"], tuple(w["waits_for"]))].append(w["rank"])
    size = {g["group"]: len(g["ranks"]) for g in report.get("groups", [])}
    ordered = sorted(
        rows.items(),  # narrow groups first (where stalls start), then nearest to a root cause
        key=lambda kv: (size.get(kv[0][0], 1 << 20), min(depth.get(r, 1 << 20) for r in kv[1]), kv[0][0], kv[0][1]),
    )
    out = [
        f"  {ranges(waiters)} -> {ranges(awaited)}  in {op} (group {group}, seq {seq})"
        for (group, seq, op, awaited), waiters in ordered[:MAX_CHAIN_LINES]
    ]
    if len(ordered) > MAX_CHAIN_LINES:
        out.append(f"  ... {plural(len(ordered) - MAX_CHAIN_LINES, 'more line')}")
    return out


def entry_table(entries: pd.DataFrame, rank: int, group: str | None = None) -> str:
    """A rank's entries as a fixed-width table (the `show` command)."""
    rows = entries.loc[entries["rank"] == rank]
    if group is not None:
        rows = rows.loc[rows["group"] == group]
    if rows.empty:
        return f"rank {rank}: no entries" + (f" in group {group}" if group is not None else "")
    view = rows[SHOW_COLUMNS].astype(object).where(rows[SHOW_COLUMNS].notna(), "")
    return view.to_string(index=False)


def to_dot(graph: nx.DiGraph, report: dict[str, Any]) -> str:
    """The wait-for graph in Graphviz DOT: root causes red, ranks without a dump dashed."""
    kinds = {r: c["kind"] for c in report["root_causes"] for r in c["ranks"]}
    lines = ["digraph waits {", "  rankdir=LR;", '  node [shape=box, fontname="monospace"];']
    for n, attrs in sorted(graph.nodes(data=True)):
        label = f"rank {n}\\n{kinds.get(n, attrs.get('status', ''))}"
        style = []
        if n in kinds:
            style.append('color=red, fontcolor=red, penwidth=2')
        if not attrs.get("dumped"):
            style.append("style=dashed")
        lines.append(f'  {n} [label="{label}"{", " + ", ".join(style) if style else ""}];')
    for u, v, attrs in sorted(graph.edges(data=True)):
        label = f"{attrs.get('op')} g{attrs.get('group')} #{attrs.get('seq')}\\n{attrs.get('reason')}"
        lines.append(f'  {u} -> {v} [label="{_esc(label)}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _esc(text: str) -> str:
    return text.replace('"', '\\"')
