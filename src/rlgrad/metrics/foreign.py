"""Other trainers' and tools' names of the quantities rlgrad logs: one table per source (TRL, OpenRLHF,
rldoctor), their differences, and the mapping both ways (``foreign_key``: theirs to rlgrad's, ``own_key``: back).
docs/metrics.md shows the tables (``rlgrad.metrics.export.foreign_markdown``)."""

from __future__ import annotations

from rlgrad.metrics.fields import component_keys
from rlgrad.metrics.keys import key, match, parse

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
    "policy_loss": "actor/pg_loss", "loss": "actor/loss", "clip_ratio/region_mean": "actor/pg_clipfrac",
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
