"""``rlgrad doctor``'s signatures of the batch size against the gradient noise scale (``analysis.per_sample``):
McCandlish et al. 2018's B_simple, with the prompt groups as the independent units (docs/noise_scale.md), read off
``noise_trace/all/task`` and ``noise_signal/all/task``.

Their model: reaching a loss takes ``S = S_min (1 + B_noise / B)`` steps and ``E = E_min (1 + B / B_noise)``
samples at batch size B. Far below B_noise a larger batch cuts the steps almost in proportion; far above it, the
samples past B_noise buy almost no steps. One step's estimates are noisy, so, as the paper does, the trace and the
signal are summed over the analysed steps before they are divided (``rlgrad.metrics.pooling``), with Fieller's
interval from each step's jackknife over its prompt groups. A finding fires only when that whole interval lies
beyond its threshold; where the signal's interval reaches 0 the noise scale is unresolved and nothing fires.

Runs logged by an rlgrad before the intervals (no ``noise_signal_se``) hold the sample-level estimate, biased by
an amount that depends on the batch: they are judged by its point value, and the evidence says so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from rlgrad.doctor.findings import Finding, Thresholds, View, fmt, signature
from rlgrad.metrics import key
from rlgrad.metrics.pooling import STEP_FIELDS, pooled_scale

# pooled_scale's fields of a step -> the keys they are logged under (bucket "all", the task term), each template
# spelled whole so that a search for it finds this reader
_ALL, _TASK = {"bucket": "all"}, {"bucket": "all", "term": "task"}
STEP_KEYS = {"trace": key("noise_trace/{bucket}/{term}", **_TASK),
             "signal": key("noise_signal/{bucket}/{term}", **_TASK),
             "trace_se": key("noise_trace_se/{bucket}/{term}", **_TASK),
             "signal_se": key("noise_signal_se/{bucket}/{term}", **_TASK),
             "cov": key("noise_cov/{bucket}/{term}", **_TASK), "groups": key("noise_groups/{bucket}", **_ALL)}


@dataclass
class NoiseScale:
    """B_simple pooled over the analysed steps: ``scale`` (NaN: unresolved), its interval ``low``-``high`` (NaN
    for a run logged without intervals), the median analysed batch ``samples``, the ``steps`` pooled and the
    ``first`` of them; ``legacy``: a run logged before the intervals (sample-level estimate, no interval)."""

    scale: float
    low: float
    high: float
    samples: float
    steps: int
    first: int
    legacy: bool

    def interval(self) -> str:
        """The figure as evidence quotes it."""
        if self.legacy:
            return (f"B_simple {fmt(self.scale)} (logged without an interval by an older rlgrad: the sample-level "
                    "estimate, biased by an amount that depends on the batch)")
        return f"B_simple {fmt(self.scale)} (95% interval {fmt(self.low)}-{fmt(self.high)})"


def _per_step(v: View) -> dict[int, dict[str, float]]:
    """step -> the noise figures it logged (``STEP_KEYS``' names), the samples it measured under ``samples``."""
    out: dict[int, dict[str, float]] = {}
    for name, k in {**STEP_KEYS, "samples": key("noise_samples/{bucket}", **_ALL)}.items():
        for step, value in zip(*v.series(k)):
            out.setdefault(step, {})[name] = value
    return out


def noise_scale(v: View) -> NoiseScale | None:
    """The run's B_simple pooled over its analysed steps, or None where it measured none (or, logged without
    intervals, its summed signal is not positive)."""
    steps = {s: d for s, d in sorted(_per_step(v).items())
             if all(math.isfinite(d.get(f, math.nan)) for f in ("trace", "signal", "samples"))}
    if not steps:
        return None
    samples = statistics.median(d["samples"] for d in steps.values())
    with_interval = {s: d for s, d in steps.items() if all(math.isfinite(d.get(f, math.nan)) for f in STEP_FIELDS)}
    if with_interval:
        got = pooled_scale(list(with_interval.values()))
        return NoiseScale(got["scale"], got["low"], got["high"], samples, len(with_interval), min(with_interval),
                          legacy=False)
    signal = sum(d["signal"] for d in steps.values())
    if signal <= 0:
        return None
    return NoiseScale(sum(d["trace"] for d in steps.values()) / signal, math.nan, math.nan, samples, len(steps),
                      min(steps), legacy=True)


def below_noise_scale(got: NoiseScale | None, factor: float = 1.0) -> bool:
    """The batch below B_simple / ``factor``: its whole interval (the point value for a run without one)."""
    if got is None or not math.isfinite(got.scale):
        return False
    return got.samples * factor < (got.scale if got.legacy else got.low)


def above_noise_scale(got: NoiseScale | None, factor: float = 1.0) -> bool:
    """The batch above ``factor`` × B_simple: its whole interval (the point value for a run without one)."""
    if got is None or not math.isfinite(got.scale):
        return False
    return got.samples > factor * (got.scale if got.legacy else got.high)


@signature("batch_below_noise_scale", "noise_trace/all/task",
           reads="per-sample analysis",
           fires="the analysed batch (samples) below B_simple / {noise_below:g}: the whole 95% interval of B_simple "
                 "pooled over the analysed steps (sum of trace over sum of signal) beyond it")
def _below(v: View, t: Thresholds) -> Finding | None:
    got = noise_scale(v)
    if not below_noise_scale(got, t.noise_below):
        return None
    return Finding(
        severity="info", step=got.first, confidence=0.6,
        title="The batch is far below the gradient noise scale",
        evidence=[f"{got.interval()}, prompt groups as the units, pooled over {got.steps} analysed step(s) "
                  f"(noise_trace/all/task over noise_signal/all/task), against {fmt(got.samples)} samples per step"],
        explanation="Per McCandlish et al. (2018) the steps needed fall as 1 + B_simple/N, with the learning rate "
                    "tuned for each batch size: with N this far below B_simple, a larger batch should take fewer "
                    "steps. Expect fewer, not proportionally fewer, and more samples in all. How closely B_simple "
                    "tracks the critical batch of RL fine-tuning is not settled (docs/noise_scale.md).",
        action="Grow the batch (samples per step) towards B_simple if steps, not samples, are what costs, and "
               "re-tune the learning rate for it. B_simple is measured for a batch grown by prompts "
               f"({v.setting('data.train_batch_size')}) at the same {v.setting('rollout.n')}; whether more samples "
               f"per prompt would do as well is known only from a run at another {v.setting('rollout.n')}.")


@signature("batch_above_noise_scale", "noise_trace/all/task",
           reads="per-sample analysis",
           fires="the analysed batch above {noise_above:g}× B_simple: the whole 95% interval of B_simple pooled over "
                 "the analysed steps below it")
def _above(v: View, t: Thresholds) -> Finding | None:
    got = noise_scale(v)
    if not above_noise_scale(got, t.noise_above):
        return None
    return Finding(
        severity="info", step=got.first, confidence=0.6,
        title="The batch is far above the gradient noise scale",
        evidence=[f"{fmt(got.samples)} samples per step against {got.interval()}, pooled over {got.steps} "
                  "analysed step(s)"],
        explanation=f"Per McCandlish et al. (2018) the samples spent grow as 1 + N/B_simple: about "
                    f"{fmt(1 + got.samples / got.scale)}× the least that reaches the same loss, while the steps are "
                    f"already within {fmt(100 * got.scale / got.samples)}% of the fewest any batch size could take.",
        action="Shrink the batch towards B_simple and take more steps (or raise the learning rate, which the "
               "noise no longer limits).")
