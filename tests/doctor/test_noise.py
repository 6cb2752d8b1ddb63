"""The batch-size signatures against the gradient noise scale (``doctor/noise.py``) on hand-made series."""

from __future__ import annotations

import pytest

from rlgrad.doctor import diagnose
from rlgrad.doctor.findings import Thresholds, fmt
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
    """A run logged without intervals (an older rlgrad): the point value, and the evidence says it has no interval."""
    # per step B_simple = 1000/1 and 1000/-0.5 (not a number); averaged: 1000 / 0.25 = 4000 > 10 x 64 samples
    run = _run([1000.0, 1000.0], [1.0, -0.5], samples=64, inter=1.0, intra=100.0)
    found = _found(run, "batch_below_noise_scale")
    assert found is not None and "B_simple 4e+03" in found.evidence[0] and "64 samples" in found.evidence[0]
    assert "without an interval" in found.evidence[0]
    # no advice between more prompts and more samples per prompt from the inter/intra split (it extrapolates to
    # another K, where the advantages themselves change): B_simple is for a batch grown by prompts
    assert "intra-prompt" not in found.action and "data.train_batch_size" in found.action
    assert "another rollout.n" in found.action
    assert _found(run, "batch_above_noise_scale") is None
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


def _with_intervals(trace: list[float], signal: list[float], signal_se: float, samples: float = 64.0,
                    groups: float = 16.0):
    """A healthy run whose analysed steps log the noise figures with their standard errors (trace_se: 10% of the
    trace, no covariance)."""
    run_series = healthy_series(2 * len(trace))
    nan = float("nan")
    for name, values in (("noise_trace/all/task", trace), ("noise_signal/all/task", signal),
                         ("noise_trace_se/all/task", [0.1 * x for x in trace]),
                         ("noise_signal_se/all/task", [signal_se] * len(trace)),
                         ("noise_cov/all/task", [0.0] * len(trace)), ("noise_groups/all", [groups] * len(trace)),
                         ("noise_samples/all", [samples] * len(trace))):
        run_series[name] = [x for v in values for x in (v, nan)]
    return run_of(run_series, {"rollout": {"n": 4}})


def test_the_batch_findings_fire_only_when_the_whole_interval_is_beyond_the_threshold():
    from rlgrad.metrics.pooling import pooled_scale

    # pooled B_simple = 3 x 1000 / (3 x 1) = 1000 = 15.6 x 64 samples, with a narrow interval: fires, quoting it
    narrow = _with_intervals([1000.0] * 3, [1.0] * 3, signal_se=0.05)
    found = _found(narrow, "batch_below_noise_scale")
    want = pooled_scale([{"trace": 1000.0, "signal": 1.0, "trace_se": 100.0, "signal_se": 0.05, "cov": 0.0,
                          "groups": 16.0}] * 3)
    assert found is not None and f"95% interval {fmt(want['low'])}-{fmt(want['high'])}" in found.evidence[0]
    assert "pooled over 3 analysed step(s)" in found.evidence[0] and want["low"] > 640
    # the same point value with a wide interval reaching below 10 x 64 samples: not beyond the threshold
    wide = _with_intervals([1000.0] * 3, [1.0] * 3, signal_se=0.6)
    got = pooled_scale([{"trace": 1000.0, "signal": 1.0, "trace_se": 100.0, "signal_se": 0.6, "cov": 0.0,
                         "groups": 16.0}] * 3)
    assert got["low"] < 640 < got["scale"] and _found(wide, "batch_below_noise_scale") is None
    # |G|²'s interval reaches 0: the noise scale is unresolved, and neither finding fires
    unresolved = _with_intervals([1000.0] * 3, [0.1] * 3, signal_se=0.5, samples=64.0)
    assert _found(unresolved, "batch_below_noise_scale") is None and _found(unresolved, "batch_above_noise_scale") \
        is None
    # above: 64 samples against B_simple 2 (interval 1.4-2.6 or so) fires; its interval's top decides
    above = _with_intervals([2.0] * 3, [1.0] * 3, signal_se=0.05)
    assert _found(above, "batch_above_noise_scale") is not None
