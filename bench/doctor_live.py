"""The live doctor's cost against the step time of the embedded default (target: at most 1% of a step).

    .venv/bin/python bench/doctor_live.py [--steps 1000]

Replays the recorded healthy demo run (tests/data/doctor/healthy, its rows repeated with small changes to
``--steps`` steps, as bench/doctor_speed.py builds them) through ``rlgrad.doctor.live.LiveDoctor`` step by step,
each step taking the demo's own median step time (its ``timing_s/step``, recorded on this machine), with the
default budget of 1%. Prints the cost of one diagnosis at a few history lengths, and the doctor's total time over
the steps' total time. The last line is

    steps=... step_s=... diagnosed=... skipped=... doctor_s=... share=... target=0.01
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from doctor_speed import SOURCE, build  # noqa: E402

from rlgrad import rundata as D  # noqa: E402
from rlgrad.doctor import diagnose  # noqa: E402
from rlgrad.doctor.live import LiveDoctor  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    a = ap.parse_args()
    step_s = statistics.median(D.series(D.load_any(SOURCE), "timing_s/step")[1])
    with tempfile.TemporaryDirectory(prefix="rlgrad-doctor-live-") as tmp:
        run_dir = Path(tmp) / "run"
        build(run_dir, a.steps)
        run = D.load_any(run_dir)
        for n in (30, 300, 1000):
            if n <= a.steps:
                part = D.RunData(name="p", source="p", rows={s: m for s, m in run.rows.items() if s <= n},
                                 config=run.config, run_dir=run_dir)
                t0 = time.perf_counter()
                diagnose(part)
                print(f"one diagnosis of {n} steps: {time.perf_counter() - t0:.4f} s")
        live = LiveDoctor(None, run.config, say=lambda line: None)
        for s in sorted(run.rows):
            live.observe(s, run.rows[s], step_s)
    total = step_s * len(run.rows)
    print(f"steps={len(run.rows)} step_s={step_s:.2f} diagnosed={len(run.rows) - live.skipped} "
          f"skipped={live.skipped} doctor_s={live.cost:.2f} share={live.cost / total:.4f} target=0.01")


if __name__ == "__main__":
    main()
