"""The analysis of issue 45's critical-batch sweep (``noise_sweep.py``), from its stored extracts alone.

For each target (a gain in greedy validation accuracy over the run's step-0 value, ``TARGETS``), a run's steps S to
it are the first crossing after step 0, interpolated linearly between the validations around it (every step is
validated). Per batch size N: S(N) = the minimum over learning rates of the median over seeds (a seed that never
reached it counts as never, so a rate needs most of its seeds there). The fit is McCandlish et al.'s trade-off
S = S_min + E_min / N (their eq. 2.11), least squares over the N's, B_crit = E_min / S_min. Its interval: a
bootstrap over seeds, resampled within every (N, lr) cell, that re-picks the best rate in each resample (so the
choice of the rate is inside the interval), and beside it the fits that leave one batch size out.

B_simple is the group-level estimate pooled over steps as McCandlish et al. pool it (Σ trace / Σ signal) with
Fieller's interval, ``rlgrad.metrics.pooling.pooled_scale``, over the analysed steps of each run at N's best rate up
to the step at which it reached the target (steps ≤ ceil(S): the updates that got it there).
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from rlgrad.metrics.pooling import LEVEL, STEP_FIELDS, pooled_scale, t_quantile  # noqa: E402

TARGETS = (0.10, 0.20, 0.30)  # gains in validation accuracy over step 0 (it starts at 0.40-0.50, tops out ~0.8)
DRAWS = 2000
EXTRACTS = "extracts"  # RESULTS/extracts/NAME.json: one run each (not "runs/": .gitignore keeps run directories out)
INF = math.inf


def load(results: Path) -> list[dict]:
    """Every run extract under ``results/extracts``, with NaN for the noise figures stored as null."""
    runs = []
    for path in sorted((results / EXTRACTS).glob("*.json")):
        run = json.loads(path.read_text())
        fields = run["noise_fields"]
        run["noise"] = [{f: (math.nan if v is None else v) for f, v in zip(fields, row)} for row in run["noise"]]
        run["run"].setdefault("role", "grid")
        runs.append(run)
    return runs


def steps_to(val: Sequence[Sequence[float]], gain: float) -> float | None:
    """The step at which the validation accuracy first gains ``gain`` over step 0, interpolated between the
    validation before it and the first at or past it; None if it never does."""
    goal = val[0][1] + gain
    for (s0, a0), (s1, a1) in zip(val, val[1:]):
        if a1 >= goal:
            return s1 if a0 >= goal else s0 + (goal - a0) / (a1 - a0) * (s1 - s0)
    return None


def cells(runs: list[dict], gain: float, samples: int, rollouts: int, role: str = "grid") -> dict[float, list[float]]:
    """Per learning rate at (N, K): every seed's steps to the target (INF where never), in seed order; ``role``
    "grid" (the sweep's seeds) or "noise" (the extra seeds at a chosen rate)."""
    out: dict[float, list[float]] = {}
    for run in sorted(runs, key=lambda r: r["run"]["seed"]):
        if (run["run"]["samples"], run["run"]["rollouts"], run["run"]["role"]) == (samples, rollouts, role):
            steps = steps_to(run["val"], gain)
            out.setdefault(run["run"]["lr"], []).append(INF if steps is None else steps)
    return out


def best_lr(by_lr: dict[float, list[float]]) -> float | None:
    """The rate with the fewest median steps over its seeds; None if none reaches the target (median INF)."""
    finite = {lr: statistics.median(s) for lr, s in by_lr.items() if s and statistics.median(s) < INF}
    return min(finite, key=finite.get) if finite else None


def fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(S_min, E_min) of S = S_min + E_min / N by least squares over (N, S) points (at least two N's)."""
    xs, ys = [1 / n for n, _ in points], [s for _, s in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def critical(points: Sequence[tuple[float, float]]) -> float:
    """B_crit = E_min / S_min of the fit: INF where S_min <= 0 (the steps still fall as fast as 1/N at the largest
    N), 0 where E_min <= 0 (they do not fall at all); NaN with fewer than two N's."""
    if len({n for n, _ in points}) < 2:
        return math.nan
    s_min, e_min = fit(points)
    return INF if s_min <= 0 else max(e_min, 0.0) / s_min


def frontier(runs: list[dict], gain: float, rollouts: int, rng: random.Random | None = None) -> dict[int, tuple]:
    """Per N: (best rate, S(N) = its median steps over seeds); with ``rng``, each (N, lr) cell's seeds resampled
    with replacement first (the bootstrap), so the best rate is picked again. N's where no rate reaches the
    target are left out."""
    out = {}
    for n in sorted({r["run"]["samples"] for r in runs if r["run"]["rollouts"] == rollouts}):
        by_lr = cells(runs, gain, n, rollouts)
        if rng is not None:
            by_lr = {lr: [rng.choice(s) for _ in s] for lr, s in by_lr.items()}
        lr = best_lr(by_lr)
        if lr is not None:
            out[n] = (lr, statistics.median(by_lr[lr]))
    return out


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-quantile of ``xs`` (INF allowed) by the nearest rank."""
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def bootstrap(runs: list[dict], gain: float, rollouts: int, draws: int = DRAWS, level: float = 0.95) -> dict:
    """B_crit's percentile interval over seeds resampled within every (N, lr) cell, the best rate re-picked in
    each draw; how often each rate was picked per N; the share of draws with S_min <= 0 (B_crit unbounded)."""
    rng, got, picks = random.Random(0), [], {}
    for _ in range(draws):
        front = frontier(runs, gain, rollouts, rng)
        for n, (lr, _) in front.items():
            picks.setdefault(n, {}).setdefault(lr, 0)
            picks[n][lr] += 1
        b = critical([(n, s) for n, (_, s) in front.items()])
        if not math.isnan(b):
            got.append(b)
    if not got:
        return {"low": math.nan, "high": math.nan, "unbounded": math.nan, "picks": picks}
    tail = (1 - level) / 2
    return {"low": percentile(got, tail), "high": percentile(got, 1 - tail),
            "unbounded": sum(b == INF for b in got) / len(got), "picks": picks}


def leave_one_out(points: Sequence[tuple[float, float]]) -> dict[int, float]:
    """B_crit of the fit without each batch size in turn (needs three N's or more)."""
    if len(points) < 3:
        return {}
    return {n: critical([p for p in points if p[0] != n]) for n, _ in points}


def noise_upto(run: dict, gain: float) -> list[dict]:
    """The run's analysed steps up to the one whose update reached the target (steps <= ceil(S)); none if it
    never reached it."""
    steps = steps_to(run["val"], gain)
    return [] if steps is None else [x for x in run["noise"] if x["step"] <= math.ceil(steps)]


def scale_floor(steps: list[dict], level: float = LEVEL) -> float:
    """The lower end of Fieller's set for Σ trace / Σ signal where it is unbounded (|G|²'s interval reaches 0, so
    ``pooled_scale`` calls B_simple unresolved): the set is then ρ <= r1 or ρ >= r2, and with r1 <= 0 < r2 every
    positive B_simple it allows is at least r2, a one-sided bound. NaN where even that fails (the set holds small
    positive values, or every value)."""
    keep = [x for x in steps if all(math.isfinite(x.get(k, math.nan)) for k in STEP_FIELDS)]
    if not keep:
        return math.nan
    num, den = sum(x["trace"] for x in keep), sum(x["signal"] for x in keep)
    var_num, var_den = sum(x["trace_se"] ** 2 for x in keep), sum(x["signal_se"] ** 2 for x in keep)
    cov, df = sum(x["cov"] for x in keep), sum(x["groups"] - 1 for x in keep)
    q2 = t_quantile(0.5 + level / 2, df) ** 2
    # (num - ρ den)² <= q² Var(num - ρ den): a ρ² - 2 b ρ + c <= 0, a <= 0 when the signal's interval reaches 0
    a, b, c = den ** 2 - q2 * var_den, num * den - q2 * cov, num ** 2 - q2 * var_num
    if a >= 0 or b * b - a * c < 0:
        return math.nan
    root = math.sqrt(b * b - a * c)
    low, high = (b + root) / a, (b - root) / a
    return high if low <= 0 < high else math.nan


def b_simple(runs: list[dict], gain: float) -> dict:
    """``pooled_scale`` over the runs' analysed steps up to the target (steps with fewer than 3 prompt groups
    have no interval and are left out by it), with ``floor`` (``scale_floor``) where it is unresolved, and the
    point value Σ trace / Σ signal over every step whose estimates are finite beside it (``all_steps``,
    ``all_scale``): at N = 16, K = 8 a step holds 2 groups."""
    steps = [x for r in runs for x in noise_upto(r, gain)]
    out = pooled_scale(steps)
    out["floor"] = scale_floor(steps) if math.isnan(out["low"]) else out["low"]
    finite = [x for x in steps if math.isfinite(x["trace"]) and math.isfinite(x["signal"])]
    signal = sum(x["signal"] for x in finite)
    out["all_steps"] = float(len(finite))
    out["all_scale"] = sum(x["trace"] for x in finite) / signal if signal > 0 else math.nan
    out["runs"] = float(len([r for r in runs if noise_upto(r, gain)]))
    return out


def at(runs: list[dict], samples: int, rollouts: int, lr: float) -> list[dict]:
    """Every run at (N, K, lr), the extra seeds included."""
    return [r for r in runs if (r["run"]["samples"], r["run"]["rollouts"], r["run"]["lr"]) == (samples, rollouts, lr)]


def _fmt(x: float | None, digits: int = 0, inf: str = "never") -> str:
    if x is None or math.isnan(x):
        return "-"
    return inf if x == INF else f"{x:.{digits}f}"


def _crit(x: float) -> str:
    return _fmt(x, inf="unbounded")


def _interval(low: float, high: float) -> str:
    return "unresolved" if math.isnan(low) else f"{_crit(low)}-{_crit(high)}"


def _scale(b: dict) -> str:
    """B_simple as the tables give it: the value and its 95% interval, or only its one-sided bound, or nothing."""
    if math.isfinite(b["low"]):
        return f"{_fmt(b['scale'])} ({_fmt(b['low'])}-{_fmt(b['high'])})"
    return f"unresolved, ≥ {_fmt(b['floor'])}" if math.isfinite(b["floor"]) else "unresolved"


def grid_table(runs: list[dict], gain: float, rollouts: int) -> dict:
    """Per N (rows) and rate (columns): the seeds' steps to the target and their median; the best rate per N."""
    lrs = sorted({r["run"]["lr"] for r in runs if r["run"]["rollouts"] == rollouts})
    rows = {}
    for n in sorted({r["run"]["samples"] for r in runs if r["run"]["rollouts"] == rollouts}):
        by_lr = cells(runs, gain, n, rollouts)
        rows[n] = {"best": best_lr(by_lr), "cells": {lr: {"seeds": s, "median": statistics.median(s)}
                                                     for lr, s in by_lr.items()}}
    print(f"\nSteps to +{gain:g} over step 0 at K = {rollouts}: median over seeds (seeds' min-max); best rate in bold")
    print("| N | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |")
    print("|---|" + "---|" * len(lrs))
    for n, row in rows.items():
        out = []
        for lr in lrs:
            cell = row["cells"].get(lr)
            if cell is None:
                out.append("")
                continue
            text = f"{_fmt(cell['median'], 1)} ({_fmt(min(cell['seeds']), 1)}-{_fmt(max(cell['seeds']), 1)})"
            out.append(f"**{text}**" if lr == row["best"] else text)
        print(f"| {n} | " + " | ".join(out) + " |")
    return {"lrs": lrs, "rows": rows}


def fit_table(runs: list[dict], gain: float, rollouts: int) -> dict:
    """The fit at the best rate per N, its bootstrap interval and the leave-one-N-out fits, and B_simple per N
    (at N's best rate) and pooled over every N."""
    front = frontier(runs, gain, rollouts)
    points = [(n, s) for n, (_, s) in front.items()]
    s_min, e_min = fit(points) if len(points) >= 2 else (math.nan, math.nan)
    out = {"points": {n: {"lr": lr, "steps": s} for n, (lr, s) in front.items()}, "s_min": s_min, "e_min": e_min,
           "b_crit": critical(points), "bootstrap": bootstrap(runs, gain, rollouts),
           "leave_one_out": leave_one_out(points), "b_simple": {}}
    # every step is validated, so ceil(S) is the first step at or past the target: the fit in whole updates, whose
    # floor of 1 step (reached on the first update) is a limit of the measurement, not of the batch
    whole = [(n, float(math.ceil(s))) for n, s in points]
    out["whole_steps"] = {"points": dict(whole), "b_crit": critical(whole), "leave_one_out": leave_one_out(whole)}
    chosen = []
    for n, (lr, _) in front.items():
        best = at(runs, n, rollouts, lr)
        chosen += best
        out["b_simple"][n] = b_simple(best, gain)
    out["b_simple_pooled"] = b_simple(chosen, gain)
    boot, pooled = out["bootstrap"], out["b_simple_pooled"]
    print(f"\nTarget +{gain:g}, K = {rollouts}: S = {_fmt(s_min, 2)} + {_fmt(e_min, 0)}/N, B_crit = "
          f"{_crit(out['b_crit'])} (95% bootstrap over seeds with the best rate re-picked: "
          f"{_interval(boot['low'], boot['high'])}; S_min <= 0 in {_fmt(100 * boot['unbounded'], 0)}% of draws)")
    print("leave one N out: " + ", ".join(f"without {n}: {_crit(b)}" for n, b in out["leave_one_out"].items()))
    print(f"in whole steps (ceil S: {', '.join(f'{s:.0f}' for _, s in whole)}): B_crit {_crit(critical(whole))}; "
          "leave one N out: " + ", ".join(f"{_crit(b)}" for b in out["whole_steps"]["leave_one_out"].values()))
    print("| N | best lr | S(N) | E = N S | rate picked in the bootstrap | S, extra seeds (median; count) "
          "| B_simple (95% interval) | steps pooled | B_simple, every step (2-group steps too) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, (lr, s) in front.items():
        b = out["b_simple"][n]
        picks = boot["picks"].get(n, {})
        share = ", ".join(f"{lr_:g}: {100 * c / DRAWS:.0f}%" for lr_, c in sorted(picks.items()))
        extra = cells(runs, gain, n, rollouts, "noise").get(lr, [])
        out["points"][n]["extra_seeds"] = extra
        again = f"{_fmt(statistics.median(extra), 1)}; {len(extra)}" if extra else "-"
        print(f"| {n} | {lr:g} | {s:.1f} | {n * s:.0f} | {share} | {again} | {_scale(b)} | {b['steps']:.0f} "
              f"| {_fmt(b['all_scale'])} |")
    print(f"B_simple pooled over the best-rate runs of every N: {_scale(pooled)}, {pooled['steps']:.0f} steps of "
          f"{pooled['runs']:.0f} runs (point value over every finite step: {_fmt(pooled['all_scale'])})")
    ratio = _ratio(pooled, boot, out["b_crit"])
    out["ratio"] = ratio
    print(f"B_simple / B_crit: {_fmt(ratio['point'], 1)} (from {_fmt(ratio['low'], 2)} to "
          f"{_fmt(ratio['high'], 1, 'unbounded')} with both intervals' ends)")
    return out


def _ratio(pooled: dict, boot: dict, crit: float) -> dict:
    """B_simple / B_crit, and its extremes over both 95% intervals (a conservative range, not a 95% interval)."""
    point = pooled["scale"] / crit if crit and math.isfinite(crit) else math.nan
    low = pooled["floor"] / boot["high"] if boot["high"] > 0 else math.nan
    high = pooled["high"] / boot["low"] if boot["low"] > 0 and math.isfinite(pooled["high"]) else INF
    return {"point": point, "low": low, "high": high}


def k_table(runs: list[dict], samples: int) -> dict:
    """At N = ``samples`` and the rate the K sweep ran at: steps to each target and B_simple per K."""
    swept = [r for r in runs if r["run"]["samples"] == samples and r["run"]["rollouts"] != 8]
    if not swept:
        return {}
    lr = swept[0]["run"]["lr"]
    out: dict = {"lr": lr, "rows": {}}
    print(f"\nK at N = {samples}, lr {lr:g}: steps to the targets (median; seeds) and B_simple to the highest target")
    print("| K | B | " + " | ".join(f"steps to +{g:g}" for g in TARGETS) + " | B_simple (95% interval) |")
    print("|---|---|" + "---|" * len(TARGETS) + "---|")
    for k in sorted({r["run"]["rollouts"] for r in runs if r["run"]["samples"] == samples}):
        group = at(runs, samples, k, lr)
        if not group:
            continue
        steps = {g: cells(group, g, samples, k)[lr] for g in TARGETS}
        b = b_simple(group, max(TARGETS))
        out["rows"][k] = {"steps": {g: {"seeds": s, "median": statistics.median(s)} for g, s in steps.items()},
                          "b_simple": b}
        cols = " | ".join(f"{_fmt(statistics.median(s), 1)} ({', '.join(_fmt(x, 1) for x in s)})"
                          for s in steps.values())
        print(f"| {k} | {samples // k} | {cols} | {_scale(b)} |")
    return out


COLOURS = dict(zip(TARGETS, ("tab:blue", "tab:red", "tab:green")))


def _steps_panel(ax, runs: list[dict], fits: dict) -> None:
    for gain, f in fits.items():
        col = COLOURS[gain]
        for n, p in f["points"].items():
            seeds = [s for s in cells(at(runs, n, 8, p["lr"]), gain, n, 8)[p["lr"]] if s < INF]
            ax.scatter([n] * len(seeds), seeds, color=col, alpha=0.3, s=12)
            ax.annotate(f"{p['lr']:g}", (n, p["steps"]), fontsize=6, xytext=(4, 2), textcoords="offset points")
        ax.plot(list(f["points"]), [p["steps"] for p in f["points"].values()], "o", color=col,
                label=f"+{gain:g}: S(N) at the best lr (median of seeds; dots: seeds)")
        if f["e_min"] > 0:  # S_min <= 0 (B_crit unbounded) still draws: the steps fall as 1/N over the grid
            ns = [2 ** (x / 8) for x in range(8 * 3, 8 * 9)]
            ax.plot(ns, [f["s_min"] + f["e_min"] / n for n in ns], "-", color=col, lw=1,
                    label=f"+{gain:g}: S = {f['s_min']:.1f} + {f['e_min']:.0f}/N, B_crit {_crit(f['b_crit'])}")
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel="N = B x K (K = 8)", ylabel="steps S to the gain over step 0", ylim=(0.3, 60))
    ax.set_title("S(N) at each N's best lr (labels) and the fits", fontsize=9)
    ax.legend(fontsize=7)


def _scale_panel(bx, fits: dict) -> None:
    for gain, f in fits.items():
        col, shift = COLOURS[gain], 1 + 0.04 * (TARGETS.index(gain) - 1)
        for n, b in f["b_simple"].items():
            if math.isfinite(b["low"]):
                bx.errorbar([n * shift], [b["scale"]], yerr=[[b["scale"] - b["low"]], [b["high"] - b["scale"]]],
                            fmt="o", color=col, capsize=3, ms=4)
            elif math.isfinite(b["floor"]):
                bx.plot([n * shift], [b["floor"]], "^", color=col, ms=6)
            if math.isfinite(b["all_scale"]) and b["all_scale"] > 0:
                bx.plot([n * shift], [b["all_scale"]], "x", color=col, ms=5)
        boot, pooled = f["bootstrap"], f["b_simple_pooled"]
        if math.isfinite(f["b_crit"]):
            bx.axhline(f["b_crit"], color=col, ls="--", lw=1,
                       label=f"B_crit, +{gain:g} (95%: {_interval(boot['low'], boot['high'])})")
        if math.isfinite(boot["low"]):
            bx.axhspan(max(boot["low"], 1.0), min(boot["high"], 1e5), color=col, alpha=0.08)
        if math.isfinite(pooled["floor"]):
            bx.axhline(pooled["floor"], color=col, lw=1, ls=":",
                       label=f"B_simple pooled over N, +{gain:g}: {_scale(pooled)}")
    bx.set_xscale("log", base=2)
    bx.set(yscale="log", xlabel="N = B x K (K = 8)", ylabel="samples", ylim=(10, 2e4))
    bx.set_title("B_simple at N's best lr (o: 95%; ^: lower bound; x: point) vs B_crit (band: 95%)", fontsize=9)
    bx.legend(fontsize=6)


def _k_panels(cx, dx, ksweep: dict) -> None:
    rows = ksweep.get("rows", {})
    for gain in TARGETS:
        cx.plot(list(rows), [rows[k]["steps"][gain]["median"] for k in rows], "o-", color=COLOURS[gain],
                label=f"+{gain:g}")
        for k in rows:
            seeds = [s for s in rows[k]["steps"][gain]["seeds"] if s < INF]
            cx.scatter([k] * len(seeds), seeds, color=COLOURS[gain], alpha=0.3, s=12)
    for k, row in rows.items():
        b = row["b_simple"]
        if math.isfinite(b["low"]):
            dx.errorbar([k], [b["scale"]], yerr=[[b["scale"] - b["low"]], [b["high"] - b["scale"]]], fmt="ko",
                        capsize=3)
        elif math.isfinite(b["floor"]):
            dx.plot([k], [b["floor"]], "k^")
        if math.isfinite(b["all_scale"]) and b["all_scale"] > 0:
            dx.plot([k], [b["all_scale"]], "kx")
    n_k, lr = ksweep.get("samples", ""), ksweep.get("lr", math.nan)
    for axis in (cx, dx):
        axis.set_xscale("log", base=2)
    cx.set(xlabel="K = rollout.n", ylabel="steps S (median of seeds; dots: seeds)")
    cx.set_title(f"N = {n_k} fixed, lr {lr:g}: steps against K", fontsize=9)
    cx.legend(fontsize=7)
    dx.set(xlabel="K = rollout.n", ylabel="B_simple (samples)", yscale="log")
    dx.set_title(f"N = {n_k}, lr {lr:g}: B_simple to +{max(TARGETS):g} against K (o / ^ / x as above)", fontsize=9)


def plot(runs: list[dict], fits: dict, ksweep: dict, figure: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((ax, bx), (cx, dx)) = plt.subplots(2, 2, figsize=(12, 9))
    _steps_panel(ax, runs, fits)
    _scale_panel(bx, fits)
    _k_panels(cx, dx, ksweep)
    fig.tight_layout()
    figure.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(figure, dpi=110)


def _jsonable(x: object) -> object:
    """NaN and infinity as strings (JSON has neither); dict keys as strings."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def _revived(x: object) -> object:
    """``_jsonable``'s inverse: "inf" / "nan" back to floats, numeric keys back to numbers."""
    if isinstance(x, dict):
        return {_number(k): _revived(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_revived(v) for v in x]
    return float(x) if x in ("inf", "-inf", "nan") else x


def _number(key: str) -> object:
    for kind in (int, float):
        try:
            return kind(key)
        except ValueError:
            pass
    return key


def stored(results: Path) -> dict:
    """``analysis.json`` as ``analyse`` returned it."""
    return _revived(json.loads((results / "analysis.json").read_text()))


def _span(values: list[float]) -> str:
    return f"{_crit(min(values))}-{_crit(max(values))}" if values else "-"


def fit_summary(out: dict) -> str:
    """docs/noise_scale.md's summary of the fits: one row per target."""
    lines = ["| target | S(N) at N = 16, 32, 64, 128, 256 (best lr) | S_min | E_min | B_crit | 95% bootstrap (lr "
             "re-picked) | draws with S_min ≤ 0 | leaving one N out | in whole steps (ceil S) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for gain, f in out["fits"].items():
        whole, boot = f["whole_steps"], f["bootstrap"]
        steps = ", ".join(f"{point['steps']:.1f}" for point in f["points"].values())
        lines.append(f"| +{gain:g} | {steps} | "
                     f"{f['s_min']:.2f} | {f['e_min']:.0f} | **{_crit(f['b_crit'])}** | "
                     f"{_crit(boot['low'])}-{_crit(boot['high'])} | {boot['unbounded']:.0%} | "
                     f"{_span(list(f['leave_one_out'].values()))} | {_crit(whole['b_crit'])} "
                     f"({_span(list(whole['leave_one_out'].values()))}) |")
    return "\n".join(lines) + "\n"


def b_simple_summary(out: dict, gain: float, rollouts: int = 8) -> str:
    """docs/noise_scale.md's B_simple per N at one target: the pooled interval, or why there is none."""
    lines = ["| N | runs | steps pooled | B_simple (95%) | point value |", "|---|---|---|---|---|"]
    for n, b in out["fits"][gain]["b_simple"].items():
        shown = (f"unresolved ({n // rollouts} groups a step: no interval)" if b["steps"] == 0
                 else _scale(b))
        lines.append(f"| {n} | {b['runs']:.0f} | {b['steps']:.0f} | {shown} | {_fmt(b['all_scale'])} |")
    return "\n".join(lines) + "\n"


def analyse(results: Path, figure: Path | None, k_samples: int = 64) -> dict:
    """Every table (printed as Markdown; written to ``results/analysis.json``) and the figure, from the extracts."""
    runs = load(results)
    print(f"{len(runs)} runs; wall time {sum(r['wall_s'] for r in runs) / 60:.0f} min in all; ends: "
          + ", ".join(f"{e} {sum(r['end'] == e for r in runs)}" for e in ("target", "collapse", "stall", "cap")))
    out = {"runs": len(runs), "wall_min": sum(r["wall_s"] for r in runs) / 60, "targets": TARGETS,
           "grid": {g: grid_table(runs, g, 8) for g in TARGETS}}
    out["fits"] = {g: fit_table(runs, g, 8) for g in TARGETS}
    out["k_sweep"] = dict(k_table(runs, k_samples), samples=k_samples)
    (results / "analysis.json").write_text(json.dumps(_jsonable(out), indent=1) + "\n")
    print("\n" + fit_summary(out) + "\n" + b_simple_summary(out, TARGETS[-1]))
    if figure is not None:
        plot(runs, out["fits"], out["k_sweep"], figure)
        print(f"figure: {figure}")
    return out
