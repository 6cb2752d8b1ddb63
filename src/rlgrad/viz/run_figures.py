"""Run-level figures: training curves, buckets across steps, the multi-step grid, components, neurons, critic.

The multi-step grid is the paper-style figure of RAGEN's ``gradient_analysis/plot_icml_steps.py``; the
reward-component and neuron-health figures draw one step's ``components.json`` / ``neurons.json``.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rlgrad import rundata as D
from rlgrad.metrics import key, parse
from rlgrad.viz.figbase import (
    BAD_CELL,
    COLORS,
    NORM_UNIT,
    UNDEFINED,
    annotate,
    auto_scale,
    finite,
    left_out,
    new_fig,
    note,
    plot_steps,
    points_by_x,
    value_labels,
)

# ---------------------------------------------------------------- one step's components.json / neurons.json


def fig_components(geom: dict, title: str) -> Figure:
    """Reward-component gradient geometry: cosine matrix, norm share, per-layer cosine of each pair."""
    comps = list(geom.get("components") or [])
    names_of = geom.get("labels") or {}  # component key -> the trainer's own name (D.component_geometry)

    def lab(c: str) -> str:
        return names_of.get(c, c)

    g = geom.get("global", {})
    layers = geom.get("layers") or {}
    ncols = 3 if layers else 2
    fig, axes = new_fig(1, ncols, (6 * ncols, 5))
    _component_cosines(fig, axes[0, 0], comps, g, lab)
    _component_norms(axes[0, 1], comps, g, lab)
    if layers:
        _component_layer_cosines(axes[0, 2], layers, lab)
    fig.suptitle(title, fontsize=13)
    return fig


def _component_cosines(fig: Figure, ax, comps: list[str], g: dict, lab) -> None:
    n = len(comps)
    cos, norms = g.get("cosine", {}), g.get("norm", {})
    mat = np.eye(n)
    for i, a in enumerate(comps):
        if not norms.get(a, 1.0):  # a zero gradient has no direction: not even a cosine with itself
            mat[i, i] = np.nan
        for j, b in enumerate(comps):
            if i != j:
                mat[i, j] = cos.get(f"{a}__{b}", cos.get(f"{b}__{a}", np.nan))
    # an undefined cosine (a component with a zero gradient) is a grey "n/a" cell, never white ("orthogonal")
    im = ax.imshow(mat, cmap=matplotlib.colormaps["RdBu_r"].with_extremes(bad=BAD_CELL), norm=TwoSlopeNorm(0, -1, 1))
    annotate(ax, im, mat, "{:+.2f}", missing=UNDEFINED)
    ax.set_xticks(range(n), [lab(c) for c in comps], rotation=30, ha="right")
    ax.set_yticks(range(n), [lab(c) for c in comps])
    ax.set_xlabel("reward component")
    ax.set_ylabel("reward component")
    ax.set_title("cosine similarity of component gradients", fontweight="bold", fontsize=11)
    cb = fig.colorbar(im, ax=ax, shrink=0.85, pad=0.02)
    cb.set_label("cosine (−1 opposed, 0 orthogonal, +1 aligned)", fontsize=8)


def _component_norms(ax, comps: list[str], g: dict, lab) -> None:
    norms, share = g.get("norm", {}), g.get("share", {})
    names = comps + (["total"] if "total" in norms else [])  # the update's gradient as a bar of its own
    vals = [norms.get(c, np.nan) for c in names]
    bars = ax.bar([lab(c) for c in names], np.nan_to_num(vals),
                  color=["#34495e"] * len(comps) + [COLORS["all"]] * (len(names) - len(comps)), alpha=0.85,
                  edgecolor="black")

    def share_of(c: str) -> float:  # null (a zero update: no share) reads as NaN; a 0 share is a number
        v = share.get(c)
        return float(v) if isinstance(v, int | float) else math.nan

    labels = [value_labels([v])[0] + (f"\n{D.share_label(share_of(c))}" if math.isfinite(share_of(c))
                            else ("\nshare n/a" if c != "total" else "")) for v, c in zip(vals, names)]
    ax.bar_label(bars, labels=labels, fontsize=8, padding=2)
    ax.tick_params(axis="x", labelrotation=30)
    ax.set_ylabel(f"gradient norm ({NORM_UNIT})")
    ax.set_xlabel("reward component (label: norm, share of the update; 'signed': a contribution outside 0-100%)")
    ax.set_title("component gradient norm and share", fontweight="bold", fontsize=11)
    ax.margins(y=0.2)
    ax.grid(axis="y", linestyle="--", alpha=0.5)


def _component_layer_cosines(ax, layers: dict, lab) -> None:
    def pair_lab(p: str) -> str:
        a, _, b = p.partition("__")
        return f"{lab(a)} · {lab(b)}"

    groups = sorted(layers, key=D.layer_sort_key)
    pairs = sorted({p for lg in groups for p in (layers[lg].get("cosine") or {})})
    drawn = []
    for p in pairs:
        ys = [layers[lg].get("cosine", {}).get(p, np.nan) for lg in groups]
        ys = [np.nan if y is None else y for y in ys]
        if any(math.isfinite(y) for y in ys):
            ax.plot(range(len(groups)), ys, "o-", label=pair_lab(p))
            drawn.append(p)
    if len(drawn) < len(pairs):  # a pair without a cosine anywhere is named, not an empty legend entry
        note(ax, "n/a (zero gradient): " + ", ".join(pair_lab(p) for p in pairs if p not in drawn),
             y=0.08 if drawn else 0.5)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_ylim(-1.05, 1.05)
    ax.set_xticks(range(len(groups)), groups, rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("layer group (input → output)")
    ax.set_ylabel("cosine similarity")
    ax.set_title("cosine per layer group", fontweight="bold", fontsize=11)
    ax.grid(linestyle="--", alpha=0.5)
    if drawn:
        ax.legend(fontsize=8)


def _lines(parts: list[str], width: int) -> str:
    """``parts`` joined by ", ", a new line before a part that would pass ``width`` characters."""
    lines: list[list[str]] = [[]]
    for p in parts:
        if lines[-1] and len(", ".join(lines[-1] + [p])) > width:
            lines.append([])
        lines[-1].append(p)
    return ",\n".join(", ".join(line) for line in lines)


def _layer_ratio(lay: dict, key: str) -> float:
    """A layer's ``key`` ratio from neurons.json (or its count over the layer's neurons); NaN when not measured
    (null: a step that only reset neurons measures no activations)."""
    count = {"act_dormant_ratio": "act_dormant", "zero_grad_ratio": "zero_grad"}.get(key)
    v = lay.get(key)
    if v is None and count and isinstance(lay.get(count), int | float) and lay.get("neurons"):
        v = lay[count] / lay["neurons"]
    return float(v) if isinstance(v, int | float) else math.nan


def fig_neurons(health: dict, title: str) -> Figure:
    """Per role: dormant / activation-dormant / zero-gradient fraction of neurons per layer (or global)."""
    roles = [r for r in D.ROLES if r in health]
    kinds = [("dormant_ratio", "dormant (τ-score)", "#c0392b"),
             ("act_dormant_ratio", "activation-dormant", "#e67e22"),
             ("zero_grad_ratio", "zero gradient", "#2980b9")]
    nl = max((len(health[r].get("layers") or {}) for r in roles), default=0)
    fig, axes = new_fig(1, len(roles), (8 * len(roles), max(4.5, 0.28 * nl + 2.5)))
    for ax, role in zip(axes[0], roles):
        h = health[role]
        glob = h.get("global", {})
        layers = h.get("layers") or {}
        if layers:
            names, rows = list(layers), []
            y = np.arange(len(names))
            hgt = 0.8 / len(kinds)
            for k, (key, label, color) in enumerate(kinds):
                vals = [_layer_ratio(layers[nm], key) for nm in names]
                ax.barh(y + (k - 1) * hgt, np.nan_to_num(vals), hgt, color=color, label=label)
                rows.append(vals)
            for i in range(len(names)):  # a row with no bar: say whether it measured zero or nothing
                got = [r[i] for r in rows if math.isfinite(r[i])]
                if not any(got):
                    ax.text(0.002, y[i], "0 (none)" if got else "not measured", va="center", fontsize=6,
                            color="#555")
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
        facts = [f"{label} {glob[k]:.1%}" for k, label in (("dormant_ratio", "dormant"),
                                                           ("zero_grad_ratio", "zero gradient"),
                                                           ("nullspace_ratio", "gradient null space"))
                 if isinstance(glob.get(k), int | float)]  # null: not measured at this step (a reset-only step)
        if isinstance(glob.get("reset_count"), int | float):
            facts.append(f"reset this step {int(glob['reset_count'])}")
        ax.set_title(f"{role}" + (f" (τ = {h['tau']})" if "tau" in h else "") + "\n"
                     + _lines(facts, 60), fontweight="bold", fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(title, fontsize=13)
    return fig


# ---------------------------------------------------------------- across steps


def _rv_scale(ax, values: list[float], axis: str) -> None:
    """Log axis for reward variance when every value is positive (as in RAGEN's plot); else log only across
    decades."""
    v = finite(values)
    if v and min(v) > 0:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    else:
        auto_scale(ax, v, axis=axis)


def fig_steps_grid(steps: list[tuple[str, dict[str, float]]], mode: str, title: str | None = None) -> Figure:
    """The paper-style grid of RAGEN's ``plot_icml_steps.py``: a row per step; RV per bucket; task and
    KL+entropy norm vs RV (log x).

    Buckets are those present at every step. Unlike RAGEN's plot, the regulariser column follows the data
    (RAGEN's plot fixes it to [0, 0.1]) and zero reward std stays visible (symlog instead of log).
    """
    common = None
    for _, m in steps:
        b = D.bucket_names(m)
        common = b if common is None else [x for x in common if x in b]
    buckets = common or []
    labels = [b.replace("_", " ") for b in buckets]
    has_reg = any(D.has_component(m, c) for _, m in steps for c in ("kl", "entropy"))  # else no column (c)
    fig, axes = new_fig(len(steps), 3 if has_reg else 2, ((16 if has_reg else 11), 3.4 * len(steps) + 0.8),
                        sharex="col")
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
        cols = ((task, "#e67e22", "task grad norm (L2)"), (reg, "#16a085", "KL + entropy grad norm (L2)"))
        for c, (ys, color, ylab) in enumerate(cols[:2 if has_reg else 1], start=1):
            ax = axes[r, c]
            points_by_x(ax, mean, ys, color)
            _rv_scale(ax, mean, "x")
            ax.set_ylabel(f"{name}\n{ylab}")
        for ax in axes[r]:
            ax.grid(axis="y", linestyle="--", alpha=0.3)
            ax.spines[["top", "right"]].set_visible(False)
    top = max(finite(regs) or [0.0])
    for r in range(len(steps) if has_reg else 0):
        axes[r, 2].set_ylim(0, top * 1.15 if top > 0 else 1.0)
    axes[0, 0].set_title("(a) Reward std by bucket", fontweight="bold")
    axes[0, 1].set_title("(b) Task gradient norm vs reward std", fontweight="bold")
    if has_reg:
        axes[0, 2].set_title("(c) KL + entropy gradient norm vs reward std", fontweight="bold")
    axes[-1, 0].set_xlabel(f"reward-std quantile bucket ({labels[0] if labels else ''} → "
                           f"{labels[-1] if labels else ''})")
    for c in range(1, 3 if has_reg else 2):
        axes[-1, c].set_xlabel(f"bucket mean reward std ({axes[-1, c].get_xscale()} scale)")
    fig.suptitle((title or f"{mode.upper()}: gradient norm vs reward std across training steps")
                 + ("" if has_reg else left_out(["entropy", "kl"])), fontsize=14)
    return fig


Panel = tuple[list[tuple[str, str]], str, str]  # ([(metric, legend label)], title, y label)


def _series_grid(run: D.RunData, panels: list[Panel], title: str, ncols: int = 3,
                 pct: frozenset[str] = frozenset(), counts: frozenset[str] = frozenset()) -> Figure | None:
    """A grid of time-series panels; a panel none of whose metrics were logged is left out. A panel titled in
    ``counts`` starts its axis at 0 (a constant count is a flat line, not noise on a zoomed axis)."""
    keep = [p for p in panels if any(D.series(run, k)[0] for k, _ in p[0])]
    if not keep:
        return None
    ncols = min(ncols, len(keep))
    nrows = math.ceil(len(keep) / ncols)
    fig, axes = new_fig(nrows, ncols, (5.6 * ncols, 3.8 * nrows))
    for ax, (keys, ptitle, ylabel) in zip(axes.flat, keep):
        for name, label in keys:
            s, v = D.series(run, name)
            if s:
                v = [100 * x for x in v] if name in pct else v
                plot_steps(ax, s, v, "o-" if len(s) < 30 else "-", markersize=3, label=label)
        ax.set_title(ptitle, fontweight="bold", fontsize=11)
        if ptitle in counts:
            ax.set_ylim(bottom=0, top=max(1.0, 1.1 * ax.dataLim.y1))
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
        ([("actor/loss", "loss (the host trainer's: TRL's)"), ("actor/pg_loss", "policy loss"),
          ("actor/kl_loss", "KL loss"), ("critic/vf_loss", "value loss")],
         "Losses", "loss (dimensionless)"),
        ([("actor/grad_norm", "actor (before clipping)"), ("critic/grad_norm", "critic")],
         "Gradient norm", f"gradient norm ({NORM_UNIT})"),
        ([("actor/entropy", "policy entropy")], "Entropy", "entropy (nats / token)"),
        ([("actor/ppo_kl", "KL(old ‖ new), PPO"), ("actor/kl_loss", "KL to reference")], "KL",
         "KL (nats / token)"),
        ([("response_length/mean", "mean"), ("response_length/max", "max"), ("response_length/min", "min")],
         "Response length", "tokens"),
        ([("actor/pg_clipfrac", "clipped (upper)"), ("actor/pg_clipfrac_lower", "dual-clip")],
         "Clip fraction", "fraction of tokens"),
    ]
    title = f"Training curves — run {run.name}"
    mini = D.config_get(run, "actor.ppo_mini_batch_size", None)
    if D.config_get(run, "actor.ppo_epochs", None) == 1 and mini in (None, D.config_get(run, "data.train_batch_size")):
        # one update per batch, from the policy that sampled it: the ratio is 1, PPO's KL(old ‖ new) float noise
        # and the clip fraction 0 by construction; drawing them would only show noise
        drop = {"actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_clipfrac_lower"}
        trimmed = [([(k, lb) for k, lb in keys if k not in drop], t, y) for keys, t, y in panels]
        panels = [p for p in trimmed if p[0]]
        title += "\n(one update per batch: KL(old ‖ new) and clip fraction are 0 by construction, not drawn)"
    return _series_grid(run, panels, title, pct=frozenset({"val/accuracy"}))


def fig_bucket_trend(run: D.RunData, steps: list[int]) -> Figure | None:
    """The task gradient by reward-std level across analysis steps. A bucket's members change from step to step,
    so no line joins "bucket k" over steps: (a) each bucket is a point coloured by its mean reward std, the whole
    batch a line; (b) one curve per step through its buckets, task gradient norm against bucket reward std."""
    if len(steps) < 2:
        return None
    pts = [(s, b, D.bucket_value(run.metrics(s), b, "reward_std_mean"), D.bucket_value(run.metrics(s), b, "task"))
           for s in steps for b in D.bucket_names(run.metrics(s))]
    pts = [p for p in pts if math.isfinite(p[2]) and math.isfinite(p[3])]
    if not pts:
        return None
    fig, axes = new_fig(1, 2, (14, 4.8))
    ax = axes[0, 0]
    stds = [p[2] for p in pts]
    norm = matplotlib.colors.Normalize(min(stds), max(stds) if max(stds) > min(stds) else min(stds) + 1)
    sc = ax.scatter([p[0] for p in pts], [p[3] for p in pts], c=stds, cmap="viridis", norm=norm, s=36,
                    edgecolors="black", linewidths=0.4, zorder=3)
    fig.colorbar(sc, ax=ax, pad=0.02).set_label("bucket mean reward std", fontsize=8)
    xs, ys = D.series(run, "grad_norm/all/task")
    if xs:
        plot_steps(ax, xs, ys, "--", color=COLORS["all"], label="all (whole batch)", zorder=2)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.14), frameon=False)
    ax.set_title("Task gradient norm per bucket (colour: its reward std)", fontweight="bold", fontsize=11)
    ax.set_xlabel("training step (analysis steps)")
    ax.set_ylabel(f"gradient norm ({NORM_UNIT})")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    auto_scale(ax, [p[3] for p in pts])
    ax.grid(linestyle="--", alpha=0.4)
    ax = axes[0, 1]
    cmap = matplotlib.colormaps["plasma"]
    for i, s in enumerate(steps):
        mine = [(p[2], p[3]) for p in pts if p[0] == s]
        if mine:
            points_by_x(ax, *zip(*mine), cmap(0.85 * i / max(1, len(steps) - 1)), label=f"step {s}")
    ax.set_title("Task gradient norm vs bucket reward std, per step", fontweight="bold", fontsize=11)
    ax.set_xlabel("bucket mean in-group reward std (reward units)")
    ax.set_ylabel(f"gradient norm ({NORM_UNIT})")
    auto_scale(ax, stds, axis="x")
    ax.grid(linestyle="--", alpha=0.4)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)  # beside the data
    fig.suptitle(f"Buckets across analysis steps — run {run.name}", fontsize=13)
    return fig


def fig_component_trend(run: D.RunData) -> Figure | None:
    """What pulls against what over training: each pair's gradient cosine and each component's share of the
    update at every reward-component step (a cosine or share a zero gradient lacks is a gap, marked n/a)."""
    steps = D.component_steps(run)
    geoms = [(s, g) for s in steps if (g := D.component_geometry(run, s))]
    if len(geoms) < 2:
        return None
    comps = list(dict.fromkeys(c for _, g in geoms for c in g.get("components") or []))
    pairs = list(dict.fromkeys(p for _, g in geoms for p in g["global"].get("cosine", {})))
    fig, axes = new_fig(1, 2, (14, 4.6))
    gaps = False
    for ax, names, part in ((axes[0, 0], pairs, "cosine"), (axes[0, 1], comps, "share")):
        missing: set[int] = set()
        for name in names:
            xs = [s for s, _ in geoms]
            ys = np.array([g["global"].get(part, {}).get(name, np.nan) for _, g in geoms], dtype=float)
            bad = [x for x, y in zip(xs, ys) if not math.isfinite(y)]
            label = D.pair_label(run, name) if part == "cosine" else D.label(run, name)
            if bad:  # a gap in the line, named in the legend; never a point at 0 (a cosine of 0 means orthogonal)
                label += f" (n/a at step {', '.join(map(str, bad))})"
                missing.update(bad)
            plot_steps(ax, xs, ys, "o-", markersize=4, label=label)
        _mark_undefined(ax, sorted(missing))
        gaps = gaps or bool(missing)
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xlabel("training step (reward-component steps)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(linestyle="--", alpha=0.4)
        if names:
            ax.legend(fontsize=8, loc="best")
    axes[0, 0].set_ylim(-1.05, 1.05)
    axes[0, 0].set_ylabel("cosine of the two gradients")
    axes[0, 0].set_title("Which components pull against each other (cosine < 0)", fontweight="bold", fontsize=11)
    axes[0, 1].set_ylabel("⟨g_c, g⟩ / |g|²: a share in 0-1, a signed contribution outside")
    axes[0, 1].set_title("Each component's share of the update", fontweight="bold", fontsize=11)
    fig.suptitle(f"Reward-component gradients over training — run {run.name}"
                 + (f"  (grey band: {UNDEFINED})" if gaps else ""), fontsize=13)
    return fig


def _mark_undefined(ax: Axes, steps: list[int]) -> None:
    """A grey hatched band over each step where a value does not exist, labelled n/a at the top: the gap in a
    line is then a visible absence, not a value."""
    for x in steps:
        ax.axvspan(x - 0.4, x + 0.4, facecolor=BAD_CELL, edgecolor="#999", hatch="//", alpha=0.5, zorder=0,
                   gid="undefined")
        ax.text(x, 0.98, "n/a", transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=7,
                color="#555")


def _component_names(run: D.RunData, by_step: dict) -> list[str]:
    """The reward components of a run, from its per-step records, else from its reward/<c>/mean metrics."""
    comps: list[str] = []
    for row in by_step.values():
        comps += [c for c in row.get("components", []) if c not in comps]
    if not comps:  # metrics only (e.g. a W&B run): reward/<c>/mean
        comps = sorted({f["component"] for k in D.metric_keys(run) if (f := parse("reward/{component}/mean", k))})
    return comps


def _component_series(run: D.RunData, by_step: dict, comp: str) -> tuple[list, np.ndarray, np.ndarray, Any, Any]:
    """(steps, mean, std, low, high) of one component's reward: the band's bounds are the values the samples
    took (±inf where only the metrics are there: no band)."""
    if not by_step:
        steps, mean = D.series(run, key("reward/{component}/mean", component=comp))
        std_key = key("reward/{component}/std", component=comp)
        std = np.asarray([run.metrics(st).get(std_key, np.nan) for st in steps], dtype=float)
        return steps, np.asarray(mean, dtype=float), std, -np.inf, np.inf
    steps = [st for st, row in by_step.items() if comp in row.get("stats", {})]
    stats = [by_step[st]["stats"][comp] for st in steps]

    def column(name: str, missing: float) -> np.ndarray:
        return np.array([st.get(name, missing) for st in stats], dtype=float)

    return steps, column("mean", np.nan), column("std", np.nan), column("min", -np.inf), column("max", np.inf)


def _draw_component_means(ax: Axes, run: D.RunData, by_step: dict, comps: list[str]) -> None:
    for comp in comps:
        steps, mean, std, low, high = _component_series(run, by_step, comp)
        line = ax.plot(steps, mean, "o-" if len(steps) < 30 else "-", markersize=3, label=D.label(run, comp))[0]
        # the band stays within the values the samples took (a 0/1 reward: [0, 1]); without them (metrics only:
        # a W&B or verl run) the reward's range is unknown and no band is drawn, rather than one past it
        if np.isfinite(std).any() and np.isfinite(low).all() and np.isfinite(high).all():
            ax.fill_between(steps, np.maximum(mean - np.nan_to_num(std), low),
                            np.minimum(mean + np.nan_to_num(std), high), color=line.get_color(), alpha=0.15)
    ax.set_title("Reward components: mean ± std over the trained samples" + (
        "" if by_step else "\n(no band: the samples' range is not in this run's files)"), fontweight="bold",
        fontsize=11)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("component reward (unweighted, reward units)")
    ax.grid(linestyle="--", alpha=0.4)
    ax.legend(fontsize=8)


def _draw_sample_counts(ax: Axes, by_step: dict) -> None:
    """The share of samples correct and with a valid format per step (the panel hidden if none is recorded)."""
    steps = list(by_step)
    n = np.array([max(1, by_step[st].get("num_samples", 1)) for st in steps], dtype=float)
    drew = False
    for field, label in (("num_correct", "correct"), ("num_valid_format", "valid format")):
        if any(field in by_step[st] for st in steps):
            ax.plot(steps, [100 * by_step[st].get(field, np.nan) / n[i] for i, st in enumerate(steps)], "o-",
                    markersize=3, label=label)
            drew = True
    if not drew:
        ax.set_visible(False)
        return
    ax.set_title("Samples correct / with a valid format", fontweight="bold", fontsize=11)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("share of samples (%)")
    ax.set_xlabel("training step")
    ax.set_ylim(-2, 102)
    ax.grid(linestyle="--", alpha=0.4)
    ax.legend(fontsize=8)


def fig_reward_components(run: D.RunData) -> Figure | None:
    """Per-component reward mean (± std band) over steps, and format/correctness counts."""
    by_step = D.reward_components(run)
    comps = _component_names(run, by_step)
    if not comps:
        return None
    fig, axes = new_fig(1, 2, (14, 4.6))
    _draw_component_means(axes[0, 0], run, by_step, comps)
    _draw_sample_counts(axes[0, 1], by_step)
    fig.suptitle(f"Reward components — run {run.name}", fontsize=13)
    return fig


def fig_neuron_trend(run: D.RunData) -> Figure | None:
    panels: list[Panel] = [
        ([(key("{role}/neuron/dormant_ratio", role=role), "dormant"),
          (key("{role}/neuron/act_dormant_ratio", role=role), "activation-dormant"),
          (key("{role}/neuron/zero_grad_ratio", role=role), "zero-gradient neurons"),
          (key("{role}/param/zero_grad_ratio", role=role), "zero-gradient parameters"),
          (key("{role}/neuron/nullspace_ratio", role=role), "gradient null space")], f"{role}: neuron health",
         "fraction")
        for role in D.ROLES]
    panels.append(([(key("{role}/neuron/reset_count", role=role), role) for role in D.ROLES], "ReDo resets",
                   "neurons reset (count)"))
    return _series_grid(run, panels, f"Neuron health over training — run {run.name}",
                        counts=frozenset({"ReDo resets"}))


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
