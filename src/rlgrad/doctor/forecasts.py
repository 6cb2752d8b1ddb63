"""``rlgrad doctor``'s forecasts, one signature each: where a trend is clear, how many steps until the entropy falls
below entropy_collapse's bound, the KL passes kl_blowup's, and the responses reach the length limit. A forecast is
a straight line fitted by least squares to the last ``forecast_points`` steps (to the logarithm of the entropy,
which decays geometrically; to the KL or its logarithm, whichever fits better: the k3 estimate grows
exponentially), given only when the fit explains at least ``forecast_r2`` of their variance (its R², the
forecast's confidence) and the bound is crossed within ``forecast_horizon`` steps; never from fewer points."""

from __future__ import annotations

import math

from rlgrad.doctor.findings import (
    Finding,
    Thresholds,
    View,
    entropy_cause,
    first_last,
    fmt,
    signature,
    train_series,
    update_size,
)


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares ``y = a + b·x``: (a, b, R²); R² is 0 for a flat series."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    b = sxy / sxx if sxx > 0 else 0.0
    r2 = sxy * sxy / (sxx * syy) if sxx > 0 and syy > 0 else 0.0
    return my - b * mx, b, r2


def crossing(steps: list[int], vals: list[float], bound: float, log: bool) -> tuple[float, float, float] | None:
    """Where a line fitted to (steps, vals) (to log vals with ``log``) meets ``bound``: (that step, the slope per
    step, R²); None when the line runs away from the bound or is flat."""
    if log and (bound <= 0 or min(vals) <= 0):  # a logarithm needs positive values
        return None
    ys = [math.log(v) for v in vals] if log else vals
    a, b, r2 = line_fit([float(s) for s in steps], ys)
    target = math.log(bound) if log else bound
    if b == 0 or (target - ys[-1]) / b <= 0:  # flat, or moving away from the bound
        return None
    return (target - a) / b, b, r2


def _forecast(v: View, t: Thresholds, key: str, bound: float, logs: tuple[bool, ...]) -> tuple | None:
    """The best of the fits ``logs`` names (linear, log-linear) over the last ``forecast_points`` steps of ``key``
    that crosses ``bound`` within the horizon with R² ≥ ``forecast_r2``: (steps left, at step, slope, R², log)."""
    steps, vals = train_series(v, key)
    steps, vals = steps[-t.forecast_points:], vals[-t.forecast_points:]
    if len(vals) < t.forecast_points:
        return None
    fits = [(c, log) for log in logs if (c := crossing(steps, vals, bound, log)) is not None]
    if not fits:
        return None
    (at, slope, r2), log = max(fits, key=lambda f: f[0][2])
    left = at - steps[-1]
    if r2 < t.forecast_r2 or not 0 < left <= t.forecast_horizon:
        return None
    return left, at, slope, r2, log


def _finding(name: str, what: str, fc: tuple, last: float, bound: float, why: str, action: str,
             t: Thresholds, step: int) -> Finding:
    left, at, slope, r2, log = fc
    trend = (f"{fmt(100 * (math.exp(slope) - 1))}% per step" if log else f"{fmt(slope)} per step")
    return Finding(
        severity="info", step=step, confidence=round(r2, 2),
        title=f"Forecast: {what} in about {left:.0f} steps (step {at:.0f})",
        evidence=[f"{name} {fmt(last)} now; the fitted trend over the last {t.forecast_points} steps: {trend} "
                  f"({'log-linear' if log else 'linear'} fit, R² {r2:.2f}); bound {fmt(bound)}"],
        explanation=why + " A forecast extrapolates the recent trend; its confidence is the fit's R².",
        action=action)


@signature("entropy_forecast", "actor/entropy", trend="actor/entropy", min_points=lambda t: t.forecast_points,
           reads="logs",
           fires="the entropy's log-linear trend over the last {forecast_points} steps (R² ≥ {forecast_r2:g}) reaches "
                 "{entropy_drop:.0%} of its start (entropy_collapse's bound) within {forecast_horizon} steps (info)")
def _entropy_forecast(v: View, t: Thresholds) -> Finding | None:
    steps, e = train_series(v, "actor/entropy")
    start = first_last(e, t.window)[0]
    bound = t.entropy_drop * start
    if not e or e[-1] <= bound or (fc := _forecast(v, t, "actor/entropy", bound, (True,))) is None:
        return None
    why, action, _ = entropy_cause(v, t)  # entropy_collapse's advice, by the cause the run supports
    return _finding(v.name("actor/entropy"), "the entropy collapses", fc, e[-1], bound,
                    "The entropy falls steadily toward the level entropy_collapse calls a collapse." + (
                        f" {why}" if why else ""),
                    "Watch the entropy; if it is not meant to fall this far: " + action[:1].lower() + action[1:],
                    t, steps[-1])


@signature("kl_forecast", "actor/kl_loss|actor/ppo_kl", trend="actor/kl_loss|actor/ppo_kl",
           min_points=lambda t: t.forecast_points, reads="logs",
           fires="the KL's linear or log-linear trend over the last {forecast_points} steps (R² ≥ {forecast_r2:g}) "
                 "passes {kl_high:g} (kl_blowup's critical bound) within {forecast_horizon} steps (info)")
def _kl_forecast(v: View, t: Thresholds) -> Finding | None:
    key = "actor/kl_loss" if v.has("actor/kl_loss") else "actor/ppo_kl"
    steps, k = train_series(v, key)
    if not k or abs(k[-1]) >= t.kl_high or (fc := _forecast(v, t, key, t.kl_high, (False, True))) is None:
        return None
    size = update_size(v)
    action = ("Lower the learning rate toward an actor/update_ratio of about 1e-3 before it runs away (the update "
              f"size is {fmt(size)} of the weights' norm, median)" if size is not None and size > t.update_high
              else "Lower the learning rate or raise kl_loss_coef before it runs away")
    return _finding(v.name(key), "the KL passes its bound", fc, k[-1], t.kl_high,
                    "The KL to the reference grows steadily toward the level kl_blowup calls critical.",
                    action + "; check the samples.", t, steps[-1])


@signature("length_forecast", "response_length/mean", trend="response_length/mean",
           min_points=lambda t: t.forecast_points, reads="logs + config",
           fires="the mean response length's linear trend over the last {forecast_points} steps (R² ≥ "
                 "{forecast_r2:g}) reaches the length limit within {forecast_horizon} steps (info)")
def _length_forecast(v: View, t: Thresholds) -> Finding | None:
    limit = v.cfg("rollout.response_length", "actor_rollout_ref.rollout.response_length", "max_completion_length")
    steps, m = train_series(v, "response_length/mean")
    if not isinstance(limit, int | float) or isinstance(limit, bool) or not m or m[-1] >= limit:
        return None
    if (fc := _forecast(v, t, "response_length/mean", float(limit), (False,))) is None:
        return None
    return _finding(v.name("response_length/mean"), "the responses reach the length limit", fc, m[-1], float(limit),
                    "The mean response length grows steadily toward the limit: cut responses follow.",
                    "Raise the length limit or add an overlong penalty (reward.overlong_buffer) before responses "
                    "are cut.", t, steps[-1])
