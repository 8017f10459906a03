"""Plots (`analyzers.reporting.plots`) and the self-contained HTML page (`flightrec analyze --html`)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import matplotlib.colors as mcolors
import matplotlib.image as mimage
import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.patches import Rectangle

import analyzers
from analyzers.cli import analyze_command
from analyzers.reporting import html_report, plots
from analyzers.reporting import postmortem as pm
from fixtures.builders import OP_STEP_NS, Job

from .conftest import GOLDEN

FIXTURES = ["compute_hang", "straggler_20", "torch_fr_gloo", "cascade", "p2p_deadlock", "crash"]
ROOT_RED = mcolors.to_rgba(plots.ROLE_COLORS["root_cause"])


@pytest.fixture(scope="module")
def loaded() -> dict[str, analyzers.Analysis]:
    return {name: analyzers.load(GOLDEN / name) for name in FIXTURES}


@pytest.mark.parametrize("name", FIXTURES)
def test_every_plot_returns_a_figure(loaded, name):
    a = loaded[name]
    figures = plots.all_figures(a)
    assert list(figures) == ["Wait-for graph", "Timeline", "Lateness", "Step times", "Slow links"]
    for title, fig in figures.items():
        assert isinstance(fig, Figure) and fig.axes, title
        png = plots.to_png(fig, dpi=40)
        assert png[:8] == b"\x89PNG\r\n\x1a\n", title


def _bars(ax, hatched: bool | None = None) -> list:
    """The timeline's bars (one path each), optionally only the hatched (still running) ones."""
    return [path for c in ax.collections if isinstance(c, PolyCollection) and not isinstance(c, PathCollection)
            and (hatched is None or bool(c.get_hatch()) == hatched) for path in c.get_paths()]


def test_timeline_draws_every_op_and_marks_the_hang(loaded):
    a = loaded["compute_hang"]
    ax = plots.timeline(a).axes[0]
    assert len(_bars(ax)) == len(a.entries)  # 12 completed + 3 blocking (open, hatched)
    assert len(_bars(ax, hatched=True)) == 3
    assert len(_bars(plots.timeline(a, last_ops=2).axes[0])) == 8  # only each rank's last 2 ops
    assert any(line.get_linestyle() == "--" for line in ax.get_lines())  # the hang point
    labels = {t.get_text(): t for t in ax.get_yticklabels()}
    assert list(labels) == ["0", "1", "2 root", "3"]
    assert mcolors.to_rgba(labels["2 root"].get_color()) == ROOT_RED
    assert mcolors.to_rgba(labels["0"].get_color()) != ROOT_RED


def test_timeline_shows_missing_completion_as_missing(loaded):
    a = loaded["torch_fr_gloo"]
    ax = plots.timeline(a).axes[0]
    df = pm.entries(a)
    ticks = [c for c in ax.collections if isinstance(c, PathCollection) and "completion not recorded" in c.get_label()]
    assert len(ticks) == 1 and len(ticks[0].get_offsets()) == int((~df["blocking"]).sum())
    assert len(_bars(ax)) == int(df["blocking"].sum())  # only the ops still waiting get a bar
    crash = plots.timeline(loaded["crash"]).axes[0]
    assert "1 (no dump) root" in [t.get_text() for t in crash.get_yticklabels()]


def test_lateness_heatmap(loaded):
    a = loaded["straggler_20"]
    ax = plots.lateness_heatmap(a).axes[0]
    image = next(i for i in ax.get_images() if isinstance(i, AxesImage))
    grid = image.get_array()
    assert grid.shape == (4, pm.lateness(a)["collective_id"].nunique())
    assert int(np.ma.median(grid, axis=1).argmax()) == 1  # rank 1 is the straggler
    assert "1 straggler" in [t.get_text() for t in plots.timeline(a).axes[0].get_yticklabels()]
    assert "1 straggler" in [t.get_text() for t in ax.get_yticklabels()]
    empty = plots.lateness_heatmap(loaded["torch_fr_gloo"]).axes[0]
    assert not empty.get_images() and "no completion times" in " ".join(t.get_text() for t in empty.texts).replace("\n", " ")


def test_wait_graph_highlights_roots_and_cycles(loaded):
    ax = plots.wait_graph(loaded["cascade"]).axes[0]
    nodes = next(c for c in ax.collections if isinstance(c, PathCollection))
    colors = [mcolors.to_rgba(c) for c in nodes.get_facecolors()]
    order = sorted(loaded["cascade"].graph.nodes)
    assert [r for r, c in zip(order, colors, strict=True) if c == ROOT_RED] == [5]
    deadlock = plots.wait_graph(loaded["p2p_deadlock"]).axes[0]
    red = [p for p in deadlock.patches if mcolors.to_rgba(p.get_edgecolor()) == ROOT_RED]
    assert len(red) == 2  # the two edges of the 1 <-> 2 cycle
    healthy = plots.wait_graph(analyzers.load(GOLDEN / "healthy")).axes[0]
    assert "no rank is waiting" in " ".join(t.get_text() for t in healthy.texts).replace("\n", " ")


def test_large_wait_graph_is_condensed(tmp_path):
    job = Job(80)
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce", ranks=[r for r in range(80) if r != 7], state="started")
    ax = plots.wait_graph(analyzers.load(job.write(tmp_path / "big"))).axes[0]
    labels = sorted(t.get_text() for t in ax.texts if "ranks" in t.get_text() or t.get_text() == "7")
    assert labels == ["0-6, 8-79\n(79 ranks)", "7"]


def test_slow_link_matrix(tmp_path):
    job = Job(4)
    for _ in range(10):
        for src, dst, ms in ((0, 1, 1.0), (1, 2, 1.0), (2, 3, 8.0)):
            job.send("0", src, dst, t_complete_ns=job._now + OP_STEP_NS + int(ms * 1e6))
            job.recv("0", dst, src, t_complete_ns=job._now + OP_STEP_NS + int(ms * 1e6))
    a = analyzers.load(job.write(tmp_path / "links"))
    ax = plots.slow_links(a).axes[0]
    grid = ax.get_images()[0].get_array()
    assert grid[2, 3] == pytest.approx(8.0) and grid[0, 1] == pytest.approx(1.0) and np.ma.is_masked(grid[3, 0])
    outlined = [p for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill()]
    assert [(p.get_xy()[1] + 0.5, p.get_xy()[0] + 0.5) for p in outlined] == [(2, 3)]


def test_missing_matplotlib_names_the_extra(monkeypatch, loaded):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(ImportError, match=r"flightrec\[notebook\]"):
        plots.timeline(loaded["compute_hang"])


def test_html_report_without_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    html = html_report.render_html(analyzers.load(GOLDEN / "crash"))
    assert "flightrec[notebook]" in html and "data:image/png" not in html
    assert "root cause: rank 1 — crashed [crashed]" in html


def test_html_report(tmp_path):
    page = tmp_path / "report.html"
    result = CliRunner().invoke(analyze_command, [str(GOLDEN / "compute_hang"), "--html", str(page)])
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert ">hang</span>" in html and "rank 2 never reached all_reduce #4 of group 0 [0-3] (world)" in html
    assert "root cause: rank 2 — never reached the op its peers wait in [not_entered]" in html
    assert "train.py&quot;, line 34, in stall_in_compute" in html  # its stack, as a traceback
    # a plot with nothing to show is named with why, never drawn as an empty panel
    assert html.count("data:image/png;base64,") == 4
    assert "not drawn: Slow links (no slow-link matrix: no completed, matched send/receive pairs" in html
    assert "http://" not in html and "https://" not in html and "<script" not in html  # self-contained

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (.ci/test installs it)")
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", "--window-size=1200,1600",
                    f"--screenshot={shot}", page.as_uri()],
                   check=True, timeout=90, capture_output=True)
    pixels = mimage.imread(shot)[..., :3]
    assert pixels.shape[:2] == (1600, 1200)
    badge = np.all(np.abs(pixels - np.array(ROOT_RED[:3])) < 0.03, axis=-1)
    assert badge.sum() > 500  # the verdict badge and the plots' red marks were painted
    assert pixels.std() > 0.05  # not a blank page
