"""Per-step bucket figures: RAGEN's gradient-analysis plots (improved) and the per-layer heatmap.

One analysis step of a run, seen through :class:`StepView`, gives the five files of RAGEN's plotting script
(``gradient_analysis/plot_gradient_analysis.py``): summary, gradient norms, losses, reward std and
normalised gradient norms by reward-variance bucket; then the bucket x layer-group heatmap (``layers.json``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib
import numpy as np
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure

from rlgrad import rundata as D
from rlgrad.viz.figbase import (
    COLORS,
    LOSS_TITLES,
    LOSS_UNITS,
    MISSING,
    NORM_UNIT,
    TITLES,
    UNDEFINED,
    annotate,
    auto_scale,
    finite,
    left_out,
    line_through_means,
    new_fig,
    note,
    value_labels,
)


class StepView:
    """One analysis step of a run: its metric row, buckets, and labels."""

    def __init__(self, run: D.RunData, step: int):
        self.run, self.step = run, step
        self.metrics = run.metrics(step)
        self.buckets = D.bucket_names(self.metrics)
        self.has_all = any(k.startswith(f"{D.PREFIX}/all/") for k in self.metrics)
        self.labels = [b.replace("_", " ") for b in self.buckets]

    def values(self, name: str, buckets: Sequence[str] | None = None) -> list[float]:
        return [D.bucket_value(self.metrics, b, name) for b in (buckets or self.buckets)]

    def all_value(self, name: str) -> float:
        return D.bucket_value(self.metrics, "all", name)

    def tick_labels(self) -> list[str]:
        out = []
        for b, lab in zip(self.buckets, self.labels):
            rv = D.bucket_value(self.metrics, b, "reward_std_mean")
            n = D.bucket_value(self.metrics, b, "group_rv_count")
            extra = f"\nstd {rv:.2g}" if math.isfinite(rv) else ""
            extra += f"\n{int(n)} group{'s' if n != 1 else ''}" if math.isfinite(n) else ""
            out.append(lab + extra)
        return out

    def title(self, what: str) -> str:
        return f"{what} — run {self.run.name}, step {self.step}"


def _bucket_bars(ax, sv: StepView, name: str, color: str, fmt: str = "%.3g") -> list[float]:
    """Bars per bucket, then the ``all`` bucket apart (grey, hatched) for reference."""
    vals = sv.values(name)
    x = np.arange(len(vals))
    bars = ax.bar(x, np.nan_to_num(vals), color=color, alpha=0.85, edgecolor="black", linewidth=0.8,
                  label="bucket")
    ax.bar_label(bars, labels=value_labels(vals, fmt), fontsize=7, padding=2)
    ticks, labels = list(x), sv.tick_labels()
    shown = list(vals)
    if sv.has_all:
        a = sv.all_value(name)
        xa = len(vals) + 0.6
        b = ax.bar([xa], [np.nan_to_num(a)], color=COLORS["all"], alpha=0.7, hatch="//", edgecolor="black",
                   linewidth=0.8, label="all (whole batch)")
        ax.bar_label(b, labels=value_labels([a], fmt), fontsize=7, padding=2)
        ax.axvline(len(vals) - 0.2, color="#999", linestyle=":", linewidth=1)
        ticks.append(xa)
        labels.append("all")
        shown.append(a)
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_xlabel("reward-variance bucket (1 = lowest in-group reward std)")
    ax.grid(axis="y", linestyle="--", alpha=0.5)
    ax.margins(y=0.15)
    if not any(v != 0 for v in finite(shown)):
        ax.text(0.5, 0.75, "all zero at this step", transform=ax.transAxes, ha="center", color="#555")
    return shown


def _pad(ax, shown: list[float]) -> None:
    """Room above and below the bars (either sign) for their value labels."""
    v = finite(shown) or [0.0]
    lo, hi = min(0.0, *v), max(0.0, *v)
    pad = 0.15 * (hi - lo) or 1.0
    ax.set_ylim(lo - (pad if lo < 0 else 0), hi + (pad if hi > 0 or lo == 0 else 0.35 * pad))


def _bucket_legend(fig: Figure, color: str = "white") -> None:
    """One legend for the figure: coloured bars are buckets, the grey hatched bar is the whole batch."""
    from matplotlib.patches import Patch

    fig.legend(handles=[Patch(facecolor=color, edgecolor="black",
                              label="reward-variance bucket (colour: term)"),
                        Patch(facecolor=COLORS["all"], hatch="//", edgecolor="black",
                              label="all (whole batch)")],
               loc="outside lower center", ncols=2, fontsize=8, frameon=False)


# ---------------------------------------------------------------- RAGEN's per-step files


def _terms(sv: StepView) -> tuple[list[str], list[str]]:
    """The loss terms a step's analysis measured (KL, entropy, task: RAGEN's panel order) and the regularisers it
    did not (their panels are left out, not drawn empty); the task term is always drawn."""
    present = [c for c in ("kl", "entropy", "task") if c == "task" or D.has_component(sv.metrics, c)]
    return present, [c for c in ("entropy", "kl") if c not in present]


def fig_grad_norms(sv: StepView) -> Figure:
    """gradient_analysis_plots_step_N: KL / entropy / task gradient norm per bucket."""
    comps, absent = _terms(sv)
    fig, axes = new_fig(1, len(comps), (max(10.0, 5.7 * len(comps) + 0.5), 5.2))
    for ax, comp in zip(axes[0], comps):
        ax.set_title(f"{TITLES[comp]} norm", fontweight="bold")
        ax.set_ylabel(f"gradient norm ({NORM_UNIT})")
        if not D.has_component(sv.metrics, comp):
            note(ax, MISSING.get(comp, "not logged"))
            ax.set_xticks([])
            continue
        shown = _bucket_bars(ax, sv, comp, COLORS[comp])
        if auto_scale(ax, shown) == "linear":
            _pad(ax, shown)
    fig.suptitle(sv.title("Gradient norm per loss component and reward-variance bucket") + left_out(absent),
                 fontsize=13)
    _bucket_legend(fig)
    return fig


def fig_losses(sv: StepView) -> Figure:
    """gradient_analysis_loss_plots_step_N: policy / entropy / KL / total loss per bucket."""
    terms = [t for t in D.LOSS_TERMS
             if t in ("policy", "total") or any(math.isfinite(v) for v in sv.values(f"loss/{t}"))]
    fig, axes = new_fig(2, 2, (15, 9)) if len(terms) == 4 else new_fig(1, len(terms), (6.5 * len(terms), 5.2))
    agg = D.config_get(sv.run, "actor.loss_agg_mode", None)
    for ax, term in zip(axes.flat, terms):
        ax.set_title(LOSS_TITLES[term], fontweight="bold")
        ax.set_ylabel(LOSS_UNITS[term] + (f", {agg}" if agg and term in ("policy", "total") else ""))
        if not any(math.isfinite(v) for v in sv.values(f"loss/{term}")):
            note(ax, MISSING.get(term, "not logged"))
            ax.set_xticks([])
            continue
        color = {"policy": "#8e44ad", "entropy": "#27ae60", "kl": "#2980b9", "total": "#c0392b"}[term]
        shown = _bucket_bars(ax, sv, f"loss/{term}", color, fmt="%.3g")
        _pad(ax, shown)
        ax.axhline(0, color="black", linewidth=0.6)
    fig.suptitle(sv.title("Per-component losses by reward-variance bucket")
                 + left_out([t for t in ("entropy", "kl") if t not in terms]), fontsize=13)
    _bucket_legend(fig)
    return fig


def fig_reward_std(sv: StepView) -> Figure:
    """gradient_analysis_reward_std_step_N: mean in-group reward std per bucket, min..max whiskers."""
    fig, axes = new_fig(1, 1, (10, 5))
    ax = axes[0, 0]
    mean, lo, hi = sv.values("reward_std_mean"), sv.values("reward_std_min"), sv.values("reward_std_max")
    x = np.arange(len(mean))
    mean0 = np.nan_to_num(mean)
    err = [np.maximum(0, mean0 - np.nan_to_num(lo, nan=0)), np.maximum(0, np.nan_to_num(hi, nan=0) - mean0)]
    bars = ax.bar(x, mean0, color=COLORS["rv"], alpha=0.85, edgecolor="black", linewidth=0.8,
                  label="bucket mean")
    ax.errorbar(x, mean0, yerr=err, fmt="none", ecolor="#2d3436", capsize=4, label="min .. max of groups")
    ax.bar_label(bars, fmt="%.3g", fontsize=8, padding=3)
    if sv.has_all and math.isfinite(sv.all_value("reward_std_mean")):
        ax.axhline(sv.all_value("reward_std_mean"), color=COLORS["all"], linestyle="--",
                   label=f"all (whole batch): {sv.all_value('reward_std_mean'):.3g}")
    ax.set_xticks(x, sv.tick_labels(), fontsize=8)
    ax.set_xlabel("reward-variance bucket (1 = lowest)")
    ax.set_ylabel("in-group reward std (reward units)")
    scale = auto_scale(ax, [*mean, *finite(hi)])
    if not any(v > 0 for v in finite(mean)):
        note(ax, "every group has zero reward std:\nall samples of a prompt got the same reward")
    ax.set_title(sv.title("Reward std by bucket") + (" (log axis)" if scale != "linear" else ""), fontsize=12)
    ax.grid(axis="y", linestyle="--", alpha=0.5)
    ax.legend(fontsize=8)
    return fig


def fig_normed(sv: StepView) -> Figure:
    """gradient_analysis_normed_grads_step_N: gradient norm per sample and per token, per component."""
    comps, absent = _terms(sv)
    fig, axes = new_fig(1, len(comps), (max(10.0, 5.7 * len(comps) + 0.5), 5.2))
    for ax, comp in zip(axes[0], comps):
        ax.set_title(f"{TITLES[comp]}: norm per sample vs per token", fontweight="bold", fontsize=11)
        ax.set_ylabel("gradient norm / sample count, / token count")
        if not D.has_component(sv.metrics, comp):
            note(ax, MISSING.get(comp, "not logged"))
            ax.set_xticks([])
            continue
        names = [*sv.buckets, *(["all"] if sv.has_all else [])]
        ps, pt = sv.values(f"per_sample/{comp}", names), sv.values(f"per_token/{comp}", names)
        x, w = np.arange(len(names)), 0.38
        # values: the metrics JSON
        for shift, vals, color, label in ((-w / 2, ps, "#16a085", "per sample"), (w / 2, pt, "#f39c12", "per token")):
            bars = ax.bar(x + shift, np.nan_to_num(vals), w, color=color, label=label)
            # a missing value says so; a present one needs no label (the axis reads it)
            ax.bar_label(bars, labels=["" if lab != "n/a" else lab for lab in value_labels(vals)], fontsize=7)
        labels = [n.replace("_", " ") for n in names]
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_xlabel("reward-variance bucket (1 = lowest); last: all")
        ax.grid(axis="y", linestyle="--", alpha=0.5)
        if not any(v != 0 for v in finite([*ps, *pt])):
            ax.text(0.5, 0.75, "all zero at this step", transform=ax.transAxes, ha="center", color="#555")
        if auto_scale(ax, [*ps, *pt]) != "linear":
            ax.set_title(f"{TITLES[comp]}: per sample vs per token (log)", fontweight="bold", fontsize=11)
        ax.legend(fontsize=8)
    fig.suptitle(sv.title("Normalised gradient norms") + left_out(absent), fontsize=13)
    return fig


def _rv_table_consistent(sv: StepView, table: list[tuple[str, int, float]]) -> dict[str, list[float]] | None:
    """Group reward stds per bucket, if they agree with the logged min/max (RAGEN's plotting script checks
    the same)."""
    per = {b: [sd for bk, _, sd in table if bk == b] for b in sv.buckets}
    for b, vals in per.items():
        if not vals:
            return None
        if abs(min(vals) - D.bucket_value(sv.metrics, b, "reward_std_min", 0)) > 1e-3 or \
                abs(max(vals) - D.bucket_value(sv.metrics, b, "reward_std_max", 0)) > 1e-3:
            return None
    return per


def _summary_rv_panel(ax, sv: StepView, rv: list[float]) -> None:
    """(a) RV per bucket: box plot of the group stds when the table agrees with the logged min/max."""
    per = _rv_table_consistent(sv, D.rv_table(sv.run, sv.step))
    x = np.arange(1, len(sv.buckets) + 1)
    if per is not None:
        ax.boxplot([per[b] for b in sv.buckets], positions=x, showfliers=False, widths=0.5)
        for i, b in enumerate(sv.buckets):
            jitter = np.linspace(-0.12, 0.12, len(per[b])) if len(per[b]) > 1 else [0.0]
            ax.plot(x[i] + np.asarray(jitter), per[b], ".", color=COLORS["rv"], alpha=0.7, markersize=4)
        ax.set_title("(a) Reward std by bucket (box: groups)", fontweight="bold", fontsize=11)
        auto_scale(ax, [v for b in sv.buckets for v in per[b]])
    else:
        lo, hi = sv.values("reward_std_min"), sv.values("reward_std_max")
        rv0 = np.nan_to_num(rv)
        err = [np.maximum(0, rv0 - np.nan_to_num(lo)), np.maximum(0, np.nan_to_num(hi) - rv0)]
        ax.errorbar(x, rv0, yerr=err, fmt="o-", color="#6c5ce7", ecolor="#2d3436", capsize=4,
                    label="mean, min..max")
        ax.set_title("(a) Reward std by bucket (mean, min..max)", fontweight="bold", fontsize=11)
        auto_scale(ax, [*rv, *hi])
        ax.legend(fontsize=8)
    ax.set_xticks(x, sv.labels, fontsize=8)
    ax.set_xlabel("reward-variance bucket")
    ax.set_ylabel("in-group reward std (reward units)")
    ax.grid(axis="y", linestyle="--", alpha=0.5)


def _vs_rv(ax, rv: list[float], y: list[float], color: str, label: str) -> None:
    """``y`` against the bucket mean reward std, each point labelled Q<bucket>. Buckets of one reward std (RAGEN's
    quantiles over many zero-variance groups) are drawn as points with one label, and the line runs through their
    mean: a line joining them in bucket order would zigzag up and down a vertical."""
    pts = [(xv, yv, i) for i, (xv, yv) in enumerate(zip(rv, y), start=1) if math.isfinite(xv) and math.isfinite(yv)]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", color=color, label=label)
    line = line_through_means(rv, y)
    if len(line[0]) > 1:
        ax.plot(*line, "-", color=color)
    at: dict[tuple[str, str], list[tuple[float, float, int]]] = {}  # (near-)coincident points get one label
    for p in sorted(pts):
        at.setdefault((f"{p[0]:.3g}", f"{p[1]:.2g}"), []).append(p)
    for g in at.values():
        ids = [p[2] for p in g]
        names = f"Q{ids[0]}" if len(ids) == 1 else f"Q{ids[0]}–Q{ids[-1]}" if ids == list(
            range(ids[0], ids[-1] + 1)) else ",".join(f"Q{i}" for i in ids)
        ax.annotate(names, g[0][:2], textcoords="offset points", xytext=(4, 4), fontsize=7)


def _summary_task_panel(ax, sv: StepView, rv: list[float], task: list[float]) -> None:
    """(b) task gradient norm vs RV mean, the ``all`` bucket as a distinct point."""
    _vs_rv(ax, rv, task, COLORS["task"], "bucket (Q1 = lowest reward std)")
    if sv.has_all:
        ax.plot([sv.all_value("reward_std_mean")], [sv.all_value("task")], "*", color="black", markersize=12,
                label="all (whole batch)")
    ax.set_title("(b) Task gradient norm vs reward std", fontweight="bold", fontsize=11)
    ax.set_xlabel("bucket mean in-group reward std (reward units)")
    ax.set_ylabel(f"task gradient norm ({NORM_UNIT})")
    auto_scale(ax, rv, axis="x")
    ax.grid(linestyle="--", alpha=0.5)
    ax.legend(fontsize=8)


def _summary_reg_panel(ax, sv: StepView, rv: list[float], task: list[float]) -> None:
    """(c) regulariser (KL + entropy) vs RV mean; the axis follows the data (RAGEN's plot fixes [0, 1])."""
    ax.set_title("(c) Regulariser (KL + entropy) gradient vs reward std", fontweight="bold", fontsize=11)
    ax.set_xlabel("bucket mean in-group reward std (reward units)")
    ax.set_ylabel(f"gradient norm ({NORM_UNIT})")
    present = [c for c in ("kl", "entropy") if D.has_component(sv.metrics, c)]
    if not present:
        note(ax, "no regulariser in this run\n(actor.entropy_coeff = 0, actor.use_kl_loss = false)")
    else:
        reg = np.sum([np.nan_to_num(sv.values(c)) for c in present], axis=0)
        _vs_rv(ax, rv, list(reg), COLORS["reg"], " + ".join(present).replace("kl", "KL"))
        if len(present) == 2:
            for c in present:
                ax.plot(rv, sv.values(c), "--", color=COLORS[c], alpha=0.8,
                        label=f"{'KL' if c == 'kl' else c} alone")
        top = max(finite(list(reg)) or [0.0])
        ax.set_ylim(0, top * 1.2 if top > 0 else 1.0)
        task_top = max(finite(task) or [0.0])
        if top > 0 and task_top > 0:
            ax.text(0.02, 0.97,
                    f"largest task norm {task_top:.3g} = {task_top / top:.3g}× largest regulariser norm",
                    transform=ax.transAxes, va="top", fontsize=7, color="#555")
        auto_scale(ax, rv, axis="x")
        ax.legend(fontsize=8)
    ax.grid(linestyle="--", alpha=0.5)


def fig_summary(sv: StepView) -> Figure:
    """gradient_analysis_summary_step_N: RV by bucket; task and regulariser gradient norm vs RV mean."""
    _, absent = _terms(sv)
    reg = len(absent) < 2  # panel (c) only when a regulariser was measured
    fig, axes = new_fig(1, 3 if reg else 2, (17 if reg else 12, 5.2))
    rv, task = sv.values("reward_std_mean"), sv.values("task")
    _summary_rv_panel(axes[0, 0], sv, rv)
    _summary_task_panel(axes[0, 1], sv, rv, task)
    if reg:
        _summary_reg_panel(axes[0, 2], sv, rv, task)
    fig.suptitle(sv.title("Gradient summary") + ("" if reg else left_out(absent)), fontsize=13)
    return fig


# ---------------------------------------------------------------- beyond RAGEN's plots


def fig_layers(sv: StepView, component: str = "task") -> Figure | None:
    """Bucket x layer-group gradient norm (layers.json): where in the network each bucket's gradient lives."""
    norms = D.layer_norms(sv.run, sv.step, component)
    if not norms:
        return None
    rows = [b for b in [*sv.buckets, "all"] if b in norms] or sorted(norms)
    cols = sorted({g for b in rows for g in norms[b]}, key=D.layer_sort_key)
    mat = np.array([[norms[b].get(g, np.nan) for g in cols] for b in rows], dtype=float)
    sq = np.nan_to_num(mat) ** 2
    total = sq.sum(1, keepdims=True)
    # a bucket whose gradient is zero everywhere has no shares: its row is n/a (grey), never 0%
    share = np.where(total > 0, sq / np.where(total > 0, total, 1.0), np.nan)
    fig, axes = new_fig(1, 2, (max(10, 1.1 * len(cols) * 2 + 4), 0.55 * len(rows) + 2.6))
    pos = mat[np.isfinite(mat) & (mat > 0)]
    if pos.size and pos.max() > pos.min():
        norm = LogNorm(pos.min(), pos.max())
    else:
        norm = Normalize(0, max(1e-12, pos.max() if pos.size else 1))
    masked = np.ma.masked_where(~np.isfinite(mat) | (mat <= 0), mat)
    norm_label = f"{component} gradient norm (L2 over the group's parameters)"
    for ax, data, nm, cmap, label, fmt in (
            (axes[0, 0], masked, norm, "viridis", norm_label, "{:.2g}"),
            (axes[0, 1], np.ma.masked_invalid(share), Normalize(0, 1), "magma", "share of the bucket's squared norm",
             "{:.0%}")):
        cm = matplotlib.colormaps[cmap].with_extremes(bad="#dddddd")
        im = ax.imshow(data, aspect="auto", cmap=cm, norm=nm)
        ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(rows)), [r.replace("_", " ") for r in rows], fontsize=8)
        ax.set_xlabel("layer group (input → output)")
        ax.set_ylabel("reward-variance bucket")
        fig.colorbar(im, ax=ax, label=label, shrink=0.9)
        if len(cols) * len(rows) <= 160:
            annotate(ax, im, mat if data is masked else share, fmt,
                     missing="n/a (not measured)" if data is masked else UNDEFINED)
    axes[0, 0].set_title(f"{component} gradient norm per layer group", fontweight="bold", fontsize=11)
    zero_rows = [r.replace("_", " ") for r, t in zip(rows, total[:, 0]) if t <= 0]
    axes[0, 1].set_title("share per layer group (each row sums to 100%)"
                         + (f"\nn/a (grey): {', '.join(zero_rows)}, zero gradient" if zero_rows else ""),
                         fontweight="bold", fontsize=11)
    fig.suptitle(sv.title("Per-layer gradient by bucket"), fontsize=13)
    return fig
