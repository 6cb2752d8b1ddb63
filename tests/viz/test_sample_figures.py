"""The report's per-sample section (``viz/sample_figures.py``) drawn from a hand-made run directory's
``analysis/step_N/samples.jsonl``, and absent, without an error, from a run that has none."""

from __future__ import annotations

import html
import json
import math
import re

import numpy as np
import pytest

from rlgrad import rundata as D
from rlgrad.viz.report import _per_sample_section
from rlgrad.viz.sample_figures import fig_per_sample, group_reward_std

# group 0: rewards 1, 1 (std 0, advantages 0, norms 0); group 1: 1, 0 (std 0.7071); group 2: 1, 0, 0.5 (std 0.5)
SAMPLES = [
    {"sample": 0, "group": 0, "bucket": "bucket_1", "reward": 1.0, "advantage": 0.0, "grad_norm/task": 0.0},
    {"sample": 1, "group": 0, "bucket": "bucket_1", "reward": 1.0, "advantage": 0.0, "grad_norm/task": 0.0},
    {"sample": 2, "group": 1, "bucket": "bucket_2", "reward": 1.0, "advantage": 0.5, "grad_norm/task": 0.3},
    {"sample": 3, "group": 1, "bucket": "bucket_2", "reward": 0.0, "advantage": -0.5, "grad_norm/task": 0.2},
    {"sample": 4, "group": 2, "bucket": "bucket_2", "reward": 1.0, "advantage": 0.5, "grad_norm/task": 0.4},
    {"sample": 5, "group": 2, "bucket": "bucket_2", "reward": 0.0, "advantage": -0.5, "grad_norm/task": 0.1},
    {"sample": 6, "group": 2, "bucket": "bucket_2", "reward": 0.5, "advantage": 0.0, "grad_norm/task": 0.05},
]


def _run(tmp_path, samples: bool) -> D.RunData:
    tmp_path.mkdir(parents=True)
    rows = {s: {"critic/score/mean": 0.5 + 0.01 * s, "actor/grad_norm": 0.3} for s in range(1, 5)}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": r}) + "\n"
                                                    for s, r in rows.items()))
    step = tmp_path / "analysis" / "step_3"
    step.mkdir(parents=True)
    if samples:
        step.joinpath("samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SAMPLES))
    return D.load_run(tmp_path)


def test_group_reward_std_is_the_unbiased_std():
    assert group_reward_std(SAMPLES) == pytest.approx({0: 0.0, 1: 2 ** -0.5, 2: 0.5})


def test_the_figure_draws_each_moving_sample_at_its_advantage_and_norm():
    fig = fig_per_sample(SAMPLES, "t")
    scatter = fig.axes[0].collections[0]
    # the two zero-variance samples rest at (0, 0) and are counted, not drawn
    assert np.allclose(scatter.get_offsets(), [[0.5, 0.3], [0.5, 0.2], [0.5, 0.4], [0.5, 0.1], [0.0, 0.05]])
    assert np.allclose(scatter.get_array(), [2 ** -0.5] * 2 + [0.5] * 3)
    assert "2 of 7 samples at (0, 0)" in fig.axes[0].get_title()
    boxes = next(a for a in fig.axes if "by bucket" in a.get_title())
    assert [t.get_text() for t in boxes.get_xticklabels()] == ["bucket 1", "bucket 2"]
    # bucket 2's median norm: of 0.3, 0.2, 0.4, 0.1, 0.05
    medians = [line.get_ydata()[0] for line in boxes.lines if line.get_color() != "black" and len(line.get_ydata())
               == 2 and line.get_xdata()[0] != line.get_xdata()[1]]
    assert pytest.approx(0.2) in medians and pytest.approx(0.0) in medians
    assert fig_per_sample([{"sample": 0, "advantage": 0.1}], "no norms") is None


def test_the_report_has_the_per_sample_section_only_with_samples_jsonl(tmp_path):
    # the section alone: the whole page would add the training curves' figure, seconds of drawing
    section = _per_sample_section(_run(tmp_path / "with", samples=True), dpi=20)
    assert section.startswith('<section id="per_sample">') and "--step 3 --by grad-norm" in section
    alts = re.findall(r'<img alt="([^"]*)"', section)
    assert len(alts) == 1 and html.unescape(alts[0]).startswith("step 3: per-sample task norm against |advantage|")
    assert _per_sample_section(_run(tmp_path / "without", samples=False), dpi=20) == ""


@pytest.mark.parametrize("signal_se,resolved", [(0.05, True), (2.0, False)])
def test_the_per_sample_section_gives_the_noise_scale_with_its_interval_or_unresolved(tmp_path, signal_se, resolved):
    from rlgrad.metrics.pooling import pooled_scale

    run_dir = tmp_path / "run"
    _run(run_dir, samples=True)
    noise = {"noise_trace/all/task": 300.0, "noise_signal/all/task": 1.0, "noise_trace_se/all/task": 30.0,
             "noise_signal_se/all/task": signal_se, "noise_cov/all/task": 0.0, "noise_groups/all": 16.0,
             "noise_samples/all": 64.0}
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if row["step"] in (1, 3):
            row["data"].update(noise)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = html.unescape(_per_sample_section(D.load_run(run_dir), dpi=20))
    want = pooled_scale([{k.split("/")[0].removeprefix("noise_"): v for k, v in noise.items()}] * 2)
    if resolved:  # 600 / 2 = 300, its Fieller interval from the two steps' standard errors
        from rlgrad.doctor.findings import fmt

        assert f"B_simple 300 (95% interval {fmt(want['low'])}-{fmt(want['high'])}), pooled over 2" in text
    else:
        assert "unresolved" in text and "B_simple" not in text and math.isnan(want["scale"])
