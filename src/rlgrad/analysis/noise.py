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
with P − 1 degrees of freedom, and Fieller's interval for their ratio (``rlgrad.metrics.pooling.ratio_interval``,
which the readers use to pool steps): bounded exactly when the signal's own interval excludes 0. Where it does not,
the noise scale is unresolved and reported as NaN.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rlgrad.metrics.pooling import NAN, ratio_interval


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
