"""The multi-turn demos' records (docs/training.md, docs/benchmarks.md "The Sokoban demo" and "The FrozenLake
demo"): the greedy validation success of `rlgrad train --config-name sokoban_demo` (or `frozen_lake_demo`) runs
at every validation step, their time, and the bucket analysis at each analysis step, read from the runs' metric
files into one compact JSON; ``--table`` prints the rows docs/benchmarks.md shows from such a record.

    rlgrad train --config-name sokoban_demo trainer.seed=1 trainer.default_local_dir=runs/sok-s1   # and seed 2
    python bench/sokoban_demo.py runs/sok-s1 runs/sok-s2 --out bench/results/examples/sokoban_demo.json
    python bench/sokoban_demo.py --table bench/results/examples/sokoban_demo.json

The e2e test tests/rl/test_agent_runs.py::test_the_sokoban_demo_learns guards a shorter run of the same preset.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from rlgrad.runfiles import CONFIG_FILE, METRICS_FILE, atomic_write_text, read_jsonl


def bucket_rows(data: dict) -> list[dict]:
    """One analysis step's buckets: groups, groups whose episodes all scored the same, mean reward std, and the
    task gradient's norm (the bucket's mean gradient, and per sample)."""
    out = []
    for k in range(1, 100):
        pre = f"grad_norm/bucket_{k}/"
        if f"{pre}task" not in data:
            break
        out.append({"bucket": k, "groups": data.get(f"{pre}group_rv_count"),
                    "groups_all_same": data.get(f"{pre}group_rv_zero_count"),
                    "reward_std_mean": data.get(f"{pre}reward_std_mean"), "task": data.get(f"{pre}task"),
                    "per_sample_task": data.get(f"{pre}per_sample/task")})
    return out


def summary(run: Path) -> dict:
    rows = read_jsonl(run / METRICS_FILE)
    val = {r["step"]: r["data"] for r in rows if "val/env/success" in r["data"]}
    steps = [r for r in rows if r["step"] > 0]
    first, last = min(val), max(val)
    return {
        "run": run.name,
        "seed": yaml.safe_load((run / CONFIG_FILE).read_text())["trainer"]["seed"],
        "val_success": {s: round(d["val/env/success"], 4) for s, d in sorted(val.items())},
        "val_action_is_effective": {s: round(d["val/env/action_is_effective"], 4) for s, d in sorted(val.items())
                                    if "val/env/action_is_effective" in d},
        "gain_points": round(100 * (val[last]["val/env/success"] - val[first]["val/env/success"]), 1),
        "best_points": round(100 * (max(d["val/env/success"] for d in val.values())
                                    - val[first]["val/env/success"]), 1),
        "steps": len(steps),
        "step_s_sum": round(sum(r["data"].get("timing_s/step", 0.0) for r in steps), 1),
        "buckets": {r["step"]: bucket_rows(r["data"]) for r in steps if "grad_norm/bucket_1/task" in r["data"]},
    }


def table(record: dict) -> str:
    """The rows docs/benchmarks.md shows of a record: per run, greedy success at the first validation, at its best
    and at the last, and the gain in points (the table's other columns, time and load, come from the note)."""
    lines = []
    for run in record["runs"]:
        val = {int(s): v for s, v in run["val_success"].items()}
        best = max(val.values())
        at = [s for s, v in sorted(val.items()) if v == best]
        lines.append(f"| {run['seed']} | {100 * val[min(val)]:.1f}% | {100 * best:.1f}% (step"
                     f"{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}) | {100 * val[max(val)]:.1f}% | "
                     f"**{run['gain_points']:+.1f}** |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories of one preset (sokoban_demo, frozen_lake_demo)")
    ap.add_argument("--out", type=Path, help="write the JSON here (default: print it)")
    ap.add_argument("--note", default="", help="the machine and load the runs had, the wall times measured")
    ap.add_argument("--table", action="store_true", help="RUNS is one stored record: print its docs table rows")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(args.runs[0].read_text())))
        return 0
    preset = yaml.safe_load((args.runs[0] / CONFIG_FILE).read_text())["trainer"]["experiment_name"]
    record = {"command": f"rlgrad train --config-name {preset} trainer.seed=SEED", "note": args.note,
              "runs": [summary(run) for run in args.runs]}
    text = json.dumps(record, indent=1) + "\n"
    if args.out is None:
        print(text, end="")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
