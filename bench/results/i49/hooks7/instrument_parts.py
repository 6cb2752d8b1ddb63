"""Wall time per step of the instruments' parts outside the update's backward (issue 49, branch hooks7).

The bench's always-on setting (bench/always_on_cost.py ``--instruments default actor.ppo_micro_batch_size=128
analysis.neurons.actor.nullspace_every=10``, one thread), every step instrumented; each function named below is
wrapped in a timer (by its name in the module that calls it), and each hook phase of ``HookRunner`` too, whose
label a part's time carries. Printed: the median and mean ms per step over ``--steps`` steps after 2 warm-up
steps. Run it on two trees (``PYTHONPATH=<tree>/src``) back to back to compare them; a name a tree lacks is left out.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=src python bench/results/i49/hooks7/instrument_parts.py --steps 30
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

PARTS = [
    "per_sample.PerSampleHook.measure", "per_sample.analyse_per_sample", "per_sample.proxy_correlation",
    "per_sample.null_permutations", "per_sample.global_buckets", "per_sample.group_noise", "per_sample.sample_rows",
    "per_sample.fast_unsupported", "buckets.GradientAnalysisHook.measure", "buckets.analyse_buckets",
    "buckets.global_buckets", "buckets.fast_unsupported", "components.ComponentGeometryHook.measure",
    "components.analyse_components", "components.component_advantages", "components.fast_unsupported",
    "neurons.NeuronHealthHook.on_grads", "neurons.gradient_stats", "neurons.NeuronHealthHook.after_update",
    "instrument.InstrumentHook.write", "groups.rides_on_update",
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
    measure(PARTS, ["analysis.every=1", "analysis.neurons.actor.nullspace_every=10"], ap.parse_args().steps)


def measure(parts: list[str], overrides: list[str], steps: int) -> None:
    """The parts' (``module.attr`` of rlgrad.analysis) and the hook phases' ms per step, printed, over ``steps`` steps
    of the embedded default with ``overrides`` (one thread, the whole batch in one micro-batch)."""
    acc: dict[str, float] = {}
    phase: list[str] = []
    for spec in parts:
        module, attr = spec.split(".", 1)
        if found := _owner(f"rlgrad.analysis.{module}", attr):
            _wrap(*found, spec, acc, phase, sets_phase=False)
    for name in PHASES:
        _wrap(importlib.import_module("rlgrad.hooks").HookRunner, name, f"HookRunner.{name}", acc, phase, True)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(overrides=[
            "trainer.logger=[]", f"trainer.default_local_dir={tmp}/run", "trainer.num_threads=1",
            "actor.ppo_micro_batch_size=128", *overrides])
        tr = make_trainer(cfg, log=lambda *a: None)
        logger = MetricLogger([])
        per: dict[str, list[float]] = {}
        step_times: list[float] = []
        for k in range(steps + 2):
            before = dict(acc)
            started = time.perf_counter()
            tr.train_step(k + 1, logger)
            if k < 2:  # warm-up
                continue
            step_times.append(time.perf_counter() - started)
            for label, v in acc.items():
                per.setdefault(label, []).append(v - before.get(label, 0.0))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {steps} steps; ms per step "
          f"(median, mean); a step: median {statistics.median(step_times) * 1e3:.1f} ms")
    outside = [f"HookRunner.{p}" for p in PHASES if p != "before_grads"]
    sums = [sum(per[p][i] for p in outside if p in per) for i in range(len(step_times))]
    print(f"{statistics.median(sums) * 1e3:8.2f} {statistics.mean(sums) * 1e3:8.2f}  "
          "hooks outside the backward (before_update + on_grads + after_update)")
    for label in sorted(per, key=lambda n: -statistics.mean(per[n])):
        print(f"{statistics.median(per[label]) * 1e3:8.2f} {statistics.mean(per[label]) * 1e3:8.2f}  {label}")


if __name__ == "__main__":
    main()
