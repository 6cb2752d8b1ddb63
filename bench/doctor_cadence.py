"""The doctor's gradient-level lead time against the analysis cadence: every instrument on every step against every
tenth step, on fresh seeds (issue 49; the table in docs/doctor.md, "Lead time and the analysis cadence").

    .venv/bin/python bench/doctor_cadence.py --seeds 21 22 23 24 25 [--out runs/doctor_cadence]

Trains, on the embedded default (``rlgrad train --config-name demo``, ``--steps`` steps), the faults of
``bench/doctor_lead_time.py``'s suite whose first detection in docs/doctor.md's lead-time table is gradient-level
(``FAULTS``) and a healthy run, with ``trainer.seed`` set to each of ``--seeds`` (the lead-time suite used the
demo's default seed and 1-3), at two cadences (``CADENCES``):

- ``every1``: the always-on setting of docs/instruments.md ("Every instrument on every step"):
  ``analysis.every=1 analysis.neurons.actor.nullspace_every=10 actor.ppo_micro_batch_size=128``;
- ``every10``: ``analysis.every=10`` (analysis steps 1, 11, 21).

Otherwise the lead-time suite's settings (``BASE`` there), without validation (``trainer.test_freq=-1``, none
before training): this study compares detection steps across cadences, not against validation. Each run is
``nice``d on one thread, one at a time, and skipped when ``--out`` already holds it finished (a ``done`` file), so an
interrupted study resumes. Then, per run, ``rlgrad_firsts`` (the doctor on every prefix of the run, as the live
doctor runs after each step; no re-training): the first step each finding shows as warn or critical, split into
gradient-level (it reads the instruments) and scalar.

Writes ``OUT/doctor_cadence.json`` (the command, when, the load, every run's detections) and prints the tables; the
stored copy is ``bench/results/doctor_cadence.json``, and ``--table bench/results/doctor_cadence.json`` prints
docs/doctor.md's tables from it alone (tests/doctor/test_heldout.py checks the page holds them).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from doctor_lead_time import BASE, ROOT, SUITE, alarms, earliest, is_gradient_level, rlgrad_firsts, train_run  # noqa: E402

from rlgrad import rundata as D  # noqa: E402

# the faults whose first detection in docs/doctor.md's lead-time table (analysis.every=2) is gradient-level
FAULTS = ("kl_huge", "entropy_collapse", "brevity_takeover", "std_norm_binary", "length_runaway")
CASES = (*FAULTS, "healthy")
CADENCES = {
    "every1": ["analysis.every=1", "analysis.neurons.actor.nullspace_every=10", "actor.ppo_micro_batch_size=128"],
    "every10": ["analysis.every=10"],
}
# the lead-time suite's settings less the ones this study sets otherwise (a key given twice is not left to the
# parser's choice)
SET_HERE = {"trainer.test_freq": "-1", "trainer.val_before_train": "false"}
REFERENCE = ROOT / "bench" / "results" / "doctor_lead_time.json"


def settings(case: str, seed: int, cadence: str) -> list[str]:
    """The ``rlgrad train`` overrides of one run."""
    mine = [*CADENCES[cadence], *(f"{k}={x}" for k, x in SET_HERE.items())]
    keys = {o.split("=")[0] for o in mine}
    base = [o for o in BASE if o.split("=")[0] not in keys]
    fault = [] if case == "healthy" else SUITE[case].overrides
    return [*base, *mine, *fault, f"trainer.seed={seed}"]


def run_name(case: str, seed: int, cadence: str) -> str:
    return f"{case}-seed{seed}-{cadence}"


def train(case: str, seed: int, cadence: str, out: Path, steps: int) -> str:
    """Train one run unless ``out`` holds it finished; returns what happened."""
    name = run_name(case, seed, cadence)
    return train_run(out / name, [*settings(case, seed, cadence), f"trainer.total_training_steps={steps}"])


def analysis_steps(run: D.RunData) -> list[int]:
    """The steps whose metrics hold the bucket analysis (what the gradient-level findings read)."""
    return sorted(s for s, m in run.rows.items() if "grad_norm/all/task" in m)


def detect(case: str, seed: int, cadence: str, out: Path) -> dict:
    """One run's first detections (kept in ``out/name/cadence.json``: done once)."""
    run_dir = out / run_name(case, seed, cadence)
    cache = run_dir / "cadence.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    run = D.load_run(run_dir)
    t0 = time.perf_counter()
    firsts = rlgrad_firsts(run)
    found = {"case": case, "seed": seed, "cadence": cadence, "steps": max(run.rows),
             "analysis_steps": analysis_steps(run), "trained_s": float((run_dir / "done").read_text()),
             "detect_s": round(time.perf_counter() - t0, 2), "rlgrad": firsts}
    cache.write_text(json.dumps(found, indent=1) + "\n")
    return found


def reference() -> dict[str, str]:
    """fault -> its first gradient-level detection in the lead-time table (analysis.every=2, the demo's seed 1)."""
    if not REFERENCE.is_file():
        return {}
    stored = json.loads(REFERENCE.read_text())
    return {f: words(earliest(stored[f]["rlgrad"], is_gradient_level)) for f in FAULTS if f in stored}


# ---------------------------------------------------------------- the tables


def words(found: tuple[int, list[str]] | None) -> str:
    if found is None:
        return "—"
    s, ids = found
    return f"{', '.join(f'`{i}`' for i in ids)} @ {s}"


def split(first: dict[str, dict], gradient: bool) -> dict[str, dict]:
    return {sid: d for sid, d in first.items() if is_gradient_level(sid) == gradient}


def table(stored: dict) -> str:
    runs = {(r["case"], r["seed"], r["cadence"]): r for r in stored["runs"].values()}
    seeds = sorted({r["seed"] for r in runs.values()})
    ref = stored.get("reference_every2", {})
    rows = ["| fault | seed | first gradient-level @ step: every=1 | every=10 | first scalar @ step: every=1 | "
            "every=10 | lead-time table (every=2, seed 1, 30 steps): first gradient-level |",
            "|---|---|---|---|---|---|---|"]
    for case in FAULTS:
        for seed in seeds:
            one, ten = runs.get((case, seed, "every1")), runs.get((case, seed, "every10"))
            if one is None and ten is None:
                continue
            cells = [words(earliest(r["rlgrad"], is_gradient_level)) if r else "not run" for r in (one, ten)]
            cells += [words(earliest(r["rlgrad"], lambda sid: not is_gradient_level(sid))) if r else "not run"
                      for r in (one, ten)]
            rows.append(f"| {case} | {seed} | " + " | ".join(cells) + f" | {ref.get(case, '—')} |")
    rows += ["", "| healthy run | seed | cadence (analysis steps) | gradient-level warn / critical at any prefix | "
                 "scalar warn / critical at any prefix |", "|---|---|---|---|---|"]
    for seed in seeds:
        for cadence in CADENCES:
            r = runs.get(("healthy", seed, cadence))
            if r is None:
                continue
            rows.append(f"| healthy | {seed} | {cadence.replace('every', 'every=')} ({len(r['analysis_steps'])}) | "
                        f"{alarms(split(r['rlgrad'], True))} | {alarms(split(r['rlgrad'], False))} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "doctor_cadence")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--seeds", type=int, nargs="+", default=[21, 22, 23, 24, 25])
    ap.add_argument("--only", nargs="*", default=list(CASES), choices=list(CASES), metavar="CASE")
    ap.add_argument("--table", type=Path, metavar="JSON", help="print the tables of a stored doctor_cadence.json "
                    "(bench/results/doctor_cadence.json: docs/doctor.md's) and stop")
    a = ap.parse_args()
    if a.table:
        if not a.table.is_file():
            print(f"error: no such file: {a.table}", file=sys.stderr)
            sys.exit(2)
        print(table(json.loads(a.table.read_text())), end="")
        return
    a.out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    plan = [(c, s, k) for s in a.seeds for c in a.only for k in CADENCES]  # seed by seed: the first is whole first
    for c, s, k in plan:
        print(train(c, s, k, a.out, a.steps), flush=True)
    failed = [run_name(*p) for p in plan if not (a.out / run_name(*p) / "done").is_file()]
    if failed:
        sys.exit(f"not trained: {', '.join(failed)} (see their .log under {a.out})")
    runs = {run_name(*p): detect(*p, a.out) for p in plan}
    wall = time.perf_counter() - t0
    stored = {"command": shlex.join(["python", "bench/doctor_cadence.py", *sys.argv[1:]]),
              "measured": {"started": started, "load_at_start": [round(x, 2) for x in load0],
                           "load_at_end": [round(x, 2) for x in os.getloadavg()],
                           "wall_s_this_invocation": round(wall, 1),
                           "train_s_sum": round(sum(r["trained_s"] for r in runs.values()), 1),
                           "detect_s_sum": round(sum(r["detect_s"] for r in runs.values()), 1)},
              "settings": {k: settings("healthy", 0, k)[:-1] for k in CADENCES},
              "reference_every2": reference(), "runs": runs}
    (a.out / "doctor_cadence.json").write_text(json.dumps(stored, indent=1) + "\n")
    print(table(stored))
    print(f"total: {wall:.0f} s wall; {a.out / 'doctor_cadence.json'}")


if __name__ == "__main__":
    main()
