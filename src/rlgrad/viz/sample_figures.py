"""The per-sample gradient norms of an ``analysis.per_sample`` step (``analysis/step_N/samples.jsonl``) against
the sample's advantage and its prompt group's reward spread: which samples a step's gradient is made of.

Left: each sample's task norm ||g_i|| against |advantage|, coloured by its group's reward std (the unbiased std
of the group's rewards in the file, as the bucket analysis computes it). Right: the norms per reward-variance
bucket as box plots. Under GRPO a zero-variance group's samples have advantage 0 and task norm 0: they sit at
the origin, counted in the caption rather than drawn over each other.
"""

from __future__ import annotations

import math
import statistics

import matplotlib
from matplotlib.colors import Normalize

from rlgrad import rundata as D
from rlgrad.viz.figbase import Figure, auto_scale, new_fig, note


def group_reward_std(rows: list[dict]) -> dict[object, float]:
    """group -> the unbiased std of its samples' rewards (0 for a group of one sample)."""
    rewards: dict[object, list[float]] = {}
    for r in rows:
        x = r.get("reward")
        if isinstance(x, int | float) and math.isfinite(x):
            rewards.setdefault(r.get("group"), []).append(float(x))
    return {g: statistics.stdev(v) if len(v) > 1 else 0.0 for g, v in rewards.items()}


def _points(rows: list[dict], term: str) -> list[tuple[float, float, float, str]]:
    """(|advantage|, ||g_i||, the group's reward std, bucket) of every sample with finite numbers."""
    std = group_reward_std(rows)
    out = []
    for r in rows:
        norm, adv = r.get(f"grad_norm/{term}"), r.get("advantage")
        if all(isinstance(x, int | float) and math.isfinite(x) for x in (norm, adv)):
            out.append((abs(float(adv)), float(norm), std.get(r.get("group"), math.nan), str(r.get("bucket", ""))))
    return out


def fig_per_sample(rows: list[dict], title: str, term: str = "task") -> Figure | None:
    """The step's per-sample ``term`` norms against |advantage| and by bucket; None without such norms."""
    pts = _points(rows, term)
    if not pts:
        return None
    fig, axes = new_fig(1, 2, (13, 4.8))
    ax, bx = axes[0, 0], axes[0, 1]
    moving = [p for p in pts if p[0] > 0 or p[1] > 0]
    resting = len(pts) - len(moving)
    if moving:
        stds = [p[2] for p in moving]
        sc = ax.scatter([p[0] for p in moving], [p[1] for p in moving], c=stds, s=14, alpha=0.8,
                        cmap="viridis", norm=Normalize(0, max(max(stds), 1e-12)))
        fig.colorbar(sc, ax=ax, label="the prompt group's reward std")
        auto_scale(ax, [p[1] for p in moving])
    else:
        note(ax, f"every sample's {term} gradient is zero (no reward variance)")
    ax.set_xlabel("|advantage| of the sample")
    ax.set_ylabel(f"||g_i||, the sample's {term} gradient norm")
    ax.set_title(f"per-sample {term} norm against |advantage|"
                 + (f"\n{resting} of {len(pts)} samples at (0, 0), not drawn" if resting else ""), fontsize=10)
    buckets = D.sort_buckets({p[3] for p in pts if p[3]})
    data = [[p[1] for p in pts if p[3] == b] for b in buckets]
    if data:
        bx.boxplot(data, tick_labels=[b.replace("_", " ") for b in buckets], showfliers=True,
                   flierprops={"markersize": 3}, medianprops={"color": matplotlib.colormaps["tab10"](3)})
        auto_scale(bx, [x for d in data for x in d])
        for i, d in enumerate(data, start=1):
            bx.annotate(f"n={len(d)}", (i, 0), xycoords=("data", "axes fraction"), xytext=(0, 3),
                        textcoords="offset points", ha="center", fontsize=7, color="#555")
    bx.set_xlabel("reward-variance bucket (bucket 1: the lowest reward std)")
    bx.set_ylabel(f"||g_i|| ({term})")
    bx.set_title(f"per-sample {term} norms by bucket", fontsize=10)
    fig.suptitle(title, fontsize=12)
    return fig
