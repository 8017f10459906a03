"""`flightrec analyze DIR --html FILE`: one self-contained HTML page of the postmortem.

Why one file with everything inlined (CSS, plots as base64 PNG): it is attached to tickets and
opened from mail or a laptop's disk, where nothing next to it exists and nothing may be fetched.
The page is a view of the JSON report (docs/report-format.md) plus the plots of `plots.py`; without
matplotlib the page is still written, with a note where the plots would be.
"""

from __future__ import annotations

import base64
from html import escape
from typing import Any

from ..analysis import Analysis
from ..textutil import ranges, who
from . import postmortem as pm
from . import render

MAX_ROWS = 200  # per table: a 16k-rank job stays a page, not a 10 MB document
VERDICT_COLORS = {"healthy": "#2ca02c", "slow": "#e6a100", "hang": "#d62728", "desync": "#9467bd", "deadlock": "#8c1c13"}

CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; line-height: 1.4; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.15em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
.verdict { display: inline-block; color: white; font-weight: bold; padding: 0.15em 0.6em; border-radius: 4px;
           text-transform: uppercase; letter-spacing: 0.05em; margin-right: 0.5em; }
.summary { font-size: 1.1em; }
.muted { color: #666; font-size: 0.9em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.cause { border-left: 4px solid #d62728; padding: 0.3em 0.8em; margin: 0.8em 0; background: #fdf3f3; }
.cause .head { font-weight: bold; }
pre { background: #f6f6f6; padding: 0.5em; overflow-x: auto; font-size: 0.85em; margin: 0.3em 0; }
img { max-width: 100%; height: auto; display: block; margin: 0.5em 0; }
ul.gaps li { margin: 0.2em 0; }
"""


def render_html(a: Analysis) -> str:
    """The whole page as a string."""
    rep = a.report()
    verdict = rep["verdict"]
    color = VERDICT_COLORS.get(verdict, "#d62728")
    r = rep["ranks"]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>flightrec: {escape(rep['summary'])}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>flightrec postmortem</h1>",
        f'<p class="muted">{escape(str(rep["folder"]))}</p>',
        f'<p class="summary"><span class="verdict" style="background:{color}">{escape(verdict)}</span>'
        f"{escape(render.headline(rep).split(': ', 1)[-1])}</p>",
        f'<p class="muted">{r["expected"]} ranks expected, {len(r["dumped"])} dumped'
        + (f", missing {escape(ranges(r['missing']))}" if r["missing"] else "")
        + (f", unreadable {escape(ranges(r['unreadable']))}" if r["unreadable"] else "")
        + "</p>",
    ]
    parts += _causes(rep)
    parts += _plots(a)
    parts += _waits(rep)
    parts += _stragglers(rep)
    parts += _costs(a)
    parts += _mismatches(rep)
    if rep["gaps"]:
        parts += ["<h2>Evidence gaps</h2>", '<ul class="gaps">'] + [
            f"<li>{escape(g)}</li>" for g in render.group_gaps(rep["gaps"])] + ["</ul>"]
    parts += ["<h2>Ranks</h2>"] + _ranks(a)
    parts.append('<p class="muted">written by flightrec analyze --html</p></body></html>')
    return "\n".join(parts)


def _costs(a: Analysis) -> list[str]:
    """What each rank's own work cost the others, most first: where people look for a slow rank."""
    table = pm.rank_cost(a)
    if table.empty or not (table["cost_ms"] > 0).any():
        return []
    rows = table.head(MAX_ROWS).round({"cost_ms": 1, "cost_pct": 2, "vote_z": 1}).to_dict("records")
    return ["<h2>Cost per rank</h2>",
            '<p class="muted">the time each rank\'s own work held the others up in the collectives (most first); '
            "held_up: in how many of its collectives; vote_z: how far above chance</p>", _table(rows)]


def _ranks(a: Analysis) -> list[str]:
    """Every rank up to MAX_ROWS; beyond, root causes and ranks without a dump first, then the lowest."""
    table = pm.ranks(a)
    order = table["role"].map({"root_cause": 0, "missing": 1}).fillna(2)
    shown = table.assign(_o=order).sort_values(["_o", "rank"], kind="stable").head(MAX_ROWS).sort_values("rank")
    cols = ["rank", "role", "status", "blocking_op", "file", "format", "host", "reason", "entries"]
    out = [_table(shown[cols].to_dict("records"))]
    if len(table) > MAX_ROWS:
        out.append(f'<p class="muted">{len(table) - MAX_ROWS} more ranks not listed (flightrec export has them all).</p>')
    return out


def _causes(rep: dict[str, Any]) -> list[str]:
    """Each root cause as the text report's labelled lines (verbose), its stack as a traceback."""
    out = ["<h2>Root causes</h2>"]
    if not rep["root_causes"]:
        return out + ["<p>None: no rank is blocked by another.</p>"]
    causes = [render.cause_view(c, rep) for c in rep["root_causes"]]
    for i, c in enumerate(causes):
        lines = render.cause_lines(c, rep, i, len(causes), verbose=True)
        out.append('<div class="cause">')
        out.append(f'<div class="head">{escape(lines[0])}</div>')
        out.append("<pre>" + escape("\n".join(line[2:] for line in lines[1:])) + "</pre>")
        if c.get("victims"):
            out.append(f"<div>held up: {escape(who(c['victims']))}</div>")
        out.append("</div>")
    return out


def _plots(a: Analysis) -> list[str]:
    """The plots that have something to show; the others named in one line with why (no empty panels)."""
    out = ["<h2>Plots</h2>"]
    try:
        from . import plots

        figures = plots.all_figures(a)
    except ImportError as exc:
        return out + [f'<p class="muted">No plots: they need matplotlib ({escape(str(exc))}); '
                      "<code>pip install 'flightrec[notebook]'</code> adds it. The rest of this page is complete.</p>"]
    skipped = []
    for title, fig in figures.items():
        note = getattr(fig, "flightrec_note", None)
        if note:
            skipped.append(f"{escape(title)} ({escape(note)})")
            continue
        data = base64.b64encode(plots.to_png(fig)).decode("ascii")
        out.append(f"<h3>{escape(title)}</h3>")
        out.append(f'<img alt="{escape(title)}" src="data:image/png;base64,{data}">')
    if skipped:
        out.append('<p class="muted">not drawn: ' + "; ".join(skipped) + "</p>")
    return out


def _waits(rep: dict[str, Any]) -> list[str]:
    if not rep["waits"]:
        return []
    more = len(rep["waits"]) - MAX_ROWS
    rows = [{"rank": w["rank"], "blocked in": f"{w['op']} (group {w['group']}, seq {w['seq']})",
             "waits for": ranges(w["waits_for"]) or "-",
             "why": ", ".join(f"{k}: {v}" for k, v in w["reasons"].items()) or "-",
             "state": w["state"], "evidence": w["evidence"]} for w in rep["waits"][:MAX_ROWS]]
    tail = [f'<p class="muted">{more} more waiting ranks not listed (--format json lists all).</p>'] if more > 0 else []
    return ["<h2>Waits</h2>", _table(rows), *tail]


def _stragglers(rep: dict[str, Any]) -> list[str]:
    out = []
    if rep.get("stragglers"):
        out += ["<h2>Stragglers</h2>", _table(rep["stragglers"])]
    if rep.get("slow_links"):
        out += ["<h2>Slow links</h2>", _table(rep["slow_links"])]
    return out


def _mismatches(rep: dict[str, Any]) -> list[str]:
    if not rep["mismatches"]:
        return []
    rows = [{"group": m["group"], "seq": m["seq"], "op": m["op"], "field": m["field"], "culprits": ranges(m["ranks"]),
             "values": "; ".join(f"{v} on {ranges(rs)}" for v, rs in m["values"].items())} for m in rep["mismatches"][:100]]
    return ["<h2>Mismatches</h2>", _table(rows)]


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>none</p>"
    head = "".join(f"<th>{escape(str(k))}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{escape(_cell(v))}</td>" for v in row.values()) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)
