"""Other trainers' and tools' names of the quantities rlgrad logs: one table per source (TRL, OpenRLHF,
rldoctor) and their differences. Data only, below ``rlgrad.metrics``, which re-exports them and maps keys with
them (``foreign_key``, ``own_key``); docs/metrics.md shows both (``metrics.foreign_markdown``)."""

from __future__ import annotations

# Other trainers' names of quantities rlgrad logs, read by rlgrad's TRL integration and by ``rlgrad doctor``: one
# table per trainer, their differences in ``FOREIGN_NOTES`` (docs/metrics.md shows both, ``foreign_markdown``).
# TRL 1.16's GRPOTrainer.log: every scalar a doctor signature can use. ``rewards/<f>/mean`` and ``/std`` map to
# ``reward/<f>/mean`` and ``/std``. Not mapped: clip_ratio/low_mean, high_mean, low_min, high_max (one-sided clips
# rlgrad does not log), completions/*_terminated_length, num_tokens, sampling/*, entropy_coef (a setting).
TRL_NAMES = {
    "reward": "critic/score/mean", "reward_std": "critic/score/std",
    "frac_reward_zero_std": "critic/score/frac_zero_std", "completions/mean_length": "response_length/mean",
    "completions/max_length": "response_length/max", "completions/min_length": "response_length/min",
    "completions/clipped_ratio": "response_length/clip_ratio", "entropy": "actor/entropy", "kl": "actor/kl_loss",
    "policy_loss": "actor/pg_loss", "clip_ratio/region_mean": "actor/pg_clipfrac",
    "cispo_clip_ratio": "actor/pg_clipfrac", "grad_norm": "actor/grad_norm", "learning_rate": "actor/lr",
    "step_time": "timing_s/step",
}
# OpenRLHF's PPO / GRPO actor status (``ActorPPOTrainer.training_step``; W&B: ``train/<name>``).
OPENRLHF_NAMES = {
    "reward": "critic/score/mean", "policy_loss": "actor/pg_loss", "actor_lr": "actor/lr",
    "entropy_loss": "actor/entropy", "kl": "actor/kl_loss", "ppo_kl": "actor/ppo_kl",
    "ppo_clip_ratio": "actor/pg_clipfrac", "response_length": "response_length/mean", "grad_norm": "actor/grad_norm",
}
# rldoctor 0.2.0's canonical fields (``rl-doctor fields``; its ``Run.series`` keys, what its JSON report and its
# simulated runs use). It reads other logs through an alias table with suffix matching, which misreads rlgrad's own
# names: ``rollout/accuracy`` (training samples) becomes its held-out ``eval_score`` while ``val/accuracy`` is
# dropped (an "eval copy" of that same suffix), and any ``*/entropy`` key (``actor/loss/entropy``,
# ``actor/grad_norm/entropy``, ``coherence/<bucket>/entropy``) may stand for the policy's ``entropy``. A log
# written under these names (``own_key(k, "rldoctor")``, bench/doctor_lead_time.py) is read as meant.
# Not mapped: its pg_clipfrac_low / _high (the one-sided PPO clip: verl's actor/pg_clipfrac_lower, which it aliases,
# is the dual clip's fraction, another quantity), prompt_len_mean, throughput, group_size (rlgrad does not log them).
RLDOCTOR_NAMES = {
    "reward_mean": "critic/score/mean", "reward_std": "critic/score/std", "reward_max": "critic/score/max",
    "reward_min": "critic/score/min", "eval_score": "val/accuracy", "zero_var_group_frac": "critic/score/frac_zero_std",
    "advantage_mean": "critic/advantages/mean", "entropy": "actor/entropy", "kl": "actor/kl_loss",
    "pg_clipfrac": "actor/pg_clipfrac", "grad_norm": "actor/grad_norm", "lr": "actor/lr",
    "policy_loss": "actor/pg_loss",
    "response_len_mean": "response_length/mean", "response_len_max": "response_length/max",
    "response_len_clip_ratio": "response_length/clip_ratio", "value_explained_var": "critic/vf_explained_var",
    "time_per_step": "timing_s/step",
}
FOREIGN_NAMES = {"trl": TRL_NAMES, "openrlhf": OPENRLHF_NAMES, "rldoctor": RLDOCTOR_NAMES}
FOREIGN_NOTES = {
    "trl": "TRL's entropy is a token mean (rlgrad's actor/entropy follows loss_agg_mode); its kl is the k3 estimate; "
           "reward_std and rewards/<f>/std are the unbiased std over the whole batch (rlgrad's: population std); "
           "cispo_clip_ratio is its clip fraction under loss_type=cispo. W&B and TensorBoard prefix them `train/`.",
    "openrlhf": "entropy_loss is the entropy itself (H, not a loss); kl the KL loss estimate (args.kl_estimator); "
                "reward the mean reward of the batch. W&B prefixes them `train/`.",
    "rldoctor": "its canonical fields (rl-doctor fields). eval_score is any held-out score (rlgrad's: val/accuracy); "
                "kl is whichever KL the log has (rlgrad's kl_loss; actor/ppo_kl is the policy's own drift); "
                "zero_var_group_frac is TRL's frac_reward_zero_std. Its reader takes rlgrad's rollout/accuracy "
                "(training) for eval_score, drops val/accuracy, and may take a */entropy key (actor/loss/entropy) "
                "for entropy: give it these names.",
    "wandb": "a W&B run's history carries the trainer's own names (the columns above) with `train/` before TRL's "
             "and OpenRLHF's, `eval/` before their evaluation metrics, and `_step` as the step; rlgrad reads `_step` "
             "and drops `train/`.",
    "verl": "rlgrad's names are verl's; only validation differs: `val-core/<data source>/acc/mean@N` is "
            "val/accuracy, `val-core/<data source>/reward/mean@N` is val/score/mean; rlgrad's metrics from its verl "
            "actor worker reach verl's logs with verl's actor prefix (actor/grad_norm/all/task is grad_norm/all/task).",
}
