"""How long ``rlgrad doctor`` takes on a 1,000-step run directory (target: under 2 s).

    .venv/bin/python bench/doctor_speed.py [--steps 1000] [--repeats 5]

The run is built from the recorded healthy demo run (tests/data/doctor/healthy): its metric rows repeated,
with small changes, to ``--steps`` steps, and its analysis files copied to every 10th step (100 analysis
steps for 1,000). Timed in this process: reading the run (``load_any``) plus every signature (``diagnose``),
best of ``--repeats``; and once, the whole command in a fresh interpreter (``python -m rlgrad doctor``,
Python and import start-up included). The last line is

    steps=... keys_per_step=... doctor_s=... cli_s=... target_s=2.0 ratio=...   (ratio = cli_s / target)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rlgrad import rundata as D  # noqa: E402
from rlgrad.doctor import diagnose  # noqa: E402

SOURCE = ROOT / "tests" / "data" / "doctor" / "healthy"
TARGET_S = 2.0


def build(run: Path, steps: int) -> int:
    rows = [json.loads(x) for x in (SOURCE / "metrics.jsonl").read_text().splitlines()]
    merged: dict[int, dict] = {}
    for r in rows:
        merged.setdefault(r["step"], {}).update(r["data"])
    src = [merged[s] for s in sorted(merged) if s > 0]
    run.mkdir(parents=True)
    shutil.copy(SOURCE / "config.yaml", run / "config.yaml")
    analysis = sorted((SOURCE / "analysis").glob("step_*"))
    with open(run / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            data = {k: (v * (1 + 0.001 * (s % 7)) if isinstance(v, float) else v)
                    for k, v in src[(s - 1) % len(src)].items()}
            f.write(json.dumps({"step": s, "data": data}) + "\n")
            if s % 10 == 1 and analysis:
                shutil.copytree(analysis[(s // 10) % len(analysis)], run / "analysis" / f"step_{s}")
    return max(len(d) for d in src)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlgrad-doctor-bench-") as tmp:
        run = Path(tmp) / "run"
        keys = build(run, a.steps)
        best = float("inf")
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            d = diagnose(D.load_any(run))
            best = min(best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "rlgrad", "doctor", str(run)], capture_output=True, text=True)
        cli = time.perf_counter() - t0
        assert res.returncode in (0, 1), res.stderr[-2000:]
        print(f"findings: {', '.join(f.id for f in d.findings)}")
        print(f"steps={a.steps} keys_per_step={keys} doctor_s={best:.3f} cli_s={cli:.3f} target_s={TARGET_S} "
              f"ratio={cli / TARGET_S:.3f}")


if __name__ == "__main__":
    main()
