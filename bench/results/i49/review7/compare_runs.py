"""Compares metrics.jsonl of the review runs (runs.sh) at fcda033 against 4900ed6: keys only one has, values
non-finite in the new run only, and the largest relative differences (timings left out)."""

from __future__ import annotations

import json
import math
import sys


def load(path: str) -> list[dict]:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return [dict(r["data"], step=r["step"]) for r in rows]


def main(root: str = "/tmp") -> None:
    for mode in ("default", "own_std"):
        base = load(f"{root}/review7_run_base_{mode}/metrics.jsonl")
        new = load(f"{root}/review7_run_new_{mode}/metrics.jsonl")
        worst: dict[str, tuple] = {}
        only, nonfinite = set(), set()
        for ra, rb in zip(base, new):
            ka = {k for k in ra if not k.startswith("timing_s/")}
            kb = {k for k in rb if not k.startswith("timing_s/")}
            only |= ka ^ kb
            for k in ka & kb:
                x, y = ra[k], rb[k]
                if not isinstance(x, (int, float)) or not isinstance(y, (int, float)):
                    continue
                if not math.isfinite(y) and math.isfinite(x):
                    nonfinite.add(k)
                if math.isfinite(x) and math.isfinite(y) and x != y:
                    r = abs(x - y) / max(abs(x), 1e-12)
                    if r > worst.get(k, (0.0,))[0]:
                        worst[k] = (r, ra["step"], x, y)
        grad_keys = sorted(k for k in new[-1] if k.startswith(("grad_comp/", "grad_sim/", "grad_norm_sample/")))
        print(f"{mode}: rows {len(base)}/{len(new)}, keys in one run only: {sorted(only)}, non-finite in the new run "
              f"only: {sorted(nonfinite)}, grad_comp/grad_sim/grad_norm_sample keys at the last step: {len(grad_keys)}")
        for k, v in sorted(worst.items(), key=lambda kv: (-kv[1][0], kv[0]))[:10]:
            r, step, x, y = v
            print(f"  {k:<45} rel {r:.2e} step {step} base {x:.6g} new {y:.6g}")


if __name__ == "__main__":
    main(*sys.argv[1:])
