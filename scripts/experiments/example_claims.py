"""What the shipped examples show, measured: each example's preset trained on a few seeds, its validation accuracy
at the start, along the way and at the end, stored compactly under ``bench/results/examples/`` (docs/benchmarks.md,
"What the examples show").

    python scripts/experiments/example_claims.py run demo custom_reward_demo [--seeds 1 2 3] [--out runs/example_claims]
    python scripts/experiments/example_claims.py show        # the tables docs/benchmarks.md shows, from the store

``run`` trains the preset once per seed, exactly as a user would (``rlgrad train --config-name PRESET
trainer.seed=S``, one torch thread, no checkpoints), and adds the seed to ``bench/results/examples/<name>.json``
with the command, the date, the wall time, the load average before and after, and the validation curve (plus, for
a run with the reward-component geometry, the per-step shares and cosines the docs quote). It is resumable: a seed
already in the store is kept (delete it from the file to measure it again). ``show`` reads the store alone and
prints each example's table; tests/experiments/test_example_claims.py checks that docs/benchmarks.md holds them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "bench" / "results" / "examples"
EXAMPLES = {  # name -> (preset, extra overrides, whether its claim is the reward-component geometry too)
    "demo": ("demo", [], False),
    "custom_reward_demo": ("custom_reward_demo", [], True),
}


def command(name: str, seed: int, run_dir: Path) -> list[str]:
    """The run's command line, as a user types it from the repository root (where it runs)."""
    preset, extra, _ = EXAMPLES[name]
    run_dir = run_dir.resolve()
    if run_dir.is_relative_to(ROOT):
        run_dir = run_dir.relative_to(ROOT)
    return ["rlgrad", "train", "--config-name", preset, *extra, f"trainer.seed={seed}", "trainer.save_freq=-1",
            "trainer.logger=[jsonl]", "trainer.num_threads=1", f"trainer.default_local_dir={run_dir}"]


def metric_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row["step"], {}).update(row["data"])
    return out


def summarize(run_dir: Path) -> dict:
    """The compact record of one run: the validation curve, and the medians of the geometry's shares and cosines
    over the steps that logged them (``rest``'s largest absolute share, the score the weighted fields leave out)."""
    rows = metric_rows(run_dir)
    curve = [[step, rows[step]["val/accuracy"]] for step in sorted(rows) if "val/accuracy" in rows[step]]
    record: dict = {"val": curve, "start": curve[0][1], "end": curve[-1][1]}
    shares: dict[str, list[float]] = {}
    cosines: dict[str, list[float]] = {}
    for data in rows.values():
        for key, value in data.items():
            if key.startswith("grad_comp/") and key.endswith("/share") and value == value:
                shares.setdefault(key.split("/")[1], []).append(value)
            elif key.startswith("grad_sim/") and value == value:
                cosines.setdefault(key.split("/", 1)[1], []).append(value)
    if shares:
        rest = shares.pop("rest", [0.0])
        record["geometry"] = {"steps": len(next(iter(shares.values()))),
                              "share_median": {k: statistics.median(v) for k, v in sorted(shares.items())},
                              "rest_share_max_abs": max(abs(v) for v in rest),
                              "cosine_median": {k: statistics.median(v) for k, v in sorted(cosines.items())}}
    return record


def load(name: str) -> dict:
    path = STORE / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else {"example": name, "preset": EXAMPLES[name][0],
                                                                 "seeds": {}}


def save(name: str, record: dict) -> None:
    STORE.mkdir(parents=True, exist_ok=True)
    path = STORE / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)  # atomic: a killed run never leaves half a record


def run(names: list[str], seeds: list[int], out: Path) -> None:
    for name in names:
        record = load(name)
        for seed in seeds:
            if str(seed) in record["seeds"]:
                print(f"{name} seed {seed}: stored, kept")
                continue
            run_dir = out / f"{name}-seed{seed}"
            if run_dir.exists():  # a half-run of an interrupted call: start it again from nothing
                shutil.rmtree(run_dir)
            cmd = command(name, seed, run_dir)
            print(" ".join(cmd), flush=True)
            load_before, started = os.getloadavg()[0], time.perf_counter()
            subprocess.run([sys.executable, "-m", *cmd[:1], *cmd[1:]], check=True, cwd=ROOT,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
            seconds = time.perf_counter() - started
            record["seeds"][str(seed)] = {"command": cmd, "date": datetime.date.today().isoformat(),
                                          "wall_s": round(seconds, 1),
                                          "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                                          **summarize(run_dir)}
            save(name, record)


def percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def table(record: dict) -> str:
    """The example's table: one row per seed, start -> end, the change and the best point of the curve."""
    lines = ["| seed | validation accuracy, start → end | change | best (step) | date | wall time (load) |",
             "|---|---|---|---|---|---|"]
    for seed, r in sorted(record["seeds"].items(), key=lambda kv: int(kv[0])):
        best_step, best = max(r["val"], key=lambda point: (point[1], -point[0]))
        lines.append(f"| {seed} | {percent(r['start'])} → {percent(r['end'])} | "
                     f"{100 * (r['end'] - r['start']):+.1f} points | {percent(best)} ({best_step}) | {r['date']} | "
                     f"{r['wall_s']:.0f} s ({r['load'][0]:.1f} → {r['load'][1]:.1f}) |")
    return "\n".join(lines)


def two_places(x: float) -> str:
    return f"{x:.2f}".replace("-0.00", "0.00")


def geometry_table(record: dict) -> str | None:
    """The reward-component geometry per seed (median share of each field, rest's largest, median cosines), for
    an example whose claim it is."""
    if not EXAMPLES[record["example"]][2]:
        return None
    rows = [(seed, r["geometry"]) for seed, r in sorted(record["seeds"].items(), key=lambda kv: int(kv[0]))
            if "geometry" in r]
    if not rows:
        return None
    fields, pairs = list(rows[0][1]["share_median"]), list(rows[0][1]["cosine_median"])
    lines = ["| seed | steps | " + " | ".join(f"{f} share (median)" for f in fields) + " | rest share (max abs) | "
             + " | ".join(f"cosine {p} (median)" for p in pairs) + " |",
             "|---" * (3 + len(fields) + len(pairs)) + "|"]
    for seed, g in rows:
        lines.append(f"| {seed} | {g['steps']} | " + " | ".join(two_places(g["share_median"][f]) for f in fields)
                     + f" | {g['rest_share_max_abs']:.2g} | "
                     + " | ".join(f"{g['cosine_median'][p]:+.2f}" for p in pairs) + " |")
    return "\n".join(lines)


def tables() -> dict[str, list[str]]:
    """Every table docs/benchmarks.md shows from the store, by example."""
    out = {}
    # the store also holds records other scripts write (bench/sokoban_demo.py): only this script's examples
    for path in sorted(STORE / f"{name}.json" for name in EXAMPLES):
        if not path.is_file():
            continue
        record = json.loads(path.read_text())
        geometry = geometry_table(record)
        out[record["example"]] = [table(record)] + ([geometry] if geometry is not None else [])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run_parser = sub.add_parser("run", help="train the examples' presets, add each seed to the store")
    run_parser.add_argument("names", nargs="+", choices=sorted(EXAMPLES))
    run_parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    run_parser.add_argument("--out", type=Path, default=ROOT / "runs" / "example_claims")
    sub.add_parser("show", help="print the tables docs/benchmarks.md shows")
    args = parser.parse_args(argv)
    if args.what == "run":
        run(args.names, args.seeds, args.out)
    else:
        for name, blocks in tables().items():
            print(f"{name} (bench/results/examples/{name}.json):\n")
            for block in blocks:
                print(block + "\n")


if __name__ == "__main__":
    main()
