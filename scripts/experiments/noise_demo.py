"""docs/noise_scale.md's "Measured on the embedded default, groups as the units": six steps of the default with the
per-sample analysis on every step, and the table drawn from the stored record.

    python scripts/experiments/noise_demo.py run   [--out runs/noise_demo]   # train, then store the record
    python scripts/experiments/noise_demo.py table                           # the page's table, from the record

``run`` trains ``rlgrad train trainer.total_training_steps=6 analysis.per_sample.every=1 trainer.test_freq=-1``
(the embedded default, arithmetic, 16 prompts x 8 samples, seed 1, one thread) and keeps the noise and proxy keys of
bucket ``all``, term ``task`` per step in ``bench/results/noise_demo_group_level.json``; ``table`` prints the page's
table from it alone (tests/experiments/test_noise_demo.py checks the page holds it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "bench" / "results" / "noise_demo_group_level.json"
COMMAND = ["rlgrad", "train", "trainer.total_training_steps=6", "analysis.per_sample.every=1", "trainer.test_freq=-1"]
KEYS = ("proxy_corr/samples", "proxy_corr/spearman", "proxy_corr/spearman_null95", "proxy_corr/pearson",
        "noise_samples/all", "noise_groups/all", "noise_trace/all/task", "noise_signal/all/task",
        "noise_trace_se/all/task", "noise_signal_se/all/task", "noise_cov/all/task", "noise_scale/all/task",
        "noise_scale_low/all/task", "noise_scale_high/all/task", "critic/score/mean")


def run(out: Path) -> None:
    cmd = [*COMMAND, "trainer.num_threads=1", "trainer.logger=[jsonl]", "trainer.save_freq=-1",
           f"trainer.default_local_dir={out}"]
    subprocess.run([sys.executable, "-m", *cmd], check=True)
    steps: dict[int, dict] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["step"], {}).update(row["data"])
    record = {"command": " ".join(COMMAND) + " (embedded default, arithmetic, 16 prompts x 8 samples, seed 1; CPU)",
              "steps": [{"step": s, **{k: m.get(k) for k in KEYS}} for s, m in sorted(steps.items())
                        if "noise_trace/all/task" in m]}
    STORE.write_text(json.dumps(record, indent=1) + "\n")


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
    ap.add_argument("what", choices=("run", "table"))
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "noise_demo")
    args = ap.parse_args()
    if args.what == "run":
        run(args.out)
    print(table(json.loads(STORE.read_text())), end="")


if __name__ == "__main__":
    main()
