"""The gradient noise of a batch with the prompt groups as its independent units (``analysis.per_sample``).

GRPO draws prompts independently, but a prompt's K samples share its advantage baseline (and std), so they are
not independent of each other: the units are the groups. For a bucket of n samples in P groups, group k holding
K_k samples with per-sample gradients h_i (``h_i = n·g_i``, so h̄ = Σ_i h_i / n is the bucket's gradient), write
S_k = Σ_{i∈k} h_i, u_k = S_k / K_k and w_k = K_k / n, so h̄ = Σ_k w_k u_k. If the groups are drawn independently and
each u_k has mean G (the expected gradient at this group size):

* E<u_k, u_l> = |G|² for k ≠ l, so ``signal`` = Σ_{k≠l} <S_k, S_l> / (n² − Σ_k K_k²) is unbiased for |G|² (with equal
  K, the mean of <u_k, u_l> over the P(P−1) pairs of distinct groups: a U-statistic);
* E||h̄||² = |G|² + Σ_k w_k² tr Cov(u_k), so ||h̄||² − signal is unbiased for the batch gradient's noise, and
  ``trace`` = n (||h̄||² − signal) is that noise in per-sample units: a batch of N samples grown by prompts at the
  same group sizes has noise trace / N;
* ``scale`` = B_simple = trace / signal (McCandlish et al. 2018), in samples, for a batch grown by prompts at fixed K.

Estimating the signal from pairs of samples, as the i.i.d. formula ||h̄||² − S/n with S the samples' variance does,
counts the pairs inside a group: they share the group's mean, so E[that estimate] − |G|² = (K−1)/(n−1) · (the
spread of the group means), which shrinks as the batch grows (docs/noise_scale.md derives it).

Intervals: leave-one-group-out jackknife variances of ``trace`` and ``signal`` and their covariance, Student's t
with P − 1 degrees of freedom, and Fieller's interval for their ratio (``ratio_interval``): bounded exactly when the
signal's own interval excludes 0. Where it does not, the noise scale is unresolved and reported as NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import torch

NAN = float("nan")
LEVEL = 0.95  # the intervals' nominal coverage


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile by the Cornish-Fisher expansion about the normal quantile (Abramowitz & Stegun 26.7.5):
    within 1% of the exact value at df = 2 and 0.05% from df = 5 (tests compare it with printed tables)."""
    z = NormalDist().inv_cdf(p)
    if not math.isfinite(df):
        return z
    g = ((z ** 3 + z) / 4,
         (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
         (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
         (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160)
    return z + sum(gk / df ** (k + 1) for k, gk in enumerate(g))


def ratio_interval(num: float, den: float, var_num: float, var_den: float, cov: float, df: float,
                   level: float = LEVEL) -> tuple[float, float]:
    """Fieller's interval for num/den from estimates with the given (co)variances: the ρ with
    (num − ρ·den)² <= q² Var(num − ρ·den), q Student's t at ``level`` with ``df`` degrees of freedom. (NaN, NaN)
    where the denominator's own interval reaches 0 or below (the set is then unbounded): unresolved."""
    q2 = t_quantile(0.5 + level / 2, df) ** 2
    a = den ** 2 - q2 * var_den
    if not (den > 0 and a > 0):
        return NAN, NAN
    b = num * den - q2 * cov
    c = num ** 2 - q2 * var_num
    root = math.sqrt(max(b * b - a * c, 0.0))
    return (b - root) / a, (b + root) / a


def trace_and_signal(total: Any, diag: Any, n: Any, sum_k2: Any) -> tuple[Any, Any]:
    """(trace, signal) from Σ_kl <S_k, S_l>, Σ_k ||S_k||², n = Σ_k K_k and Σ_k K_k²: floats, or tensors of any shape
    elementwise (a batch's leave-one-group-out jackknife; many batches at once)."""
    signal = (total - diag) / (n ** 2 - sum_k2)
    return n * (total / n ** 2 - signal), signal


def group_noise(row_sq: torch.Tensor, gram: torch.Tensor, sizes: torch.Tensor) -> dict[str, float]:
    """The noise estimates of ``n = Σ sizes`` per-sample gradients ``h_i`` in ``P`` prompt groups.

    ``row_sq`` ``[n]``: ``||h_i||²``; ``gram`` ``[P, P]``: ``<S_k, S_l>``; ``sizes`` ``[P]``: the groups' sample
    counts. Returns ``trace``, ``signal``, ``scale`` (the module's docstring), their jackknife standard errors
    ``trace_se``, ``signal_se`` and covariance ``cov``, ``scale_low`` / ``scale_high`` (Fieller, 95%), ``intra``
    (the spread of the h_i around their group's mean), ``inter`` = (trace − intra) / (n / P) (so that the batch's
    noise is (K·inter + intra)/n), ``coherence`` = ||Σ h_i||² / (n Σ ||h_i||²) and its floor under grouping
    Σ_k ||S_k||² / (n Σ ||h_i||²) (its value if the groups' gradients were orthogonal), and ``groups``. NaN where the
    batch cannot tell: fewer than 2 groups for the estimates, 3 for the intervals; ``scale`` where the signal's
    interval reaches 0.
    """
    row_sq, gram, sizes = row_sq.double(), gram.double(), sizes.double()
    n, groups = float(sizes.sum()), len(sizes)
    sum_sq, total, diag = float(row_sq.sum()), float(gram.sum()), gram.diagonal()
    out = dict.fromkeys(("trace", "signal", "scale", "trace_se", "signal_se", "cov", "scale_low", "scale_high",
                         "intra", "inter"), NAN)
    out["groups"] = float(groups)
    out["coherence"] = total / (n * sum_sq) if sum_sq > 0 else NAN
    out["coherence_floor"] = float(diag.sum()) / (n * sum_sq) if sum_sq > 0 else NAN
    if n > groups:
        out["intra"] = (sum_sq - float((diag / sizes).sum())) / (n - groups)
    if groups < 2:
        return out
    sum_k2 = float((sizes ** 2).sum())
    trace, signal = trace_and_signal(total, float(diag.sum()), n, sum_k2)
    out.update(trace=trace, signal=signal)
    out["inter"] = (out["trace"] - out["intra"]) * groups / n
    if groups >= 3:
        # leave group k out: its row and column leave the Gram, its size leaves n and Σ K²
        loo = trace_and_signal(total - 2 * gram.sum(1) + diag, diag.sum() - diag, n - sizes, sum_k2 - sizes ** 2)
        dev = torch.stack(loo) - torch.stack(loo).mean(1, keepdim=True)
        cov = (groups - 1) / groups * (dev @ dev.T)
        out.update(trace_se=float(cov[0, 0].sqrt()), signal_se=float(cov[1, 1].sqrt()), cov=float(cov[0, 1]))
        out["scale_low"], out["scale_high"] = ratio_interval(out["trace"], out["signal"], float(cov[0, 0]),
                                                             float(cov[1, 1]), out["cov"], groups - 1)
    if math.isfinite(out["scale_low"]):
        out["scale"] = out["trace"] / out["signal"]
    return out


def pooled_scale(steps: Sequence[dict[str, float]], level: float = LEVEL) -> dict[str, float]:
    """B_simple pooled over steps as McCandlish et al. pool it, the summed trace over the summed signal, with
    Fieller's interval from the steps' jackknife (co)variances, the steps taken as independent (each its own
    groups); degrees of freedom Σ (P − 1). ``steps``: ``group_noise``'s dicts (the keys ``trace``, ``signal``,
    ``trace_se``, ``signal_se``, ``cov``, ``groups``); steps without an interval are left out. Returns ``scale``
    (NaN when unresolved), ``low``, ``high``, ``trace``, ``signal``, ``signal_low``, ``signal_high``, ``steps``."""
    keep = [s for s in steps if all(math.isfinite(s.get(k, NAN)) for k in
                                    ("trace", "signal", "trace_se", "signal_se", "cov", "groups"))]
    trace, signal = sum(s["trace"] for s in keep), sum(s["signal"] for s in keep)
    var_t, var_s = sum(s["trace_se"] ** 2 for s in keep), sum(s["signal_se"] ** 2 for s in keep)
    cov, df = sum(s["cov"] for s in keep), sum(s["groups"] - 1 for s in keep)
    out = dict(scale=NAN, low=NAN, high=NAN, trace=trace, signal=signal, signal_low=NAN, signal_high=NAN,
               steps=float(len(keep)))
    if not keep:
        return out
    half = t_quantile(0.5 + level / 2, df) * math.sqrt(var_s)
    out.update(signal_low=signal - half, signal_high=signal + half)
    out["low"], out["high"] = ratio_interval(trace, signal, var_t, var_s, cov, df, level)
    if math.isfinite(out["low"]):
        out["scale"] = trace / signal
    return out
