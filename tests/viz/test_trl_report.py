"""Issue 48, the TRL run's report: TRL's own loss in the Losses panel, y-axis labels that fit their panels, every
term the Terms section uses defined there, and the metric catalogue linked relative to the report."""

from __future__ import annotations

import html
import json
import math
import os
import re
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg

from rlgrad import rundata as D
from rlgrad.cli import main
from rlgrad.viz import run_figures as RF
from rlgrad.viz.figbase import png_bytes
from rlgrad.viz.terms import CATALOGUE_DOC, TERMS
from tests.conftest import REPO

TRL_RUN = REPO / "tests" / "data" / "doctor" / "trl_too_easy"  # a TRL output directory: trainer_state.json


def test_the_losses_panel_draws_trls_own_loss():
    run = D.load_any(TRL_RUN)
    steps, loss = D.series(run, "actor/loss")
    assert steps == list(range(1, 25)) and loss[0] == 0.0  # TRL's "loss", step by step (its last entry: no step loss)
    losses = next(ax for ax in RF.fig_training_curves(run).axes if ax.get_title() == "Losses")
    (line,) = losses.get_lines()
    assert line.get_label() == "loss (the host trainer's: TRL's)"
    assert list(line.get_xdata()) == steps and list(line.get_ydata()) == loss


def _component_run(tmp_path: Path) -> D.RunData:
    rows = {s: {"grad_sim/correctness__format": c, "grad_comp/correctness/norm": 1.0, "grad_comp/format/norm": 0.5,
                "grad_comp/correctness/share": 0.7, "grad_comp/format/share": 0.3, "grad_comp/total/norm": 1.0,
                "critic/score/mean": 0.5, "rollout/accuracy": 0.4, "actor/pg_loss": 0.1, "actor/grad_norm": 1.0}
            for s, c in ((1, -0.4), (51, 0.2))}
    return D.RunData("r", "r", rows, run_dir=tmp_path)


def test_every_y_label_fits_along_its_panel(tmp_path):
    """The share panel's label ("⟨g_c, g⟩ / |g|²: a share in 0-1, ...") ran off both ends of its panel; a label
    taller than its axes is wrapped onto lines that fit."""
    run = _component_run(tmp_path)
    trend = RF.fig_component_trend(run)
    for fig in (trend, RF.fig_training_curves(run)):
        png_bytes(fig, dpi=100)
        renderer = (fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)).get_renderer()
        fig.draw(renderer)
        for ax in fig.axes:
            if ax.get_visible() and ax.yaxis.label.get_text():
                label = ax.yaxis.label.get_window_extent(renderer)
                assert label.height <= ax.get_window_extent(renderer).height, ax.yaxis.label.get_text()
                assert 0 <= label.y0 and label.y1 <= fig.bbox.height
    # the trend figure as png_bytes left it above (a second one drawn at 150 dpi took 1.5 s)
    share = next(ax for ax in trend.axes if ax.get_title() == "Each component's share of the update")
    assert "\n" in share.get_ylabel()  # wrapped, every word kept in order
    assert share.get_ylabel().split() == "⟨g_c, g⟩ / |g|²: a share in 0-1, a signed contribution outside".split()


def test_terms_define_shared_std_and_link_the_catalogue_relative_to_the_report(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = _component_run(run_dir).rows
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": m}) + "\n" for s, m in rows.items()))
    out = tmp_path / "elsewhere" / "report.html"
    out.parent.mkdir()
    assert main(["report", str(run_dir), "--output", str(out), "--dpi", "30"]) == 0
    page = html.unescape(out.read_text())
    terms = page[page.index('<section id="terms">'):]
    assert "shared_std" in terms and f"<dt id=\"term-shared-std\">shared_std</dt><dd>{TERMS['shared-std'].definition}" \
        in terms
    href = re.search(r'<a href="([^"]+)">' + re.escape(CATALOGUE_DOC), terms)[1]
    assert not href.startswith("file:") and not os.path.isabs(href)
    assert href == os.path.relpath(REPO / CATALOGUE_DOC, out.parent)
    assert (out.parent / href).resolve() == (REPO / CATALOGUE_DOC).resolve()


def test_measurements_far_apart_are_points_not_a_line(tmp_path):
    """The TRL run's two analysis steps, 1 and 51, were joined by a straight line across 50 steps never measured;
    steps 1, 6 and 11 (5 apart) still make a line."""
    run = _component_run(tmp_path)  # component analyses at steps 1 and 51
    cosine = next(ax for ax in RF.fig_component_trend(run).axes if ax.get_title().startswith("Which components"))
    (line,) = cosine.get_lines()[:1]
    xs, ys = list(line.get_xdata()), list(line.get_ydata())
    assert xs == [1, 26, 51] and ys[0] == -0.4 and ys[2] == 0.2 and math.isnan(ys[1])  # broken, both points marked
    assert line.get_marker() == "o"
    near = D.RunData("r", "r", {s: {**m} for s, m in zip((1, 6, 11), [run.rows[1], run.rows[51], run.rows[51]])},
                     run_dir=tmp_path)
    (line,) = next(ax for ax in RF.fig_component_trend(near).axes
                   if ax.get_title().startswith("Which components")).get_lines()[:1]
    assert list(line.get_xdata()) == [1, 6, 11] and not any(map(math.isnan, line.get_ydata()))
    curves = next(ax for ax in RF.fig_training_curves(run).axes if ax.get_title() == "Reward")
    assert all(math.isnan(y) for y in curves.get_lines()[0].get_ydata()[1:2])
