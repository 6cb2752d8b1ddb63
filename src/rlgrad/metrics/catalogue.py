"""The catalogue of every metric key rlgrad logs, each a template with a one-line meaning.

The rule: every key the project logs (to ``metrics.jsonl`` and the other sinks, W&B tables included) is
declared here, ONCE, as a template such as ``grad_norm/{bucket}/{term}`` whose ``{field}`` placeholders
match the regexes of :data:`FIELDS`. Code that writes a key builds it with the literal template,

    metrics[key("grad_norm/{bucket}/{term}", bucket=b, term=t)] = norm

so that one search for the template finds both its meaning here and the lines that write it; the
reverse, from a concrete key to its entry, is :func:`match`, and :func:`parse` reads the field values
back out of a key (e.g. the bucket names of a run). ``docs/metrics.md`` is :func:`markdown`'s output (``python -m
rlgrad.metrics`` prints it) followed by the section on the JSON export (``rlgrad.metrics_export``, which writes the
catalogue for other tools): regenerate it with ``rlgrad metrics --format markdown > docs/metrics.md`` after changing
the catalogue.

This module imports only the standard library, so anything may import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

# other trainers' names: data of their own module, re-exported here (rlgrad.metrics.TRL_NAMES, ...)
from rlgrad.foreign_names import FOREIGN_NAMES, FOREIGN_NOTES, OPENRLHF_NAMES, RLDOCTOR_NAMES, TRL_NAMES  # noqa: F401

# The regex each placeholder matches (whole field values; never a "/").
FIELDS: dict[str, str] = {
    "bucket": r"all|bucket_\d+",
    "term": r"[A-Za-z0-9_]+",
    "loss": r"[A-Za-z0-9_]+",
    "role": r"actor|critic",
    "component": r"[A-Za-z0-9_]+",
    "pair": r"[A-Za-z0-9_]+?__[A-Za-z0-9_]+",
    "stat": r"mean|max|min",
    "layer": r"embed|layer_\d+|final_norm|lm_head|head",
}



def layer_group(name: str) -> str:
    """The ``{layer}`` field of a parameter name: embed, layer_<i>, final_norm, lm_head (or head)."""
    m = re.search(r"\.(?:layers|h|blocks)\.(\d+)\.", name)
    if m:
        return f"layer_{int(m.group(1))}"
    if "embed" in name or ".wte." in name or ".wpe." in name:
        return "embed"
    if "lm_head" in name:
        return "lm_head"
    if "norm" in name or ".ln_f." in name:
        return "final_norm"
    return "head"


# What each placeholder stands for (docs/metrics.md).
FIELD_MEANINGS: dict[str, str] = {
    "bucket": "a reward-variance bucket: `all` (the whole analysed batch) or `bucket_<k>` "
              "(k = 1 holds the prompt groups of lowest reward std)",
    "term": "a loss term of the actor loss, with its coefficient: `task` (the policy loss), "
            "`entropy` (-entropy_coeff·H), `kl` (kl_loss_coef·KL), or a custom loss's term names; "
            "a term with a zero coefficient is not logged",
    "loss": "a loss value of the bucket analysis; rlgrad's actor loss: `policy`, `entropy` (H), `kl` "
            "(KL to the reference), without coefficients, and `total` = policy − entropy_coeff·entropy + "
            "kl_loss_coef·kl; a custom loss: its terms (with coefficients) and `total`",
    "role": "the trained model: `actor` or `critic`",
    "component": "a reward component of the task (`correctness`, `format`, `length`, ...: reward.weights), or "
                 "of a reward.custom_reward_function (each numeric field of its dict, and `rest`: the score less the "
                 "weighted fields), or of the shaping: `overlong` (reward.overlong_buffer) and `kl_penalty` "
                 "(algorithm.use_kl_in_reward: "
                 "−beta·Σ_t KL of the response), each with weight 1; a name from another trainer (a TRL reward "
                 "function or model) goes through `component_keys`: every run of other characters than letters "
                 "and digits becomes one `_`, none at either end, and a name whose key an earlier one (or `total`) "
                 "already has gets the first free `_2`, `_3`, ... suffix; the run keeps the original names "
                 "(`run_source.json`)",
    "pair": "two reward components `<a>__<b>`, in the task's component order",
    "stat": "`mean`, `max` or `min` over the samples or tokens named in the meaning",
    "layer": "a layer group of the model's parameters: `embed`, `layer_<i>` (decoder layer i), `final_norm`, "
             "`lm_head`, or `head` (any other parameter)",
}

# Group id -> (heading, one line of context shown under it), in document order.
GROUPS: dict[str, tuple[str, str]] = {
    "rollout": ("Rollout", "The step's sampled training responses, before the rollout filter."),
    "agent": ("Agent episodes (`env/`, `val/env/`)",
              "data.task=sokoban | frozen_lake: the step's training episodes before the rollout filter (`env/`), "
              "and the validation episodes (`val/env/`, one per validation start, greedy unless "
              "rollout.val_do_sample)."),
    "filter": ("Rollout filter", "The prompt groups the rollout filter (rollout.rollout_filter_*) kept."),
    "reward": ("Rewards and advantages",
               "The kept batch: the responses the rollout filter kept, as the update sees them."),
    "actor": ("Actor update",
              "Each value is the mean over the step's optimizer steps (ppo_epochs × mini-batches) unless "
              "stated; absent during trainer.critic_warmup and in rlgrad probe runs."),
    "critic": ("Critic (algorithm.adv_estimator=gae)",
               "Update values are means over the step's critic optimizer steps; the critic is fitted "
               "before the analysis hook point and the actor update."),
    "buckets": ("Bucket analysis (`grad_norm/`)",
                "At analysis.buckets.every steps, on the actor at the hook point (the kept batch "
                "with its advantages, or the separate analysis batch), before the update; no optimizer "
                "step."),
    "prefilter": ("Bucket analysis before the filter (`grad_norm_prefilter/`)",
                  "The same measurements on the step's whole rollout batch before the rollout filter "
                  "(advantages recomputed over it); analysis.buckets.log_prefilter=true only."),
    "per_sample": ("Per-sample gradients and the noise scale (`grad_norm_sample/`, `noise_*/`, `coherence/`)",
                   "At analysis.per_sample.every steps, before the update, per bucket of the bucket analysis; g_i: "
                   "sample i's part of the bucket's gradient, h_i = n·g_i. Formulas, references: docs/noise_scale.md."),
    "components": ("Reward-component gradient geometry (`grad_comp/`, `grad_sim/`)",
                   "At analysis.components.every steps, on the kept batch before the actor update "
                   "(grpo / rloo): policy-loss gradients, before clipping, no optimizer step."),
    "neurons": ("Neuron health (`{role}/neuron/`, `{role}/param/`)",
                "At analysis.neurons.{role}.metric_every / reset_every steps, on the gradient of the step's "
                "first mini-batch, before clipping. A neuron is an MLP unit or an attention head."),
    "validation": ("Validation", "Every trainer.test_freq steps, at the last step, and at step 0 "
                                 "(trainer.val_before_train); the weights after the step's update."),
    "timing": ("Timing (`timing_s/`)", "Wall-clock seconds of the main process."),
    "trainer": ("Trainer", "Events of the training loop."),
    "tables": ("Tables", "Logged with log_table (W&B), not in metrics.jsonl."),
}

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_LITERAL = re.compile(r"[A-Za-z0-9_/]*")
_FIELD_RE = {name: re.compile(rx) for name, rx in FIELDS.items()}


@dataclass(frozen=True)
class Metric:
    """One logged key: its template (``{field}`` placeholders from :data:`FIELDS`) and its meaning."""

    template: str
    meaning: str
    group: str = ""  # a key of GROUPS
    fields: tuple[str, ...] = field(init=False, repr=False, compare=False)
    regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = tuple(_PLACEHOLDER.findall(self.template))
        unknown = [n for n in names if n not in FIELDS]
        if unknown:
            raise ValueError(f"metric template {self.template!r}: placeholder(s) {', '.join(unknown)} not in "
                             f"rlgrad.metrics.FIELDS ({', '.join(FIELDS)})")
        if len(set(names)) != len(names):
            raise ValueError(f"metric template {self.template!r} repeats a placeholder")
        literals = _PLACEHOLDER.split(self.template)[::2]
        if not all(_LITERAL.fullmatch(p) for p in literals):
            raise ValueError(f"metric template {self.template!r}: only letters, digits, '_', '/' and "
                             "{field} placeholders are allowed")
        if self.group and self.group not in GROUPS:
            raise ValueError(f"metric template {self.template!r}: unknown group {self.group!r}")
        parts = _PLACEHOLDER.split(self.template)
        rx = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>{FIELDS[p]})" for i, p in enumerate(parts))
        object.__setattr__(self, "fields", names)
        object.__setattr__(self, "regex", re.compile(rx))

    @property
    def specificity(self) -> tuple[int, int]:
        """More literal characters, then fewer placeholders: the more specific of two matching templates."""
        return len(_PLACEHOLDER.sub("", self.template)), -len(self.fields)


def _group(group: str, *entries: tuple[str, str]) -> tuple[Metric, ...]:
    return tuple(Metric(template, meaning, group) for template, meaning in entries)


CATALOGUE: tuple[Metric, ...] = (
    *_group(
        "rollout",
        ("rollout/accuracy",
         "Fraction of the step's sampled training responses (rollout.n per prompt) that the task scores "
         "correct."),
        ("rollout/score/mean",
         "Mean sequence score (weighted total reward) over the step's sampled training responses, before the "
         "rollout filter (critic/score/ is the kept batch's)."),
        ("response_length/{stat}",
         "Mean / max / min response length in tokens (EOS included) over the step's sampled training "
         "responses."),
        ("response_length/clip_ratio",
         "Fraction of the step's sampled training responses cut at rollout.response_length without an EOS."),
    ),
    *_group(
        "agent",
        ("env/success",
         "Fraction of episodes that ended in success (the environment's `success`, e.g. every box on a target)."),
        ("env/num_turns",
         "Mean model turns per episode."),
        ("env/num_actions",
         "Mean actions the environment played per episode."),
        ("env/episode_reward",
         "Mean episode score: the environment's rewards plus the format penalties, weighted by reward.weights."),
        ("env/action_is_valid",
         "Fraction of the action words the model wrote (up to agent.max_actions_per_turn a turn) that the "
         "environment knows."),
        ("env/action_is_effective",
         "Fraction of the played actions that changed the environment's state (a move into a wall does not)."),
        ("val/env/success",
         "Fraction of episodes that ended in success (the environment's `success`, e.g. every box on a target)."),
        ("val/env/num_turns",
         "Mean model turns per episode."),
        ("val/env/num_actions",
         "Mean actions the environment played per episode."),
        ("val/env/episode_reward",
         "Mean episode score: the environment's rewards plus the format penalties, weighted by reward.weights."),
        ("val/env/action_is_valid",
         "Fraction of the action words the model wrote (up to agent.max_actions_per_turn a turn) that the "
         "environment knows."),
        ("val/env/action_is_effective",
         "Fraction of the played actions that changed the environment's state (a move into a wall does not)."),
    ),
    *_group(
        "filter",
        ("rollout/filter_kept_ratio",
         "Prompt groups the rollout filter kept / prompt groups sampled this step."),
        ("rollout/filter_kept_count", "Number of prompt groups the rollout filter kept this step."),
        ("rollout/filter_zero_count",
         "Number of prompt groups whose filter metric is zero (|m| <= 1e-10), whether or not they were "
         "dropped."),
        ("rollout/filter_empty",
         "1.0 when the rollout filter kept no group: the step was skipped (no update, no analysis)."),
        ("train/num_gen_batches",
         "algorithm.filter_groups (DAPO's dynamic sampling): generation rounds of data.gen_batch_size groups "
         "this step took to find data.train_batch_size groups whose samples differ (verl's name)."),
        ("train/num_gen_samples",
         "algorithm.filter_groups: responses sampled this step over all its rounds."),
        ("train/num_signal_groups",
         "algorithm.filter_groups: groups with a signal found over the rounds (the step trains on the first "
         "data.train_batch_size of them; fewer when max_num_gen_batches ran out)."),
    ),
    *_group(
        "reward",
        ("critic/score/{stat}",
         "Mean / max / min sequence score (the task's weighted total reward) over the kept responses "
         "(verl's name; logged with or without a critic)."),
        ("reward/{component}/mean", "Mean of the reward component (unweighted) over the kept responses."),
        ("reward/{component}/std",
         "Population std (divide by n) of the reward component (unweighted) over the kept responses."),
        ("reward/{component}/frac_zero_std",
         "Share of the kept prompt groups in which the component has the same value for every sample (TRL's "
         "frac_reward_zero_std, per component): 1 means the component gives GRPO no signal this step."),
        ("reward/extraction/flexible_share",
         "Share of the kept responses without the asked answer form (answer tags, \\boxed{}, a bare answer) whose "
         "answer was read the flexible way (reward.answer_extraction auto|flexible; math, countdown, "
         "reasoning_gym): high means the model does not follow the format the prompt asks for."),
        ("critic/score/std",
         "Std of the sequence score over the batch (TRL's reward_std, unbiased; 0 means every sample of every "
         "group got the same score, so every GRPO advantage is 0)."),
        ("critic/score/frac_zero_std",
         "Share of the prompt groups whose samples all got the same sequence score, so that their GRPO advantage is "
         "0 (TRL's frac_reward_zero_std: logged by rlgrad's TRL integration and read from TRL's "
         "trainer_state.json; rlgrad's trainer counts such groups in rollout/filter_zero_count)."),
        ("critic/advantages/{stat}",
         "Mean / max / min advantage over the kept batch's response tokens (grpo / rloo / "
         "reinforce_plus_plus_baseline: the sequence advantage on every token; gae, reinforce_plus_plus: "
         "per-token advantages)."),
        ("actor/reward_kl_penalty",
         "algorithm.use_kl_in_reward: KL of the sampling policy from the reference (algorithm.kl_penalty), "
         "mean over each response's tokens, then over the kept responses (verl's name)."),
        ("actor/reward_kl_penalty_coeff",
         "algorithm.use_kl_in_reward: the coefficient beta the step's reward used (kl_ctrl; adaptive: before "
         "this step's update)."),
    ),
    *_group(
        "actor",
        ("actor/pg_loss",
         "Policy loss (PPO-clip or CISPO, aggregated with actor.loss_agg_mode over the mini-batch)."),
        ("actor/pg_clipfrac",
         "Fraction of response tokens whose ratio is clipped (ppo: the clipped term is the larger; "
         "cispo: ratio > 1 + clip_ratio_high)."),
        ("actor/pg_clipfrac_lower",
         "Fraction of response tokens (negative advantage) whose loss PPO's dual clip bounds (cispo: 0)."),
        ("actor/ppo_kl",
         "Mean over response tokens of log π_old − log π: how far the update has moved the policy from "
         "the sampling one."),
        ("actor/entropy",
         "Policy entropy per token, aggregated with actor.loss_agg_mode (logged also when entropy_coeff "
         "is 0)."),
        ("actor/kl_loss",
         "KL estimate to the reference policy (actor.kl_loss_type), aggregated, without kl_loss_coef; "
         "actor.use_kl_loss only."),
        ("actor/grad_norm",
         "L2 norm over all trainable actor parameters of the gradient of the mini-batch's total loss, "
         "before clipping."),
        ("actor/lr", "Actor learning rate after the step's last optimizer and scheduler step."),
        ("actor/update_ratio",
         "‖θ_after − θ_before‖ / ‖θ_before‖ over the trainable actor parameters: how far the step's whole update "
         "(all its optimizer steps) moved the weights, relative to their size; comparable across models and "
         "learning rates where the learning rate is not."),
        ("actor/update_ratio/{layer}", "actor/update_ratio over the layer group's parameters alone."),
        ("actor/nonfinite_grad_steps",
         "Number of the step's actor optimizer steps skipped because the gradient norm was not finite."),
        ("actor/loss/{loss}",
         "Copy of grad_norm/all/loss/{loss} (policy, entropy, kl, total): the bucket analysis' whole-batch "
         "loss value (analysis steps)."),
        ("actor/grad_norm/{term}",
         "Copy of grad_norm/all/{term} (task, entropy, kl): the bucket analysis' whole-batch gradient "
         "norm of the term, before clipping (analysis steps; not actor/grad_norm)."),
    ),
    *_group(
        "critic",
        ("critic/vf_loss",
         "Clipped value loss ½·max((V−R)², (clip(V, V_old ± cliprange_value)−R)²), aggregated with "
         "critic.loss_agg_mode over the mini-batch."),
        ("critic/vf_clipfrac", "Fraction of response tokens whose clipped value term is the larger."),
        ("critic/vpred_mean",
         "Mean predicted value V over the mini-batch's response tokens during the update."),
        ("critic/grad_norm",
         "L2 norm over all trainable critic parameters of the accumulated mini-batch value-loss gradient, "
         "before clipping."),
        ("critic/lr", "Critic learning rate after the step's last optimizer and scheduler step."),
        ("critic/nonfinite_grad_steps",
         "Number of the step's critic optimizer steps skipped because the gradient norm was not finite."),
        ("critic/values/{stat}",
         "Mean / max / min of the critic's values before this step's critic update (GAE's V_old) over "
         "the kept batch's response tokens."),
        ("critic/returns/{stat}",
         "Mean / max / min of the GAE returns A + V (the critic's targets, before whitening) over the kept "
         "batch's response tokens."),
        ("critic/vf_explained_var",
         "1 − Var[R − V] / (Var[R] + 1e-5) over the kept batch's response tokens, V before this step's "
         "critic update."),
    ),
    *_group(
        "buckets",
        ("grad_norm/{bucket}/{term}",
         "L2 norm over all trainable parameters of the gradient of the bucket's aggregated term loss "
         "(with its coefficient), before clipping."),
        ("grad_norm/{bucket}/per_sample/{term}", "grad_norm/{bucket}/{term} / the bucket's sample count."),
        ("grad_norm/{bucket}/per_token/{term}",
         "grad_norm/{bucket}/{term} / the bucket's response-token count."),
        ("grad_norm/{bucket}/loss/{loss}",
         "The loss value aggregated with actor.loss_agg_mode over the bucket's samples alone."),
        ("grad_norm/{bucket}/sample_count", "Number of samples (responses) in the bucket."),
        ("grad_norm/{bucket}/sample_pct", "100 × the bucket's samples / the analysed batch's samples."),
        ("grad_norm/{bucket}/group_rv_count", "Number of prompt groups in the bucket."),
        ("grad_norm/{bucket}/group_rv_zero_count",
         "Number of the bucket's prompt groups whose reward std is 0 (every sample got the same score): the rows "
         "of analysis/step_N/group_rv_table.csv with reward_std 0. The console's zero-variance share is "
         "grad_norm/all/group_rv_zero_count / grad_norm/all/group_rv_count."),
        ("grad_norm/{bucket}/reward_std_mean",
         "Mean over the bucket's prompt groups of the group's reward std (unbiased std of its scores)."),
        ("grad_norm/{bucket}/reward_std_min", "Smallest reward std of the bucket's prompt groups."),
        ("grad_norm/{bucket}/reward_std_max", "Largest reward std of the bucket's prompt groups."),
    ),
    *_group(
        "per_sample",
        ("grad_norm_sample/{bucket}/{term}", "Mean over the bucket's samples of the exact norm ||g_i|| (RAGEN's "
         "grad_norm/{bucket}/per_sample/{term} is ||Σ_i g_i|| / n: lower by the samples' cancellation)."),
        ("noise_samples/{bucket}", "Number of samples n the bucket's per-sample metrics are over."),
        ("noise_trace/{bucket}/{term}", "Unbiased tr(Σ) of the per-sample gradients h_i: Σ_i ||h_i − h̄||² / (n − 1)."),
        ("noise_signal/{bucket}/{term}", "Unbiased |G|²: ||h̄||² − tr(Σ)/n, ||h̄|| being grad_norm/{bucket}/{term}."),
        ("noise_scale/{bucket}/{term}", "B_simple = tr(Σ) / |G|² (McCandlish et al. 2018), in samples; NaN when the "
         "|G|² estimate is <= 0."),
        ("noise_intra/{bucket}/{term}", "Intra-prompt part of tr(Σ): the pooled spread of h_i around their prompt "
         "group's mean."),
        ("noise_inter/{bucket}/{term}", "Inter-prompt part of tr(Σ): the spread of the prompt groups' mean gradients, "
         "less the intra-prompt noise they carry."),
        ("coherence/{bucket}/{term}",
         "||Σ_i g_i||² / (n Σ_i ||g_i||²): 1 aligned, 1/n uncorrelated, 0 cancelling samples."),
        ("proxy_corr/spearman", "Rank correlation of verl's logit-space variance proxy A_i²·Σ_t(1 − 2π(y_t) + Σπ²) "
         "with the true ||g_i||² of the task term, over the batch's samples."),
        ("proxy_corr/pearson", "Linear (Pearson) correlation of the same two."),
    ),
    *_group(
        "prefilter",
        ("grad_norm_prefilter/{bucket}/{term}",
         "grad_norm/{bucket}/{term} of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/per_sample/{term}",
         "grad_norm/{bucket}/per_sample/{term} of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/per_token/{term}",
         "grad_norm/{bucket}/per_token/{term} of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/loss/{loss}",
         "grad_norm/{bucket}/loss/{loss} of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/sample_count",
         "grad_norm/{bucket}/sample_count of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/sample_pct",
         "grad_norm/{bucket}/sample_pct of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/group_rv_count",
         "grad_norm/{bucket}/group_rv_count of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/group_rv_zero_count",
         "grad_norm/{bucket}/group_rv_zero_count of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/reward_std_mean",
         "grad_norm/{bucket}/reward_std_mean of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/reward_std_min",
         "grad_norm/{bucket}/reward_std_min of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/reward_std_max",
         "grad_norm/{bucket}/reward_std_max of the batch before the rollout filter."),
    ),
    *_group(
        "components",
        ("grad_comp/{component}/norm",
         "L2 norm over all trainable parameters of the policy-loss gradient with the component's "
         "advantage (analysis.components.mode)."),
        ("grad_comp/{component}/share",
         "⟨g_c, g_total⟩ / |g_total|²: the component's share of the update's policy gradient (the shares "
         "sum to 1 in shared_std); absent when g_total = 0."),
        ("grad_comp/total/norm",
         "L2 norm of the update's policy gradient (shared_std: the sum of the component gradients; "
         "own_std: with the update's own advantage)."),
        ("grad_comp/save_failures",
         "component_grads.npz writes failed so far in this run (analysis.components.save_gradients only)."),
        ("grad_sim/{pair}",
         "Cosine between the policy-loss gradients of components a and b of a__b over all trainable "
         "parameters; absent when either is zero."),
    ),
    *_group(
        "neurons",
        ("{role}/neuron/dormant_ratio",
         "Fraction of neurons whose GraMa score (mean |gradient| of its incoming weights / its layer's "
         "mean) is <= tau."),
        ("{role}/neuron/act_dormant_ratio",
         "Fraction of neurons whose mean |activation| over the sampled sequences' response tokens / its "
         "layer's mean is <= tau (metric steps)."),
        ("{role}/neuron/zero_grad_ratio",
         "Fraction of neurons whose incoming-weight gradient is exactly zero."),
        ("{role}/param/zero_grad_ratio",
         "Fraction of trainable parameter elements whose gradient is exactly zero (or absent)."),
        ("{role}/neuron/nullspace_ratio",
         "Fraction of eigenvalues below 1e-10·λ_max of the unit-diagonal Gram matrix of up to "
         "nullspace_samples sampled sequences' loss gradients (metric steps)."),
        ("{role}/neuron/reset_count",
         "Number of neurons the ReDo-style reset re-initialised after this step's update "
         "(reset_every steps)."),
    ),
    *_group(
        "validation",
        ("val/accuracy",
         "Fraction of the task's validation examples answered correctly, one response each (greedy unless "
         "rollout.val_do_sample)."),
        ("val/score/mean", "Mean sequence score (weighted total reward) of the validation responses."),
    ),
    *_group(
        "timing",
        ("timing_s/gen", "Seconds generating and scoring the step's training rollouts."),
        ("timing_s/old_log_prob",
         "Seconds computing the old policy's log-probs of the kept batch (about 0 when the rollout's "
         "own are reused)."),
        ("timing_s/ref", "Seconds computing the reference policy's log-probs (actor.use_kl_loss only)."),
        ("timing_s/values", "Seconds computing the critic's values of the kept batch (gae only)."),
        ("timing_s/adv", "Seconds computing the advantages (and GAE returns)."),
        ("timing_s/update_critic", "Seconds in the critic update, its on_grads hooks included (gae only)."),
        ("timing_s/update_actor", "Seconds in the actor update, its on_grads hooks included."),
        ("timing_s/filter", "Seconds in the rollout filter (its entropy forward included, for entropy metrics)."),
        ("timing_s/doctor", "Seconds the live doctor took at the end of this step (doctor.live; 0 on a step it "
         "skipped to keep its cost under 1% of the step time)."),
        ("timing_s/val", "Seconds of the validation after this training step (not logged for the validation "
                         "before training, step 0)."),
        ("timing_s/step",
         "Seconds of the whole training step, from sampling to the after-update hooks (validation and "
         "checkpoint excluded)."),
        ("timing_s/neuron/{role}",
         "Seconds spent in the neuron-health measurement of the role at this step."),
        ("timing_s/analysis/buckets", "Seconds spent in the bucket analysis at this step."),
        ("timing_s/analysis/per_sample", "Seconds spent in the per-sample gradient analysis at this step."),
        ("timing_s/analysis/components",
         "Seconds spent in the reward-component gradient analysis at this step."),
    ),
    *_group(
        "trainer",
        ("trainer/exited_after_gradient_analysis",
         "1.0 at the step where the run stopped after the bucket analysis, before the actor update "
         "(analysis.buckets.exit_after, RAGEN's trainer.exit_after_gradient_analysis)."),
    ),
    *_group(
        "tables",
        ("grad_norm/group_rv_table",
         "One row per prompt group of the bucket analysis: bucket, group_id, reward_std (also "
         "analysis/step_N/group_rv_table.csv)."),
        ("grad_norm_prefilter/group_rv_table",
         "The same for the batch before the rollout filter (analysis/step_N/group_rv_table_prefilter.csv)."),
    ),
)

_BY_TEMPLATE: dict[str, Metric] = {}
for _m in CATALOGUE:
    if _m.template in _BY_TEMPLATE:
        raise ValueError(f"metric template {_m.template!r} is declared twice in rlgrad.metrics.CATALOGUE")
    _BY_TEMPLATE[_m.template] = _m
del _m


def _entry(template: str) -> Metric:
    m = _BY_TEMPLATE.get(template)
    if m is None:
        raise KeyError(f"metric template {template!r} is not in rlgrad.metrics.CATALOGUE; declare it there")
    return m


def key(template: str, **fields: str | int) -> str:
    """The concrete key of a catalogued ``template`` with its placeholders filled from ``fields``.

    ``KeyError`` (naming the template) if the template is not in :data:`CATALOGUE`; ``ValueError`` if a
    field is missing, not one of the template's, or its value does not match :data:`FIELDS`.
    """
    m = _entry(template)
    missing = [f for f in m.fields if f not in fields]
    extra = sorted(set(fields) - set(m.fields))
    if missing or extra:
        why = "; ".join(p for p in (missing and f"missing field(s) {', '.join(missing)}",
                                    extra and f"unknown field(s) {', '.join(extra)}") if p)
        raise ValueError(f"metric template {template!r}: {why}")
    values = {}
    for name in m.fields:
        v = fields[name]
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise ValueError(f"metric template {template!r}: field {name}={v!r} must be a str or an int")
        s = str(v)
        if not _FIELD_RE[name].fullmatch(s):
            raise ValueError(f"metric template {template!r}: field {name}={s!r} does not match "
                             f"{FIELDS[name]!r}")
        values[name] = s
    return template.format(**values)


@lru_cache(maxsize=8192)
def match(key: str) -> Metric | None:
    """The catalogue entry ``key`` is an instance of (the most specific one if several match), or None."""
    hits = [m for m in CATALOGUE if m.regex.fullmatch(key)]
    return max(hits, key=lambda m: m.specificity) if hits else None


def parse(template: str, key: str) -> dict[str, str] | None:
    """The field values of ``key`` under the catalogued ``template``; None if ``key`` is not its key.

    A key that a more specific template claims is not one (``grad_norm/all/sample_count`` is not a
    ``grad_norm/{bucket}/{term}`` key): :func:`match` decides. ``KeyError`` for an unknown template.
    """
    m = _entry(template)
    if match(key) is not m:
        return None
    return m.regex.fullmatch(key).groupdict()


def trl_reward_name(name: str) -> str | None:
    """The reward function (or model) of a TRL ``rewards/<name>/mean`` key, None for another key."""
    head, tail = "rewards/", "/mean"
    if name.startswith(head) and name.endswith(tail) and len(name) > len(head) + len(tail):
        return name[len(head):-len(tail)]
    return None


def foreign_key(name: str, source: str, components: dict[str, str] | None = None) -> str | None:
    """rlgrad's name for a metric another trainer logged (``source``: ``trl``, ``openrlhf`` or ``verl``), None if
    unknown (``FOREIGN_NAMES``; a ``train/`` prefix is dropped).

    TRL's ``rewards/<f>/mean`` is ``reward/<key>/mean``, ``<key>`` the ``{component}`` key of ``f``:
    ``components[f]`` (``component_keys`` of all the run's reward names), else ``f`` escaped alone.
    verl's names are rlgrad's (rlgrad follows verl), but for validation: ``val-core/<data source>/acc/mean@N``
    is ``val/accuracy`` and ``val-core/<data source>/reward/mean@N`` is ``val/score/mean``; rlgrad's own metrics
    from its verl actor worker reach verl's trainer ``actor/``-prefixed (``actor/grad_norm/all/task``, verl's
    ``rename_dict``) and are rlgrad's names again without that prefix."""
    if source in FOREIGN_NAMES:
        name = name.removeprefix("train/")  # W&B's and TensorBoard's prefix for the training logs
        if source == "trl" and name.startswith("rewards/") and name.endswith(("/mean", "/std")):
            f, stat = name[len("rewards/"):].rsplit("/", 1)
            c = (components or {}).get(f) or component_keys([f])[0]
            return key(f"reward/{{component}}/{stat}", component=c) if f else None
        return FOREIGN_NAMES[source].get(name)
    if name.startswith("val-core/") or name.startswith("val-aux/"):
        parts = name.split("/")
        if len(parts) >= 4 and parts[-1].startswith("mean@"):  # the data source may hold slashes (openai/gsm8k)
            return {"acc": "val/accuracy", "reward": "val/score/mean", "score": "val/score/mean"}.get(parts[-2])
        return None
    # name[6:]: without "actor/", where that is rlgrad's key and the prefixed name is not one of verl's
    return name[6:] if name.startswith("actor/") and match(name) is None and match(name[6:]) is not None else name


_NOT_KEY = re.compile(r"[^A-Za-z0-9]+")
RESERVED_COMPONENTS = ("total",)  # grad_comp/total/norm is the update's own gradient


def component_keys(names: list[str] | tuple[str, ...]) -> list[str]:
    """The ``{component}`` field of each of ``names`` (in order): any string becomes a distinct key.

    The rule (``FIELD_MEANINGS["component"]``): each run of characters other than ASCII letters and digits becomes
    one ``_``, with none at either end (an empty result is ``reward``). So a key never holds ``__`` and never
    starts or ends with ``_``, and ``grad_sim/<a>__<b>`` splits at its only ``__``. Where names share a key (or
    it is a reserved one, ``total``), the first keeps it and each later one gets ``<key>_<k>``, the smallest
    ``k >= 2`` that no name's key and no earlier suffix holds: the keys are distinct, and a name that is
    already a key keeps it unless an earlier name took it.
    """
    base = [_NOT_KEY.sub("_", n).strip("_") or "reward" for n in names]
    taken = set(RESERVED_COMPONENTS)
    claimed = set(base) | taken  # a suffix never takes a key some name has of its own
    out = []
    for b in base:
        k, i = b, 2
        while k in taken or (k != b and k in claimed):
            k, i = f"{b}_{i}", i + 1
        taken.add(k)
        out.append(k)
    return out


def trl_key(name: str, labels: dict[str, str] | None = None) -> str:
    """TRL's name of an rlgrad metric key it logs (the reverse of ``foreign_key``; ``labels``: component key ->
    TRL's reward name); any other key unchanged (rlgrad's own instruments log under rlgrad's names)."""
    return own_key(name, "trl", labels)


def own_key(name: str, source: str, labels: dict[str, str] | None = None) -> str:
    """``source``'s name of rlgrad's metric ``name`` (the reverse of ``foreign_key``; the first name of the table
    that maps to it); ``name`` itself where ``source`` has none (verl's names are rlgrad's)."""
    table = FOREIGN_NAMES.get(source, {})
    back = next((k for k, v in table.items() if v == name), None)
    if back is not None:
        return back
    for stat in ("mean", "std"):
        if source == "trl" and (f := parse(f"reward/{{component}}/{stat}", name)) is not None:
            return f"rewards/{(labels or {}).get(f['component'], f['component'])}/{stat}"
    return name


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """``docs/metrics.md``: the catalogue as Markdown, a table per group."""
    out = [
        "# Metrics",
        "",
        "Every key rlgrad logs (`RUN/metrics.jsonl`, TensorBoard, W&B), as a template with its meaning. "
        "A `{field}` is a placeholder for the values in the first table. This file is generated from "
        "`rlgrad.metrics.CATALOGUE` (`rlgrad metrics --format markdown > docs/metrics.md`): edit the catalogue, "
        "not this file. Search for a template (e.g. `grad_norm/{bucket}/{term}`) to find the code that "
        "writes it; `rlgrad.metrics.match(key)` gives the entry of a concrete key.",
        "",
        "## Placeholders",
        "",
        "| placeholder | matches | meaning |",
        "|---|---|---|",
    ]
    out += [f"| `{{{name}}}` | `{_cell(rx)}` | {_cell(FIELD_MEANINGS.get(name, ''))} |"
            for name, rx in FIELDS.items()]
    for group, (title, note) in GROUPS.items():
        rows = [m for m in CATALOGUE if m.group == group]
        if not rows:
            continue
        out += ["", f"## {title}", "", note, "", "| key | meaning |", "|---|---|"]
        out += [f"| `{m.template}` | {_cell(m.meaning)} |" for m in rows]
    return "\n".join(out) + "\n" + foreign_markdown()


def foreign_markdown() -> str:
    """docs/metrics.md's table of other trainers' names: one row per rlgrad key, a column per trainer."""
    keys = list(dict.fromkeys(v for t in FOREIGN_NAMES.values() for v in t.values()))
    heads = list(FOREIGN_NAMES)
    out = ["", "## Other trainers' names", "",
           "What `rlgrad doctor` (and rlgrad's TRL integration) reads another trainer's logs as, from "
           "`rlgrad.metrics.FOREIGN_NAMES`; `rewards/<f>/mean` and `/std` (TRL) are `reward/<f>/mean` and `/std`. "
           "verl's names are rlgrad's. A `train/` prefix (W&B, TensorBoard) is dropped.", "",
           "| rlgrad | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for k in keys:
        cells = [", ".join(f"`{n}`" for n, v in FOREIGN_NAMES[h].items() if v == k) or "-" for h in heads]
        out.append(f"| `{k}` | " + " | ".join(cells) + " |")
    out += ["", *[f"- {src}: {_cell(note)}" for src, note in FOREIGN_NOTES.items()]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
