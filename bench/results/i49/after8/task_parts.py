"""Wall time per step of the task-term instruments' parts outside the update's backward (issue 49, branch after8;
bench/results/i49/hooks7/instrument_parts.py with the ``task`` instruments and their parts).

The bench's task-term setting (bench/always_on_cost.py ``--instruments task actor.ppo_micro_batch_size=128``, one
thread), every step instrumented; each function named below is
wrapped in a timer (by its name in the module that calls it), and each hook phase of ``HookRunner`` too, whose
label a part's time carries. Printed: the median and mean ms per step over ``--steps`` steps after 2 warm-up
steps. Run it on two trees (``PYTHONPATH=<tree>/src``) back to back to compare them; a name a tree lacks is left out.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=src python bench/results/i49/after8/task_parts.py --steps 30
"""

from __future__ import annotations

import argparse
import functools
import importlib
import statistics
import tempfile
import time

import torch

from rlgrad.config.load import load_config
from rlgrad.logging.sinks import MetricLogger
from rlgrad.recipes import make_trainer

# bench/always_on_cost.py's INSTRUMENTS["task"] (copied: this file runs on trees whose bench/ may differ)
TASK = ["analysis.buckets.every=1", "analysis.components.every=1", "analysis.per_sample.every=1",
        "analysis.per_sample.terms=[task]", "actor.entropy_coeff=0", "actor.use_kl_loss=false"]

PARTS = [
    "per_sample.PerSampleHook.measure", "per_sample.analyse_per_sample", "per_sample.proxy_correlation",
    "per_sample.null_permutations", "per_sample.global_buckets", "per_sample.group_noise", "per_sample.sample_rows",
    "per_sample.layer_summary", "per_sample.fast_unsupported", "buckets.GradientAnalysisHook.measure",
    "buckets.analyse_buckets", "buckets.global_buckets", "buckets.fast_unsupported", "buckets._loss_values",
    "buckets._from_groups", "components.ComponentGeometryHook.measure", "components.analyse_components",
    "components.component_advantages", "components._component_grams", "components._with_zero_slices",
    "components.fast_unsupported", "components.split_advantages", "instrument.fast_unsupported",
    "instrument.InstrumentHook.write", "instrument.atomic_write_text",
    "instrument.atomic_write_json", "groups.rides_on_update", "groups.group_pass",
]
PHASES = ["before_update", "on_grads", "after_update", "before_grads"]


def _wrap(owner: object, name: str, label: str, acc: dict[str, float], phase: list[str], sets_phase: bool) -> None:
    """``owner.name`` replaced by a timer adding its seconds to ``acc[label [phase]]``."""
    f = getattr(owner, name)

    @functools.wraps(f)
    def timed(*a, **k):
        if sets_phase:
            phase.append(name)
        started = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            if sets_phase:
                phase.pop()
            where = label if sets_phase or not phase else f"{label} [{phase[-1]}]"
            acc[where] = acc.get(where, 0.0) + time.perf_counter() - started

    setattr(owner, name, timed)


def _owner(module: str, attr: str) -> tuple[object, str] | None:
    obj = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        obj = getattr(obj, part)
    return (obj, name) if hasattr(obj, name) else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    acc: dict[str, float] = {}
    phase: list[str] = []
    for spec in PARTS:
        module, attr = spec.split(".", 1)
        if found := _owner(f"rlgrad.analysis.{module}", attr):
            _wrap(*found, spec, acc, phase, sets_phase=False)
    for name in PHASES:
        _wrap(importlib.import_module("rlgrad.hooks").HookRunner, name, f"HookRunner.{name}", acc, phase, True)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(overrides=[
            "trainer.logger=[]", f"trainer.default_local_dir={tmp}/run", "trainer.num_threads=1",
            "actor.ppo_micro_batch_size=128", *TASK])
        tr = make_trainer(cfg, log=lambda *a: None)
        logger = MetricLogger([])
        per: dict[str, list[float]] = {}
        step_times: list[float] = []
        for k in range(args.steps + 2):
            before = dict(acc)
            started = time.perf_counter()
            tr.train_step(k + 1, logger)
            if k < 2:  # warm-up
                continue
            step_times.append(time.perf_counter() - started)
            for label, v in acc.items():
                per.setdefault(label, []).append(v - before.get(label, 0.0))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {args.steps} steps; ms per step "
          f"(median, mean); a step: median {statistics.median(step_times) * 1e3:.1f} ms")
    outside = [f"HookRunner.{p}" for p in PHASES if p != "before_grads"]
    sums = [sum(per[p][i] for p in outside if p in per) for i in range(len(step_times))]
    print(f"{statistics.median(sums) * 1e3:8.2f} {statistics.mean(sums) * 1e3:8.2f}  "
          "hooks outside the backward (before_update + on_grads + after_update)")
    for label in sorted(per, key=lambda n: -statistics.mean(per[n])):
        print(f"{statistics.median(per[label]) * 1e3:8.2f} {statistics.mean(per[label]) * 1e3:8.2f}  {label}")


if __name__ == "__main__":
    main()
