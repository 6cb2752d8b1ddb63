"""Cost of the neuron-health metrics: a training step with analysis.neurons.actor.metric_every=1 against one without.

One Trainer (the default configuration: the embedded 4-block width-128 Qwen2, 16 prompts x 8 samples,
8 response tokens; no warm start, no bucket analysis), whose NeuronHealthHook is switched on and off
on alternate steps; each pair of steps gives a ratio (with / without) and the median is printed last
(wall clock, and in brackets the same from process CPU time, which other jobs on a shared machine disturb less).
The measured part is ``Trainer.train_step``: rollout, filter, log-probs, advantages, actor update and,
when on, the hook's statistics (gradient scores, plus the nullspace / activation pass on
``analysis.neurons.actor.nullspace_samples`` sequences).

    python bench/neuron_cost.py [--steps 10] [--threads N] [--samples 32] [key=value overrides ...]

Target: ratio <= 1.05 with the nullspace sample at its default (32).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from rlgrad.analysis.neurons import NeuronHealthHook
from rlgrad.config.load import load_config
from rlgrad.hooks import HookRunner
from rlgrad.logging.sinks import MetricLogger
from rlgrad.recipes import make_trainer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10, help="timed pairs of steps")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--samples", type=int, default=32, help="analysis.neurons.actor.nullspace_samples")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(overrides=[
            "model.warmstart_steps=0", "analysis.buckets.enable=false", "trainer.logger=[]",
            f"trainer.default_local_dir={tmp}/run", "analysis.neurons.actor.metric_every=1",
            f"analysis.neurons.actor.nullspace_samples={args.samples}", "actor.entropy_coeff=0.001",
            *([f"trainer.num_threads={args.threads}"] if args.threads else []), *args.overrides])
        tr = make_trainer(cfg, log=lambda *a: None)
        hook = next(h for h in tr.hooks if isinstance(h, NeuronHealthHook))
        logger = MetricLogger([])
        times: dict[bool, list[float]] = {True: [], False: []}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        neuron_s: list[float] = []
        step = 0
        for k in range(2 * (args.steps + 1)):  # the first pair is a warm-up
            on = (k // 2 + k) % 2 == 0  # on/off, then off/on, ...: neither side always runs first
            tr.hooks = HookRunner([hook] if on else [])
            step += 1
            t0, c0 = time.perf_counter(), time.process_time()
            m, _ = tr.train_step(step, logger)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if k >= 2:
                times[on].append(dt)
                cpu[on].append(dc)
                if on:
                    neuron_s.append(m.get("timing_s/neuron/actor", float("nan")))
        params = sum(p.numel() for p in tr.actor.parameters())
    ratios = [a / b for a, b in zip(times[True], times[False])]
    cpu_ratios = [a / b for a, b in zip(cpu[True], cpu[False])]
    print(f"model {params / 1e6:.2f}M params, {cfg.data.train_batch_size}x{cfg.rollout.n} samples, "
          f"response_length {cfg.rollout.response_length}, nullspace sample {args.samples}, "
          f"threads {torch.get_num_threads()}")
    for on, ts in times.items():
        print(f"{'with' if on else 'without':>8}: median {statistics.median(ts):.3f} s over {len(ts)} steps "
              f"(all: {', '.join(f'{t:.3f}' for t in ts)})")
    hook_s, base_s = statistics.median(neuron_s), statistics.median(times[False])
    print(f"timing_s/neuron/actor: median {hook_s:.3f} s; 1 + hook/step(without) = {1 + hook_s / base_s:.3f}")
    print(f"ratio={statistics.median(ratios):.3f} (process CPU time: {statistics.median(cpu_ratios):.3f})")


if __name__ == "__main__":
    main()
