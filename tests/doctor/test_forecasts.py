"""Forecasts on synthetic trends whose answer is known: the step an exponential decay, an exponential growth and a
straight line meet their bounds; none from fewer points than the minimum, none on noise."""

from __future__ import annotations

import math
import random

import pytest

from rlgrad.doctor import diagnose
from rlgrad.doctor.findings import Thresholds
from rlgrad.doctor.forecasts import line_fit
from tests.doctor.test_doctor import healthy_series, run_of


def forecast(run, fid: str):
    return next((f for f in diagnose(run).findings if f.id == fid), None)


def steps_in(title: str) -> tuple[int, int]:
    """(steps left, at step) from a forecast's title."""
    left = int(title.split("about ")[1].split(" ")[0])
    return left, int(title.split("(step ")[1].rstrip(")"))


def test_line_fit_is_least_squares():
    a, b, r2 = line_fit([0, 1, 2, 3], [1.0, 3.0, 5.0, 7.0])
    assert (a, b, r2) == (1.0, 2.0, 1.0)
    assert line_fit([0, 1, 2], [2.0, 2.0, 2.0])[2] == 0.0


def test_entropy_decaying_geometrically_is_forecast_to_its_collapse_step():
    """entropy = 2·0.95^(s-1): its first-10-step mean a; entropy_collapse's bound 0.1·a is met where
    2·0.95^(s-1) = 0.1·a, i.e. s = 1 + ln(0.05·a)/ln(0.95)."""
    n = 20
    s = healthy_series(n)
    s["actor/entropy"] = [2 * 0.95 ** i for i in range(n)]
    a = sum(s["actor/entropy"][:10]) / 10
    expected = 1 + math.log(0.1 * a / 2) / math.log(0.95)
    f = forecast(run_of(s), "entropy_forecast")
    left, at = steps_in(f.title)
    assert abs(at - expected) < 1 and left == round(expected - n) and f.confidence == 1.0
    assert "-5% per step" in f.evidence[0] and f.severity == "info"


def test_kl_growing_exponentially_and_length_growing_linearly():
    n = 20
    s = healthy_series(n)
    s["actor/kl_loss"] = [0.01 * 1.2 ** i for i in range(n)]  # 1.0 at step 1 + ln(100)/ln(1.2) = 26.26
    s["response_length/mean"] = [20.0 + 2 * i for i in range(n)]  # 64 (the limit) at step 1 + 44/2 = 23
    assert forecast(run_of(s), "length_forecast") is None  # the run does not say its length limit
    run = run_of(s, {"rollout": {"response_length": 64}})
    kl, length = forecast(run, "kl_forecast"), forecast(run, "length_forecast")
    assert abs(steps_in(kl.title)[1] - (1 + math.log(100) / math.log(1.2))) < 1
    assert steps_in(length.title) == (3, 23) and "2 per step" in length.evidence[0]


@pytest.mark.parametrize("n", [5, 9])
def test_no_forecast_from_fewer_points_than_the_minimum(n):
    s = healthy_series(n)
    s["actor/entropy"] = [2 * 0.8 ** i for i in range(n)]
    d = diagnose(run_of(s))
    assert d.too_early["entropy_forecast"] == (n, Thresholds().forecast_points)
    assert "entropy_forecast" not in [f.id for f in d.findings]


def test_no_forecast_on_noise_or_far_away():
    rng = random.Random(0)
    s = healthy_series(30)
    s["actor/entropy"] = [1.5 + rng.gauss(0, 0.2) for _ in range(30)]  # no trend: R² small
    assert forecast(run_of(s), "entropy_forecast") is None
    s["actor/entropy"] = [2 * 0.999 ** i for i in range(30)]  # a clear trend, 2,000+ steps away
    assert forecast(run_of(s), "entropy_forecast") is None


def test_a_forecasts_advice_follows_the_cause_the_run_supports():
    """The entropy forecast gives entropy_collapse's advice (a penalty is brought toward 0, not "add a bonus"); the
    KL forecast names the learning rate alone at a large update size."""
    n = 20
    s = healthy_series(n)
    s["actor/entropy"] = [1.5 * 0.9 ** i for i in range(n)]  # 12% of its start by step 20: collapsing, not yet
    s["actor/update_ratio"] = [5e-4] * n
    penalty = run_of(s, {"actor": {"entropy_coeff": -0.2}})
    f = next(f for f in diagnose(penalty).findings if f.id == "entropy_forecast")
    assert "bring it toward 0" in f.action and "bonus (entropy_coeff > 0)" not in f.action
    s["actor/kl_loss"] = [0.02 * 1.15 ** i for i in range(n)]
    s["actor/update_ratio"] = [0.03] * n
    f = next(f for f in diagnose(run_of(s)).findings if f.id == "kl_forecast")
    assert f.action.startswith("Lower the learning rate toward an actor/update_ratio")
    assert "kl_loss_coef" not in f.action
