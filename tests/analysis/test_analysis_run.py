"""The bucket analysis inside training runs: side-effect freedom, exits, probe mode, bundles, `rlgrad probe`."""

import csv
import json

import pytest
import torch
from safetensors.torch import load_file

from rlgrad.algos.aggregation import Denominators
from rlgrad.algos.objective import LossSettings, actor_objective
from rlgrad.batch import Batch
from rlgrad.cli import main
from rlgrad.config.load import load_config
from rlgrad.recipes import make_trainer
from rlgrad.runfiles import read_jsonl
from tests.conftest import run_cli

QUIET = dict(log=lambda *a: None)


def _run(overrides):
    return make_trainer(load_config(overrides=overrides), **QUIET).fit()


def test_analysis_every_step_leaves_training_bitwise_unchanged(tiny, tmp_path):
    common = [o for o in tiny if not o.startswith("trainer.default_local_dir")] + [
        "trainer.total_training_steps=3", "actor.use_kl_loss=true", "actor.entropy_coeff=0.01"]
    _run(common + ["trainer.gradient_analysis_mode=false", f"trainer.default_local_dir={tmp_path / 'plain'}"])
    _run(common + ["trainer.gradient_analysis_every=1", "analysis.save_batch=true",
                   f"trainer.default_local_dir={tmp_path / 'probed'}"])
    a = load_file(tmp_path / "plain" / "global_step_3" / "actor" / "model.safetensors")
    b = load_file(tmp_path / "probed" / "global_step_3" / "actor" / "model.safetensors")
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rp, rq = read_jsonl(tmp_path / "plain" / "metrics.jsonl"), read_jsonl(tmp_path / "probed" / "metrics.jsonl")
    for x, y in zip(rp, rq):
        for k, v in x["data"].items():
            if not k.startswith("timing_s/"):
                assert y["data"][k] == v, (x["step"], k)
    for step in (1, 2, 3):
        d = rq[step]["data"]
        assert d["grad_norm/all/sample_count"] == 16.0 and d["grad_norm/all/sample_pct"] == 100.0
        assert d["actor/grad_norm/task"] == d["grad_norm/all/task"]
        assert {"actor/grad_norm/entropy", "actor/grad_norm/kl", "actor/loss/total"} <= set(d)
        counts = sum(v for k, v in d.items() if k.startswith("grad_norm/bucket_") and k.endswith("/sample_count"))
        assert counts == 16.0  # buckets partition the batch
        step_dir = tmp_path / "probed" / "analysis" / f"step_{step}"
        assert json.loads((step_dir / "layers.json").read_text())["grad_norm"]["all"]["task"]
        with open(step_dir / "group_rv_table.csv") as f:
            table = list(csv.DictReader(f))
        assert len(table) == 4 and {r["bucket"] for r in table} <= {f"bucket_{i}" for i in range(1, 7)}


def test_instruments_riding_on_a_one_pass_update_leave_training_unchanged_but_for_rounding(tiny, tmp_path,
                                                                                            monkeypatch):
    """One mini-batch, one micro-batch, the policy loss alone: every instrument every step runs no pass of its own
    (the prompt-group pass rides on the update's backward, which forms the update's gradient from the group
    gradients), the run's weights and training metrics are a plain run's up to float32 rounding, and the
    instruments' metrics, files and tables are all there."""
    import rlgrad.analysis.groups as groups

    common = [o for o in tiny if not o.startswith("trainer.default_local_dir")] + [
        "trainer.total_training_steps=2", "actor.ppo_micro_batch_size=16"]
    _run(common + [f"trainer.default_local_dir={tmp_path / 'plain'}"])

    def no_pass(*args, **kwargs):
        raise AssertionError("a prompt-group pass of its own ran")

    monkeypatch.setattr(groups, "group_pass", no_pass)
    _run(common + ["analysis.every=1", "analysis.per_sample.every=1", "trainer.logger=[jsonl]",
                   f"trainer.default_local_dir={tmp_path / 'rode'}"])
    a = load_file(tmp_path / "plain" / "global_step_2" / "actor" / "model.safetensors")
    b = load_file(tmp_path / "rode" / "global_step_2" / "actor" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-6, msg=k)
    plain, rode = read_jsonl(tmp_path / "plain" / "metrics.jsonl"), read_jsonl(tmp_path / "rode" / "metrics.jsonl")
    for x, y in zip(plain, rode):
        for k, v in x["data"].items():
            if not k.startswith("timing_s/"):
                assert y["data"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), (x["step"], k)
    for step in (1, 2):
        d = rode[step]["data"]
        assert {"grad_norm/all/task", "grad_comp/correctness/norm", "grad_norm_sample/all/task",
                "actor/neuron/nullspace_ratio"} <= set(d), step
        assert (tmp_path / "rode" / "analysis" / f"step_{step}" / "group_rv_table.csv").exists()


def test_exit_after_analysis_stops_before_update(tiny, tmp_path):
    summary = _run(tiny + ["trainer.total_training_steps=5", "trainer.gradient_analysis_every=2",
                           "trainer.exit_after_gradient_analysis=true", "trainer.save_freq=1"])
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]  # step 1 is an analysis step: exit at once
    d = rows[1]["data"]
    assert d["trainer/exited_after_gradient_analysis"] == 1.0 and "grad_norm/all/task" in d
    assert "actor/pg_loss" not in d and "val/accuracy" not in d
    assert not list((tmp_path / "run").glob("global_step_*")) and summary["stopped_at_step"] == 1


def test_probe_never_updates(tiny, tmp_path, capsys):
    """RAGEN's analysis-only mode is `rlgrad probe` (Trainer.probe): the actor and the critic keep their
    weights, nothing is checkpointed; `rlgrad train trainer.gradient_analysis_only=true` points there."""
    from rlgrad.cli import main
    from rlgrad.recipes import make_prober

    _run(tiny + ["trainer.total_training_steps=1", "trainer.save_freq=1", "algorithm.adv_estimator=gae"])
    probe_dir = tmp_path / "probe"
    # one micro-batch: a training step's instruments would ride on its update, which a probe never runs
    overrides = [o for o in tiny if not o.startswith("trainer.default_local_dir")] + ["actor.ppo_micro_batch_size=16"]
    cfg = load_config(overrides=overrides + [
        "algorithm.adv_estimator=gae", "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={tmp_path / 'run' / 'global_step_1'}", f"trainer.default_local_dir={probe_dir}"])
    prober = make_prober(cfg, log=lambda *a: None)
    before = [p.detach().clone() for m in (prober.actor, prober.critic) for p in m.parameters()]
    row = prober.probe()
    after = [p for m in (prober.actor, prober.critic) for p in m.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert "grad_norm/all/task" in row and "actor/pg_loss" not in row and "critic/vf_loss" not in row
    assert not list(probe_dir.glob("global_step_*"))
    assert [r["step"] for r in read_jsonl(probe_dir / "metrics.jsonl")] == [1, 2]  # validation, the probe
    assert main(["train", *tiny, "trainer.gradient_analysis_only=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trainer.gradient_analysis_only" in err[0] and "rlgrad probe" in err[0]


def test_separate_batch_and_prefilter(tiny, tmp_path):
    _run(tiny + ["trainer.total_training_steps=1", "trainer.gradient_analysis_env_groups=6",
                 "trainer.gradient_analysis_group_size=3", "trainer.gradient_analysis_log_prefilter=true",
                 "rollout.rollout_filter_strategy=top_k_abs", "rollout.rollout_filter_value=4",
                 "rollout.gradient_analysis_num_buckets=2"])
    d = read_jsonl(tmp_path / "run" / "metrics.jsonl")[1]["data"]
    assert d["grad_norm_prefilter/all/sample_count"] == 18.0  # 6 groups x 3, before the filter
    assert d["grad_norm/all/sample_count"] == 12.0  # 4 groups kept
    assert d["grad_norm/bucket_1/group_rv_count"] == 2.0 and d["grad_norm/bucket_2/group_rv_count"] == 2.0
    assert d["rollout/filter_kept_count"] == 4.0  # the training batch: 4 prompts, filter keeps 4


def test_saved_bundle_recomputes_logged_norms(tiny, tmp_path):
    _run(tiny + ["trainer.total_training_steps=1", "analysis.save_batch=true", "analysis.save_model=true",
                 "actor.loss_agg_mode=seq-mean-token-mean", "rollout.gradient_analysis_num_buckets=3"])
    step_dir = tmp_path / "run" / "analysis" / "step_1"
    logged = read_jsonl(tmp_path / "run" / "metrics.jsonl")[1]["data"]
    t = load_file(step_dir / "batch.safetensors")
    spec = json.loads((step_dir / "loss.json").read_text())
    s = LossSettings(**spec["loss_settings"])
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(step_dir / "model")
    batch = Batch(
        input_ids=t["input_ids"], attention_mask=t["attention_mask"], response_mask=t["response_mask"],
        group_ids=t["group_ids"], scores=torch.zeros(len(t["group_ids"])), reward_std=t["reward_std"],
        old_log_probs=t["old_log_probs"], advantages=t["advantages"], ref_log_probs=t.get("ref_log_probs"))
    for k in sorted(set(t["bucket_ids"].tolist())):
        sub = batch.select(torch.nonzero(t["bucket_ids"] == k).squeeze(-1))
        loss = actor_objective(model, sub, s, Denominators.of(sub)).task
        grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
        norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))
        assert logged[f"grad_norm/bucket_{k}/task"] == pytest.approx(norm, rel=1e-4, abs=1e-9)


def test_probe_cli(tiny, tmp_path, capsys):
    run = tmp_path / "run"
    _run(tiny + ["trainer.total_training_steps=2", "trainer.save_freq=1"])
    res = run_cli(["probe", "--resume-from-path", str(run / "global_step_1"), "--with-val"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    probes = [p for p in tmp_path.iterdir() if p.name.startswith("run_probe_step1_")]
    assert len(probes) == 1
    rows = read_jsonl(probes[0] / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]  # validation of the checkpoint, then the probe at step 2
    d = rows[1]["data"]
    assert d["trainer/exited_after_gradient_analysis"] == 1.0
    assert "grad_norm/all/kl" in d and "grad_norm/all/entropy" in d and "grad_norm_prefilter/all/task" in d
    # the original run is untouched
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2]
    capsys.readouterr()  # the bad path in process (cli.main): the real entry point is launched above
    assert main(["probe", "--resume-from-path", str(tmp_path / "nope" / "global_step_9")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlgrad: error:") and len(err.strip().splitlines()) == 1, err


def test_one_setting_puts_every_instrument_on_the_same_steps(tiny, tmp_path):
    """analysis.every=2: buckets, components and neuron health all at steps 1 and 3 (RAGEN's rule); the
    instruments' own cadences keep their conventions: (step - 1) % N for buckets, step % N for neurons."""
    from rlgrad.analysis import schedules

    cfg = load_config(overrides=["trainer.gradient_analysis_every=3", "actor.redo_metric_freq=3",
                                 "analysis.components.every=3"])
    at = schedules(cfg)
    due = {name: [s for s in range(1, 10) if sch.due(s)] for name, sch in at.items()}
    assert due["buckets"] == due["components"] == [1, 4, 7] and due["neurons/actor"] == [3, 6, 9]
    assert due["neurons/critic"] == due["reset/actor"] == []
    _run(tiny + ["trainer.total_training_steps=3", "analysis.every=2", "trainer.val_before_train=false"])
    rows = {r["step"]: r["data"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")}
    for step, on in ((1, True), (2, False), (3, True)):
        d = rows[step]
        assert ("grad_norm/all/task" in d) == on and ("grad_comp/total/norm" in d) == on
        assert ("actor/neuron/dormant_ratio" in d) == on and ("timing_s/analysis/buckets" in d) == on
        assert not any(k.startswith("critic/neuron/") for k in d)  # no critic without gae
