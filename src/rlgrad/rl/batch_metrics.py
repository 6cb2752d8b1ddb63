"""The metrics of a step's kept batch (the one the update sees): its scores, reward components, advantages and,
with a critic, values and returns, over every rank's rows."""

from __future__ import annotations

import torch

from rlgrad.algos.advantages import explained_variance
from rlgrad.batch import Batch
from rlgrad.collectives import all_gather_cat
from rlgrad.logging.rewards import RewardComponentLog, reward_metrics, step_record
from rlgrad.logging.sinks import summarize


def kept_batch_metrics(step: int, batch: Batch, info: dict, kept: torch.Tensor, *, has_critic: bool,
                       reward_weights: dict[str, float], reward_log: RewardComponentLog | None) -> dict[str, float]:
    """The kept batch's scores, reward components (and a line of ``reward_components.jsonl`` where ``reward_log``:
    the main process), advantages and values. ``info``: the rollout's per-sample record, ``kept`` its rows kept.
    Every rank calls it (the gathers are collectives, in the same order everywhere)."""
    gather = all_gather_cat
    metrics: dict[str, float] = {}
    comps, scores = {k: gather(v) for k, v in batch.components.items()}, gather(batch.scores)
    metrics.update(summarize("critic/score/{stat}", scores))
    lengths, correct = gather(info["actual_lengths"][kept]), gather(info["correct"][kept])
    group_ids = gather(batch.group_ids)
    metrics.update(reward_metrics(comps, group_ids, gather(info["fallback"][kept]) if "fallback" in info else None))
    valid = gather(info["valid_format"][kept]) if "valid_format" in info else None
    if reward_log is not None:
        reward_log.append(step_record(step, comps, reward_weights, scores, group_ids, lengths, correct, valid))
    on_response = batch.response_mask.bool()
    metrics.update(summarize("critic/advantages/{stat}", gather(batch.advantages[on_response])))
    if has_critic:
        values, returns = gather(batch.values[on_response]), gather(batch.returns[on_response])
        metrics.update({**summarize("critic/values/{stat}", values), **summarize("critic/returns/{stat}", returns)})
        metrics["critic/vf_explained_var"] = float(explained_variance(returns, values, torch.ones_like(values)))
    return metrics
