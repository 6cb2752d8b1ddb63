"""``rlgrad doctor``'s signatures of the batch size against the gradient noise scale (``analysis.per_sample``):
McCandlish et al. 2018's B_simple = tr(Σ)/|G|² read off ``noise_trace/all/task`` and ``noise_signal/all/task``.

Their model: reaching a loss takes ``S = S_min (1 + B_noise / B)`` steps and ``E = E_min (1 + B / B_noise)``
samples at batch size B. Far below B_noise a larger batch cuts the steps almost in proportion; far above it, the
samples past B_noise buy almost no steps. The noise estimates of one step are noisy, so, as the paper does, the
trace and the signal are averaged over the analysed steps before they are divided.
"""

from __future__ import annotations

import math
import statistics

from rlgrad.doctor.findings import Finding, Thresholds, View, fmt, signature


def noise_scale(v: View) -> tuple[float, float, int, int] | None:
    """(B_simple from the averaged trace and signal, the median analysed batch size, the analysed steps, the first
    of them), or None without a positive averaged signal."""
    steps, trace = v.series("noise_trace/all/task")
    signal = dict(zip(*v.series("noise_signal/all/task")))
    size = dict(zip(*v.series("noise_samples/all")))
    rows = [(s, tr, signal[s], size[s]) for s, tr in zip(steps, trace)
            if all(math.isfinite(x) for x in (tr, signal.get(s, math.nan), size.get(s, math.nan)))]
    if not rows:
        return None
    mean_signal = statistics.fmean(r[2] for r in rows)
    if mean_signal <= 0:
        return None
    return statistics.fmean(r[1] for r in rows) / mean_signal, statistics.median(r[3] for r in rows), len(rows), \
        rows[0][0]


def _split_advice(v: View) -> str:
    """Raise K (samples per prompt) or B (prompts), from the inter/intra-prompt split of the noise."""
    inter = [x for x in v.series("noise_inter/all/task")[1] if math.isfinite(x)]
    intra = [x for x in v.series("noise_intra/all/task")[1] if math.isfinite(x)]
    k = v.cfg("rollout.n", "actor_rollout_ref.rollout.n")
    if not inter or not intra or not isinstance(k, int):
        return "Raise the prompts per step (data.train_batch_size) or the samples per prompt (rollout.n)."
    inter_m, intra_m = statistics.fmean(inter), statistics.fmean(intra)
    # a step's noise is inter/B + intra/(B·K) = (K·inter + intra)/N: while intra > K·inter, N = B·K is what counts
    if intra_m > k * max(inter_m, 0.0):
        return (f"The intra-prompt noise ({fmt(intra_m)}) outweighs {k}× the inter-prompt noise ({fmt(inter_m)}): "
                "more samples per prompt (rollout.n) cut it as well as more prompts, and share each prompt's cost.")
    return (f"The inter-prompt noise ({fmt(inter_m)}) dominates at rollout.n={k} (intra {fmt(intra_m)}): more prompts "
            "per step (data.train_batch_size) cut it; more samples per prompt barely do.")


@signature("batch_below_noise_scale", "noise_trace/all/task",
           reads="per-sample analysis",
           fires="the analysed batch (samples) below B_simple / {noise_below:g}, trace and signal averaged over the "
                 "analysed steps")
def _below(v: View, t: Thresholds) -> Finding | None:
    got = noise_scale(v)
    factor = t.noise_below
    if got is None or got[1] * factor > got[0]:
        return None
    scale, size, n_steps, first = got
    return Finding(
        severity="info", step=first, confidence=0.6,
        title="The batch is far below the gradient noise scale",
        evidence=[f"B_simple {fmt(scale)} (noise_trace/all/task over noise_signal/all/task, averaged over "
                  f"{n_steps} analysed step(s)) against {fmt(size)} samples per step"],
        explanation="Per McCandlish et al. (2018) the steps needed fall as 1 + B_simple/N, with the learning rate "
                    "tuned for each batch size: with N this far below B_simple, a larger batch should take fewer "
                    "steps. Expect fewer, not proportionally fewer, and more samples in all: on the embedded default "
                    "B_simple overstated the critical batch 4-15x at a fixed learning rate and 1-3.6x with it tuned "
                    "(docs/noise_scale.md).",
        action="Grow the batch (samples per step) towards B_simple if steps, not samples, are what costs, and "
               "re-tune the learning rate for it. " + _split_advice(v))


@signature("batch_above_noise_scale", "noise_trace/all/task",
           reads="per-sample analysis",
           fires="the analysed batch above {noise_above:g}× B_simple, trace and signal averaged over the analysed "
                 "steps")
def _above(v: View, t: Thresholds) -> Finding | None:
    got = noise_scale(v)
    factor = t.noise_above
    if got is None or got[1] <= factor * got[0]:
        return None
    scale, size, n_steps, first = got
    return Finding(
        severity="info", step=first, confidence=0.6,
        title="The batch is far above the gradient noise scale",
        evidence=[f"{fmt(size)} samples per step against B_simple {fmt(scale)} (averaged over {n_steps} analysed "
                  "step(s))"],
        explanation=f"Per McCandlish et al. (2018) the samples spent grow as 1 + N/B_simple: about "
                    f"{fmt(1 + size / scale)}× the least that reaches the same loss, while the steps are already "
                    f"within {fmt(100 * scale / size)}% of the fewest any batch size could take.",
        action="Shrink the batch towards B_simple and take more steps (or raise the learning rate, which the "
               "noise no longer limits).")
