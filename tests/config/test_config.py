import re

import pytest

from rlgrad.config.load import CONFIG_DIRS, load_config
from rlgrad.config.saved import from_yaml_file
from rlgrad.config.schema import to_yaml
from rlgrad.errors import UserError


def test_defaults_and_overrides_are_typed():
    cfg = load_config(overrides=["trainer.total_training_steps=7", "rollout.n=3", "actor.optim.lr=2e-5",
                                 "trainer.logger=[jsonl,console]", "reward.weights={correctness: 1.0}"])
    assert cfg.trainer.total_training_steps == 7 and cfg.rollout.n == 3
    assert cfg.actor.optim.lr == pytest.approx(2e-5)
    assert cfg.trainer.logger == ["jsonl", "console"]
    assert cfg.reward.weights == {"correctness": 1.0}
    assert cfg.data.task == "arithmetic"  # untouched default


@pytest.mark.parametrize("seed_key,ours,value,expect", [
    ("actor_rollout_ref.actor.kl_loss_type", "actor.kl_loss_type", "low-var-kl", "low-var-kl"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor.ppo_micro_batch_size", "4", 4),
    ("actor_rollout_ref.rollout.rollout_filter_value", "rollout.rollout_filter_value", "0.9", 0.9),
    ("es_manager.train.env_groups", "data.train_batch_size", "32", 32),
    ("es_manager.train.group_size", "rollout.n", "16", 16),
    ("data.max_response_length", "rollout.response_length", "12", 12),
    ("actor_rollout_ref.rollout.gradient_analysis_num_buckets", "analysis.buckets.num_buckets", "4", 4),
    ("actor_rollout_ref.rollout.gradient_analysis_bucket_mode", "analysis.buckets.bucket_mode", "fixed_rv", "fixed_rv"),
    ("actor_rollout_ref.rollout.rollout_filter_top_p_prob_mode", "rollout.rollout_filter_top_p_prob_mode",
     "softmax", "softmax"),
    ("trainer.gradient_analysis_env_groups", "analysis.buckets.env_groups", "128", 128),
])


def test_seed_aliases(seed_key, ours, value, expect):
    cfg = load_config(overrides=[f"{seed_key}={value}"])
    section, _, name = ours.rpartition(".")
    node = cfg
    for part in section.split("."):
        node = getattr(node, part)
    assert getattr(node, name) == expect


def test_seed_probe_command_lines():
    """The seeds' checkpoint-probe overrides: ours are accepted verbatim, the rest say they are unsupported."""
    supported = ["trainer.resume_mode=resume_path", "trainer.save_freq=-1", "trainer.val_before_train=False",
                 "trainer.test_freq=-1", "es_manager.train.env_groups=32", "es_manager.train.group_size=16",
                 "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.kl_loss_type=low-var-kl",
                 "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.entropy_coeff=0.001",
                 "actor_rollout_ref.actor.loss_agg_mode=token-mean",
                 "actor_rollout_ref.rollout.rollout_filter_value=0.9",
                 "actor_rollout_ref.rollout.rollout_filter_strategy=top_p",
                 "actor_rollout_ref.rollout.rollout_filter_type=largest",
                 "actor_rollout_ref.rollout.rollout_filter_metric=reward_variance",
                 "actor_rollout_ref.rollout.rollout_filter_include_zero=True",
                 "trainer.gradient_analysis_mode=True", "trainer.gradient_analysis_every=1",
                 "trainer.exit_after_gradient_analysis=True", "trainer.resume_from_path=/x/global_step_100"]
    cfg = load_config(overrides=supported)
    assert (cfg.data.train_batch_size, cfg.rollout.n, cfg.analysis.buckets.every) == (32, 16, 1)
    for unsupported in ["actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
                        "actor_rollout_ref.actor.entropy_from_logits_with_chunking=True",
                        "actor_rollout_ref.actor.filter_loss_scaling=none"]:
        with pytest.raises(UserError, match="not support"):
            load_config(overrides=[unsupported])


def test_unknown_key_suggests_closest():
    with pytest.raises(UserError, match=r"'trainer.total_training_step'.*did you mean 'trainer.total_training_steps'"):
        load_config(overrides=["trainer.total_training_step=5"])


@pytest.mark.parametrize("key, first, also", [
    ("actor.lr", "actor.optim.lr", ["critic.optim.lr"]),  # the same word in another part of the section
    ("lr", "actor.optim.lr", ["critic.optim.lr"]),  # a bare word: every setting ending in it
    ("trainer.gradient_analysis_freq", "trainer.gradient_analysis_every", []),  # verl's _freq is our _every
    ("agent.max_turns", "agent.max_turn", []),
])
def test_unknown_keys_get_the_settings_they_most_likely_meant(key, first, also):
    with pytest.raises(UserError) as e:
        load_config(overrides=[f"{key}=1"])
    hints = re.findall(r"'([^']+)'", str(e.value).split("did you mean", 1)[1])
    assert hints[0] == first and all(a in hints for a in also) and len(hints) <= 3
    assert "actor" not in hints  # a section is not a setting
    assert "--show-config" in str(e.value)


def test_show_config_prints_every_setting_documented_and_loads_back(tmp_path, capsys):
    from rlgrad.cli import main
    from rlgrad.config.schema import flat_settings

    assert main(["train", "--config-name", "sokoban_demo", "rollout.n=3", "--show-config"]) == 0
    text = capsys.readouterr().out
    assert "# Samples per prompt (the GRPO group size)." in text and "  n: 3" in text
    (tmp_path / "c.yaml").write_text(text)
    assert flat_settings(load_config(config_file=str(tmp_path / "c.yaml"))) == flat_settings(
        load_config("sokoban_demo", overrides=["rollout.n=3"]))
    assert not (tmp_path / "runs").exists()
    assert main(["presets"]) == 0
    listed = capsys.readouterr().out
    assert "sokoban_demo" in listed and "The demo: GRPO on the embedded default" in listed


def test_unsupported_seed_key_says_so():
    with pytest.raises(UserError, match="not support"):
        load_config(overrides=["actor_rollout_ref.rollout.gpu_memory_utilization=0.3"])


@pytest.mark.parametrize("spelling", ["rollout.name=vllm", "actor_rollout_ref.rollout.name=sglang"])
def test_verls_rollout_engine_gets_the_supported_path_not_a_spelling_hint(spelling):
    with pytest.raises(UserError) as e:
        load_config(overrides=[spelling])
    msg = str(e.value)
    assert "\n" not in msg and spelling.split("=")[0] in msg and "did you mean" not in msg
    assert "its own engine" in msg and "rollout.engine" in msg and "rlgrad.integrations.verl_main" in msg


def test_a_hub_id_as_critic_path_says_how_to_download(tmp_path):
    with pytest.raises(UserError, match=r"critic.model.path 'Qwen/Qwen2.5-0.5B'.*hf download Qwen/Qwen2.5-0.5B "
                                        r"--local-dir DIR.*then set critic.model.path=DIR$"):
        load_config(overrides=["algorithm.adv_estimator=gae", "critic.model.path=Qwen/Qwen2.5-0.5B"])
    with pytest.raises(UserError, match="not a local Hugging Face model directory"):  # a folder: no hub hint
        load_config(overrides=["algorithm.adv_estimator=gae", f"critic.model.path={tmp_path}"])


@pytest.mark.parametrize("item,pattern", [
    ("rollout.n=abc", "rollout.n"),
    ("noequals", "key=value"),
    ("actor.policy_loss=grpo", "actor.policy_loss"),
    ("actor.loss_agg_mode=token_mean", "did you mean 'token-mean'"),
    ("trainer.logger=[jsonl,mlflow]", "mlflow"),
    ("rollout.n=0", "rollout.n"),
    ("analysis.per_sample.terms=[task,entropi]", r"analysis.per_sample.terms.*task, entropy, kl"),
    ("analysis.per_sample.terms=[]", "analysis.per_sample.terms"),
    ("data.train_batch_size=6", None),  # fine alone
    # issue 50: a mapping's value is named by its own key, not the mapping's
    ("reward.weights={format: 0.5, correctness: nan}",
     r"^'reward\.weights\.correctness' must be a finite number, got nan$"),
    ("actor.optim.betas=[0.9, .inf]", r"^'actor\.optim\.betas' must be a finite number, got inf$"),
])
def test_bad_values_name_the_key(item, pattern):
    if pattern is None:
        assert load_config(overrides=[item]).data.train_batch_size == 6
        return
    with pytest.raises(UserError, match=pattern):
        load_config(overrides=[item])


def test_mini_batch_must_divide():
    with pytest.raises(UserError, match="ppo_mini_batch_size"):
        load_config(overrides=["data.train_batch_size=8", "actor.ppo_mini_batch_size=3"])


def test_config_file_and_yaml_errors(tmp_path):
    good = tmp_path / "c.yaml"
    good.write_text("trainer:\n  total_training_steps: 3\nactor_rollout_ref:\n  actor:\n    entropy_coeff: 0.01\n")
    cfg = load_config(config_file=str(good), overrides=["trainer.total_training_steps=4"])
    assert cfg.trainer.total_training_steps == 4  # override wins over the file
    assert cfg.actor.entropy_coeff == pytest.approx(0.01)
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [unclosed\n")
    with pytest.raises(UserError, match="bad.yaml"):
        load_config(config_file=str(bad))
    typo = tmp_path / "typo.yaml"
    typo.write_text("trainer:\n  sed: 3\n")
    with pytest.raises(UserError, match=r"typo.yaml.*trainer.sed"):
        load_config(config_file=str(typo))
    with pytest.raises(UserError, match="does not exist"):
        load_config(config_file=str(tmp_path / "missing.yaml"))


def test_every_preset_loads():
    presets = sorted({p.stem for d in CONFIG_DIRS if d.is_dir() for p in d.glob("*.yaml")})
    assert "demo" in presets
    for name in presets:
        overrides = ["data.train_files=[x.jsonl]"] if "math" in name else []
        load_config(preset=name, overrides=overrides)
    with pytest.raises(UserError, match="did you mean 'demo'"):
        load_config(preset="dmeo")


def test_yaml_roundtrip(tmp_path):
    cfg = load_config(overrides=["rollout.n=5", "reward.weights={format: 0.2}"])
    p = tmp_path / "config.yaml"
    p.write_text(to_yaml(cfg))
    assert from_yaml_file(p) == cfg


def test_an_error_names_the_spelling_of_the_layer_that_set_the_key(tmp_path):
    old_run = tmp_path / "config.yaml"
    old_run.write_text("trainer:\n  gradient_analysis_every: 5\n")
    with pytest.raises(UserError, match=r"^'analysis.buckets.every' must be"):
        load_config(overrides=["analysis.buckets.every=0"], base_file=str(old_run))
    with pytest.raises(UserError, match=r"^'trainer.gradient_analysis_every' \(analysis.buckets.every\) must be"):
        load_config(overrides=["trainer.gradient_analysis_every=0"])


def test_the_probe_mode_key_is_refused_by_train_and_implied_by_probe(tmp_path):
    for spelling in ("trainer.gradient_analysis_only=true", "+trainer.gradient_analysis_only=True"):
        with pytest.raises(UserError, match="rlgrad probe"):
            load_config(overrides=[spelling])
        assert load_config(overrides=[spelling], probe=True).analysis.buckets.enable
    f = tmp_path / "probe.yaml"
    f.write_text("trainer:\n  gradient_analysis_only: true\n")
    assert load_config(config_file=str(f), probe=True) is not None
    load_config(overrides=["trainer.gradient_analysis_only=false"])  # as a saved run config holds it: no-op


@pytest.mark.parametrize("value", ["2", "1", "0", "0.5", "maybe", "'maybe'", "[true]"])
def test_a_bool_setting_takes_only_true_or_false(value):
    with pytest.raises(UserError, match=r"^override: 'actor.use_kl_loss' must be true or false, got ") as e:
        load_config(overrides=[f"actor.use_kl_loss={value}"])
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"must be true or false, got 2$"):
        load_config(overrides=["actor.use_kl_loss=2"])


@pytest.mark.parametrize("value, expect", [("true", True), ("false", False), ("True", True), ("no", False),
                                           ("on", True), ("'yes'", True), ("'false'", False), ("'1'", True)])
def test_yaml_and_omegaconf_spellings_of_a_bool_still_work(value, expect, tmp_path):
    assert load_config(overrides=[f"actor.use_kl_loss={value}"]).actor.use_kl_loss is expect
    f = tmp_path / "c.yaml"
    f.write_text(f"actor:\n  use_kl_loss: {value}\n")
    assert load_config(config_file=str(f)).actor.use_kl_loss is expect


def test_a_config_file_bool_of_2_names_the_file_and_key(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("algorithm:\n  filter_groups:\n    enable: 2\n")
    with pytest.raises(UserError, match=rf"^{re.escape(str(f))}: 'algorithm.filter_groups.enable' must be true or "
                                        "false, got 2$"):
        load_config(config_file=str(f))


def test_a_config_built_in_python_is_checked_for_bools_too():
    from rlgrad.config.schema import RLGradConfig
    from rlgrad.config.validate import validate

    cfg = RLGradConfig()
    cfg.actor.use_kl_loss = 2
    with pytest.raises(UserError, match=r"^'actor.use_kl_loss' must be true or false, got 2$"):
        validate(cfg)


def test_the_demo_runs_every_instrument():
    """The demo shows the bucket analysis, the reward components' gradients and neuron health, each at least once
    (and few times: the demo stays fast)."""
    from rlgrad.analysis import schedules

    cfg = load_config("demo")
    due = {name: [s for s in range(1, cfg.trainer.total_training_steps + 1) if sch.due(s)]
           for name, sch in schedules(cfg).items()}
    assert due["buckets"] == due["components"] == due["neurons/actor"] == [1, 51]


def test_the_embedded_default_trains_on_one_thread_unless_told(tmp_path):
    """trainer.num_threads=null: one thread for the embedded default (a second one spin-waits on a shared machine:
    the demo took 64 s on one and over 15 minutes on two at load 11), torch's default for a model.path; a number
    wins."""
    from rlgrad.config import load_config
    from rlgrad.config.trainer import cpu_threads

    assert cpu_threads(load_config(overrides=[])) == 1
    assert cpu_threads(load_config(overrides=["trainer.num_threads=3"])) == 3
    model = tmp_path / "model"
    model.mkdir()
    assert cpu_threads(load_config(overrides=[f"model.path={model}"])) is None
