"""Issue 45's critical-batch experiment (issue 32's, redone so that it can fail): does the group-level gradient noise
scale B_simple predict the critical batch B_crit of GRPO on the embedded default? (McCandlish, Kaplan, Amodei et al.
2018, "An Empirical Model of Large-Batch Training", arXiv:1812.06162.)

    python scripts/experiments/noise_sweep.py run [--phase grid|widen|k|noise] [--samples 16 32 ...] [--seeds 1 2 3]
    python scripts/experiments/noise_sweep.py analyse [--figure docs/img/noise_sweep.png]

``run`` trains ``rlgrad train --config-name demo`` (the embedded tiny Qwen2, warm-started, on arithmetic; Dr. GRPO,
token-mean) with the learning-rate warm-up removed (``actor.optim.lr_warmup_steps=0``), one thread under
``nice -n 10``, validating greedily on ``--val-size`` prompts after every step and analysing every step
(``analysis.per_sample.every=1``: the group-level noise_trace / noise_signal and their jackknife errors). A run stops
once its validation accuracy has gained the highest target over its step-0 value, once it collapses (``COLLAPSE``
below its best so far), once it stalls (no new best for ``STALL`` steps), or at its step cap. Each finished run
leaves a compact extract, ``RESULTS/extracts/NAME.json`` (its validation curve and the noise figures of every analysed
step), written atomically; a run with an extract is skipped, so the sweep resumes and widens. The phases:

* ``grid``: N = B·K in ``--samples`` at K = 8, every learning rate of ``LRS``, every seed;
* ``widen``: one more rate past the edge of the grid for every N whose best rate (at any target) is at an edge;
* ``k``: K in ``K_SWEEP`` at N = ``K_SAMPLES``, at that N's best rate (the highest target) from the grid's runs;
* ``noise``: ``NOISE_SEEDS`` more seeds at each N of ``NOISE_SAMPLES`` at its best rate (the highest target): a
  handful of steps of 8-32 groups each up to the target does not resolve B_simple; these runs add steps for it and
  re-measure S(N) at the chosen rate on seeds that did not choose it (they stay out of the fit).

``analyse`` reads ``RESULTS`` alone (``noise_sweep_analysis.py``): every table (printed as Markdown, written to
``RESULTS/analysis.json``) and the figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import noise_sweep_analysis as analysis  # noqa: E402  (beside this script)
from noise_sweep_analysis import EXTRACTS  # noqa: E402

from rlgrad.runfiles import METRICS_FILE, atomic_write_text  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "noise_sweep"
SAMPLES = (16, 32, 64, 128, 256)
K = 8
LRS = (5e-5, 1e-4, 2e-4, 4e-4, 8e-4)  # a factor 2 apart; ``widen`` extends by the same factor
SEEDS = (1, 2, 3)
K_SAMPLES, K_SWEEP = 64, (2, 4, 8, 16)
NOISE_SAMPLES, NOISE_SEEDS = (64, 128, 256), tuple(range(11, 26))
COLLAPSE = 0.2  # validation accuracy this far below the run's best so far: the policy collapsed (it does not recover)
STALL = 25  # steps without a new best validation accuracy: the run sits on a plateau below the highest target
NOISE_KEYS = {"trace": "noise_trace/all/task", "signal": "noise_signal/all/task",
              "trace_se": "noise_trace_se/all/task", "signal_se": "noise_signal_se/all/task",
              "cov": "noise_cov/all/task", "groups": "noise_groups/all"}


@dataclass(frozen=True)
class Run:
    samples: int  # N = B·K rollouts per step
    rollouts: int  # K = rollout.n
    lr: float
    seed: int
    role: str = "grid"  # "noise": an extra seed for B_simple only, left out of the steps and the fit

    @property
    def prompts(self) -> int:
        return self.samples // self.rollouts

    @property
    def name(self) -> str:
        tail = "_noise" if self.role == "noise" else ""
        return f"N{self.samples}_K{self.rollouts}_lr{self.lr:g}_s{self.seed}{tail}"

    @property
    def max_steps(self) -> int:
        # the slowest rate (5e-5) needs ~45 steps to +0.3 at N = 16 in the pilot, ~25 at N = 128
        return 60 if self.samples <= 32 else 40


def _rows(metrics: Path) -> list[dict]:
    out = []
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # the trainer's line being written
                continue
    return out


def _val(rows: list[dict]) -> list[tuple[int, float]]:
    return [(r["step"], r["data"]["val/accuracy"]) for r in rows if "val/accuracy" in r.get("data", {})]


def _end(val: list[tuple[int, float]], top: float) -> str:
    """Why a run can stop now: "target" (past the highest), "collapse", "stall", or "cap" (it goes on)."""
    best = max(acc for _, acc in val)
    best_step = next(step for step, acc in val if acc == best)
    if val[-1][1] - val[0][1] >= top:
        return "target"
    if val[-1][1] < best - COLLAPSE:
        return "collapse"
    return "stall" if val[-1][0] - best_step >= STALL else "cap"


def _number(value: object) -> float | None:
    """A metric as JSON can hold it: None for NaN (the trainer writes "nan" strings) or a missing key."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def extract(run: Run, rows: list[dict], wall: float, end: str) -> dict:
    """The compact record a run leaves: its validation curve and every analysed step's noise figures."""
    fields = list(NOISE_KEYS)
    noise = [[r["step"], *(_number(r["data"].get(NOISE_KEYS[f])) for f in fields)] for r in rows
             if NOISE_KEYS["trace"] in r.get("data", {})]
    return {"run": asdict(run), "max_steps": run.max_steps, "wall_s": round(wall, 1), "end": end,
            "val": _val(rows), "noise_fields": ["step", *fields], "noise": noise}


def train(run: Run, rundirs: Path, results: Path, top: float, val_size: int) -> None:
    target = results / EXTRACTS / f"{run.name}.json"
    if target.exists():
        return
    rundir = rundirs / run.name
    shutil.rmtree(rundir, ignore_errors=True)  # a run cut short is retrained from scratch
    rundir.mkdir(parents=True)
    cmd = ["nice", "-n", "10", sys.executable, "-m", "rlgrad", "train", "--config-name", "demo",
           f"data.train_batch_size={run.prompts}", f"rollout.n={run.rollouts}", f"trainer.seed={run.seed}",
           f"trainer.total_training_steps={run.max_steps}", "trainer.test_freq=1", f"data.val_size={val_size}",
           f"actor.optim.lr={run.lr}", "actor.optim.lr_warmup_steps=0", "analysis.every=null",
           "analysis.per_sample.every=1", "analysis.per_sample.proxy_corr=false", "trainer.num_threads=1",
           "trainer.logger=[jsonl]", "trainer.save_freq=-1", f"trainer.default_local_dir={rundir}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    start, end = time.time(), "cap"
    with open(rundir / "train.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        while proc.poll() is None:
            time.sleep(1)
            val = _val(_rows(rundir / METRICS_FILE))
            if len(val) < 2:
                continue
            end = _end(val, top)
            if end != "cap":  # the rest of the run reads nothing the analysis needs
                proc.terminate()
                proc.wait()
    rows = _rows(rundir / METRICS_FILE)
    if proc.returncode != 0 and end == "cap" or not _val(rows):
        print(f"{run.name}: failed (exit {proc.returncode}), see {rundir / 'train.log'}", flush=True)
        return
    wall = time.time() - start
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, json.dumps(extract(run, rows, wall, end)) + "\n")  # compact: ~100 runs stored
    val = _val(rows)
    print(f"{run.name}: {wall:.0f} s, {end} at step {val[-1][0]}, val {val[0][1]:.3f} -> {val[-1][1]:.3f}", flush=True)


def widened(results: Path, samples: list[int]) -> list[float | None]:
    """Per N, one rate past the grid's edge where the best rate at some target is at that edge (else None)."""
    runs = analysis.load(results)
    out = []
    for n in samples:
        lrs = sorted({r["run"]["lr"] for r in runs if r["run"]["samples"] == n and r["run"]["rollouts"] == K})
        extra = None
        for gain in analysis.TARGETS:
            best = analysis.best_lr(analysis.cells(runs, gain, n, K))
            if best is not None and len(lrs) >= 2 and best == lrs[0]:
                extra = lrs[0] / 2
            elif best is not None and len(lrs) >= 2 and best == lrs[-1]:
                extra = lrs[-1] * 2
        out.append(extra)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("run", "analyse"))
    parser.add_argument("--phase", choices=("grid", "widen", "k", "noise"), default="grid", help="what to run (run)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the extracts and the analysis")
    parser.add_argument("--rundirs", type=Path, default=ROOT / "runs" / "noise_sweep_i45", help="run directories")
    parser.add_argument("--samples", type=int, nargs="+", default=list(SAMPLES), help="N = B x K (grid, widen)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--noise-samples", type=int, nargs="+", default=list(NOISE_SAMPLES), help="N's (noise)")
    parser.add_argument("--noise-seeds", type=int, nargs="+", default=list(NOISE_SEEDS), help="seeds (noise)")
    parser.add_argument("--val-size", type=int, default=512)
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "noise_sweep.png")
    args = parser.parse_args()
    if args.what == "analyse":
        analysis.analyse(args.results, args.figure)
        return
    top = max(analysis.TARGETS)
    if args.phase == "grid":
        # seed by seed: a sweep cut short still has every (N, lr) cell at the first seeds
        todo = [Run(n, K, lr, s) for s in args.seeds for n in args.samples for lr in LRS]
    elif args.phase == "widen":
        todo = [Run(n, K, lr, s) for s in args.seeds
                for n, lr in zip(args.samples, widened(args.results, args.samples)) if lr is not None]
    elif args.phase == "noise":
        runs = analysis.load(args.results)
        best = {n: analysis.best_lr(analysis.cells(runs, top, n, K, "grid")) for n in args.noise_samples}
        todo = [Run(n, K, lr, s, "noise") for s in args.noise_seeds for n, lr in best.items() if lr is not None]
    else:
        lr = analysis.best_lr(analysis.cells(analysis.load(args.results), top, K_SAMPLES, K))
        if lr is None:
            sys.exit(f"no rate at N = {K_SAMPLES}, K = {K} reaches +{top:g} yet: run the grid first")
        print(f"K sweep at N = {K_SAMPLES}, lr {lr:g} (that N's best at +{top:g})", flush=True)
        todo = [Run(K_SAMPLES, k, lr, s) for s in args.seeds for k in K_SWEEP]
    for run in todo:
        train(run, args.rundirs, args.results, top, args.val_size)


if __name__ == "__main__":
    main()
