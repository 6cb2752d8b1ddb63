"""Drift of a run whose instruments ride on the update (analysis.every=1, one micro-batch) from the same run without
instruments: weights at the saved steps and every logged metric. Usage: ride_drift.py BASE STEPS [RUN ...], where
BASE/plain and BASE/RUN are run directories of ``rlgrad train`` (see README.md here for the commands)."""

from __future__ import annotations

import math
import sys

from safetensors.torch import load_file

from rlgrad.runfiles import read_jsonl


def main(base: str, steps: list[int], others: list[str]) -> None:
    for other in others:
        for step in steps:
            a = load_file(f"{base}/plain/global_step_{step}/actor/model.safetensors")
            b = load_file(f"{base}/{other}/global_step_{step}/actor/model.safetensors")
            absd = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
            rel = max(float((a[k].double() - b[k].double()).abs().max()) / float(a[k].double().abs().max()) for k in a)
            tot = math.sqrt(sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a)
                            / sum(float(a[k].double().pow(2).sum()) for k in a))
            print(f"{other} vs plain, step {step}: weights max |diff| {absd:.3e}, max over tensors of "
                  f"max|diff|/max|w| {rel:.3e}, ||diff||/||w|| {tot:.3e}")
        plain, run = read_jsonl(f"{base}/plain/metrics.jsonl"), read_jsonl(f"{base}/{other}/metrics.jsonl")
        worst: dict[str, tuple[float, int, float, float]] = {}
        compared = set()
        for x, y in zip(plain, run):
            for k, v in x["data"].items():
                w = y["data"].get(k)
                if k.startswith("timing_s/") or not isinstance(v, (int, float)) or not isinstance(w, (int, float)):
                    continue
                if isinstance(v, float) and math.isnan(v):
                    continue
                compared.add(k)
                d = abs(w - v) / max(abs(v), 1e-12)
                if d > worst.get(k, (0.0,))[0]:
                    worst[k] = (d, x["step"], v, w)
        print(f"{other}: {len(plain)} rows; {len(worst)} of the {len(compared)} metric keys both runs log differ; "
              "largest relative differences:")
        for k, (d, s, v, w) in sorted(worst.items(), key=lambda kv: -kv[1][0])[:8]:
            print(f"   {k} step {s}: {v!r} vs {w!r} (rel {d:.2e})")


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3:] or ["rode"])
