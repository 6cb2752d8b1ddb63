"""The per-sample instrument inside rlgrad's trainer: metrics, samples.jsonl joined with the rollouts, cadence."""

import json
import math

import pytest

from rlgrad.cli import main
from rlgrad.config.load import load_config
from rlgrad.recipes import make_trainer
from rlgrad.runfiles import read_jsonl


def test_per_sample_hook_in_a_run(tiny, tmp_path, capsys):
    cfg = load_config(overrides=tiny + ["trainer.total_training_steps=2", "analysis.per_sample.every=2",
                                        "analysis.buckets.every=2", "analysis.buckets.num_buckets=2",
                                        "actor.entropy_coeff=0.01"])
    make_trainer(cfg, log=lambda *a: None).fit()
    rows = {r["step"]: r["data"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")}
    assert "noise_scale/all/task" not in rows[2]  # steps 1, 3, ...: not step 2
    d = rows[1]
    n = d["grad_norm/all/sample_count"]
    for term in ("task", "entropy"):
        assert {f"grad_norm_sample/all/{term}", f"noise_intra/all/{term}", f"coherence/bucket_1/{term}"} <= set(d)
        # the per-sample gradients' mean is the bucket analysis' gradient of the same step, before the update
        signal, trace = d[f"noise_signal/all/{term}"], d[f"noise_trace/all/{term}"]
        assert signal + trace / n == pytest.approx(d[f"grad_norm/all/{term}"] ** 2, rel=1e-5)
    for name in ("spearman", "pearson"):  # NaN (logged "nan") where every task gradient is 0 (no reward variance)
        value = float(d[f"proxy_corr/{name}"])
        assert -1 <= value <= 1 or (math.isnan(value) and d["grad_norm_sample/all/task"] == 0)
    samples = read_jsonl(tmp_path / "run" / "analysis" / "step_1" / "samples.jsonl")
    rollouts = {r["index"]: r for r in read_jsonl(tmp_path / "run" / "rollouts" / "step_1.jsonl")}
    assert len(samples) == n
    for s in samples:
        r = rollouts[s["sample"]]
        assert r["group_id"] == s["group"] and r["total"] == pytest.approx(s["reward"]) and r["kept"]
        assert r["advantage"] == pytest.approx(s["advantage"]) and s["bucket"].startswith("bucket_")
        assert s["grad_norm/task"] >= 0 and s["grad_norm/entropy"] > 0
    # sample_layers.json: the layer groups' squared batch-gradient norms add up to the bucket analysis' `all`
    layers = json.loads((tmp_path / "run" / "analysis" / "step_1" / "sample_layers.json").read_text())
    for term in ("task", "entropy"):
        assert sum(v["grad_norm"] ** 2 for v in layers[term].values()) == pytest.approx(
            d[f"grad_norm/all/{term}"] ** 2, rel=1e-5)
    assert d["grad_norm_sample/all/task"] == pytest.approx(sum(s["grad_norm/task"] for s in samples) / n, rel=1e-6)
    # rlgrad samples --by grad-norm: the largest first, shares of Σ ||g_i||²
    capsys.readouterr()
    assert main(["samples", str(tmp_path / "run"), "--step", "1", "--by", "grad-norm", "--max", "2",
                 "--term", "entropy"]) == 0
    out = capsys.readouterr().out
    top = max(samples, key=lambda s: s["grad_norm/entropy"])
    share = top["grad_norm/entropy"] ** 2 / sum(s["grad_norm/entropy"] ** 2 for s in samples)
    assert f"1. #{top['sample']} · group {top['group']}" in out and f"share {share:.1%}" in out
    assert "showing 2 of" in out and rollouts[top["sample"]]["response"][:20] in out
    assert main(["samples", str(tmp_path / "run"), "--step", "2", "--by", "grad-norm"]) == 2
    assert "no per-sample gradient norms" in capsys.readouterr().err
