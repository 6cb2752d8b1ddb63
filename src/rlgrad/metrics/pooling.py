"""How the noise scale's figures (``noise_trace``, ``noise_signal`` and their standard errors, ``analysis.per_sample``)
give an interval, for one step and pooled over steps: the one definition the instrument (``analysis/noise.py``) and
the readers of a run (the doctor, the report) share. Pure Python: the readers import no torch.

McCandlish et al. (2018) pool B_simple over steps as a ratio of sums, Σ trace / Σ signal. The interval is Fieller's
for a ratio of two estimates with known (co)variances; each step's are its jackknife over prompt groups, and steps are
taken as independent (each its own prompt groups), so their variances add.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist

NAN = float("nan")
LEVEL = 0.95  # the intervals' nominal coverage
STEP_FIELDS = ("trace", "signal", "trace_se", "signal_se", "cov", "groups")  # what a step contributes to a pool


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


def pooled_scale(steps: Sequence[Mapping[str, float]], level: float = LEVEL) -> dict[str, float]:
    """B_simple pooled over steps as McCandlish et al. pool it, the summed trace over the summed signal, with
    Fieller's interval from the steps' jackknife (co)variances, the steps taken as independent (each its own
    groups); degrees of freedom Σ (P − 1). ``steps``: ``group_noise``'s dicts (the keys ``trace``, ``signal``,
    ``trace_se``, ``signal_se``, ``cov``, ``groups``); steps without an interval are left out. Returns ``scale``
    (NaN when unresolved), ``low``, ``high``, ``trace``, ``signal``, ``signal_low``, ``signal_high``, ``steps``."""
    keep = [s for s in steps if all(math.isfinite(s.get(k, NAN)) for k in STEP_FIELDS)]
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
