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
import pandas as pd

from ..analysis import Analysis
from ..textutil import ranges
from . import postmortem as pm
from .render import headline

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
MAX_EDGE_LABELS = 24
MAX_ARROWS = 300  # above this, edges are one line collection (FancyArrowPatch per edge is slow)


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
    fig.flightrec_note = text  # type: ignore[union-attr]  # the HTML page lists it instead of an empty panel
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
    special = {i for i, r in enumerate(ranks) if r in marked}
    pos = sorted(special | {i for i in range(0, len(ranks), step) if step == 1 or all(abs(i - j) >= step for j in special)})
    labels = [f"{ranks[i]}" + ("" if ranks[i] in a.dumps else " (no dump)") + marked.get(ranks[i], "") for i in pos]
    ax.set_yticks(pos, labels)
    for i, tick in zip(pos, ax.get_yticklabels(), strict=True):
        if ranks[i] in marked:
            tick.set_color(ROLE_COLORS["root_cause"])
            tick.set_fontweight("bold")


def _root_marks(a: Analysis) -> dict[int, str]:
    return {r: " root" for r, role in pm.rank_roles(a).items() if role == "root_cause"}


def timeline(a: Analysis, width: float = 11.0, last_ops: int = 200) -> Figure:
    """Per-rank timeline (wall clock × rank): one bar per op, coloured by status, the hang marked.

    Ops still running at dump time extend (hatched) to the end of the record. Ops whose completion
    the dump does not record are drawn as a tick at their start. Root-cause ranks are labelled red.
    Only each rank's `last_ops` most recent entries are drawn (a hang is at the end); the bars are
    one polygon collection, so thousands of ranks still draw in seconds.
    """
    df = pm.entries(a)
    kept = df.groupby("rank", sort=False).cumcount(ascending=False) < last_ops
    trimmed = not bool(kept.all())
    df = df[kept]
    ranks = _rank_rows(a)
    fig = _figure(width, min(max(2.6, 0.32 * len(ranks) + 1.6), 24))
    ax = fig.add_subplot()
    ax.set_title(textwrap.shorten(headline(a.report()), 120) + (f" (last {last_ops} ops per rank)" if trimmed else ""),
                 fontsize=10, loc="left")
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
    row = pd.Series(np.arange(len(ranks), dtype=float), index=ranks)
    y = df["rank"].map(row).to_numpy(dtype=float)
    status = df["status"].astype(str)
    colors = status.map(STATUS_COLORS).fillna(STATUS_COLORS[pm.ST_UNKNOWN]).to_numpy(dtype=object)
    status = status.to_numpy(dtype=object)
    x0 = (start.to_numpy() - t0) / scale
    has_end = end.notna().to_numpy()
    open_ = ~has_end & np.isin(status, [pm.ST_PENDING, pm.ST_BLOCKING, pm.ST_MISMATCH, pm.ST_FAILED])
    x1 = (np.where(has_end, end.to_numpy(), np.where(open_, horizon, np.nan)) - t0) / scale
    x1 = np.maximum(x1, x0 + span / scale * 0.003)  # every op stays visible
    closed = has_end & ~np.isnan(x0)
    _bars(ax, x0[closed], x1[closed], y[closed], colors[closed], label="ops")
    _bars(ax, x0[open_], x1[open_], y[open_], colors[open_], label="running at dump time", hatch="//", alpha=0.55)
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
    _label_ranks(ax, ranks, a, {s["rank"]: " straggler" for s in a.report()["stragglers"]} | _root_marks(a))
    ax.set_ylabel("rank")
    ax.set_xlabel(f"wall clock ({unit} since the first recorded op; each rank's own clock)")
    ax.set_xlim(0, (horizon - t0) / scale)
    _status_legend(ax, set(status), tick.any() or blocking.any())
    return fig


def _bars(ax: Axes, x0: np.ndarray, x1: np.ndarray, y: np.ndarray, colors: np.ndarray, label: str, **style: Any) -> None:
    """Horizontal bars [x0, x1] at rows y as one PolyCollection (one artist, not one per op)."""
    if not len(x0):
        return
    from matplotlib.collections import PolyCollection

    h = 0.35
    verts = np.stack([np.column_stack([x0, y - h]), np.column_stack([x1, y - h]),
                      np.column_stack([x1, y + h]), np.column_stack([x0, y + h])], axis=1)
    ax.add_collection(PolyCollection(verts, facecolors=list(colors), edgecolors="#555555",
                                     linewidths=0.3 if len(x0) < 3000 else 0.0,
                                     label=f"_{label}", **style))


def _status_legend(ax: Axes, present: set[str], extra: bool) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, edgecolor="#555555", label=s) for s, c in STATUS_COLORS.items() if s in present]
    if extra:
        h, _ = ax.get_legend_handles_labels()
        handles += h
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


def lateness_heatmap(a: Analysis, width: float = 11.0, max_columns: int = 240) -> Figure:
    """Lateness (ms) of each rank (rows) in each timed collective (columns, in the order entered).

    With more than `max_columns` timed collectives, consecutive ones are binned (a bin reads as a
    stretch of steps) and a cell is the rank's mean lateness over the collectives of the bin it
    took part in: with many small groups, one column per collective would be nearly all empty.
    """
    lat = pm.lateness(a)
    ranks = sorted(a.dumps)
    fig = _figure(width, min(max(2.6, 0.3 * len(ranks) + 1.6), 20))
    ax = fig.add_subplot()
    ax.set_title("lateness per collective (ms: the longest wait there minus the rank's own)", fontsize=10, loc="left")
    if lat.empty:
        _note(ax, "no lateness: no collective was completed by every member with recorded completion times"
              + _lacking(a))
        return fig
    ids = pd.factorize(lat["collective_id"], sort=True)[0]
    n = int(ids.max()) + 1
    per_bin = -(-n // max_columns)  # ceil
    column = ids // per_bin
    grid = lat.assign(column=column).pivot_table(index="rank", columns="column", values="late_ms", aggfunc="mean")
    grid = grid.reindex(ranks)
    data = np.ma.masked_invalid(grid.to_numpy(dtype=float))
    import matplotlib as mpl

    cmap = mpl.colormaps["magma_r"].with_extremes(bad="#eeeeee")
    image = ax.imshow(data, aspect="auto", interpolation="nearest", cmap=cmap, vmin=0)
    fig.colorbar(image, ax=ax, label="ms late", shrink=0.9 if len(ranks) <= 16 else 0.5)
    _label_ranks(ax, ranks, a, {s["rank"]: " straggler" for s in a.report()["stragglers"]})
    ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("rank")
    what = f"{n} collectives with timing from every member, in the order first entered"
    ax.set_xlabel(what if per_bin == 1 else f"{what}, in bins of {per_bin} (mean per rank)")
    return fig


def step_times(a: Analysis, width: float = 11.0) -> Figure:
    """Step time per rank (ms, the loop's own collective: `postmortem.steps`), with the steps a rank's
    own work held the others up marked on its line: where a slow step came from, at a glance."""
    st = pm.steps(a)
    fig = _figure(width, 3.4)
    ax = fig.add_subplot()
    ax.set_title("step time per rank (ms); dots: the rank whose own work held that step up", fontsize=10, loc="left")
    if st.empty:
        _note(ax, "no timed steps: no collective was completed by every member with recorded completion times"
              + _lacking(a))
        return fig
    slow = {s["rank"] for s in a.report()["stragglers"]}
    for rank, part in st.groupby("rank"):
        style = {"linewidth": 1.6, "zorder": 3} if rank in slow else {"linewidth": 0.7, "alpha": 0.6}
        (line,) = ax.plot(part["step"], part["step_ms"], label=f"rank {rank}" + (" (straggler)" if rank in slow else ""),
                          **style)
        held = part[part["held_up_by"] == rank]
        ax.scatter(held["step"], held["step_ms"], s=10, color=line.get_color(), zorder=4)
    ax.set_xlabel(f"step (collective of group {st['group'].iloc[0]})")
    ax.set_ylabel("ms since the rank's previous step")
    if st["rank"].nunique() <= 16:
        ax.legend(fontsize=7, ncol=4, loc="upper right")
    return fig


def _lacking(a: Analysis) -> str:
    formats = {d.fmt for d in a.dumps.values()}
    if any(f.startswith("torch_fr") for f in formats) and a.entries["t_complete_ns"].isna().all():
        return " (these PyTorch recorder dumps record no completion times)"
    return ""


def wait_graph(a: Analysis, width: float = 9.0) -> Figure:
    """The wait-for graph: arrows point from a waiting rank to the rank it waits for; roots in red.

    Ranks are laid out in columns by the longest wait chain to a root (roots on the right); edges of
    wait cycles are drawn red. Above MAX_LABELLED_RANKS ranks, ranks with the same role that wait
    for the same ranks are drawn as one node labelled with their rank ranges.
    """
    rep = a.report()
    fig = _figure(width, 4.0)
    ax = fig.add_subplot()
    ax.set_title(textwrap.shorten(headline(rep), 110), fontsize=10, loc="left")
    ax.set_axis_off()
    if a.graph.number_of_edges() == 0:
        _note(ax, f"no rank is waiting for another ({a.graph.number_of_nodes()} ranks)")
        return fig
    graph = _display_graph(a, rep)
    pos = _layered_layout(graph)
    tallest = max(collections.Counter(float(p[0]) for p in pos.values()).values())
    fig.set_size_inches(width, min(max(2.6, 0.55 * tallest + 1.2), 14))
    nodes = list(graph.nodes)
    roles = [graph.nodes[n]["role"] for n in nodes]
    edges = list(graph.edges)
    red = [graph.edges[e]["cycle"] for e in edges]
    arrows = {"arrows": True, "arrowsize": 14, "connectionstyle": "arc3,rad=0.08"} if len(edges) <= MAX_ARROWS else {"arrows": False}
    nx.draw_networkx_edges(graph, pos, ax=ax, edgelist=edges, node_size=1100,
                           edge_color=["#d62728" if r else "#777777" for r in red],
                           width=[2.2 if r else 1.0 for r in red], **arrows)
    nx.draw_networkx_nodes(graph, pos, ax=ax, nodelist=nodes, node_color=[ROLE_COLORS[r] for r in roles],
                           edgecolors="#555555", node_size=1100,
                           linewidths=[2.5 if r == "root_cause" else 1.0 for r in roles])
    xy = np.array(list(pos.values()))
    ax.set_xlim(xy[:, 0].min() - 0.4, xy[:, 0].max() + 0.4)
    ax.set_ylim(xy[:, 1].min() - 0.7, xy[:, 1].max() + 0.7)
    if len(nodes) <= MAX_LABELLED_RANKS:
        nx.draw_networkx_labels(graph, pos, labels={n: graph.nodes[n]["label"] for n in nodes}, ax=ax,
                                font_size=7 if graph.number_of_nodes() == a.graph.number_of_nodes() else 6)
    if len(edges) <= MAX_EDGE_LABELS:
        elabels = {(u, v): f"{d.get('op')} g{d.get('group')}#{d.get('seq')}" for u, v, d in graph.edges(data=True)}
        nx.draw_networkx_edge_labels(graph, pos, edge_labels=elabels, ax=ax, font_size=6, label_pos=0.6,
                                     bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(facecolor=c, edgecolor="#555555", label=r.replace("_", " ")) for r, c in ROLE_COLORS.items()
                       if r in set(roles)], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return fig


def _display_graph(a: Analysis, rep: dict[str, Any]) -> nx.DiGraph:
    """The wait graph with drawing attributes (role, label, cycle edges); condensed when large."""
    graph = a.graph
    roles = pm.rank_roles(a)
    in_cycle = {(u, v) for cyc in rep["cycles"] for u in cyc for v in cyc if graph.has_edge(u, v)}
    out = nx.DiGraph()
    for n, attrs in graph.nodes(data=True):
        dumped = bool(attrs.get("dumped"))
        role = roles.get(n, "idle") if dumped or roles.get(n) == "root_cause" else "missing"
        out.add_node(n, role=role, label=f"{n}" + ("" if dumped else "\nno dump"), ranks=[n], dumped=dumped)
    for u, v, attrs in graph.edges(data=True):
        out.add_edge(u, v, **attrs, cycle=(u, v) in in_cycle)
    if out.number_of_nodes() <= MAX_LABELLED_RANKS:
        return out
    key = {n: (out.nodes[n]["role"], out.nodes[n]["dumped"], frozenset(out.successors(n)), n if n in
               {r for c in rep["root_causes"] for r in c["ranks"]} else -1) for n in out.nodes}
    blocks: dict[Any, list[int]] = {}
    for n in sorted(out.nodes):
        blocks.setdefault(key[n], []).append(n)
    block_of = {n: min(members) for members in blocks.values() for n in members}
    small = nx.DiGraph()
    for members in blocks.values():
        first = out.nodes[members[0]]
        text = ranges(members)
        label = textwrap.shorten(text, 14, placeholder="…") + (f"\n({len(members)} ranks)" if len(members) > 1 else "")
        small.add_node(min(members), role=first["role"], label=label + ("" if first["dumped"] else "\nno dump"),
                       ranks=members, dumped=first["dumped"])
    for u, v, attrs in out.edges(data=True):
        bu, bv = block_of[u], block_of[v]
        if bu != bv and not small.has_edge(bu, bv):
            small.add_edge(bu, bv, **attrs)
        elif bu != bv and attrs["cycle"]:
            small.edges[bu, bv]["cycle"] = True
    return small


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
        "Step times": step_times(a),
        "Slow links": slow_links(a),
    }


__all__ = ["INSTALL_HINT", "all_figures", "lateness_heatmap", "slow_links", "step_times", "timeline", "to_png",
           "wait_graph"]
