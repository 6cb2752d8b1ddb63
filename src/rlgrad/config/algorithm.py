"""The settings of the RL algorithm: the actor's loss and optimizer, the critic, the advantage estimator, the KL
in the reward, DAPO's dynamic sampling and the reward shaping. Part of the config schema (``rlgrad.config``); the
field docs are the user documentation. Keys and defaults follow verl's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlgrad.config.fields import setting as _f

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "low-var-kl", "k3", "kl+", "k1+", "abs+", "mse+", "k2+",
            "low_var_kl+", "low-var-kl+", "k3+")  # verl's kl_penalty takes any estimator with "+"
# verl's kl_penalty names; rlgrad also takes the hyphenated spelling of low_var_kl, which verl does not.
VERL_KL_TYPES = tuple(k for k in KL_TYPES if "-" not in k)
ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae")
# One advantage per response (constant along it): what the reward-component geometry splits.
OUTCOME_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline", "reinforce_plus_plus")
PER_TOKEN = ("gae", "reinforce_plus_plus")  # advantages that may change along a response (the rest: one per response)
COMPONENT_MODES = ("shared_std", "own_std")  # analysis.components.mode


@dataclass
class OptimConfig:
    lr: float = _f(1e-4, "AdamW learning rate.", gt=0)
    weight_decay: float = _f(0.0, "AdamW weight decay.", ge=0)
    betas: list[float] = _f([0.9, 0.999], "AdamW betas.")
    eps: float = _f(1e-8, "AdamW epsilon.", gt=0)
    lr_warmup_steps: int = _f(0, "Linear learning-rate warm-up over this many optimizer steps.", ge=0)


@dataclass
class LoRAConfig:
    """LoRA adapters on the actor (PEFT): only the adapters are trained, measured and saved. verl's spellings:
    actor_rollout_ref.model.lora_rank / lora_alpha / target_modules."""

    rank: int = _f(0, "LoRA rank r of the actor's adapters; 0: full fine-tuning (verl: lora_rank). Needs peft "
                   "(pip install 'rlgrad[lora]'). Checkpoints then hold the adapter (PEFT's adapter_model.safetensors "
                   "and adapter_config.json), which PeftModel.from_pretrained loads onto the initial weights.", ge=0)
    alpha: float = _f(16.0, "LoRA alpha: the adapter's update B·A is scaled by alpha / rank (verl: lora_alpha).", gt=0)
    target_modules: Any = _f("all-linear", "The modules that get adapters: all-linear (every nn.Linear but the "
                             "output head; PEFT's and verl's default) or a list of module names, e.g. [q_proj, v_proj] "
                             "(verl: target_modules).")


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    ppo_epochs: int = _f(1, "Passes over each step's batch.", ge=1)
    ppo_mini_batch_size: int | None = _f(None, "Prompts per optimizer step "
                                         "(x rollout.n samples); null: the whole batch, one step per epoch.", ge=1)
    ppo_micro_batch_size: int = _f(64, "Samples per forward/backward (gradient "
                                   "accumulation; does not change the update).", ge=1)
    shuffle: bool = _f(True, "Shuffle samples into mini-batches each epoch.")
    policy_loss: str = _f("ppo", "Policy loss: ppo (clipped, dual-clip) | cispo (clipped, stop-gradient IS weight) | "
                          "gspo (sequence-level ratio: the geometric mean of the token ratios, clipped per "
                          "sequence; verl's gspo, TRL's importance_sampling_level=sequence). verl: "
                          "actor.policy_loss.loss_mode.", choices=("ppo", "cispo", "gspo"))
    clip_ratio_low: float = _f(0.2, "PPO lower clip: ratio >= 1 - clip_ratio_low.", ge=0, lt=1)
    clip_ratio_high: float = _f(0.2, "PPO upper clip: ratio <= 1 + clip_ratio_high (CISPO's IS-weight cap; DAPO's "
                                "clip-higher sets it above clip_ratio_low).", ge=0)
    clip_ratio_c: float = _f(3.0, "Dual-clip bound for negative advantages.", gt=1,
                             why="the dual clip bounds a negative-advantage token's loss at c x |A|, above the "
                             "clipped ratio 1")
    loss_agg_mode: str = _f("token-mean", "Loss aggregation: token-mean (every response token of the batch "
                            "weighs the same; DAPO) | token-sum (no normaliser) | seq-mean-token-mean (GRPO, GSPO) | "
                            "seq-mean-token-sum | seq-mean-token-sum-norm (Dr. GRPO: / response_length).",
                            choices=AGG_MODES)
    use_kl_loss: bool = _f(False, "Add kl_loss_coef * KL(policy || reference) to the loss.")
    kl_loss_coef: float = _f(0.001, "KL loss coefficient.", ge=0)
    kl_loss_type: str = _f("low_var_kl", "KL estimator: kl/k1 | abs | mse/k2 | low_var_kl/k3; with + (k1+, abs+, "
                           "low_var_kl+, k3+) the value of that estimator with the gradient of k2 (straight-through, "
                           "an unbiased gradient of KL).", choices=KL_TYPES)
    entropy_coeff: float = _f(0.0, "Entropy bonus: the loss gets -entropy_coeff * entropy.")
    max_grad_norm: float = _f(1.0, "Clip the global gradient norm (the pre-clip norm is logged as actor/grad_norm).",
                              gt=0, why="a negative clip factor reverses the update")


@dataclass
class CriticModelConfig:
    path: str | None = _f(None, "Local Hugging Face directory the value model starts from "
                          "(its base weights; a zero value head unless it has one). null: "
                          "the actor's initial weights (model.path or the embedded default).")


@dataclass
class CriticConfig:
    """The value model of PPO with a critic; used only when algorithm.adv_estimator=gae."""

    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_epochs: int = _f(1, "Passes of the critic over each step's batch.", ge=1)
    ppo_mini_batch_size: int | None = _f(None, "Prompts per critic optimizer step "
                                         "(x rollout.n samples); null: the whole batch.", ge=1)
    ppo_micro_batch_size: int = _f(64, "Samples per critic forward/backward (gradient "
                                   "accumulation; does not change the update).", ge=1)
    shuffle: bool = _f(True, "Shuffle samples into critic mini-batches each epoch.")
    cliprange_value: float = _f(0.5, "Value clipping: the loss uses max((V-R)^2, (clip(V, V_old-c, V_old+c)-R)^2) / 2.",
                                gt=0)
    loss_agg_mode: str | None = _f(None, "Aggregation of the value loss (null: actor.loss_agg_mode).",
                                   choices=AGG_MODES)
    max_grad_norm: float = _f(1.0, "Clip the critic's global gradient norm (the "
                              "pre-clip norm is logged as critic/grad_norm).", gt=0)


@dataclass
class KLControlConfig:
    """The coefficient of the KL in the reward (algorithm.use_kl_in_reward), verl's kl_ctrl."""

    type: str = _f("fixed", "fixed: kl_coef throughout | adaptive: Ziegler et al.'s controller, which moves the "
                   "coefficient towards target_kl (by at most 20% of n/horizon per batch of n samples).",
                   choices=("fixed", "adaptive"))
    kl_coef: float = _f(0.001, "The (initial) coefficient beta.", ge=0)
    target_kl: float = _f(0.1, "adaptive: the KL per token it steers to.", gt=0)
    horizon: int = _f(10000, "adaptive: samples over which a full correction is made.", ge=1)


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling (verl's algorithm.filter_groups): drop the groups whose samples all score the same
    and sample more until data.train_batch_size groups with a signal are in hand."""

    enable: bool = _f(False, "Resample until the batch is full of groups with a reward spread.")
    metric: str = _f("acc", "What must differ within a group (verl's names): acc (the correctness) | score (the "
                     "task's reward) | seq_reward (the reward with DAPO's overlong penalty) | seq_final_reward (the "
                     "reward the advantage sees; the same, as the KL in the reward comes after the filter here).",
                     choices=("acc", "score", "seq_reward", "seq_final_reward"))
    max_num_gen_batches: int = _f(10, "Generation rounds of data.gen_batch_size groups at most per step; then the "
                                  "step trains on the groups found so far (verl stops the run instead).", ge=1)


@dataclass
class AlgorithmConfig:
    adv_estimator: str = _f("grpo", "Advantage estimator: grpo | rloo (outcome, group baseline) | "
                            "reinforce_plus_plus (discounted return whitened over the batch, no baseline) | "
                            "reinforce_plus_plus_baseline (group mean subtracted, then whitened over the batch) | "
                            "gae (PPO with a critic: token-level GAE on a learned value model, see critic.*).",
                            choices=ESTIMATORS)
    norm_adv_by_std_in_grpo: bool = _f(True, "GRPO: divide by the group's (unbiased) reward std + 1e-6.")
    gamma: float = _f(1.0, "Discount over response tokens (gae, reinforce_plus_plus).", ge=0, le=1)
    lam: float = _f(1.0, "GAE lambda (bias/variance trade-off of the advantage; 1: Monte-Carlo return minus value).",
                    ge=0, le=1)
    use_kl_in_reward: bool = _f(False, "Subtract beta * KL(old policy || reference) per token from the reward "
                                "before the advantages (the outcome estimators take its sum per response), beta "
                                "from kl_ctrl. Independent of actor.use_kl_loss.")
    kl_penalty: str = _f("kl", "KL estimator of the reward penalty (as actor.kl_loss_type).", choices=KL_TYPES)
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)


@dataclass
class OverlongBufferConfig:
    """DAPO's overlong reward shaping (verl's reward_model.overlong_buffer): a response that runs into the last
    len tokens before rollout.response_length loses reward linearly, up to penalty_factor at the limit."""

    enable: bool = _f(False, "Add the reward component overlong = -min(max(length - (response_length - len), 0) / "
                      "len, 1) * penalty_factor.")
    len: int = _f(4, "Buffer length in tokens (< rollout.response_length).", ge=1)
    penalty_factor: float = _f(1.0, "The penalty at the length limit.", ge=0)
    log: bool = _f(True, "Accepted for verl's DAPO scripts (its switch for logging the penalty); rlgrad always logs "
                   "it, as the reward component overlong (reward/overlong/mean, reward/overlong/std).")


@dataclass
class CustomRewardFunctionConfig:
    """verl's custom_reward_function: your own Python reward function scores the responses of a task with a ground
    truth (arithmetic, countdown, math, reasoning_gym), called as verl calls it (rlgrad.tasks.custom_reward).
    Alias: custom_reward_function.* (verl's top-level spelling before 0.9)."""

    path: str | None = _f(None, "A Python file (or pkg://a.module, file://x.py, as verl takes them) holding the "
                          "reward function; null (or empty): the task's own reward. Called as name(data_source=, "
                          "solution_str=, ground_truth=, extra_info=, **reward_kwargs) with the row's data_source, "
                          "reward_model.ground_truth and extra_info. A number is the reward; a dict's score is the "
                          "reward and its other numeric fields are reward components (weight 0 unless "
                          "reward.weights gives one; the component rest = score - the weighted fields).")
    name: str = _f("compute_score", "The function's name in that file.")
    reward_kwargs: dict[str, Any] = _f({}, "Extra keyword arguments of every call (verl's reward_kwargs; they win "
                                       "over the four above).")


@dataclass
class RewardConfig:
    weights: dict[str, float] = _f({}, "Reward component weights (empty: the task's defaults), "
                                   "e.g. {correctness: 0.34, format: 0.33, length: 0.33}; with "
                                   "custom_reward_function, its dict's numeric fields (default 0).")
    length_max: int = _f(800, "math: target length of the length component.", ge=1)
    length_unit: str = _f("chars", "math: length in chars or tokens.", choices=("chars", "tokens"))
    answer_extraction: str = _f("auto", "How math, countdown and reasoning_gym read the answer: strict (only the "
                                "asked form: <answer> tags, \\boxed{}, or the response being the bare answer), "
                                "flexible (verl's GSM8K 'flexible': the last number, or the last line), auto (strict "
                                "when the asked form is there, else flexible). The format component is 1 only for "
                                "the asked form. Alias: data.reasoning_gym.answer_extraction.",
                                choices=("auto", "strict", "flexible"))
    partial_credit: bool = _f(False, "reasoning_gym: pass the verifier's partial credit through as correctness "
                              "(chain_sum pays 0.5 for '17' against '7'); false: 1 when the verifier gives 1.0, "
                              "else 0. Alias: data.reasoning_gym.partial_credit.")
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)


def per_response_advantage(a: AlgorithmConfig, turn_scores: bool = False) -> str | None:
    """None when the advantage is one number per response (what the reward-component split needs), else why not.
    ``turn_scores``: the run puts each turn's reward on its own token (``agent.use_turn_scores``)."""
    if a.adv_estimator not in OUTCOME_ESTIMATORS:
        return (f"needs one advantage per response (algorithm.adv_estimator: {' | '.join(OUTCOME_ESTIMATORS)}), "
                f"got '{a.adv_estimator}'")
    if a.adv_estimator == "reinforce_plus_plus" and a.gamma != 1:
        return (f"with reinforce_plus_plus needs algorithm.gamma=1: with gamma {a.gamma} the advantage changes "
                "along the response")
    if a.adv_estimator == "reinforce_plus_plus" and turn_scores:
        return ("cannot split reinforce_plus_plus with agent.use_turn_scores: each turn's reward makes the advantage "
                "change along the response")
    if a.adv_estimator == "reinforce_plus_plus" and a.use_kl_in_reward:
        return ("cannot split reinforce_plus_plus with algorithm.use_kl_in_reward: the per-token KL makes the "
                "advantage change along the response")
    return None
