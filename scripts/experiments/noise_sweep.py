"""Issue 32's experiment: does the gradient noise scale B_simple predict the critical batch of GRPO on the embedded
default? (McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training", arXiv:1812.06162.)

    python scripts/experiments/noise_sweep.py run      [--out DIR] [--jobs 1]   # train (resumable: skips finished runs)
    python scripts/experiments/noise_sweep.py analyse  [--out DIR] [--target 0.7] [--figure docs/img/noise_sweep.png]

``run`` trains ``rlgrad train --config-name demo`` (the embedded tiny Qwen2, warm-started, on arithmetic; lr 1e-4)
at N = B·K rollouts per step for every (B, K) in ``GRID`` and seeds 1, 2, each under ``nice -n 10`` on one thread,
validating every ``test_freq`` steps (greedy, data.val_size prompts) with ``analysis.per_sample.every=10``. A run
stops at its step cap or as soon as its validation accuracy reaches ``--stop`` (above any target ``analyse`` reads),
and leaves ``sweep.json`` in its directory; a directory without it is retrained from scratch.

``analyse`` reads, per run, the first step whose validation accuracy reaches ``--target`` (S; the samples E = N·S)
and B_simple = mean noise_trace/all/task / mean noise_signal/all/task over the analysed steps up to S (the paper
averages the trace and the signal before dividing; ``rlgrad doctor``'s noise signatures do the same over a whole
run). It fits the paper's trade-off S = S_min + E_min / N (eq. 2.11: S = S_min (1 + B_crit/N), E = E_min (1 +
N/B_crit), B_crit = E_min / S_min) by least squares on the runs that reached the target, bootstraps B_crit over
runs, plots the steps against the samples next to the measured B_simple and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# (prompts B, rollouts per prompt K): N = B·K over {16, ..., 256} at K = 8, and K = 4 at the same N
GRID = [(2, 8), (4, 8), (8, 8), (16, 8), (32, 8), (4, 4), (8, 4), (16, 4), (32, 4)]
SEEDS = (1, 2, 3)
ANALYSE_EVERY = 10
DEMO_LR = 1e-4  # configs/demo.yaml's actor.optim.lr
COLLAPSE = 0.2  # a run whose validation accuracy falls this far below its start is stopped (collapsed)


@dataclass(frozen=True)
class Run:
    prompts: int
    rollouts: int
    seed: int
    lr: float = DEMO_LR
    analyse_every: int = ANALYSE_EVERY

    @property
    def samples(self) -> int:
        return self.prompts * self.rollouts

    @property
    def name(self) -> str:
        tail = ("" if self.lr == DEMO_LR else f"_lr{self.lr:g}") + (
            "" if self.analyse_every == ANALYSE_EVERY else f"_a{self.analyse_every}")
        return f"B{self.prompts}_K{self.rollouts}_s{self.seed}{tail}"

    @property
    def max_steps(self) -> int:
        # generous caps: the default (N = 128) reaches +20 points in ~40 steps; a small batch needs more steps
        return {16: 300, 32: 240, 64: 160, 128: 100, 256: 80}[self.samples]

    @property
    def test_freq(self) -> int:
        return {16: 4, 32: 3, 64: 2, 128: 1, 256: 1}[self.samples]


def _val_accuracy(metrics: Path) -> list[tuple[int, float]]:
    out = []
    if not metrics.exists():
        return out
    for line in metrics.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # the trainer's line being written
            continue
        acc = row.get("data", {}).get("val/accuracy")
        if acc is not None:
            out.append((row["step"], acc))
    return out


def train(run: Run, out: Path, stop: float, val_size: int) -> None:
    rundir = out / run.name
    if (rundir / "sweep.json").exists():
        print(f"{run.name}: done already", flush=True)
        return
    shutil.rmtree(rundir, ignore_errors=True)  # a run cut short is retrained from scratch
    rundir.mkdir(parents=True)
    cmd = ["nice", "-n", "10", sys.executable, "-m", "rlgrad", "train", "--config-name", "demo",
           f"data.train_batch_size={run.prompts}", f"rollout.n={run.rollouts}", f"trainer.seed={run.seed}",
           f"trainer.total_training_steps={run.max_steps}", f"trainer.test_freq={run.test_freq}",
           f"data.val_size={val_size}", f"actor.optim.lr={run.lr}",
           "analysis.every=null", f"analysis.per_sample.every={run.analyse_every}",
           "analysis.per_sample.proxy_corr=false", "trainer.num_threads=1", "trainer.logger=[jsonl]",
           "trainer.save_freq=-1", f"trainer.default_local_dir={rundir}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    start = time.time()
    with open(rundir / "train.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        stopped = False
        while proc.poll() is None:
            time.sleep(2)
            val = _val_accuracy(rundir / "metrics.jsonl")
            # stop at the stop accuracy (the rest of the run reads nothing the analysis needs), or once the
            # policy has collapsed (COLLAPSE below its start: too large a learning rate for the batch; it does
            # not come back in the runs seen, which otherwise train to the cap for nothing)
            if any(acc >= stop or acc < val[0][1] - COLLAPSE for step, acc in val if step > 0):
                proc.terminate()
                proc.wait()
                stopped = True
    if proc.returncode != 0 and not stopped:
        print(f"{run.name}: failed (exit {proc.returncode}), see {rundir / 'train.log'}", flush=True)
        return
    wall = time.time() - start
    (rundir / "sweep.json").write_text(json.dumps({"run": run.__dict__, "wall_s": wall, "stopped": stopped}))
    print(f"{run.name}: {wall:.0f} s, val {_val_accuracy(rundir / 'metrics.jsonl')[-1]}", flush=True)


def _series(metrics: Path, key: str) -> dict[int, float]:
    out = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if key in row.get("data", {}):
            out[row["step"]] = row["data"][key]
    return out


def finished(out: Path) -> list[Run]:
    """Every run of ``out`` that has its ``sweep.json``, whatever grid and learning rate trained it."""
    runs = []
    for path in sorted(out.glob("*/sweep.json")):
        runs.append(Run(**json.loads(path.read_text())["run"]))
    return runs


def measure(run: Run, out: Path, target: float) -> dict:
    """Steps to the target (None if never), samples, the analysed steps' noise estimates up to it, B_simple."""
    metrics = out / run.name / "metrics.jsonl"
    val = _val_accuracy(metrics)
    reached = next((step for step, acc in val if step > 0 and acc >= target), None)
    steps = None if reached is None else crossing(val, target)
    trace, signal = _series(metrics, "noise_trace/all/task"), _series(metrics, "noise_signal/all/task")
    noise = [(s, trace[s], signal[s]) for s in sorted(trace)
             if s in signal and math.isfinite(trace[s]) and math.isfinite(signal[s])]
    upto = [(tr, sg) for s, tr, sg in noise if reached is None or s <= reached]
    return {"run": run, "steps": steps, "samples": None if steps is None else steps * run.samples,
            "noise": upto, "b_simple": b_simple(upto), "b_simple_run": b_simple([(tr, sg) for _, tr, sg in noise]),
            "val0": val[0][1], "val_max": max(a for _, a in val), "val_last": val[-1][1]}


def crossing(val: list[tuple[int, float]], target: float) -> float:
    """The step at which the validation accuracy first reaches ``target``, interpolated linearly between the
    validation before it and the first at or above it: validations every ``test_freq`` steps would otherwise round
    a run's steps up by up to test_freq - 1, more for the small batches (validated less often)."""
    for (s0, a0), (s1, a1) in zip(val, val[1:]):
        if a1 >= target > a0:
            return s0 + (target - a0) / (a1 - a0) * (s1 - s0)
    return float(next(step for step, acc in val if acc >= target))


def b_simple(noise: list[tuple[float, float]]) -> float:
    """McCandlish et al.'s B_simple from (trace, signal) estimates: their means' ratio (Appendix A averages both
    over steps before dividing, since a step's signal estimate is noisy and can be negative)."""
    if not noise or statistics.fmean(sg for _, sg in noise) <= 0:
        return math.nan
    return statistics.fmean(tr for tr, _ in noise) / statistics.fmean(sg for _, sg in noise)


def fit(points: list[tuple[int, int]]) -> tuple[float, float]:
    """(S_min, E_min) of S = S_min + E_min / N by least squares over (N, S) points."""
    xs = [1 / n for n, _ in points]
    ys = [s for _, s in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def bootstrap(points: list[tuple[int, int]], draws: int = 2000) -> tuple[float, float]:
    """The 10th and 90th percentiles of B_crit = E_min / S_min over runs resampled with replacement (a resample
    whose fit has S_min <= 0 counts as B_crit = inf, one with E_min <= 0 as 0)."""
    rng = random.Random(0)
    got = []
    for _ in range(draws):
        sample = [rng.choice(points) for _ in points]
        if len({n for n, _ in sample}) < 2:
            continue
        s_min, e_min = fit(sample)
        got.append(math.inf if s_min <= 0 else max(e_min, 0.0) / s_min)
    got.sort()
    if not got:
        return math.nan, math.nan
    return got[int(0.1 * len(got))], got[int(0.9 * len(got)) - 1]


def best_lr(rows: list[dict], target: float) -> list[dict]:
    """The runs at each (N, K)'s best learning rate, the one with the fewest mean steps to the target over its seeds
    (a run that never reached it counts as its step cap): the paper tunes the learning rate per batch size. Only
    learning rates that hold the target count: every seed's last validation at or above it (a run stops at
    --stop or when it collapses), so a rate that crosses the target on its way to a collapse is not "best"."""
    by: dict[tuple[int, int, float], list[dict]] = {}
    for r in rows:
        if any(x["run"].samples == r["run"].samples and x["run"].rollouts == r["run"].rollouts
               and x["run"].lr == r["run"].lr and x["val_last"] < target for x in rows):
            continue
        by.setdefault((r["run"].samples, r["run"].rollouts, r["run"].lr), []).append(r)
    best: dict[tuple[int, int], tuple[float, list[dict]]] = {}
    for (n, k, _), runs in by.items():
        cost = statistics.fmean(r["steps"] if r["steps"] is not None else r["run"].max_steps for r in runs)
        if (n, k) not in best or cost < best[(n, k)][0]:
            best[(n, k)] = (cost, runs)
    return [r for _, runs in best.values() for r in runs]


def describe(rows: list[dict], label: str) -> dict:
    """The trade-off fit over ``rows`` (those that reached the target), printed; its numbers for the plot."""
    reached = [r for r in rows if r["steps"] is not None]
    points = [(r["run"].samples, r["steps"]) for r in reached]
    if len({n for n, _ in points}) < 2:
        print(f"{label}: fewer than two batch sizes reached the target")
        return {"s_min": math.nan, "e_min": math.nan}
    s_min, e_min = fit(points)
    lo, hi = bootstrap(points)
    # the paper's B_simple: trace and signal averaged over every analysed step (here: of these runs, to the target)
    pooled = b_simple([x for r in reached for x in r["noise"]])
    crit = e_min / s_min if s_min > 0 else math.inf
    print(f"{label}: {len(reached)} of {len(rows)} runs reached it; S_min {s_min:.1f} steps, E_min {e_min:.0f} "
          f"samples, B_crit {crit:.1f} (bootstrap 10-90%: {lo:.1f}-{hi:.1f}); B_simple pooled over their "
          f"{sum(len(r['noise']) for r in reached)} analysed steps {pooled:.0f} = {pooled / crit:.1f}x B_crit")
    for k in sorted({r["run"].rollouts for r in reached}):
        sub = [(r["run"].samples, r["steps"]) for r in reached if r["run"].rollouts == k]
        if len({n for n, _ in sub}) >= 2:
            sk, ek = fit(sub)
            print(f"  K = {k} alone: S_min {sk:.1f}, E_min {ek:.0f}, B_crit {ek / sk if sk > 0 else math.inf:.1f}")
    return {"s_min": s_min, "e_min": e_min, "b_simple": pooled, "lo": lo, "hi": hi}


def _curve(ax, s_min: float, e_min: float, style: str, label: str) -> None:
    if not (s_min > 0 and e_min > 0):
        return
    ns = [2 ** (x / 8) for x in range(8 * 2, 8 * 10)]
    ax.plot([e_min + s_min * n for n in ns], [s_min + e_min / n for n in ns], style, lw=1,
            label=f"{label}: S_min {s_min:.1f}, E_min {e_min:.0f}, B_crit {e_min / s_min:.0f}")


def _steps_panel(ax, rows: list[dict], fixed: dict, tuned: dict, target: float) -> None:
    lrs = sorted({r["run"].lr for r in rows})
    for lr, colour in zip(lrs, ("tab:blue", "tab:orange", "tab:green", "tab:red")):
        for k, marker in ((8, "o"), (4, "s")):
            pts = [r for r in rows if r["run"].rollouts == k and r["run"].lr == lr and r["steps"] is not None]
            if pts:
                ax.scatter([r["samples"] for r in pts], [r["steps"] for r in pts], marker=marker, color=colour,
                           alpha=0.7, label=f"lr {lr:g}, K = {k}")
            for r in pts:
                ax.annotate(str(r["run"].samples), (r["samples"], r["steps"]), fontsize=6, xytext=(3, 2),
                            textcoords="offset points")
    _curve(ax, fixed["s_min"], fixed["e_min"], "k-", f"fit, lr {DEMO_LR:g}")
    _curve(ax, tuned["s_min"], tuned["e_min"], "k--", "fit, K = 8, best lr per N")
    b = fixed.get("b_simple", math.nan)
    if math.isfinite(b) and fixed["s_min"] > 0 and fixed["e_min"] > 0:  # where the fit would put N = B_simple
        ax.plot([fixed["e_min"] + fixed["s_min"] * b], [fixed["s_min"] + fixed["e_min"] / b], "r*", ms=14,
                label=f"N = B_simple ({b:.0f}) on the lr {DEMO_LR:g} fit")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("samples E to the target (N x steps)")
    ax.set_ylabel(f"steps S to val/accuracy >= {target:.2f}")
    ax.legend(fontsize=6)
    ax.set_title("steps against samples (McCandlish et al. 2018, fig. 3)", fontsize=9)


def _noise_panel(bx, rows: list[dict], dense: list[dict], fixed: dict, tuned: dict) -> None:
    base = [r for r in rows if r["run"].lr == DEMO_LR]
    for k, marker in ((8, "o"), (4, "s")):
        pts = [r for r in base if r["run"].rollouts == k and math.isfinite(r["b_simple"])]
        bx.scatter([r["run"].samples * (1.04 if k == 4 else 1) for r in pts], [r["b_simple"] for r in pts],
                   marker=marker, alpha=0.35, label=f"B_simple of one run (its 1-3 analysed steps), K = {k}")
    sizes = sorted({r["run"].samples for r in base})
    pooled = [b_simple([x for r in base if r["run"].samples == n and r["steps"] is not None for x in r["noise"]])
              for n in sizes]
    bx.plot(sizes, pooled, "kD-", ms=5, lw=1, label="B_simple pooled over the runs at that N")
    for r in dense:
        bx.plot([r["run"].samples], [r["b_simple"]], "m*", ms=12,
                label=f"B_simple, every step to the target analysed (seed {r['run'].seed})")
    for fitted, style, label in ((fixed, "-", f"B_crit, lr {DEMO_LR:g}"),
                                 (tuned, "--", "B_crit, K = 8, best lr per N")):
        if fitted["s_min"] > 0 and fitted["e_min"] > 0:
            bx.axhline(fitted["e_min"] / fitted["s_min"], color="k", ls=style, lw=1, label=label)
    if math.isfinite(fixed.get("b_simple", math.nan)):
        bx.axhline(fixed["b_simple"], color="r", lw=1, label=f"B_simple pooled over every lr {DEMO_LR:g} run")
    bx.set_xscale("log", base=2)
    bx.set_yscale("log")
    bx.set_xlabel("N = B x K (rollouts per step)")
    bx.set_ylabel("batch size (samples)")
    bx.legend(fontsize=6)
    bx.set_title(f"lr {DEMO_LR:g}: B_simple (analysed steps up to the target) against B_crit = E_min / S_min",
                 fontsize=9)


def plot(rows: list[dict], dense: list[dict], fixed: dict, tuned: dict, target: float, figure: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    _steps_panel(ax, rows, fixed, tuned, target)
    _noise_panel(bx, rows, dense, fixed, tuned)
    fig.tight_layout()
    figure.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(figure, dpi=120)


def _fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def summary(rows: list[dict]) -> None:
    """The docs' table: per (N, K, lr) over its seeds, the steps and samples to the target, B_simple pooled."""
    print("| N = B x K | B | K | lr | seeds reaching the target | steps S (mean; min-max) | samples E (mean) "
          "| B_simple (pooled to the target) | last validation (mean) |")
    print("|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(r["run"].lr, -r["run"].rollouts, r["run"].samples) for r in rows
                   if r["run"].analyse_every == ANALYSE_EVERY})
    for lr, k, n in keys:
        runs = [r for r in rows if (r["run"].lr, -r["run"].rollouts, r["run"].samples) == (lr, k, n)
                and r["run"].analyse_every == ANALYSE_EVERY]
        hit = [r for r in runs if r["steps"] is not None]
        steps = [r["steps"] for r in hit]
        span = f"{statistics.fmean(steps):.1f}; {min(steps):.1f}-{max(steps):.1f}" if steps else "-"
        samples = f"{statistics.fmean(r['samples'] for r in hit):.0f}" if hit else "-"
        pooled = _fmt(b_simple([x for r in hit for x in r["noise"]]))
        print(f"| {n} | {n // -k} | {-k} | {lr:g} | {len(hit)} of {len(runs)} | {span} | {samples} | {pooled} "
              f"| {statistics.fmean(r['val_last'] for r in runs):.2f} |")


def analyse(out: Path, target: float, figure: Path | None) -> None:
    rows = [measure(run, out, target) for run in finished(out)]
    rows.sort(key=lambda r: (r["run"].lr, -r["run"].rollouts, r["run"].samples, r["run"].seed))
    print(f"| N | B | K | lr | seed | val before | best val | last val | steps to {target:.2f} | samples "
          "| B_simple to the target | B_simple, whole run | analysed steps to the target |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        run = r["run"]
        print(f"| {run.samples} | {run.prompts} | {run.rollouts} | {run.lr:g} | {run.seed} | {r['val0']:.2f} "
              f"| {r['val_max']:.2f} | {r['val_last']:.2f} | {_fmt(r['steps'], 1)} | {_fmt(r['samples'])} "
              f"| {_fmt(r['b_simple'])} | {_fmt(r['b_simple_run'])} | {len(r['noise'])} |")
    print()
    summary(rows)
    print()
    # runs analysed at every step repeat a sweep run (the instruments never change training): B_simple only
    dense = [r for r in rows if r["run"].analyse_every != ANALYSE_EVERY]
    rows = [r for r in rows if r["run"].analyse_every == ANALYSE_EVERY]
    for r in dense:
        print(f"{r['run'].name}: B_simple over its {len(r['noise'])} analysed steps to the target "
              f"{r['b_simple']:.0f}; whole run {r['b_simple_run']:.0f}")
    if dense:
        print(f"dense runs pooled: B_simple {b_simple([x for r in dense for x in r['noise']]):.0f}")
    fixed = describe([r for r in rows if r["run"].lr == DEMO_LR], f"lr {DEMO_LR:g}")
    several = len({r["run"].lr for r in rows}) > 1
    # the learning-rate grid is at K = 8 only: K = 4 has no tuned rate to mix in
    tuned = describe(best_lr([r for r in rows if r["run"].rollouts == 8], target),
                     "K = 8, best lr per N of those that hold the target") if several else fixed
    if figure is not None:
        plot(rows, dense, fixed, tuned, target, figure)
        print(f"figure: {figure}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("run", "analyse"))
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "noise_sweep")
    parser.add_argument("--target", type=float, default=0.75, help="validation accuracy to reach (analyse)")
    parser.add_argument("--stop", type=float, default=0.85, help="stop a run at this validation accuracy (run)")
    parser.add_argument("--val-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=DEMO_LR, help="actor.optim.lr of the runs (run)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--analyse-every", type=int, default=ANALYSE_EVERY,
                        help="analysis.per_sample.every of the runs (run; other than 10: B_simple only)")
    parser.add_argument("--only", default=None, help="run only the runs whose name contains this")
    parser.add_argument("--samples", type=int, nargs="+", default=None, help="run only these N = B x K")
    parser.add_argument("--figure", type=Path, default=None)
    args = parser.parse_args()
    if args.what == "run":
        # seed by seed, the default batch (N = 128) first: its time tells how long the rest takes
        runs = [Run(b, k, s, args.lr, args.analyse_every) for s in args.seeds for b, k in GRID]
        for run in sorted(runs, key=lambda r: (r.seed, r.samples != 128)):
            if (args.only is None or args.only in run.name) and (args.samples is None or run.samples in args.samples):
                train(run, args.out, args.stop, args.val_size)
    else:
        analyse(args.out, args.target, args.figure)


if __name__ == "__main__":
    main()
