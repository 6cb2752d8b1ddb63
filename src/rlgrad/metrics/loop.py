"""The training loop's metric groups: what rlgrad's trainer (or the host trainer, TRL's or verl's, under rlgrad's
names) logs at every step, each group with the setting that makes a run log it and what it is measured on.
"""

from __future__ import annotations

from rlgrad.metrics.entries import EVERY_STEP, Group, Metric
from rlgrad.runfiles import REWARD_COMPONENTS_FILE

# The settings that bring keys of the loop's groups (rlgrad's names; TRL and verl take the same where they have one).
VALIDATION = "trainer.test_freq=N or trainer.val_before_train=true (validation)"
CRITIC = "algorithm.adv_estimator=gae (a critic)"
KL_LOSS = "actor.use_kl_loss=true"
KL_IN_REWARD = "algorithm.use_kl_in_reward=true"
FILTER_GROUPS = "algorithm.filter_groups.enable=true"
COMPONENTS = "a task with named reward components (rlgrad's tasks; TRL: several reward_funcs)"
EXTRACTION = "data.task=math, countdown or reasoning_gym (reward.answer_extraction=auto or flexible)"
HOST_LOSS = "TRL as the host trainer (rlgrad's trainer logs the loss's terms instead)"

ROLLOUT = Group(
    "rollout", "Rollout", "The step's sampled training responses, before the rollout filter.",
    setting=EVERY_STEP, data="train_rollout", files=("rollouts/step_N.jsonl",), metrics=(
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
    ))
AGENT = Group(
    "agent", "Agent episodes (`env/`, `val/env/`)",
    "data.task=sokoban | frozen_lake: the step's training episodes before the rollout filter (`env/`), "
    "and the validation episodes (`val/env/`, one per validation start, greedy unless "
    "rollout.val_do_sample).",
    setting="data.task=sokoban or frozen_lake (an agent task)", data="train_rollout", metrics=(
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
        Metric("val/env/success",
               "Fraction of episodes that ended in success (the environment's `success`, e.g. every box on a target).",
               data="validation", setting=VALIDATION),
        Metric("val/env/num_turns",
               "Mean model turns per episode.",
               data="validation", setting=VALIDATION),
        Metric("val/env/num_actions",
               "Mean actions the environment played per episode.",
               data="validation", setting=VALIDATION),
        Metric("val/env/episode_reward",
               "Mean episode score: the environment's rewards plus the format penalties, weighted by reward.weights.",
               data="validation", setting=VALIDATION),
        Metric("val/env/action_is_valid",
               "Fraction of the action words the model wrote (up to agent.max_actions_per_turn a turn) that the "
               "environment knows.",
               data="validation", setting=VALIDATION),
        Metric("val/env/action_is_effective",
               "Fraction of the played actions that changed the environment's state (a move into a wall does not).",
               data="validation", setting=VALIDATION),
    ))
FILTER = Group(
    "filter", "Rollout filter", "The prompt groups the rollout filter (rollout.rollout_filter_*) kept.",
    setting=EVERY_STEP, data="train_rollout", metrics=(
        ("rollout/filter_kept_ratio",
         "Prompt groups the rollout filter kept / prompt groups sampled this step."),
        ("rollout/filter_kept_count", "Number of prompt groups the rollout filter kept this step."),
        ("rollout/filter_zero_count",
         "Number of prompt groups whose filter metric is zero (|m| <= 1e-10), whether or not they were "
         "dropped."),
        ("rollout/filter_empty",
         "1.0 when the rollout filter kept no group: the step was skipped (no update, no analysis)."),
        Metric("train/num_gen_batches",
               "algorithm.filter_groups (DAPO's dynamic sampling): generation rounds of data.gen_batch_size groups "
               "this step took to find data.train_batch_size groups whose samples differ (verl's name).",
               setting=FILTER_GROUPS),
        Metric("train/num_gen_samples",
               "algorithm.filter_groups: responses sampled this step over all its rounds.",
               setting=FILTER_GROUPS),
        Metric("train/num_signal_groups",
               "algorithm.filter_groups: groups with a signal found over the rounds (the step trains on the first "
               "data.train_batch_size of them; fewer when max_num_gen_batches ran out).",
               setting=FILTER_GROUPS),
    ))
REWARD = Group(
    "reward", "Rewards and advantages",
    "The kept batch: the responses the rollout filter kept, as the update sees them.",
    setting=EVERY_STEP, data="train_batch", files=(REWARD_COMPONENTS_FILE,), metrics=(
        ("critic/score/{stat}",
         "Mean / max / min sequence score (the task's weighted total reward) over the kept responses "
         "(verl's name; logged with or without a critic)."),
        Metric("reward/{component}/mean", "Mean of the reward component (unweighted) over the kept responses.",
               setting=COMPONENTS),
        Metric("reward/{component}/std",
               "Population std (divide by n) of the reward component (unweighted) over the kept responses.",
               setting=COMPONENTS),
        Metric("reward/{component}/frac_zero_std",
               "Share of the kept prompt groups in which the component has the same value for every sample (TRL's "
               "frac_reward_zero_std, per component): 1 means the component gives GRPO no signal this step.",
               setting=COMPONENTS),
        Metric("reward/extraction/flexible_share",
               "Share of the kept responses without the asked answer form (answer tags, \\boxed{}, a bare answer) "
               "whose answer was read the flexible way (reward.answer_extraction auto|flexible; math, countdown, "
               "reasoning_gym): high means the model does not follow the format the prompt asks for.",
               setting=EXTRACTION),
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
        Metric("actor/reward_kl_penalty",
               "algorithm.use_kl_in_reward: KL of the sampling policy from the reference (algorithm.kl_penalty), "
               "mean over each response's tokens, then over the kept responses (verl's name).",
               setting=KL_IN_REWARD),
        Metric("actor/reward_kl_penalty_coeff",
               "algorithm.use_kl_in_reward: the coefficient beta the step's reward used (kl_ctrl; adaptive: before "
               "this step's update).",
               setting=KL_IN_REWARD),
    ))
ACTOR = Group(
    "actor", "Actor update",
    "Each value is the mean over the step's optimizer steps (ppo_epochs × mini-batches) unless "
    "stated; absent during trainer.critic_warmup and in rlgrad probe runs.",
    setting=EVERY_STEP, data="update", metrics=(
        ("actor/pg_loss",
         "Policy loss (PPO-clip or CISPO, aggregated with actor.loss_agg_mode over the mini-batch)."),
        Metric("actor/loss",
               "The actor's whole loss as the host trainer reports it: TRL's loss (its GRPO objective, the policy "
               "loss plus beta times the KL to the reference, as TRL aggregates it by loss_type). rlgrad's trainer "
               "logs the terms: actor/pg_loss, actor/kl_loss.",
               setting=HOST_LOSS),
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
        Metric("actor/kl_loss",
               "KL estimate to the reference policy (actor.kl_loss_type), aggregated, without kl_loss_coef; "
               "actor.use_kl_loss only.",
               setting=KL_LOSS),
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
    ))
CRITIC_UPDATE = Group(
    "critic", "Critic (algorithm.adv_estimator=gae)",
    "Update values are means over the step's critic optimizer steps; the critic is fitted "
    "before the analysis hook point and the actor update.",
    setting=CRITIC, data="update", metrics=(
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
    ))
VALIDATION_GROUP = Group(
    "validation", "Validation",
    "Every trainer.test_freq steps, at the last step, and at step 0 "
    "(trainer.val_before_train); the weights after the step's update.",
    setting=VALIDATION, data="validation", metrics=(
        ("val/accuracy",
         "Fraction of the task's validation examples answered correctly, one response each (greedy unless "
         "rollout.val_do_sample)."),
        ("val/score/mean", "Mean sequence score (weighted total reward) of the validation responses."),
    ))
TIMING = Group(
    "timing", "Timing (`timing_s/`)",
    "Wall-clock seconds of the main process; each instrument's own time is in its group.",
    setting=EVERY_STEP, data="wall_clock", metrics=(
        ("timing_s/gen", "Seconds generating and scoring the step's training rollouts."),
        ("timing_s/old_log_prob",
         "Seconds computing the old policy's log-probs of the kept batch (about 0 when the rollout's "
         "own are reused)."),
        Metric("timing_s/ref", "Seconds computing the reference policy's log-probs (actor.use_kl_loss only).",
               setting=KL_LOSS),
        Metric("timing_s/values", "Seconds computing the critic's values of the kept batch (gae only).",
               setting=CRITIC),
        ("timing_s/adv", "Seconds computing the advantages (and GAE returns)."),
        Metric("timing_s/update_critic", "Seconds in the critic update, its before_grads and on_grads hooks included "
               "(gae only).", setting=CRITIC),
        ("timing_s/update_actor", "Seconds in the actor update, its before_grads and on_grads hooks included."),
        ("timing_s/filter", "Seconds in the rollout filter (its entropy forward included, for entropy metrics)."),
        Metric("timing_s/doctor", "Seconds the live doctor took at the end of this step (doctor.live; 0 on a step it "
               "skipped to keep its cost under 1% of the step time).",
               setting="doctor.live=true (the default)", writer="doctor.live"),
        ("timing_s/val", "Seconds of the validation after this training step (not logged for the validation "
                         "before training, step 0)."),
        ("timing_s/step",
         "Seconds of the whole training step, from sampling to the after-update hooks (validation and "
         "checkpoint excluded)."),
    ))
