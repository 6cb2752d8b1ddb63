"""Multi-turn agent runs end to end: PPO with a critic and every instrument on Sokoban and FrozenLake, GRPO with the
reward-component geometry, per-turn scores, the rollout files' turns, RAGEN's keys, and exact resume."""

import json

import pytest
import torch
from safetensors.torch import load_file

from rlgrad.config.load import load_config
from rlgrad.config.schedule import schedules
from rlgrad.errors import UserError
from rlgrad.recipes import make_trainer


def agent(tiny: list[str], task: str, *extra: str) -> list[str]:
    return tiny + [f"data.task={task}", "agent.max_turn=2", "agent.enable_think=false", "rollout.response_length=12",
                   "data.max_prompt_length=320", "model.tiny.max_position_embeddings=512", "data.val_size=4",
                   "model.warmstart_steps=40", "data.train_batch_size=4", "rollout.n=4", *extra]


def rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("task", ["sokoban", "frozen_lake"])
def test_ppo_with_a_critic_and_every_instrument(tiny, tmp_path, task):
    ov = agent(tiny, task, "algorithm.adv_estimator=gae", "trainer.total_training_steps=2",
               "analysis.buckets.every=1", "analysis.buckets.num_buckets=2",
               "analysis.neurons.actor.metric_every=1", "analysis.neurons.critic.metric_every=1",
               "actor.entropy_coeff=0.01")
    make_trainer(load_config(overrides=ov), log=lambda *a: None).fit()
    run = tmp_path / "run"
    r = rows(run)
    assert [x["step"] for x in r] == [0, 1, 2]
    for k in ("val/env/success", "val/env/num_turns", "val/accuracy"):
        assert k in r[0]["data"]
    step = r[1]["data"]
    for k in ("env/success", "env/num_turns", "env/num_actions", "env/episode_reward", "critic/vf_explained_var",
              "grad_norm/all/task", "grad_norm/all/entropy", "actor/neuron/dormant_ratio",
              "critic/neuron/dormant_ratio"):
        assert k in step, k
    assert 1 <= step["env/num_turns"] <= 2 and 0 <= step["env/success"] <= 1
    lines = [json.loads(x) for x in (run / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert len(lines) == 16
    for line in lines:
        assert line["turns"] and line["end"] in ("success", "env_done", "actions_spent", "max_turn", "context_full")
        assert all(t["observation"] and t["response"].startswith("<answer>") for t in line["turns"])
        assert line["components"]["env"] == pytest.approx(sum(t["reward"] for t in line["turns"]), abs=1e-5)
    # a group's episodes start from one state
    by_group = {}
    for line in lines:
        by_group.setdefault(line["group_id"], set()).add(line["turns"][0]["observation"])
    assert all(len(s) == 1 for s in by_group.values()) and len({next(iter(s)) for s in by_group.values()}) > 1
    assert (run / "analysis" / "step_1").is_dir()


def test_grpo_with_the_reward_component_geometry_and_ragen_keys(tiny, tmp_path):
    # Its own environment settings make its own warm start: 5 steps, not 40, as nothing here needs a model that
    # plays (the geometry is computed, the rooms drawn, the format counted whatever it answers): 4 s less.
    ov = agent(tiny, "sokoban", "trainer.total_training_steps=1", "analysis.components.every=1",
               "custom_envs.SimpleSokoban.env_config.dim_x=7", "custom_envs.SimpleSokoban.max_actions_per_traj=6",
               "agent_proxy.max_actions_per_turn=3", "es_manager.format_penalty=-0.5", "model.warmstart_steps=5")
    cfg = load_config(overrides=ov)
    assert (cfg.env.sokoban.dim_x, cfg.agent.max_actions_per_traj, cfg.agent.max_actions_per_turn,
            cfg.agent.format_penalty, cfg.model.warmstart_steps) == (7, 6, 3, -0.5, 5)
    make_trainer(cfg, log=lambda *a: None).fit()
    step = rows(tmp_path / "run")[1]["data"]
    assert "grad_comp/env/norm" in step or any(k.startswith("grad_comp/") for k in step)
    first = json.loads((tmp_path / "run" / "rollouts" / "step_1.jsonl").read_text().splitlines()[0])
    assert all(len(row) == 7 for row in first["turns"][0]["observation"].splitlines())
    # the format component is a penalty: a valid format is an episode none of whose turns was penalised
    rec = json.loads((tmp_path / "run" / "reward_components.jsonl").read_text().splitlines()[0])
    assert rec["num_valid_format"] == sum(x["components"]["format"] == 0 for x in rec["samples"])


def test_turn_scores_need_gae_and_the_full_history(tiny):
    with pytest.raises(UserError, match="use_turn_scores"):
        load_config(overrides=agent(tiny, "sokoban", "agent.use_turn_scores=true"))
    with pytest.raises(UserError, match="use_turn_scores"):
        load_config(overrides=agent(tiny, "sokoban", "agent.use_turn_scores=true", "algorithm.adv_estimator=gae",
                                    "agent.context_window_mode=state"))
    with pytest.raises(UserError, match="max_prompt_length"):
        make_trainer(load_config(overrides=agent(tiny, "sokoban", "data.max_prompt_length=20")), log=lambda *a: None)
    # REINFORCE++ turns per-turn rewards into per-token advantages too, which the component split cannot take
    pp = agent(tiny, "sokoban", "agent.use_turn_scores=true", "algorithm.adv_estimator=reinforce_plus_plus")
    with pytest.raises(UserError, match="cannot split reinforce_plus_plus with agent.use_turn_scores"):
        load_config(overrides=[*pp, "analysis.components.every=1"])
    cfg = load_config(overrides=[*pp, "analysis.every=1"])  # every instrument that applies: not the components
    assert schedules(cfg)["components"].every == 0 and schedules(cfg)["buckets"].every == 1


def weights(path):
    return load_file(str(path / "actor" / "model.safetensors"))


@pytest.mark.e2e
def test_a_resumed_multi_turn_run_equals_the_uninterrupted_one(tiny, tmp_path):
    base = [o for o in agent(tiny, "frozen_lake", "algorithm.adv_estimator=gae", "agent.use_turn_scores=true",
                             "trainer.save_freq=2", "trainer.test_freq=-1")
            if not o.startswith("trainer.default_local_dir")]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for steps, run in ((4, straight), (2, resumed), (4, resumed)):
        ov = base + [f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={run}"]
        make_trainer(load_config(overrides=ov), log=lambda *a: None).fit()
    a, b = weights(straight / "global_step_4"), weights(resumed / "global_step_4")
    for k in a:
        assert torch.equal(a[k], b[k]), k
    def same(row):  # the first run validated at its last step, 2; timings differ
        return {k: v for k, v in row["data"].items() if not k.startswith(("timing_s/", "val/"))}

    assert [same(x) for x in rows(straight)] == [same(y) for y in rows(resumed)]
    assert (straight / "rollouts" / "step_3.jsonl").read_text() == (resumed / "rollouts" / "step_3.jsonl").read_text()


@pytest.mark.e2e
@pytest.mark.parametrize("preset", ["sokoban_ppo_filter_grad_analysis", "sokoban_grpo_filter_grad_analysis",
                                    "sokoban_demo", "frozen_lake_demo"])
def test_the_sokoban_presets_run_and_the_probe_reads_them(tiny, tmp_path, preset):
    """RAGEN's runs scaled down further (a narrower model, one step): the separate analysis batch of episodes,
    the filter, the critic where there is one; then RAGEN's checkpoint probe of the PPO run."""
    keep = [o for o in tiny if o.split("=")[0] in ("model.cache_dir", "trainer.default_local_dir", "trainer.logger",
                                                   "trainer.num_threads") or o.startswith("model.tiny.")]
    keep = [o for o in keep if not o.startswith("model.tiny.max_position_embeddings")]
    ov = keep + ["model.warmstart_steps=40", "trainer.total_training_steps=1", "trainer.save_freq=1",
                 "data.val_size=4", "analysis.buckets.env_groups=4", "analysis.buckets.group_size=4",
                 "rollout.rollout_filter_value=1.0", "rollout.rollout_filter_include_zero=true"]
    from rlgrad.cli import main

    assert main(["train", "--config-name", preset, *ov]) == 0
    run = tmp_path / "run"
    step = rows(run)[1]["data"]
    assert "env/success" in step and "grad_norm/all/task" in step
    assert step["grad_norm/all/sample_count"] == 16  # the separate 4 x 4 analysis batch, not the training one
    if preset == "sokoban_ppo_filter_grad_analysis":
        assert "critic/vf_loss" in step
        assert main(["probe", "--config-name", "sokoban_probe", "--resume-from-path", str(run / "global_step_1"),
                     "analysis.buckets.env_groups=4", "analysis.buckets.group_size=4"]) == 0
        probe = next(p for p in tmp_path.iterdir() if "probe_step1" in p.name)
        probed = rows(probe)[-1]["data"]
        assert "grad_norm/all/kl" in probed and "grad_norm/all/entropy" in probed


@pytest.mark.e2e
def test_the_sokoban_demo_learns(model_cache, tmp_path):
    """The sokoban_demo preset as shipped (its CPU-built warm start, copied into a fresh cache), shortened to the
    first 60 of its 160 steps, without the bucket analysis: greedy success on its 128 validation rooms rises by at
    least 5 points (measured: +15.6 and +15.7 at step 60 on seeds 1 and 2, 2026-12-06). Loose on purpose:
    another CPU or thread count samples other episodes. The full runs: docs/benchmarks.md "The Sokoban demo"."""
    from rlgrad.cli import main

    steps, floor = 60, 5.0
    assert main(["train", "--config-name", "sokoban_demo", f"model.cache_dir={model_cache}",
                 f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.logger=[jsonl]",
                 f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}",
                 "analysis.buckets.enable=false"]) == 0
    val = {r["step"]: r["data"]["val/env/success"] for r in rows(tmp_path / "run") if "val/env/success" in r["data"]}
    assert sorted(val) == [0, steps]
    assert 100 * (val[steps] - val[0]) >= floor, val
