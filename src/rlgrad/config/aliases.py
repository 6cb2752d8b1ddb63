"""verl's, RAGEN's and earlier rlgrad spellings of settings, and how a key resolves to rlgrad's own.

``rlgrad.config`` applies them to every preset, config file and override; the field docs in
``rlgrad.config`` name each setting's aliases.
"""

from __future__ import annotations

# verl's, RAGEN's and earlier rlgrad spellings -> ours. Prefix entries end with '.'; exact entries win over
# prefixes; an alias may lead to another (resolved until it names a key of the schema).
ALIASES: dict[str, str] = {
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "actor.ppo_micro_batch_size",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "rollout.log_prob_micro_batch_size",
    "actor_rollout_ref.model.path": "model.path",
    "actor_rollout_ref.model.lora_rank": "actor.lora.rank",
    "actor_rollout_ref.model.lora_alpha": "actor.lora.alpha",
    "actor_rollout_ref.model.target_modules": "actor.lora.target_modules",
    "critic.ppo_micro_batch_size_per_gpu": "critic.ppo_micro_batch_size",
    "critic.grad_clip": "critic.max_grad_norm",
    "model_path": "model.path",
    "data.max_response_length": "rollout.response_length",
    "actor.policy_loss.loss_mode": "actor.policy_loss",
    "reward_model.overlong_buffer.": "reward.overlong_buffer.",
    "reward_model.reward_kwargs.overlong_buffer_cfg.": "reward.overlong_buffer.",
    "custom_reward_function.": "reward.custom_reward_function.",  # verl before 0.9 (0.9: ours)
    "data.reasoning_gym.answer_extraction": "reward.answer_extraction",
    "data.reasoning_gym.partial_credit": "reward.partial_credit",
    "es_manager.train.env_groups": "data.train_batch_size",
    "es_manager.train.group_size": "rollout.n",
    # RAGEN's gradient analysis
    "trainer.gradient_analysis_mode": "analysis.buckets.enable",
    "trainer.gradient_analysis_every": "analysis.buckets.every",
    "trainer.exit_after_gradient_analysis": "analysis.buckets.exit_after",
    "trainer.gradient_analysis_env_groups": "analysis.buckets.env_groups",
    "trainer.gradient_analysis_group_size": "analysis.buckets.group_size",
    "trainer.gradient_analysis_log_prefilter": "analysis.buckets.log_prefilter",
    "rollout.gradient_analysis_num_buckets": "analysis.buckets.num_buckets",
    "rollout.gradient_analysis_bucket_mode": "analysis.buckets.bucket_mode",
    "analysis.save_batch": "analysis.buckets.save_batch",
    "analysis.save_model": "analysis.buckets.save_model",
    "analysis.dp_trim": "analysis.buckets.dp_trim",
    # reward components (rlgrad 0.1 spellings)
    "analysis.components_every": "analysis.components.every",
    "analysis.components_mode": "analysis.components.mode",
    "analysis.save_component_gradients": "analysis.components.save_gradients",
    # neuron health and ReDo (verl / RAGEN: actor_rollout_ref.actor.redo_*, critic.redo_*)
    **{f"{role}.redo_{old}": f"analysis.neurons.{role}.{new}" for role in ("actor", "critic") for old, new in (
        ("metric_freq", "metric_every"), ("reset_freq", "reset_every"), ("tau", "tau"), ("mode", "mode"),
        ("max_reset_frac", "max_reset_frac"), ("nullspace_samples", "nullspace_samples"),
        ("reset_outgoing", "reset_outgoing"))},
    # RAGEN's agent and environment settings (data.task=sokoban | frozen_lake)
    "agent_proxy.": "agent.",
    "es_manager.format_penalty": "agent.format_penalty",
    **{f"custom_envs.{tag}.max_actions_per_traj": "agent.max_actions_per_traj"
       for tag in ("SimpleSokoban", "LargerSokoban", "FrozenLake")},
    "custom_envs.SimpleSokoban.env_instruction": "env.sokoban.instruction",
    "custom_envs.LargerSokoban.env_instruction": "env.sokoban.instruction",
    "custom_envs.FrozenLake.env_instruction": "env.frozen_lake.instruction",
    "custom_envs.SimpleSokoban.env_config.": "env.sokoban.",
    "custom_envs.LargerSokoban.env_config.": "env.sokoban.",
    "custom_envs.FrozenLake.env_config.": "env.frozen_lake.",
    "actor_rollout_ref.actor.": "actor.",
    "actor_rollout_ref.rollout.": "rollout.",
    "actor_rollout_ref.model.": "model.",
}
# verl's settings for what rlgrad does another way: the key (as it resolves) -> the one-line answer pointing to
# the supported path, instead of "unknown key, did you mean ...".
NOT_HERE: dict[str, str] = {
    "rollout.name": "rlgrad generates with its own engine (rollout.engine: native, its decode loop, or hf, "
                    "transformers' generate), not vLLM or SGLang: drop rollout.name; for vLLM or SGLang rollouts run "
                    "rlgrad inside verl (python -m rlgrad.integrations.verl_main, README \"Inside verl\")",
}
# RAGEN's checkpoint-probe mode, which `rlgrad probe` is: no key of `rlgrad train`.
PROBE_ONLY_KEY = "trainer.gradient_analysis_only"


def resolve_alias(key: str) -> str:
    for _ in range(4):  # an alias may lead to another (actor_rollout_ref.actor.redo_tau -> actor.redo_tau -> ...)
        if key in ALIASES:
            key = ALIASES[key]
            continue
        prefix = next((src for src in ALIASES if src.endswith(".") and key.startswith(src)), None)
        if prefix is None:
            break
        key = ALIASES[prefix] + key[len(prefix):]
    return key


# The same settings under the name a host trainer takes them by, for advice on a run rlgrad did not train (rlgrad
# doctor on a TRL or verl run): our key (or key=value) -> TRL's GRPOConfig argument. A key absent here has no TRL
# counterpart; rlgrad's own sections (analysis.*, doctor.*) go to rlgrad's TRL integration as they are.
TRL_SETTINGS: dict[str, str] = {
    "rollout.n": "num_generations",
    "reward.weights": "reward_weights",
    "actor.kl_loss_coef": "beta",
    "actor.use_kl_loss=false": "beta=0",
    "actor.entropy_coeff": "entropy_coef",
    "actor.optim.lr": "learning_rate",
    "actor.optim.lr_warmup_steps": "warmup_steps",
    "actor.optim.eps": "adam_epsilon",
    "actor.optim.optimizer": "optim",
    "actor.max_grad_norm": "max_grad_norm",
    "actor.clip_ratio_low": "epsilon",
    "actor.clip_ratio_high": "epsilon_high",
    "actor.ppo_epochs": "num_iterations",
    "rollout.response_length": "max_completion_length",
    "rollout.temperature": "temperature",
    "algorithm.norm_adv_by_std_in_grpo": "scale_rewards",
    "algorithm.norm_adv_by_std_in_grpo=false": "scale_rewards=none",
    "trainer.save_freq": "save_steps",
    "trainer.max_ckpt_to_keep": "save_total_limit",
}
# ours -> verl's where it is not a prefix away (actor.* is actor_rollout_ref.actor.*, rollout.* is
# actor_rollout_ref.rollout.*; algorithm.*, data.*, trainer.* are spelled alike).
VERL_SETTINGS: dict[str, str] = {
    "actor.max_grad_norm": "actor_rollout_ref.actor.grad_clip",
    "rollout.response_length": "data.max_response_length",
    "reward.overlong_buffer.": "reward_model.overlong_buffer.",
    "actor.": "actor_rollout_ref.actor.",
    "rollout.": "actor_rollout_ref.rollout.",
    "analysis.": "+actor_rollout_ref.rlgrad.analysis.",  # rlgrad's own sections, under rlgrad's verl worker
    "doctor.": "+actor_rollout_ref.rlgrad.doctor.",
}
HOSTS = ("rlgrad", "trl", "verl")  # the trainers whose setting names advice is written in


def host_setting(setting: str, host: str) -> str:
    """Our ``setting`` (a dotted key, or ``key=value``) as ``host`` (``HOSTS``) spells it: rlgrad's own name for
    rlgrad (and any other host); TRL's GRPOConfig argument, or the key marked as having none there; verl's key. A
    key under a mapping (``reward.weights.format``) maps with its parent (TRL: ``reward_weights``, the entry of
    ``format``)."""
    key, eq, value = setting.partition("=")
    if host == "trl":
        if setting in TRL_SETTINGS:
            return TRL_SETTINGS[setting]
        parent = next((k for k in TRL_SETTINGS if key.startswith(k + ".")), None)
        if parent is not None:
            return f"{TRL_SETTINGS[parent]} (the entry of '{key[len(parent) + 1:]}')" + (eq + value)
        if key in TRL_SETTINGS:
            return TRL_SETTINGS[key] + eq + value
        if key.startswith(("analysis.", "doctor.")):
            return f"{setting} (rlgrad's TRL integration: GRPOTrainer(rlgrad=[...]))"
        return f"{setting} (rlgrad's setting; TRL has none)"
    if host == "verl":
        exact = VERL_SETTINGS.get(key)
        prefix = next((p for p in VERL_SETTINGS if p.endswith(".") and key.startswith(p)), None)
        name = exact or (VERL_SETTINGS[prefix] + key[len(prefix):] if prefix else key)
        return name + eq + value
    return setting
