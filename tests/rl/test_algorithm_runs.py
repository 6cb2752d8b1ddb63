"""GSPO, DAPO, REINFORCE++(-baseline) and the KL in the reward in short training runs with every instrument on,
exact resumes, and the combinations refused in one line."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rlgrad.config.load import load_config
from rlgrad.errors import UserError
from rlgrad.recipes import make_trainer
from rlgrad.runfiles import read_jsonl

EVERY_INSTRUMENT = ["analysis.every=1", "analysis.components.every=1"]

RUNS = {
    "gspo": ["actor.policy_loss=gspo", "actor.loss_agg_mode=seq-mean-token-mean", "actor.clip_ratio_low=0.0003",
             "actor.clip_ratio_high=0.0004", "actor.ppo_epochs=2"],
    "dapo": ["algorithm.filter_groups.enable=true", "data.gen_batch_size=2",
             "algorithm.filter_groups.metric=seq_reward",  # the score with the overlong penalty: varies here
             "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=2",
             "reward_model.overlong_buffer.log=false",  # verl's DAPO scripts set it
             "actor.clip_ratio_high=0.28"],
    "reinforce_pp": ["algorithm.adv_estimator=reinforce_plus_plus", "actor.use_kl_loss=true",
                     "actor.kl_loss_type=k3+", "actor.kl_loss_coef=0.01"],
    "rfpp_baseline_kl_in_reward": ["algorithm.adv_estimator=reinforce_plus_plus_baseline",
                                   "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                                   "algorithm.kl_ctrl.kl_coef=0.05", "algorithm.kl_ctrl.horizon=100",
                                   "actor.loss_agg_mode=token-sum"],
}


def run(tiny, extra, steps=2):
    cfg = load_config(overrides=tiny + EVERY_INSTRUMENT + extra + [f"trainer.total_training_steps={steps}"])
    make_trainer(cfg, log=lambda *a: None).fit()
    return {r["step"]: r["data"] for r in read_jsonl(cfg.trainer.default_local_dir + "/metrics.jsonl")}


@pytest.mark.parametrize("name", list(RUNS))
def test_every_instrument_runs_on_the_algorithm(tiny, name):
    m = run(tiny, RUNS[name])
    for step in (1, 2):
        d = m[step]
        assert d["grad_norm/all/task"] >= 0 and d["grad_comp/total/norm"] >= 0
        assert "actor/neuron/dormant_ratio" in d
        if d["grad_comp/total/norm"] > 0:  # the shares of a split that sums to the update add up to 1
            shares = [v for k, v in d.items() if k.startswith("grad_comp/") and k.endswith("/share")
                      and not k.startswith("grad_comp/total") and v is not None]
            assert sum(shares) == pytest.approx(1.0, abs=1e-3)
    if name == "gspo":  # a clip of 0.0004 with two epochs: the second epoch's sequences are clipped
        assert max(m[s]["actor/pg_clipfrac"] for s in (1, 2)) > 0
    if name == "dapo":
        d = m[1]
        assert d["train/num_gen_batches"] >= 1 and d["train/num_gen_samples"] == 2 * 4 * d["train/num_gen_batches"]
        assert "reward/overlong/mean" in d and d["reward/overlong/mean"] <= 0
        assert "grad_comp/overlong/share" in d
    if name == "rfpp_baseline_kl_in_reward":
        assert m[1]["actor/reward_kl_penalty_coeff"] == pytest.approx(0.05)
        assert m[2]["actor/reward_kl_penalty_coeff"] != pytest.approx(0.05, abs=1e-9)  # the controller moved
        assert "grad_comp/kl_penalty/share" in m[1]


def test_dynamic_sampling_and_adaptive_kl_resume_exactly(tiny, tmp_path):
    extra = RUNS["dapo"] + ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                            "algorithm.kl_ctrl.horizon=50", "trainer.save_freq=1"]
    straight = run(tiny, extra, steps=3)
    resumed_dir = tmp_path / "resumed"
    other = [o for o in tiny if not o.startswith("trainer.default_local_dir")] + [
        f"trainer.default_local_dir={resumed_dir}"]
    run(other, extra, steps=2)
    resumed = run(other, extra, steps=3)
    for k, v in straight[3].items():
        if not k.startswith("timing_s/"):
            assert resumed[3][k] == v, k
    a = load_file(tmp_path / "run" / "global_step_3" / "actor" / "model.safetensors")
    b = load_file(resumed_dir / "global_step_3" / "actor" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("overrides,message", [
    (["algorithm.adv_estimator=reinforce_plus_plus", "algorithm.gamma=0.9", "analysis.components.every=1"],
     "needs algorithm.gamma=1"),
    (["algorithm.adv_estimator=reinforce_plus_plus", "algorithm.use_kl_in_reward=true", "analysis.components.every=1"],
     "per-token KL"),
    (["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=8", "rollout.response_length=8"],
     "must be below rollout.response_length"),
    (["data.task=sokoban", "reward.overlong_buffer.enable=true"], "shapes single-turn responses"),
    (["actor.policy_loss=sapo"], "must be one of ppo, cispo, gspo"),
    (["algorithm.filter_groups.max_num_gen_batches=0"], "must be >= 1"),
])
def test_unsupported_combinations_are_refused_in_one_line(overrides, message):
    with pytest.raises(UserError, match=message) as e:
        load_config(overrides=overrides)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("preset", ["gspo", "dapo", "reinforce_pp"])
def test_presets_run_a_step_with_their_instruments(tiny, preset):
    small = ["data.train_batch_size=4", "data.gen_batch_size=4", "actor.ppo_mini_batch_size=2",
             "reward.overlong_buffer.len=2", "trainer.total_training_steps=1",
             "algorithm.filter_groups.metric=score"]  # the tiny model is never right: its scores still differ
    cfg = load_config(preset, overrides=tiny + small)
    make_trainer(cfg, log=lambda *a: None).fit()
    d = read_jsonl(cfg.trainer.default_local_dir + "/metrics.jsonl")[-1]["data"]
    assert "grad_norm/all/task" in d and "actor/neuron/dormant_ratio" in d
    assert ("grad_comp/total/norm" in d) == (preset != "reinforce_pp")  # a per-token KL in the reward: no split
    assert ("train/num_gen_batches" in d) == (preset == "dapo")
    assert ("actor/reward_kl_penalty" in d) == (preset == "reinforce_pp")
