"""Reward shaping between the rollout and the advantages: DAPO's overlong penalty, the KL in the reward
and its controller, and DAPO's choice of the groups that carry a signal (dynamic sampling).

Pure functions on tensors plus the controller's state; the trainer composes them (``Trainer.collect``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlgrad.algos.advantages import group_stats, outcome_token_rewards
from rlgrad.algos.aggregation import masked_mean, masked_sum
from rlgrad.algos.kl import kl_penalty
from rlgrad.batch import Batch
from rlgrad.collectives import all_gather_cat, all_reduce_sum
from rlgrad.metrics import key


def overlong_penalty(lengths: Tensor, response_length: int, buffer_len: int, penalty_factor: float) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476; verl's DAPO reward manager), ``[N]``:

        r_overlong = min(−(|y| − (L_max − L_buffer)) / L_buffer · penalty_factor, 0)

    0 up to ``L_max − L_buffer`` tokens, then falling linearly to ``−penalty_factor`` at ``L_max``.
    """
    exceed = lengths.float() - (response_length - buffer_len)
    return (-exceed / buffer_len * penalty_factor).clamp(max=0.0)


class KLController:
    """The coefficient β of the KL in the reward (verl's ``FixedKLController`` / ``AdaptiveKLController``).

    adaptive (Ziegler et al. 2019, arXiv:1909.08593): after a batch of n samples whose KL per token is KL,
        e = clip(KL / target − 1, −0.2, 0.2),   β ← β · (1 + e · n / horizon)
    """

    def __init__(self, kind: str, kl_coef: float, target_kl: float = 0.1, horizon: int = 10000):
        self.kind, self.value, self.target, self.horizon = kind, float(kl_coef), target_kl, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        if self.kind == "adaptive":
            error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
            self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


def kl_in_reward(scores: Tensor, token_rewards: Tensor | None, old_log_probs: Tensor, ref_log_probs: Tensor,
                 response_mask: Tensor, kind: str, beta: float) -> tuple[Tensor, Tensor]:
    """verl's ``apply_kl_penalty``: the token-level reward less β times the per-token KL of the sampling policy
    from the reference,

        r_t ← r_t − β · kl(logp_old,t, logp_ref,t)       (r: the score on the last token, or the turn rewards)

    Returns ``(token_rewards [N, L], kl per response [N])``: the KL's masked mean over each response, whose batch
    mean is ``actor/reward_kl_penalty`` and what the adaptive controller steers.
    """
    m = response_mask.to(torch.float32)
    kld = kl_penalty(old_log_probs.float(), ref_log_probs.float(), kind) * m
    base = token_rewards if token_rewards is not None else outcome_token_rewards(scores, response_mask)
    return base.float() - beta * kld, masked_mean(kld, m, dim=-1)


def kl_reward_share(token_rewards: Tensor, scores: Tensor, response_mask: Tensor) -> Tensor:
    """``[N]``: what the KL penalty took from each response's reward (Σ_t r_t − score): the reward component
    ``kl_penalty`` of the reward-component geometry."""
    return masked_sum(token_rewards, response_mask, dim=-1) - scores.float()


def groups_with_signal(group_ids: Tensor, values: Tensor) -> Tensor:
    """DAPO's dynamic-sampling test (verl's ``filter_groups``), ``[N]`` bool: the samples of groups whose
    ``values`` (correctness or score) are not all equal, and of singleton groups (nothing to compare)."""
    _, std, size = group_stats(values.float(), group_ids)
    return (std > 0) | (size <= 1)


def filter_metric(batch: Batch, info: dict, metric: str) -> Tensor:
    """``[N]``: what dynamic sampling compares within a group, by verl's names: ``acc`` the correctness, ``score``
    the task's reward (verl: the reward function's score), ``seq_reward`` that plus DAPO's overlong penalty (verl:
    token_level_scores summed), ``seq_final_reward`` the same here (verl subtracts an in-reward KL first; rlgrad
    applies it after the filter and refuses that pairing)."""
    if metric == "acc":
        return info["correct"]
    if metric == "score" and "overlong" in batch.components:
        return batch.scores - batch.components["overlong"]
    return batch.scores


def dynamic_sampling(sample_round: Callable[[int], tuple[Batch, dict]], needed: int, max_rounds: int, metric: str,
                     metrics: dict[str, float]) -> tuple[Batch, dict, Tensor]:
    """DAPO's dynamic sampling (verl's ``algorithm.filter_groups``): ``sample_round(r)`` rolls out round r's
    groups (global group ids unique over rounds, increasing with r) until ``needed`` groups whose ``metric``
    (``filter_metric``) differs within the group are found, or ``max_rounds``
    rounds are spent (verl then stops the run; here the step goes on with what was found).

    Returns every round's rows in one batch, their ``info`` concatenated, and ``[N]`` bool: the rows of the
    first ``needed`` groups with a signal, in round order. Decided on every rank's groups (gathered), so all
    ranks choose the same. Logs ``train/num_gen_batches``, ``train/num_gen_samples``, ``train/num_signal_groups``.
    """
    batches, infos, chosen = [], [], torch.zeros(0, dtype=torch.long)
    for r in range(max_rounds):
        batch, info = sample_round(r)
        batches.append(batch)
        infos.append(info)
        values = filter_metric(batch, info, metric)
        gids = all_gather_cat(batch.group_ids)
        chosen = torch.cat([chosen, torch.unique(gids[groups_with_signal(gids, all_gather_cat(values))])])
        if len(chosen) >= needed:
            break
    metrics[key("train/num_gen_batches")] = float(len(batches))
    metrics[key("train/num_gen_samples")] = float(sum(float(all_reduce_sum(torch.tensor(len(b)))) for b in batches))
    metrics[key("train/num_signal_groups")] = float(len(chosen))
    batch = batches[0] if len(batches) == 1 else Batch.cat(batches)
    info = {k: torch.cat([i[k] for i in infos]) if isinstance(v, Tensor) else [x for i in infos for x in i[k]]
            for k, v in infos[0].items()}
    return batch, info, torch.isin(batch.group_ids, chosen[:needed].to(batch.group_ids.dtype))
