"""Figures: the seed's per-step gradient-analysis plots (improved), the multi-step grid, run-level curves.

Every function takes data from ``rlgrad.viz.data`` and returns a ``matplotlib.figure.Figure`` built
without pyplot (no global state, no display needed; PNG through the Agg canvas). Conventions: bucket_1 is
the lowest reward variance; the ``all`` bucket (the whole batch) is drawn apart, in grey, for reference;
an axis whose positive data span more than ~1.5 decades goes logarithmic (symlog when zeros are present).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # before anything touches a canvas; plotting never needs a display

import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm, Normalize, TwoSlopeNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from rlgrad.viz import data as D  # noqa: E402

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


def png_bytes(fig: Figure, dpi: int = 150) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")  # constrained layout already fits the text
    return buf.getvalue()


def _fig(nrows: int, ncols: int, size: tuple[float, float], **kw) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def auto_scale(ax, values: Sequence[float], axis: str = "y", decades: float = 1.5) -> str:
    """Log (or symlog, with zeros) when non-negative data span more than ``decades`` decades."""
    v = _finite(values)
    pos = [x for x in v if x > 0]
    if not v or min(v) < 0 or len(pos) < 2 or math.log10(max(pos) / min(pos)) < decades:
        return "linear"
    setter = ax.set_yscale if axis == "y" else ax.set_xscale
    if len(pos) == len(v):
        setter("log")
        return "log"
    setter("symlog", linthresh=min(pos))
    return "symlog"


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=10, color="#555",
            bbox={"boxstyle": "round", "fc": "#f4f4f4", "ec": "#bbb"})


class StepView:
    """One analysis step of a run: its metric row, buckets, and labels."""

    def __init__(self, run: D.RunData, step: int):
        self.run, self.step = run, step
        self.m = run.metrics(step)
        self.buckets = D.bucket_names(self.m)
        self.has_all = any(k.startswith(f"{D.PREFIX}/all/") for k in self.m)
        self.labels = [b.replace("_", " ") for b in self.buckets]

    def values(self, name: str, buckets: Sequence[str] | None = None) -> list[float]:
        return [D.bucket_value(self.m, b, name) for b in (buckets or self.buckets)]

    def all_value(self, name: str) -> float:
        return D.bucket_value(self.m, "all", name)

    def tick_labels(self) -> list[str]:
        out = []
        for b, lab in zip(self.buckets, self.labels):
            rv, n = D.bucket_value(self.m, b, "reward_std_mean"), D.bucket_value(self.m, b, "group_rv_count")
            extra = f"\nRV {rv:.2g}" if math.isfinite(rv) else ""
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
    ax.bar_label(bars, fmt=fmt, fontsize=7, padding=2)
    ticks, labels = list(x), sv.tick_labels()
    shown = list(vals)
    if sv.has_all:
        a = sv.all_value(name)
        xa = len(vals) + 0.6
        b = ax.bar([xa], [np.nan_to_num(a)], color=COLORS["all"], alpha=0.7, hatch="//", edgecolor="black",
                   linewidth=0.8, label="all (whole batch)")
        ax.bar_label(b, fmt=fmt, fontsize=7, padding=2)
        ax.axvline(len(vals) - 0.2, color="#999", linestyle=":", linewidth=1)
        ticks.append(xa)
        labels.append("all")
        shown.append(a)
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_xlabel("reward-variance bucket (1 = lowest in-group reward std)")
    ax.grid(axis="y", linestyle="--", alpha=0.5)
    ax.margins(y=0.15)
    if not any(v != 0 for v in _finite(shown)):
        ax.text(0.5, 0.75, "all zero at this step", transform=ax.transAxes, ha="center", color="#555")
    return shown


def _pad(ax, shown: list[float]) -> None:
    """Room above and below the bars (either sign) for their value labels."""
    v = _finite(shown) or [0.0]
    lo, hi = min(0.0, *v), max(0.0, *v)
    pad = 0.15 * (hi - lo) or 1.0
    ax.set_ylim(lo - (pad if lo < 0 else 0), hi + (pad if hi > 0 or lo == 0 else 0.35 * pad))


def _bucket_legend(fig: Figure, color: str = "white") -> None:
    """One legend for the figure: coloured bars are buckets, the grey hatched bar is the whole batch."""
    from matplotlib.patches import Patch

    fig.legend(handles=[Patch(facecolor=color, edgecolor="black", label="reward-variance bucket (colour: term)"),
                        Patch(facecolor=COLORS["all"], hatch="//", edgecolor="black", label="all (whole batch)")],
               loc="outside lower center", ncols=2, fontsize=8, frameon=False)


# ---------------------------------------------------------------- the seed's per-step files


def fig_grad_norms(sv: StepView) -> Figure:
    """gradient_analysis_plots_step_N: KL / entropy / task gradient norm per bucket."""
    fig, axes = _fig(1, 3, (17, 5.2))
    for ax, comp in zip(axes[0], ("kl", "entropy", "task")):
        ax.set_title(f"{TITLES[comp]} norm", fontweight="bold")
        ax.set_ylabel(f"gradient norm ({NORM_UNIT})")
        if not D.has_component(sv.m, comp):
            _note(ax, MISSING.get(comp, "not logged"))
            ax.set_xticks([])
            continue
        shown = _bucket_bars(ax, sv, comp, COLORS[comp])
        if auto_scale(ax, shown) == "linear":
            _pad(ax, shown)
    fig.suptitle(sv.title("Gradient norm per loss component and reward-variance bucket"), fontsize=13)
    _bucket_legend(fig)
    return fig


def fig_losses(sv: StepView) -> Figure:
    """gradient_analysis_loss_plots_step_N: policy / entropy / KL / total loss per bucket."""
    fig, axes = _fig(2, 2, (15, 9))
    agg = D.config_get(sv.run, "actor.loss_agg_mode", None)
    for ax, term in zip(axes.flat, D.LOSS_TERMS):
        ax.set_title(LOSS_TITLES[term], fontweight="bold")
        ax.set_ylabel(LOSS_UNITS[term] + (f", {agg}" if agg and term in ("policy", "total") else ""))
        if not any(math.isfinite(v) for v in sv.values(f"loss/{term}")):
            _note(ax, MISSING.get(term, "not logged"))
            ax.set_xticks([])
            continue
        shown = _bucket_bars(ax, sv, f"loss/{term}", {"policy": "#8e44ad", "entropy": "#27ae60", "kl": "#2980b9",
                                                      "total": "#c0392b"}[term], fmt="%.3g")
        _pad(ax, shown)
        ax.axhline(0, color="black", linewidth=0.6)
    fig.suptitle(sv.title("Per-component losses by reward-variance bucket"), fontsize=13)
    _bucket_legend(fig)
    return fig


def fig_reward_std(sv: StepView) -> Figure:
    """gradient_analysis_reward_std_step_N: mean in-group reward std per bucket, min..max whiskers."""
    fig, axes = _fig(1, 1, (10, 5))
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
    scale = auto_scale(ax, [*mean, *_finite(hi)])
    if not any(v > 0 for v in _finite(mean)):
        _note(ax, "every group has zero reward std:\nall samples of a prompt got the same reward")
    ax.set_title(sv.title("Reward std by bucket") + (" (log axis)" if scale != "linear" else ""), fontsize=12)
    ax.grid(axis="y", linestyle="--", alpha=0.5)
    ax.legend(fontsize=8)
    return fig


def fig_normed(sv: StepView) -> Figure:
    """gradient_analysis_normed_grads_step_N: gradient norm per sample and per token, per component."""
    fig, axes = _fig(1, 3, (17, 5.2))
    for ax, comp in zip(axes[0], ("kl", "entropy", "task")):
        ax.set_title(f"{TITLES[comp]}: norm per sample vs per token", fontweight="bold", fontsize=11)
        ax.set_ylabel("gradient norm / sample count, / token count")
        if not D.has_component(sv.m, comp):
            _note(ax, MISSING.get(comp, "not logged"))
            ax.set_xticks([])
            continue
        names = [*sv.buckets, *(["all"] if sv.has_all else [])]
        ps, pt = sv.values(f"per_sample/{comp}", names), sv.values(f"per_token/{comp}", names)
        x, w = np.arange(len(names)), 0.38
        ax.bar(x - w / 2, np.nan_to_num(ps), w, color="#16a085", label="per sample")  # values: the metrics JSON
        ax.bar(x + w / 2, np.nan_to_num(pt), w, color="#f39c12", label="per token")
        labels = [n.replace("_", " ") for n in names]
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_xlabel("reward-variance bucket (1 = lowest); last: all")
        ax.grid(axis="y", linestyle="--", alpha=0.5)
        if not any(v != 0 for v in _finite([*ps, *pt])):
            ax.text(0.5, 0.75, "all zero at this step", transform=ax.transAxes, ha="center", color="#555")
        if auto_scale(ax, [*ps, *pt]) != "linear":
            ax.set_title(f"{TITLES[comp]}: per sample vs per token (log)", fontweight="bold", fontsize=11)
        ax.legend(fontsize=8)
    fig.suptitle(sv.title("Normalised gradient norms"), fontsize=13)
    return fig


def _rv_table_consistent(sv: StepView, table: list[tuple[str, int, float]]) -> dict[str, list[float]] | None:
    """Group reward stds per bucket, if they agree with the logged min/max (the seed's sanity check)."""
    per = {b: [sd for bk, _, sd in table if bk == b] for b in sv.buckets}
    for b, vals in per.items():
        if not vals:
            return None
        if abs(min(vals) - D.bucket_value(sv.m, b, "reward_std_min", 0)) > 1e-3 or \
                abs(max(vals) - D.bucket_value(sv.m, b, "reward_std_max", 0)) > 1e-3:
            return None
    return per


def fig_summary(sv: StepView) -> Figure:
    """gradient_analysis_summary_step_N: RV by bucket; task and regulariser gradient norm vs RV mean."""
    fig, axes = _fig(1, 3, (17, 5.2))
    rv = sv.values("reward_std_mean")
    # (a) RV per bucket: box plot of the group stds when the table agrees with the logged min/max
    ax = axes[0, 0]
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

    # (b) task gradient norm vs RV mean, the `all` bucket as a distinct point
    def _vs_rv(ax, y: list[float], color: str, label: str) -> None:
        ax.plot(rv, y, "o-", color=color, label=label)
        at: dict[tuple[float, float], list[str]] = {}  # buckets drawn on the same point share one label
        for i, (xv, yv) in enumerate(zip(rv, y), start=1):
            if math.isfinite(xv) and math.isfinite(yv):
                at.setdefault((f"{xv:.2g}", f"{yv:.2g}"), []).append(f"Q{i}")  # (near-)coincident points
        for names in at.values():
            i = int(names[0][1:]) - 1
            ax.annotate(",".join(names), (rv[i], y[i]), textcoords="offset points", xytext=(4, 4), fontsize=7)

    ax = axes[0, 1]
    task = sv.values("task")
    _vs_rv(ax, task, COLORS["task"], "bucket (Q1 = lowest RV)")
    if sv.has_all:
        ax.plot([sv.all_value("reward_std_mean")], [sv.all_value("task")], "*", color="black", markersize=12,
                label="all (whole batch)")
    ax.set_title("(b) Task gradient norm vs reward std", fontweight="bold", fontsize=11)
    ax.set_xlabel("bucket mean in-group reward std (reward units)")
    ax.set_ylabel(f"task gradient norm ({NORM_UNIT})")
    auto_scale(ax, rv, axis="x")
    ax.grid(linestyle="--", alpha=0.5)
    ax.legend(fontsize=8)

    # (c) regulariser (KL + entropy) vs RV mean: the axis follows the data (the seed fixed it to [0, 1])
    ax = axes[0, 2]
    ax.set_title("(c) Regulariser (KL + entropy) gradient vs reward std", fontweight="bold", fontsize=11)
    ax.set_xlabel("bucket mean in-group reward std (reward units)")
    ax.set_ylabel(f"gradient norm ({NORM_UNIT})")
    present = [c for c in ("kl", "entropy") if D.has_component(sv.m, c)]
    if not present:
        _note(ax, "no regulariser in this run\n(actor.entropy_coeff = 0, actor.use_kl_loss = false)")
    else:
        reg = np.sum([np.nan_to_num(sv.values(c)) for c in present], axis=0)
        _vs_rv(ax, list(reg), COLORS["reg"], " + ".join(present).replace("kl", "KL"))
        if len(present) == 2:
            for c in present:
                ax.plot(rv, sv.values(c), "--", color=COLORS[c], alpha=0.8,
                        label=f"{'KL' if c == 'kl' else c} alone")
        top = max(_finite(list(reg)) or [0.0])
        ax.set_ylim(0, top * 1.2 if top > 0 else 1.0)
        task_top = max(_finite(task) or [0.0])
        if top > 0 and task_top > 0:
            ax.text(0.02, 0.97, f"largest task norm {task_top:.3g} = {task_top / top:.3g}× largest regulariser norm",
                    transform=ax.transAxes, va="top", fontsize=7, color="#555")
        auto_scale(ax, rv, axis="x")
        ax.legend(fontsize=8)
    ax.grid(linestyle="--", alpha=0.5)
    fig.suptitle(sv.title("Gradient summary"), fontsize=13)
    return fig


# ---------------------------------------------------------------- beyond the seed


def fig_layers(sv: StepView, component: str = "task") -> Figure | None:
    """Bucket x layer-group gradient norm (layers.json): where in the network each bucket's gradient lives."""
    norms = D.layer_norms(sv.run, sv.step, component)
    if not norms:
        return None
    rows = [b for b in [*sv.buckets, "all"] if b in norms] or sorted(norms)
    cols = sorted({g for b in rows for g in norms[b]}, key=D.layer_sort_key)
    mat = np.array([[norms[b].get(g, np.nan) for g in cols] for b in rows], dtype=float)
    sq = np.nan_to_num(mat) ** 2
    share = sq / np.where(sq.sum(1, keepdims=True) > 0, sq.sum(1, keepdims=True), 1.0)
    fig, axes = _fig(1, 2, (max(10, 1.1 * len(cols) * 2 + 4), 0.55 * len(rows) + 2.6))
    pos = mat[np.isfinite(mat) & (mat > 0)]
    norm = LogNorm(pos.min(), pos.max()) if pos.size and pos.max() > pos.min() else Normalize(0, max(1e-12, pos.max() if pos.size else 1))
    masked = np.ma.masked_where(~np.isfinite(mat) | (mat <= 0), mat)
    for ax, data, nm, cmap, label, fmt in (
            (axes[0, 0], masked, norm, "viridis", f"{component} gradient norm (L2 over the group's parameters)", "{:.2g}"),
            (axes[0, 1], share, Normalize(0, 1), "magma", "share of the bucket's squared norm", "{:.0%}")):
        cm = matplotlib.colormaps[cmap].with_extremes(bad="#dddddd")
        im = ax.imshow(data, aspect="auto", cmap=cm, norm=nm)
        ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(rows)), [r.replace("_", " ") for r in rows], fontsize=8)
        ax.set_xlabel("layer group (input → output)")
        ax.set_ylabel("reward-variance bucket")
        fig.colorbar(im, ax=ax, label=label, shrink=0.9)
        if len(cols) * len(rows) <= 160:
            _annotate(ax, im, mat if data is masked else share, fmt)
    axes[0, 0].set_title(f"{component} gradient norm per layer group", fontweight="bold", fontsize=11)
    axes[0, 1].set_title("share per layer group (each row sums to 100%)", fontweight="bold", fontsize=11)
    fig.suptitle(sv.title("Per-layer gradient by bucket"), fontsize=13)
    return fig


def _annotate(ax, im, values: np.ndarray, fmt: str) -> None:
    """Write each cell's value in black or white, whichever reads on the cell's colour."""
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            v = values[i, j]
            if not math.isfinite(v):
                continue
            if v <= 0 and isinstance(im.norm, LogNorm):
                rgb = (0.87, 0.87, 0.87)
            else:
                rgb = im.cmap(im.norm(v))[:3]
            light = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 0.55
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=7, color="black" if light else "white")


def fig_components(geom: dict, title: str) -> Figure:
    """Reward-component gradient geometry: cosine matrix, norm share, per-layer cosine of each pair."""
    comps = list(geom.get("components") or [])
    g = geom.get("global", {})
    cos = g.get("cosine", {})
    layers = geom.get("layers") or {}
    ncols = 3 if layers else 2
    fig, axes = _fig(1, ncols, (6 * ncols, 5))
    ax = axes[0, 0]
    n = len(comps)
    mat = np.eye(n)
    for i, a in enumerate(comps):
        for j, b in enumerate(comps):
            if i != j:
                mat[i, j] = cos.get(f"{a}__{b}", cos.get(f"{b}__{a}", np.nan))
    im = ax.imshow(mat, cmap="RdBu_r", norm=TwoSlopeNorm(0, -1, 1))
    _annotate(ax, im, mat, "{:+.2f}")
    ax.set_xticks(range(n), comps, rotation=30, ha="right")
    ax.set_yticks(range(n), comps)
    ax.set_xlabel("reward component")
    ax.set_ylabel("reward component")
    ax.set_title("cosine similarity of component gradients", fontweight="bold", fontsize=11)
    fig.colorbar(im, ax=ax, label="cosine (−1 opposed, 0 orthogonal, +1 aligned)", shrink=0.85)

    ax = axes[0, 1]
    norms = g.get("norm", {})
    share = g.get("share", {})
    vals = [norms.get(c, np.nan) for c in comps]
    bars = ax.bar(comps, np.nan_to_num(vals), color="#34495e", alpha=0.85, edgecolor="black")
    ax.bar_label(bars, labels=[f"{v:.3g}" + (f"\n{share[c]:.0%}" if c in share else "")
                               for v, c in zip(vals, comps)], fontsize=8, padding=2)
    if "total" in norms:
        ax.axhline(norms["total"], color=COLORS["all"], linestyle="--", label=f"total: {norms['total']:.3g}")
        ax.legend(fontsize=8)
    ax.set_ylabel(f"gradient norm ({NORM_UNIT})")
    ax.set_xlabel("reward component (label: norm, share)")
    ax.set_title("component gradient norm and share", fontweight="bold", fontsize=11)
    ax.margins(y=0.2)
    ax.grid(axis="y", linestyle="--", alpha=0.5)

    if layers:
        ax = axes[0, 2]
        groups = sorted(layers, key=D.layer_sort_key)
        pairs = sorted({p for lg in groups for p in (layers[lg].get("cosine") or {})})
        for p in pairs:
            ax.plot(range(len(groups)), [layers[lg].get("cosine", {}).get(p, np.nan) for lg in groups], "o-",
                    label=p.replace("__", " · "))
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_ylim(-1.05, 1.05)
        ax.set_xticks(range(len(groups)), groups, rotation=45, ha="right", fontsize=8)
        ax.set_xlabel("layer group (input → output)")
        ax.set_ylabel("cosine similarity")
        ax.set_title("cosine per layer group", fontweight="bold", fontsize=11)
        ax.grid(linestyle="--", alpha=0.5)
        if pairs:
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=13)
    return fig


def fig_neurons(health: dict, title: str) -> Figure:
    """Per role: dormant / activation-dormant / zero-gradient fraction of neurons per layer (or global)."""
    roles = [r for r in D.ROLES if r in health]
    kinds = [("dormant_ratio", "dormant (τ-score)", "#c0392b"), ("act_dormant_ratio", "activation-dormant", "#e67e22"),
             ("zero_grad_ratio", "zero gradient", "#2980b9")]
    nl = max((len(health[r].get("layers") or {}) for r in roles), default=0)
    fig, axes = _fig(1, len(roles), (8 * len(roles), max(4.5, 0.28 * nl + 2.5)))
    for ax, role in zip(axes[0], roles):
        h = health[role]
        glob = h.get("global", {})
        layers = h.get("layers") or {}
        if layers:
            names = list(layers)
            y = np.arange(len(names))
            hgt = 0.8 / len(kinds)
            for k, (key, label, color) in enumerate(kinds):
                vals = []
                for nm in names:
                    lay = layers[nm]
                    if key in lay:
                        vals.append(lay[key])
                    elif key == "act_dormant_ratio" and "act_dormant" in lay and lay.get("neurons"):
                        vals.append(lay["act_dormant"] / lay["neurons"])
                    elif key == "zero_grad_ratio" and "zero_grad" in lay and lay.get("neurons"):
                        vals.append(lay["zero_grad"] / lay["neurons"])
                    else:
                        vals.append(np.nan)
                ax.barh(y + (k - 1) * hgt, np.nan_to_num(vals), hgt, color=color, label=label)
            ax.set_yticks(y, [f"{nm} ({layers[nm].get('kind', '?')})" for nm in names], fontsize=7)
            ax.invert_yaxis()
            ax.set_ylabel("module (input → output)")
        else:
            labels = [label for key, label, _ in kinds if key in glob]
            vals = [glob[key] for key, _, _ in kinds if key in glob]
            ax.barh(labels, vals, color=[c for key, _, c in kinds if key in glob])
            ax.set_ylabel("statistic (whole network)")
        ax.set_xlabel("fraction of neurons")
        ax.set_xlim(0, min(1.0, max(0.05, 1.15 * ax.dataLim.x1)))
        ax.grid(axis="x", linestyle="--", alpha=0.5)
        facts = [f"{k} {glob[k]:.3g}" for k in ("dormant_ratio", "zero_grad_ratio", "nullspace_ratio", "reset_count")
                 if k in glob]
        ax.set_title(f"{role}" + (f" (τ = {h['tau']})" if "tau" in h else "") + "\n" + ", ".join(facts),
                     fontweight="bold", fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(title, fontsize=13)
    return fig


# ---------------------------------------------------------------- across steps


def _rv_scale(ax, values: list[float], axis: str) -> None:
    """The seed's log axis for reward variance when every value is positive; else log only across decades."""
    v = _finite(values)
    if v and min(v) > 0:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    else:
        auto_scale(ax, v, axis=axis)


def fig_steps_grid(steps: list[tuple[str, dict[str, float]]], mode: str, title: str | None = None) -> Figure:
    """The seed's paper-style grid: a row per step; RV per bucket; task and KL+entropy norm vs RV (log x).

    Buckets are those present at every step. Unlike the seed, the regulariser column follows the data
    (the seed fixed it to [0, 0.1]) and zero reward std stays visible (symlog instead of log).
    """
    common = None
    for _, m in steps:
        b = D.bucket_names(m)
        common = b if common is None else [x for x in common if x in b]
    buckets = common or []
    labels = [b.replace("_", " ") for b in buckets]
    fig, axes = _fig(len(steps), 3, (16, 3.4 * len(steps) + 0.8), sharex="col")
    regs: list[float] = []
    for r, (name, m) in enumerate(steps):
        mean = [D.bucket_value(m, b, "reward_std_mean", 0.0) for b in buckets]
        lo = [D.bucket_value(m, b, "reward_std_min", 0.0) for b in buckets]
        hi = [D.bucket_value(m, b, "reward_std_max", 0.0) for b in buckets]
        task = [D.bucket_value(m, b, "task", 0.0) for b in buckets]
        reg = [D.bucket_value(m, b, "kl", 0.0) + D.bucket_value(m, b, "entropy", 0.0) for b in buckets]
        regs += reg
        ax = axes[r, 0]
        x = np.arange(len(buckets))
        err = [np.maximum(0, np.subtract(mean, lo)), np.maximum(0, np.subtract(hi, mean))]
        ax.errorbar(x, mean, yerr=err, fmt="o", color="#1f78b4", capsize=4, markersize=5)
        _rv_scale(ax, [*mean, *hi], "y")
        ax.set_ylabel(f"{name}\nreward std (reward units)")
        ax.set_xticks(x, labels if r == len(steps) - 1 else [""] * len(x))
        for c, (ys, color, ylab) in enumerate(((task, "#e67e22", "task grad norm (L2)"),
                                               (reg, "#16a085", "KL + entropy grad norm (L2)")), start=1):
            ax = axes[r, c]
            ax.plot(mean, ys, "o-", color=color, markersize=5)
            _rv_scale(ax, mean, "x")
            ax.set_ylabel(f"{name}\n{ylab}")
        for ax in axes[r]:
            ax.grid(axis="y", linestyle="--", alpha=0.3)
            ax.spines[["top", "right"]].set_visible(False)
    top = max(_finite(regs) or [0.0])
    for r in range(len(steps)):
        axes[r, 2].set_ylim(0, top * 1.15 if top > 0 else 1.0)
    axes[0, 0].set_title("(a) Reward variance by bucket", fontweight="bold")
    axes[0, 1].set_title("(b) Task gradient norm vs reward variance", fontweight="bold")
    axes[0, 2].set_title("(c) KL + entropy gradient norm vs RV", fontweight="bold")
    axes[-1, 0].set_xlabel(f"reward-variance quantile bucket ({labels[0] if labels else ''} → "
                           f"{labels[-1] if labels else ''})")
    for c in (1, 2):
        axes[-1, c].set_xlabel(f"bucket mean reward std ({axes[-1, c].get_xscale()} scale)")
    fig.suptitle(title or f"{mode.upper()}: gradient norm vs reward variance across training steps", fontsize=14)
    return fig


Panel = tuple[list[tuple[str, str]], str, str]  # ([(metric, legend label)], title, y label)


def _series_grid(run: D.RunData, panels: list[Panel], title: str, ncols: int = 3,
                 pct: frozenset[str] = frozenset()) -> Figure | None:
    """A grid of time-series panels; a panel none of whose metrics were logged is left out."""
    keep = [p for p in panels if any(D.series(run, k)[0] for k, _ in p[0])]
    if not keep:
        return None
    ncols = min(ncols, len(keep))
    nrows = math.ceil(len(keep) / ncols)
    fig, axes = _fig(nrows, ncols, (5.6 * ncols, 3.8 * nrows))
    for ax, (keys, ptitle, ylabel) in zip(axes.flat, keep):
        for key, label in keys:
            s, v = D.series(run, key)
            if s:
                v = [100 * x for x in v] if key in pct else v
                ax.plot(s, v, "o-" if len(s) < 30 else "-", markersize=3, label=label)
        ax.set_title(ptitle, fontweight="bold", fontsize=11)
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.grid(linestyle="--", alpha=0.4)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(keep):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=13)
    return fig


def fig_training_curves(run: D.RunData) -> Figure | None:
    """Reward, validation accuracy, losses, gradient norms, entropy, KL, response length over steps."""
    panels: list[Panel] = [
        ([("critic/score/mean", "mean reward (score)"), ("rollout/accuracy", "rollout accuracy")],
         "Reward", "reward (task units) / accuracy (fraction)"),
        ([("val/accuracy", "validation accuracy")], "Validation accuracy", "accuracy (%)"),
        ([("actor/pg_loss", "policy loss"), ("actor/kl_loss", "KL loss"), ("critic/vf_loss", "value loss")],
         "Losses", "loss (dimensionless)"),
        ([("actor/grad_norm", "actor (before clipping)"), ("critic/grad_norm", "critic")],
         "Gradient norm", f"gradient norm ({NORM_UNIT})"),
        ([("actor/entropy", "policy entropy")], "Entropy", "entropy (nats / token)"),
        ([("actor/ppo_kl", "KL(old ‖ new), PPO"), ("actor/kl_loss", "KL to reference")], "KL", "KL (nats / token)"),
        ([("response_length/mean", "mean"), ("response_length/max", "max"), ("response_length/min", "min")],
         "Response length", "tokens"),
        ([("actor/pg_clipfrac", "clipped (upper)"), ("actor/pg_clipfrac_lower", "dual-clip")],
         "Clip fraction", "fraction of tokens"),
    ]
    return _series_grid(run, panels, f"Training curves — run {run.name}", pct=frozenset({"val/accuracy"}))


def fig_bucket_trend(run: D.RunData, steps: list[int]) -> Figure | None:
    """Task gradient norm of each bucket (and all) across analysis steps."""
    if len(steps) < 2:
        return None
    buckets = sorted({b for s in steps for b in D.bucket_names(run.metrics(s))}, key=D._bucket_key)
    fig, axes = _fig(1, 2, (14, 4.6))
    cmap = matplotlib.colormaps["plasma"]
    for i, b in enumerate([*buckets, "all"]):
        color = COLORS["all"] if b == "all" else cmap(0.1 + 0.75 * i / max(1, len(buckets) - 1))
        style = "--" if b == "all" else "o-"
        for ax, name in zip(axes[0], ("task", "reward_std_mean")):
            ys = [D.bucket_value(run.metrics(s), b, name) for s in steps]
            ax.plot(steps, ys, style, color=color, label=b.replace("_", " "), markersize=4)
    axes[0, 0].set_title("Task gradient norm per bucket", fontweight="bold", fontsize=11)
    axes[0, 0].set_ylabel(f"gradient norm ({NORM_UNIT})")
    axes[0, 1].set_title("Mean in-group reward std per bucket", fontweight="bold", fontsize=11)
    axes[0, 1].set_ylabel("reward std (reward units)")
    for ax in axes[0]:
        ax.set_xlabel("training step (analysis steps)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(linestyle="--", alpha=0.4)
        ax.legend(fontsize=7, ncols=2)
    fig.suptitle(f"Buckets across analysis steps — run {run.name}", fontsize=13)
    return fig


def fig_reward_components(run: D.RunData) -> Figure | None:
    """Per-component reward mean (± std band) over steps, and format/correctness counts."""
    rc = D.reward_components(run)
    comps: list[str] = []
    for row in rc.values():
        comps += [c for c in row.get("components", []) if c not in comps]
    if not comps:  # metrics only (e.g. a W&B run): reward/<c>/mean
        comps = sorted({k.split("/")[1] for k in D.metric_keys(run) if k.startswith("reward/") and k.endswith("/mean")})
    if not comps:
        return None
    fig, axes = _fig(1, 2, (14, 4.6))
    ax = axes[0, 0]
    for c in comps:
        if rc:
            s = [st for st, row in rc.items() if c in row.get("stats", {})]
            mu = np.array([rc[st]["stats"][c].get("mean", np.nan) for st in s], dtype=float)
            sd = np.array([rc[st]["stats"][c].get("std", np.nan) for st in s], dtype=float)
        else:
            s, mu = D.series(run, f"reward/{c}/mean")
            mu = np.asarray(mu, dtype=float)
            sd = np.asarray([run.metrics(st).get(f"reward/{c}/std", np.nan) for st in s], dtype=float)
        line = ax.plot(s, mu, "o-" if len(s) < 30 else "-", markersize=3, label=c)[0]
        if np.isfinite(sd).any():
            ax.fill_between(s, mu - np.nan_to_num(sd), mu + np.nan_to_num(sd), color=line.get_color(), alpha=0.15)
    ax.set_title("Reward components: mean ± std over samples", fontweight="bold", fontsize=11)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("component reward (unweighted, reward units)")
    ax.grid(linestyle="--", alpha=0.4)
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    drew = False
    if rc:
        s = list(rc)
        n = np.array([max(1, rc[st].get("num_samples", 1)) for st in s], dtype=float)
        for key, label in (("num_correct", "correct"), ("num_valid_format", "valid format")):
            if any(key in rc[st] for st in s):
                ax.plot(s, [100 * rc[st].get(key, np.nan) / n[i] for i, st in enumerate(s)], "o-", markersize=3,
                        label=label)
                drew = True
    if drew:
        ax.set_title("Samples correct / with a valid format", fontweight="bold", fontsize=11)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("share of samples (%)")
        ax.set_xlabel("training step")
        ax.set_ylim(-2, 102)
        ax.grid(linestyle="--", alpha=0.4)
        ax.legend(fontsize=8)
    else:
        ax.set_visible(False)
    fig.suptitle(f"Reward components — run {run.name}", fontsize=13)
    return fig


def fig_neuron_trend(run: D.RunData) -> Figure | None:
    panels: list[Panel] = [
        ([(f"{role}/neuron/dormant_ratio", "dormant"), (f"{role}/neuron/act_dormant_ratio", "activation-dormant"),
          (f"{role}/neuron/zero_grad_ratio", "zero-gradient neurons"),
          (f"{role}/param/zero_grad_ratio", "zero-gradient parameters"),
          (f"{role}/neuron/nullspace_ratio", "gradient null space")], f"{role}: neuron health", "fraction")
        for role in D.ROLES]
    panels.append(([(f"{r}/neuron/reset_count", r) for r in D.ROLES], "ReDo resets", "neurons reset (count)"))
    return _series_grid(run, panels, f"Neuron health over training — run {run.name}")


def fig_critic(run: D.RunData) -> Figure | None:
    panels: list[Panel] = [
        ([("critic/vf_loss", "value loss")], "Value loss", "loss (squared return units)"),
        ([("critic/vf_explained_var", "explained variance")], "Explained variance",
         "1 − Var(returns − values) / Var(returns)"),
        ([("critic/values/mean", "values"), ("critic/returns/mean", "returns")], "Values vs returns (mean)",
         "return (reward units)"),
        ([("critic/vf_clipfrac", "clipped")], "Value clip fraction", "fraction"),
    ]
    return _series_grid(run, panels, f"Critic — run {run.name}", ncols=2)
