"""Postmortem plots: per-rank timeline, lateness heatmap, wait-for graph, slow-link matrix.

Why object-oriented matplotlib (`Figure`, Agg canvas) and no pyplot state: the same functions serve a
notebook (the figure is displayed), the HTML report (rendered to PNG) and tests (headless), and
never open a window. matplotlib is an optional extra, imported on first use.
Each function takes an `Analysis` and returns a `matplotlib.figure.Figure`; when the dumps lack what
a plot needs (PyTorch's gloo recorder records no completion times), the figure says so instead of
drawing guesses.
"""

from __future__ import annotations

import collections
import io
import textwrap
from typing import TYPE_CHECKING, Any

import networkx as nx
import numpy as np

from . import postmortem as pm
from .analysis import Analysis

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "plots need matplotlib: pip install 'flightrec[notebook]'"
STATUS_COLORS = {
    pm.ST_COMPLETED: "#9ecae1",
    pm.ST_PENDING: "#fdae6b",
    pm.ST_BLOCKING: "#d62728",
    pm.ST_FAILED: "#404040",
    pm.ST_MISMATCH: "#9467bd",
    pm.ST_UNKNOWN: "#c7c7c7",
}
ROLE_COLORS = {"root_cause": "#d62728", "victim": "#fdae6b", "waiting": "#fdd0a2", "idle": "#e0e0e0", "missing": "#ffffff"}
MAX_LABELLED_RANKS = 64
MAX_EDGE_LABELS = 40


def _figure(width: float, height: float) -> Figure:
    """A Figure on an Agg canvas, never registered with pyplot."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def to_png(fig: Figure, dpi: int = 110) -> bytes:
    """The figure as PNG bytes (for the HTML report)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _note(ax: Axes, text: str) -> None:
    """Nothing to draw: a short figure that says why."""
    fig = ax.get_figure()
    fig.set_size_inches(fig.get_size_inches()[0], 1.4)
    ax.set_frame_on(False)
    ax.text(0.5, 0.5, textwrap.fill(text, 70), ha="center", va="center", transform=ax.transAxes, color="#555555")
    ax.set_xticks([])
    ax.set_yticks([])


def _rank_rows(a: Analysis) -> list[int]:
    """Every rank the analysis knows of, dumped or not (missing ones get an empty, labelled row)."""
    return sorted(set(a.graph.nodes) | set(a.dumps))


def _label_ranks(ax: Axes, ranks: list[int], a: Analysis, marked: dict[int, str]) -> None:
    """Rank tick labels on the y axis; `marked` ranks (rank -> suffix) in bold red."""
    step = max(1, len(ranks) // MAX_LABELLED_RANKS)
    pos = list(range(0, len(ranks), step))
    labels = [f"{ranks[i]}" + ("" if ranks[i] in a.dumps else " (no dump)") + marked.get(ranks[i], "") for i in pos]
    ax.set_yticks(pos, labels)
    for i, tick in zip(pos, ax.get_yticklabels(), strict=True):
        if ranks[i] in marked:
            tick.set_color(ROLE_COLORS["root_cause"])
            tick.set_fontweight("bold")


def _root_marks(a: Analysis) -> dict[int, str]:
    return {r: " root" for r, role in pm.rank_roles(a).items() if role == "root_cause"}


def timeline(a: Analysis, width: float = 11.0) -> Figure:
    """Per-rank timeline (wall clock × rank): one bar per op, coloured by status, the hang marked.

    Ops still running at dump time extend (hatched) to the end of the record. Ops whose completion
    the dump does not record are drawn as a tick at their start. Root-cause ranks are labelled red.
    """
    df = pm.entries(a)
    ranks = _rank_rows(a)
    fig = _figure(width, min(max(2.6, 0.32 * len(ranks) + 1.6), 24))
    ax = fig.add_subplot()
    ax.set_title(textwrap.shorten(a.summary(), 120), fontsize=10, loc="left")
    start = df["t_enqueue_wall_ns"].astype("float64")
    if start.notna().sum() == 0:
        _note(ax, "no timestamps in these dumps: no timeline")
        return fig
    end = df["t_complete_wall_ns"].astype("float64")
    t0 = float(start.min())
    horizon = float(np.nanmax([start.max(), end.max()]))
    span = max(horizon - t0, 1.0)
    scale, unit = (1e9, "s") if span >= 2e9 else (1e6, "ms")
    horizon += 0.03 * span
    row = {r: i for i, r in enumerate(ranks)}
    y = df["rank"].map(row).to_numpy(dtype=float)
    status = df["status"].astype(str).to_numpy()
    x0 = (start.to_numpy() - t0) / scale
    has_end = end.notna().to_numpy()
    open_ = ~has_end & np.isin(status, [pm.ST_PENDING, pm.ST_BLOCKING, pm.ST_MISMATCH, pm.ST_FAILED])
    x1 = np.where(has_end, end.to_numpy(), np.where(open_, horizon, np.nan))
    x1 = (x1 - t0) / scale
    colors = np.array([STATUS_COLORS.get(s, "#c7c7c7") for s in status], dtype=object)
    width_ = np.maximum(x1 - x0, span / scale * 0.003)
    closed = has_end & ~np.isnan(x0)
    if closed.any():
        ax.barh(y[closed], width_[closed], left=x0[closed], height=0.7, color=list(colors[closed]),
                edgecolor="#555555", linewidth=0.3)
    if open_.any():
        ax.barh(y[open_], width_[open_], left=x0[open_], height=0.7, color=list(colors[open_]), alpha=0.55,
                hatch="//", edgecolor="#555555", linewidth=0.3)
    tick = ~has_end & ~open_ & ~np.isnan(x0)
    if tick.any():
        ax.scatter(x0[tick], y[tick], marker="|", s=120, c=list(colors[tick]), linewidths=2,
                   label="start only (completion not recorded)")
    blocking = df["blocking"].to_numpy()
    if blocking.any():
        hang = float(np.nanmin(x0[blocking]))
        ax.axvline(hang, color="#d62728", linestyle="--", linewidth=1, label="hang point (first blocking op entered)")
        ax.scatter(x0[blocking], y[blocking], marker=">", s=36, color="#d62728", zorder=3, label="blocking op entered")
    ax.set_ylim(len(ranks) - 0.5, -0.5)  # rank 0 on top
    _label_ranks(ax, ranks, a, _root_marks(a))
    ax.set_ylabel("rank")
    ax.set_xlabel(f"wall clock ({unit} since the first recorded op; each rank's own clock)")
    ax.set_xlim(0, (horizon - t0) / scale)
    _status_legend(ax, set(status), tick.any() or blocking.any())
    return fig


def _status_legend(ax: Axes, present: set[str], extra: bool) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, edgecolor="#555555", label=s) for s, c in STATUS_COLORS.items() if s in present]
    if extra:
        h, _ = ax.get_legend_handles_labels()
        handles += h
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


def lateness_heatmap(a: Analysis, width: float = 11.0) -> Figure:
    """Lateness (ms) of each rank (rows) in each timed collective (columns, in the order entered)."""
    lat = pm.lateness(a)
    ranks = sorted(a.dumps)
    fig = _figure(width, min(max(2.6, 0.3 * len(ranks) + 1.6), 20))
    ax = fig.add_subplot()
    ax.set_title("lateness per collective (ms: the longest wait there minus the rank's own)", fontsize=10, loc="left")
    if lat.empty:
        _note(ax, "no lateness: no collective was completed by every member with recorded completion times"
              + _lacking(a))
        return fig
    grid = lat.pivot_table(index="rank", columns="collective_id", values="late_ms", aggfunc="max").reindex(ranks)
    data = np.ma.masked_invalid(grid.to_numpy(dtype=float))
    import matplotlib as mpl

    cmap = mpl.colormaps["magma_r"].with_extremes(bad="#eeeeee")
    image = ax.imshow(data, aspect="auto", interpolation="nearest", cmap=cmap, vmin=0)
    fig.colorbar(image, ax=ax, label="ms late", shrink=0.9)
    _label_ranks(ax, ranks, a, {s["rank"]: " straggler" for s in a.report()["stragglers"]})
    ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("rank")
    ax.set_xlabel(f"collective (in the order first entered; {grid.shape[1]} with timing from every member)")
    return fig


def _lacking(a: Analysis) -> str:
    formats = {d.fmt for d in a.dumps.values()}
    if any(f.startswith("torch_fr") for f in formats) and a.entries["t_complete_ns"].isna().all():
        return " (these PyTorch recorder dumps record no completion times)"
    return ""


def wait_graph(a: Analysis, width: float = 9.0) -> Figure:
    """The wait-for graph: arrows point from a waiting rank to the rank it waits for; roots in red.

    Ranks are laid out in columns by their distance from a root cause (roots on the right); edges
    of wait cycles are drawn red.
    """
    graph = a.graph
    rep = a.report()
    roles = pm.rank_roles(a)
    fig = _figure(width, 4.0)
    ax = fig.add_subplot()
    ax.set_title(textwrap.shorten(rep["summary"], 110), fontsize=10, loc="left")
    ax.set_axis_off()
    if graph.number_of_edges() == 0:
        _note(ax, f"no rank is waiting for another ({graph.number_of_nodes()} ranks)")
        return fig
    roots = {r for c in rep["root_causes"] for r in c["ranks"]}
    pos = _layered_layout(graph)
    tallest = max(collections.Counter(float(p[0]) for p in pos.values()).values())
    fig.set_size_inches(width, min(max(2.6, 0.55 * tallest + 1.2), 14))
    color = [ROLE_COLORS.get(roles.get(n, "missing" if not graph.nodes[n].get("dumped") else "idle"), "#e0e0e0")
             for n in graph.nodes]
    edge_c = ["#555555" if n in roots or graph.nodes[n].get("dumped") else "#888888" for n in graph.nodes]
    in_cycle = {(u, v) for cyc in rep["cycles"] for u in cyc for v in cyc if graph.has_edge(u, v)}
    edges = list(graph.edges)
    nx.draw_networkx_edges(graph, pos, ax=ax, edgelist=edges, arrows=True, arrowsize=14, node_size=1100,
                           edge_color=["#d62728" if e in in_cycle else "#777777" for e in edges],
                           width=[2.2 if e in in_cycle else 1.0 for e in edges], connectionstyle="arc3,rad=0.08")
    nx.draw_networkx_nodes(graph, pos, ax=ax, node_color=color, edgecolors=edge_c, node_size=1100,
                           linewidths=[2.5 if n in roots else 1.0 for n in graph.nodes])
    ax.margins(0.12)
    few = graph.number_of_nodes() <= MAX_LABELLED_RANKS
    if few:
        labels = {n: f"{n}" + ("" if graph.nodes[n].get("dumped") else "\nno dump") for n in graph.nodes}
        nx.draw_networkx_labels(graph, pos, labels=labels, ax=ax, font_size=7)
    if graph.number_of_edges() <= MAX_EDGE_LABELS:
        elabels = {(u, v): f"{d.get('op')} g{d.get('group')}#{d.get('seq')}" for u, v, d in graph.edges(data=True)}
        nx.draw_networkx_edge_labels(graph, pos, edge_labels=elabels, ax=ax, font_size=6, label_pos=0.6,
                                     bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})
    from matplotlib.patches import Patch

    shown = {roles.get(n, "missing") if graph.nodes[n].get("dumped") or n in roots else "missing" for n in graph.nodes}
    ax.legend(handles=[Patch(facecolor=c, edgecolor="#555555", label=r.replace("_", " ")) for r, c in ROLE_COLORS.items()
                       if r in shown], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return fig


def _layered_layout(graph: nx.DiGraph) -> dict[Any, np.ndarray]:
    """Columns by the longest wait chain to a rank that waits for nobody (those rightmost), rows by rank.

    Members of a wait cycle share a column; ranks that neither wait nor are waited for go leftmost.
    """
    dag = nx.condensation(graph)
    layer_of: dict[int, int] = {}
    for c in reversed(list(nx.topological_sort(dag))):
        layer_of[c] = 1 + max((layer_of[s] for s in dag.successors(c)), default=-1)
    layer = {n: layer_of[dag.graph["mapping"][n]] for n in graph.nodes}
    far = max(layer.values(), default=0) + 1
    layer.update({n: far for n in graph.nodes if graph.degree(n) == 0})
    cols: dict[int, list[Any]] = {}
    for n in sorted(graph.nodes):
        cols.setdefault(layer[n], []).append(n)
    pos = {}
    for d, nodes in cols.items():
        for i, n in enumerate(nodes):
            pos[n] = np.array([-float(d), -(i - (len(nodes) - 1) / 2)])
    return pos


def slow_links(a: Analysis, width: float = 6.5) -> Figure:
    """Median p2p transfer time (ms) per sender (rows) × receiver (columns); slow links outlined."""
    matrix = getattr(a.slow, "link_matrix", None)
    fig = _figure(width, 5.0)
    ax = fig.add_subplot()
    ax.set_title("p2p transfer time, median (ms)", fontsize=10, loc="left")
    if matrix is None or len(matrix) == 0:
        _note(ax, "no slow-link matrix: no completed, matched send/receive pairs with timing" + _lacking(a))
        return fig
    ranks = sorted(set(matrix.index) | set(matrix.columns))
    grid = matrix.reindex(index=ranks, columns=ranks).to_numpy(dtype=float)
    import matplotlib as mpl

    cmap = mpl.colormaps["viridis"].with_extremes(bad="#eeeeee")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, interpolation="nearest")
    fig.colorbar(image, ax=ax, label="ms")
    if len(ranks) <= MAX_LABELLED_RANKS:
        ax.set_xticks(range(len(ranks)), [str(r) for r in ranks])
        ax.set_yticks(range(len(ranks)), [str(r) for r in ranks])
    from matplotlib.patches import Rectangle

    index = {r: i for i, r in enumerate(ranks)}
    for link in a.report()["slow_links"]:
        ax.add_patch(Rectangle((index[link["dst"]] - 0.5, index[link["src"]] - 0.5), 1, 1, fill=False,
                               edgecolor="#d62728", linewidth=2.5))
        ax.text(index[link["dst"]], index[link["src"]], f"{link['ratio']:.1f}x", ha="center", va="center",
                color="white", fontsize=8, fontweight="bold")
    ax.set_ylabel("sender")
    ax.set_xlabel("receiver")
    return fig


def all_figures(a: Analysis) -> dict[str, Figure]:
    """Every plot, by title, in the order a postmortem reads them."""
    return {
        "Wait-for graph": wait_graph(a),
        "Timeline": timeline(a),
        "Lateness": lateness_heatmap(a),
        "Slow links": slow_links(a),
    }


__all__ = ["INSTALL_HINT", "all_figures", "lateness_heatmap", "slow_links", "timeline", "to_png", "wait_graph"]
