"""The batch-size signatures against the gradient noise scale (``doctor/noise.py``) on hand-made series."""

from __future__ import annotations

import pytest

from rlgrad.doctor import diagnose
from rlgrad.doctor.findings import Thresholds
from tests.doctor.test_doctor import healthy_series, run_of


def _run(trace: list[float], signal: list[float], samples: float, inter: float = 1.0, intra: float = 1.0, k: int = 8):
    """A healthy run whose analysed steps 1, 3, 5, ... log the per-sample noise estimates."""
    series = healthy_series(2 * len(trace))
    nan = float("nan")
    for name, values in (("noise_trace/all/task", trace), ("noise_signal/all/task", signal),
                         ("noise_samples/all", [samples] * len(trace)), ("noise_inter/all/task", [inter] * len(trace)),
                         ("noise_intra/all/task", [intra] * len(trace))):
        series[name] = [x for v in values for x in (v, nan)]
    return run_of(series, {"rollout": {"n": k}})


def _found(run, sid):
    return next((f for f in diagnose(run).findings if f.id == sid), None)


def test_batch_below_noise_scale_averages_trace_and_signal_before_dividing():
    # per step B_simple = 1000/1 and 1000/-0.5 (not a number); averaged: 1000 / 0.25 = 4000 > 10 x 64 samples
    run = _run([1000.0, 1000.0], [1.0, -0.5], samples=64, inter=1.0, intra=100.0)
    found = _found(run, "batch_below_noise_scale")
    assert found is not None and "B_simple 4e+03" in found.evidence[0] and "64 samples" in found.evidence[0]
    assert "rollout.n" in found.action and "intra-prompt" in found.action  # intra 100 > 8 x inter 1: K is as good
    assert _found(run, "batch_above_noise_scale") is None
    # inter-prompt noise dominating: more prompts, not more samples per prompt
    assert "data.train_batch_size" in _found(_run([1000.0], [0.25], 64, inter=50.0, intra=100.0),
                                             "batch_below_noise_scale").action
    # the threshold: B_simple above Thresholds().noise_below x the batch
    assert _found(_run([64 * Thresholds().noise_below + 1], [1.0], 64), "batch_below_noise_scale") is not None
    assert _found(_run([64 * Thresholds().noise_below - 1], [1.0], 64), "batch_below_noise_scale") is None


@pytest.mark.parametrize("trace,signal,fires", [([1.0], [1.0], True),
                                                ([64 / Thresholds().noise_above * 2], [1.0], False),
                                                ([1.0], [-1.0], False)])
def test_batch_above_noise_scale(trace, signal, fires):
    found = _found(_run(trace, signal, samples=64), "batch_above_noise_scale")
    assert (found is not None) == fires
    if fires:  # B_simple 1, 64 samples: 65x the least samples, steps within 1.56% of the fewest
        assert "65×" in found.explanation and "1.56%" in found.explanation


def test_noise_thresholds_come_from_thresholds(tmp_path):
    # B_simple 1000 against 64 samples: 15.6x; fires at the default factor 10, not at 20 (read from a --thresholds file)
    run = _run([1000.0], [1.0], samples=64)
    assert _found(run, "batch_below_noise_scale") is not None
    path = tmp_path / "t.yaml"
    path.write_text("noise_below: 20\nnoise_above: 0.5\n")
    stricter = Thresholds.from_file(path)
    assert next((f for f in diagnose(run, stricter).findings if f.id == "batch_below_noise_scale"), None) is None
    # and above: 64 samples > 0.5 x B_simple 100 fires only at the file's factor
    small = _run([100.0], [1.0], samples=64)
    assert _found(small, "batch_above_noise_scale") is None
    assert any(f.id == "batch_above_noise_scale" for f in diagnose(small, stricter).findings)
