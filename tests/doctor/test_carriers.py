"""grad_norm_spike names the bucket, layer group and samples that carry a spike on an analysis.per_sample step
(``doctor/carriers.py``), on a hand-built run directory whose answer is known."""

from __future__ import annotations

import json

from rlgrad import rundata as D
from rlgrad.doctor import diagnose
from tests.doctor.test_doctor import healthy_series

SPIKE = 16
# sample ids 10..15 in groups 0..2; squared task norms 0, 0, 9, 1, 0.25, 0.25: Σ = 10.5
SAMPLES = [(10, 0, "bucket_1", 0.0, 0.0), (11, 0, "bucket_1", 0.0, 0.0), (12, 1, "bucket_2", 1.0, 0.5),
           (13, 1, "bucket_2", 0.0, -0.5), (14, 2, "bucket_3", 1.0, 0.25), (15, 2, "bucket_3", 0.5, -0.25)]
NORMS = [0.0, 0.0, 3.0, 1.0, 0.5, 0.5]


def _run_dir(tmp_path, spike_at: int = SPIKE, layers: bool = True) -> D.RunData:
    series = healthy_series(30)
    series["actor/grad_norm"][spike_at - 1] = 9.0
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for i in range(30):
            data = {k: v[i] for k, v in series.items()}
            if i + 1 == SPIKE:
                data["grad_norm/bucket_2/reward_std_mean"] = 0.5
            f.write(json.dumps({"step": i + 1, "data": data}) + "\n")
    step_dir = tmp_path / "analysis" / f"step_{SPIKE}"
    step_dir.mkdir(parents=True)
    step_dir.joinpath("samples.jsonl").write_text("".join(
        json.dumps({"sample": s, "group": g, "bucket": b, "reward": r, "advantage": a, "grad_norm/task": x}) + "\n"
        for (s, g, b, r, a), x in zip(SAMPLES, NORMS)))
    if layers:  # layer_0 carries 3² of 1² + 3² + 1² = 11
        step_dir.joinpath("sample_layers.json").write_text(json.dumps({"task": {
            g: {"grad_norm": x, "grad_norm_sample": 0.1} for g, x in (("embed", 1.0), ("layer_0", 3.0),
                                                                       ("layer_1", 1.0))}}))
    return D.load_run(tmp_path)


def _spike(run: D.RunData):
    return next(f for f in diagnose(run).findings if f.id == "grad_norm_spike")


def test_spike_on_an_analysed_step_names_bucket_layer_group_and_samples(tmp_path):
    found = _spike(_run_dir(tmp_path))
    assert found.step == SPIKE
    ev = "\n".join(found.evidence)
    # bucket_2: (9 + 1) / 10.5 of Σ ||g_i||²
    assert f"step {SPIKE} (analysed): bucket_2 (2 of 6 samples, mean reward std 0.5) holds 95%" in ev
    assert ("layer group layer_0 carries 82% of the task gradient's squared norm (||Σ_i g_i|| 3 there, 3.32 in all)"
            in ev)
    # samples 12 (9 / 10.5), 13 (1 / 10.5), then 14 or 15 (0.25 / 10.5)
    assert ("samples 12 (group 1, reward 1, advantage 0.5: 86%), 13 (group 1, reward 0, advantage -0.5: 10%), 1"
            in ev) and f"rlgrad samples RUN --step {SPIKE} --by grad-norm" in ev


def test_spike_elsewhere_or_without_layer_file(tmp_path):
    # the spike two steps after the analysed one: only the logs' evidence
    (tmp_path / "a").mkdir()
    found = _spike(_run_dir(tmp_path / "a", spike_at=SPIKE + 2))
    assert found.step == SPIKE + 2 and not any("analysed" in e or "layer group" in e for e in found.evidence)
    # samples.jsonl without sample_layers.json (a run from before it was written): bucket and samples, no layer
    (tmp_path / "b").mkdir()
    ev = _spike(_run_dir(tmp_path / "b", layers=False)).evidence
    assert any("bucket_2" in e for e in ev) and any("samples 12" in e for e in ev)
    assert not any("layer group" in e for e in ev)
