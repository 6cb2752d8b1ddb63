"""What every figure shares: the Agg backend, colours and labels, PNG export, axis scaling, small helpers.

Every figure function (``bucket_figures``, ``run_figures``) takes data from ``rlgrad.rundata`` and returns
a ``matplotlib.figure.Figure`` built without pyplot (no global state, no display needed; PNG through the
Agg canvas). Conventions: bucket_1 is the lowest reward variance; the ``all`` bucket (the whole batch) is
drawn apart, in grey, for reference; an axis whose positive data span more than ~1.5 decades goes
logarithmic (symlog when zeros are present).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # before anything touches a canvas; plotting never needs a display

import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

COLORS = {"task": "#e74c3c", "entropy": "#2ecc71", "kl": "#3498db", "reg": "#16a085", "rv": "#f39c12",
          "all": "#7f8c8d"}
TITLES = {"task": "Task (policy) gradient", "entropy": "Entropy gradient", "kl": "KL gradient"}
LOSS_TITLES = {"policy": "Policy (task) loss", "entropy": "Entropy (mean per token)",
               "kl": "KL to reference (mean per token)", "total": "Total loss"}
LOSS_UNITS = {"policy": "loss (advantage-weighted ratio)", "entropy": "entropy (nats / token)",
              "kl": "KL (nats / token)", "total": "loss (dimensionless)"}
NORM_UNIT = "L2 norm over all parameters"
MISSING = {"entropy": "not computed in this run\n(actor.entropy_coeff = 0)",
           "kl": "not computed in this run\n(actor.use_kl_loss = false)"}
WHY_ABSENT = {"entropy": "entropy (actor.entropy_coeff = 0)", "kl": "KL (actor.use_kl_loss = false)"}


JOIN_GAP = 10  # steps: two measurements farther apart are drawn as points, not joined


def plot_steps(ax, steps: Sequence[int], values: Sequence[float], style: str = "o-", **kw) -> list:
    """A metric over training steps: a line joins two measurements at most ``JOIN_GAP`` steps apart; farther apart
    (analysis steps 1 and 51) they stay points, with markers, since a line across the gap would draw values for
    steps never measured."""
    xs: list[float] = []
    ys: list[float] = []
    for i, (step, value) in enumerate(zip(steps, values)):
        if i and step - steps[i - 1] > JOIN_GAP:
            xs.append((step + steps[i - 1]) / 2)
            ys.append(math.nan)  # the line breaks here
        xs.append(step)
        ys.append(value)
    if len(xs) > len(steps) and "o" not in style:
        style = "o" + style
    return ax.plot(xs, ys, style, **kw)


def line_through_means(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """A line's points by increasing x, the y of points that share an x (to 3 digits) averaged: buckets of one
    reward std joined in bucket order would zigzag up and down a vertical."""
    at: dict[str, list[tuple[float, float]]] = {}
    for x, y in sorted((x, y) for x, y in zip(xs, ys) if math.isfinite(x) and math.isfinite(y)):
        at.setdefault(f"{x:.3g}", []).append((x, y))
    pts = [(g[0][0], sum(y for _, y in g) / len(g)) for g in at.values()]
    return [p[0] for p in pts], [p[1] for p in pts]


def points_by_x(ax, xs: Sequence[float], ys: Sequence[float], color, **line_kw) -> None:
    """Points joined by a line in x order, buckets that share an x (to 3 digits: RAGEN's quantiles over many
    zero-variance groups) drawn as one point at their mean y with a bar over their range and "×k", so no stack of
    unconnected dots sits on one vertical."""
    mx, my = line_through_means(xs, ys)
    spans: dict[str, list[float]] = {}
    for x, y in zip(xs, ys):
        if math.isfinite(x) and math.isfinite(y):
            spans.setdefault(f"{x:.3g}", []).append(y)
    groups = list(spans.values())  # in the same (x) order as line_through_means' points
    ax.plot(mx, my, "o-" if len(mx) > 1 else "o", color=color, markersize=5, **line_kw)
    for x, y, g in zip(mx, my, groups):
        if len(g) > 1:
            ax.vlines(x, min(g), max(g), color=color, linewidth=1.5, gid="shared_x_range")
            ax.annotate(f"×{len(g)}", (x, y), textcoords="offset points", xytext=(5, -10), fontsize=7, color=color)


def value_labels(values: Sequence[float], fmt: str = "%.3g") -> list[str]:
    """Bar labels: each value in ``fmt``, a missing one (NaN: not logged for this bar) "n/a", never a 0."""
    return [fmt % v if v is not None and math.isfinite(v) else "n/a" for v in values]


def left_out(terms: Sequence[str]) -> str:
    """A title's second line naming the panels a figure leaves out because the run never computed them."""
    return ("\nnot drawn, not computed in this run: " + ", ".join(WHY_ABSENT.get(t, t) for t in terms)
            if terms else "")


def png_bytes(fig: Figure, dpi: int = 150) -> bytes:
    fit_ylabels(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")  # constrained layout already fits the text
    return buf.getvalue()


def fit_ylabels(fig: Figure) -> None:
    """Wrap each y-axis label taller than its axes onto as many lines as it needs to fit along them (a long unit
    on a short panel ran off both ends of the figure); constrained layout then makes room beside it."""
    import textwrap

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    height = fig.get_figheight() * 72  # points
    if not any(len(ax.get_ylabel()) * 0.6 * ax.yaxis.label.get_fontsize() > 0.7 * ax.get_position().height * height
               for ax in fig.axes):  # no label near its axes' length (a character is ~0.6 em): no layout to measure
        return
    renderer = canvas.get_renderer()
    fig.draw(renderer)  # the layout the labels are measured against
    for ax in fig.axes:
        label = ax.yaxis.label
        text = label.get_text()
        if not text or not ax.get_visible():
            continue
        room = ax.get_window_extent(renderer).height
        need = label.get_window_extent(renderer).height
        if need > room > 0:
            lines = math.ceil(need / (0.95 * room))
            label.set_text("\n".join(textwrap.wrap(text.replace("\n", " "), math.ceil(len(text) / lines))))


def new_fig(nrows: int, ncols: int, size: tuple[float, float], **kw) -> tuple[Figure, np.ndarray]:
    """A constrained-layout figure and its axes as a 2-D array (``squeeze=False``)."""
    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def auto_scale(ax, values: Sequence[float], axis: str = "y", decades: float = 1.5) -> str:
    """Log (or symlog, with zeros) when non-negative data span more than ``decades`` decades."""
    v = finite(values)
    pos = [x for x in v if x > 0]
    if not v or min(v) < 0 or len(pos) < 2 or math.log10(max(pos) / min(pos)) < decades:
        return "linear"
    setter = ax.set_yscale if axis == "y" else ax.set_xscale
    if len(pos) == len(v):
        setter("log")
        return "log"
    setter("symlog", linthresh=min(pos))
    return "symlog"


def note(ax, text: str, y: float = 0.5) -> None:
    """A boxed message across an axis (why a panel, or part of it, is empty)."""
    ax.text(0.5, y, text, transform=ax.transAxes, ha="center", va="center", fontsize=10, color="#555",
            bbox={"boxstyle": "round", "fc": "#f4f4f4", "ec": "#bbb"})


UNDEFINED = "n/a (zero gradient)"  # how figures, report and console show a cosine or share a zero gradient lacks
BAD_CELL = "#d0d0d0"  # the colour of such a cell in a heatmap (never a colour of the scale)


def annotate(ax, im, values: np.ndarray, fmt: str, missing: str | None = None) -> None:
    """Write each cell's value in black or white, whichever reads on the cell's colour; a non-finite cell gets
    ``missing`` (when given) instead of a number."""
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            v = values[i, j]
            if not math.isfinite(v):
                if missing:
                    ax.text(j, i, missing.replace(" (", "\n("), ha="center", va="center", fontsize=6, color="#333")
                continue
            if v <= 0 and isinstance(im.norm, LogNorm):
                rgb = (0.87, 0.87, 0.87)
            else:
                rgb = im.cmap(im.norm(v))[:3]
            light = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 0.55
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=7,
                    color="black" if light else "white")
