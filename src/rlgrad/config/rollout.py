"""``rollout.*``: sampling (verl's ``actor_rollout_ref.rollout.*``) and RAGEN's reward-variance rollout filter.
Part of the config schema; the field docs are the user documentation.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlgrad.config.fields import setting as _f


@dataclass
class RolloutConfig:
    n: int = _f(8, "Samples per prompt (the GRPO group size).", ge=1)
    temperature: float = _f(1.0, "Sampling temperature of training rollouts (> 0; greedy validation is "
                            "rollout.val_do_sample=false).", gt=0,
                            why="0 would be greedy decoding: every sample of a group the same, no reward variance "
                            "and no GRPO signal, and no sampling distribution for the log-probs; use a small "
                            "temperature such as 0.1 (validation is greedy already: rollout.val_do_sample=false)")
    top_p: float = _f(1.0, "Nucleus sampling threshold of training rollouts.", gt=0, le=1)
    top_k: int = _f(0, "Top-k sampling (0: off).", ge=0)
    response_length: int = _f(8, "Maximum response tokens (verl: data.max_response_length).", ge=1)
    val_do_sample: bool = _f(False, "Sample during validation (false: greedy, as verl's val_kwargs default).")
    log_prob_micro_batch_size: int = _f(64, "Sequences per forward when computing old/ref "
                                        "log-probs (and, with gae, the critic's old values).", ge=1)
    recompute_log_probs: bool = _f(False, "Recompute old log-probs with a separate forward "
                                   "(verl's default) instead of taking them from the rollout.")
    engine: str = _f("auto", "Rollout engine: hf (transformers generate) | "
                     "native (rlgrad's decode loop for Qwen2/Llama/Mistral) | "
                     "auto (native when the model supports it, else hf).", choices=("auto", "hf", "native"))
    rollout_filter_strategy: str = _f("top_p", "Group filter: top_p | top_k | top_k_abs | min_p.",
                                      choices=("top_p", "top_k", "top_k_abs", "min_p"))
    rollout_filter_value: float = _f(1.0, "Filter threshold (1.0 with top_p keeps every group).", ge=0)
    rollout_filter_type: str = _f("largest", "Keep the groups with the largest or smallest metric.",
                                  choices=("largest", "smallest"))
    rollout_filter_metric: str = _f("reward_variance", "Group metric the filter ranks by.",
                                    choices=("reward_variance", "reward", "reward_sum", "entropy", "entropy_variance",
                                             "length"))
    rollout_filter_top_p_prob_mode: str = _f("linear", "top_p probabilities: metric/sum (linear) or softmax.",
                                             choices=("linear", "softmax"))
    rollout_filter_include_zero: bool = _f(True, "Keep groups whose metric is exactly zero.")
    rollout_filter_selection_eps: float = _f(0.01, "top_p with linear probabilities: the prefix stops once its "
                                             "metric sum reaches value x the total minus this slack (metric "
                                             "units; RAGEN's selection_eps).", ge=0)
    rollout_filter_empty_stop_steps: int = _f(5, "Stop the run after this many consecutive "
                                              "steps whose filter kept nothing.", ge=1)
    group_seeded_sampling: bool | None = _f(None, "Draw each prompt group's samples from its own "
                                            "generator seeded by (seed, step, group id), so the global "
                                            "batch does not depend on how groups are split over ranks (a "
                                            "1-process run with true reproduces an N-process run). null: "
                                            "on whenever torchrun launches rlgrad (any number of processes, "
                                            "so torchrun with 1 and with N processes sample the same batch), "
                                            "off in a plain one-process run.")
