"""Advantage estimators, named as verl's ``core_algos.py``: GRPO, RLOO, REINFORCE++ (and its baseline variant)
and GAE, with ``compute_advantages`` choosing by ``algorithm.adv_estimator``.

Per-sample tensors are ``[N]``; ``group_ids`` ``[N]`` are prompt-group ids (arbitrary ints, need not be
contiguous). The estimators that whiten over the batch take a ``reduce`` callable that sums partial sums over
the processes sharing a batch (identity in one process).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlgrad.algos.aggregation import masked_sum
from rlgrad.config.algorithm import ESTIMATORS


def _group_index(group_ids: Tensor) -> tuple[Tensor, Tensor, int]:
    """Inverse index into the sorted unique ids, and each group's first sample (a shift reference)."""
    uniq, inv = torch.unique(group_ids, sorted=True, return_inverse=True)
    g = uniq.numel()
    n = group_ids.numel()
    pos = torch.arange(n, device=group_ids.device)
    first = torch.full((g,), n, dtype=torch.long, device=group_ids.device)
    first = first.scatter_reduce(0, inv, pos, reduce="amin")
    return inv, first, g


def group_stats(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample (group mean, unbiased group std, group size), all ``[N]`` in ``scores.dtype``.

    std = sqrt(Σ_j (s_j − mean)² / (n − 1)); a singleton group has std 0. The sums are taken on
    scores shifted by each group's first score, so a constant group gets mean == its score and std
    == 0 *exactly* (a plain Σs/n can be off by an ulp, which would leak a tiny non-zero advantage).
    """
    scores = scores.float() if not scores.is_floating_point() else scores
    inv, first, g = _group_index(group_ids)
    ref = scores[first][inv]  # [N], the group's first score
    d = scores - ref
    zeros = torch.zeros(g, dtype=scores.dtype, device=scores.device)
    size = zeros.index_add(0, inv, torch.ones_like(scores))
    mean = ref + (zeros.index_add(0, inv, d) / size)[inv]
    sq = zeros.index_add(0, inv, (scores - mean) ** 2)
    std = (sq / (size - 1).clamp_min(1.0)).sqrt()
    std = torch.where(size > 1, std, zeros)
    return mean, std[inv], size[inv]


def group_reward_std(scores: Tensor, group_ids: Tensor) -> Tensor:
    """``[N]``: each sample's group's unbiased score std (singleton -> 0); ``Batch.reward_std``."""
    return group_stats(scores, group_ids)[1]


def grpo_advantages(scores: Tensor, group_ids: Tensor, *, norm_by_std: bool, eps: float = 1e-6) -> Tensor:
    """GRPO outcome advantage ``[N]``: A_i = (s_i − mean_g) [/ (std_g + eps)], unbiased std.

    As in verl, a singleton group uses mean 0 and std 1 (so A = s, or s/(1+eps) when normalised):
    with no siblings there is no baseline to subtract. ``norm_by_std=False`` is Dr. GRPO's variant.
    """
    mean, std, size = group_stats(scores, group_ids)
    single = size <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    adv = scores - mean
    return adv / (std + eps) if norm_by_std else adv


def rloo_advantages(scores: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO outcome advantage ``[N]``: A_i = s_i − mean_{j≠i} s_j = n/(n−1)·(s_i − mean_g).

    Singleton group: A = s (verl). Computed on shifted scores, so a constant group gives exactly 0.
    """
    scores = scores.float() if not scores.is_floating_point() else scores
    inv, first, g = _group_index(group_ids)
    d = scores - scores[first][inv]
    zeros = torch.zeros(g, dtype=scores.dtype, device=scores.device)
    n = zeros.index_add(0, inv, torch.ones_like(scores))[inv]
    total = zeros.index_add(0, inv, d)[inv]
    loo = d - (total - d) / (n - 1).clamp_min(1.0)
    return torch.where(n > 1, loo, scores)


def broadcast_to_tokens(per_sample: Tensor, response_mask: Tensor) -> Tensor:
    """``[N]`` -> ``[N, L]``: every response token of sample i gets ``per_sample[i]``; 0 elsewhere."""
    mask = response_mask.to(per_sample.dtype)
    return torch.where(mask != 0, per_sample.unsqueeze(-1) * mask, torch.zeros_like(mask))


def outcome_token_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """``[N]`` -> ``[N, L]``: the sequence score on the LAST response token of each row, 0 elsewhere.

    verl's token-level reward for an outcome score (no KL-in-reward). A row without response tokens
    gets no reward.
    """
    mask = response_mask.to(torch.bool)
    cols = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, cols, torch.full_like(cols, -1)).amax(-1)  # [N], -1 for an empty row
    out = torch.zeros(mask.shape, dtype=scores.dtype if scores.is_floating_point() else torch.float32,
                      device=mask.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = scores[rows].to(out.dtype)
    return out


Reduce = Callable[[Tensor], Tensor]  # sums a tensor over the processes that share a batch (identity in one)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8, reduce: Reduce | None = None) -> Tensor:
    """(x − μ) / sqrt(σ² + eps) over the masked entries; 0 outside the mask. μ = masked mean, σ² = masked variance
    with Bessel's correction n/(n − 1) (verl's ``masked_whiten``, ``shift_mean=True``). With a single masked entry
    (n = 1) verl divides by zero; here σ² = 0 then."""
    mean, rstd = whiten_stats(x, mask, eps, reduce)
    return torch.where(mask != 0, (x - mean) * rstd, torch.zeros_like(x))


def whiten_stats(x: Tensor, mask: Tensor, eps: float = 1e-8, reduce: Reduce | None = None) -> tuple[Tensor, Tensor]:
    """``masked_whiten``'s (μ, 1 / sqrt(σ² + eps)): whitening is x ↦ (x − μ)·rstd on the masked entries. ``reduce``
    (``collectives.all_reduce_sum`` under torchrun) makes μ and σ those of the whole batch when its rows are split
    over processes, as verl whitens the whole batch on its driver (exact partial sums)."""
    m, total = mask.to(x.dtype), reduce or (lambda t: t)
    n, s = total(torch.stack([m.sum(), masked_sum(x, m)]))
    mean = s / n.clamp_min(1e-8)
    var = total(masked_sum((x - mean) ** 2, m)) / n.clamp_min(1e-8) * (n / (n - 1) if float(n) > 1 else 1.0)
    return mean, torch.rsqrt(var + eps)


def gae_advantages(token_rewards: Tensor, values: Tensor, response_mask: Tensor, *, gamma: float,
                   lam: float, reduce: Reduce | None = None) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2015, arXiv:1506.02438), as verl computes it.

    Over the response tokens of each row, backwards from its last token (V beyond it is 0):

        TD error   δ_t = r_t + γ V_{t+1} − V_t
        advantage  A_t = δ_t + γ λ A_{t+1}
        return     R_t = A_t + V_t          (the critic's regression target, before whitening)

    "t + 1" is the next RESPONSE token: masked-out columns are skipped (they carry V and A through).
    The advantages are then whitened over all response tokens of the batch (``masked_whiten``, ``reduce``).
    Returns ``(advantages, returns)``, both ``[N, L]`` and 0 outside ``response_mask``.
    """
    m = response_mask.to(values.dtype)
    values = values * m
    rewards = token_rewards.to(values.dtype) * m
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    adv = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a_t = delta + gamma * lam * next_adv
        keep = m[:, t]
        next_value = values[:, t] * keep + (1 - keep) * next_value  # masked column: carry V_{t+1} on
        next_adv = a_t * keep + (1 - keep) * next_adv
        adv[:, t] = next_adv * keep
    returns = adv + values
    return masked_whiten(adv, m, reduce=reduce), returns * m


def reinforce_plus_plus_advantages(token_rewards: Tensor, response_mask: Tensor, *, gamma: float,
                                   reduce: Reduce | None = None) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu et al. 2025, arXiv:2501.03262; verl ``compute_reinforce_plus_plus_outcome_advantage``):
    no critic and no group baseline, the discounted return whitened over the whole batch,

        G_t = r_t + γ G_{t+1}           (over response tokens; a masked column carries G through)
        A_t = masked_whiten(G)_t        (mean and Bessel std over every response token of the batch)

    Returns ``(advantages, returns)``, ``[N, L]``, 0 outside ``response_mask``. With an outcome reward and γ = 1
    every token of a response has the same return, its score."""
    m = response_mask.to(token_rewards.dtype if token_rewards.is_floating_point() else torch.float32)
    rewards = token_rewards.to(m.dtype) * m
    running = torch.zeros_like(rewards[:, 0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        new = rewards[:, t] + gamma * running
        returns[:, t] = new * m[:, t]
        running = new * m[:, t] + running * (1 - m[:, t])
    return masked_whiten(returns, m, reduce=reduce), returns


def reinforce_plus_plus_baseline_advantages(scores: Tensor, group_ids: Tensor, response_mask: Tensor,
                                            reduce: Reduce | None = None) -> Tensor:
    """REINFORCE++-baseline (arXiv:2501.03262; verl ``compute_reinforce_plus_plus_baseline_outcome_advantage``):
    the score minus its group's mean (a singleton group: mean 0), put on every response token and whitened
    over the batch's response tokens,

        A_it = masked_whiten(s_i − mean_g s)_it

    ``[N, L]``, 0 outside ``response_mask``. Unlike GRPO the scale comes from the whole batch, not the group.
    """
    centred = grpo_advantages(scores, group_ids, norm_by_std=False)
    return masked_whiten(broadcast_to_tokens(centred, response_mask), response_mask, reduce=reduce)


def compute_advantages(estimator: str, scores: Tensor, group_ids: Tensor, response_mask: Tensor, *,
                       token_rewards: Tensor | None = None, values: Tensor | None = None, gamma: float = 1.0,
                       lam: float = 1.0, norm_by_std: bool = True, reduce: Reduce | None = None
                       ) -> tuple[Tensor, Tensor | None]:
    """Per-token advantages ``[N, L]`` of verl's ``algorithm.adv_estimator``, and the returns (gae and
    reinforce_plus_plus; else None).

    ``token_rewards`` (verl's ``token_level_rewards``; default: each score on its response's last token) is
    what every estimator starts from: the outcome estimators (grpo, rloo, reinforce_plus_plus_baseline) take
    its row sums as the scores, as verl does. ``reduce``: the batch-whitening estimators (gae, reinforce_plus_plus,
    reinforce_plus_plus_baseline) whiten over every process's rows; the group ones need whole groups per process.
    """
    if estimator in ("gae", "reinforce_plus_plus"):
        rewards = token_rewards if token_rewards is not None else outcome_token_rewards(scores, response_mask)
        if estimator == "gae":
            return gae_advantages(rewards, values, response_mask, gamma=gamma, lam=lam, reduce=reduce)
        return reinforce_plus_plus_advantages(rewards, response_mask, gamma=gamma, reduce=reduce)
    scores = sequence_scores(scores, token_rewards, response_mask)
    if estimator == "reinforce_plus_plus_baseline":
        return reinforce_plus_plus_baseline_advantages(scores, group_ids, response_mask, reduce=reduce), None
    if estimator == "grpo":
        adv = grpo_advantages(scores, group_ids, norm_by_std=norm_by_std)
    elif estimator == "rloo":
        adv = rloo_advantages(scores, group_ids)
    else:
        raise ValueError(f"unknown advantage estimator {estimator!r}; expected one of {', '.join(ESTIMATORS)}")
    return broadcast_to_tokens(adv, response_mask), None


def sequence_scores(scores: Tensor, token_rewards: Tensor | None, response_mask: Tensor) -> Tensor:
    """``[N]``: what an outcome estimator baselines, each response's summed token reward (its score when there
    are no token rewards; less the KL with algorithm.use_kl_in_reward)."""
    return scores if token_rewards is None else masked_sum(token_rewards, response_mask, dim=-1)


def explained_variance(returns: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """1 − Var[R − V] / (Var[R] + 1e-5) over the masked tokens (unbiased variances; verl's
    ``critic/vf_explained_var``): 1 = the values predict the returns, 0 = no better than their mean."""
    keep = mask.to(torch.bool)
    r, v = returns[keep].double(), values[keep].double()
    if r.numel() < 2:
        return torch.zeros((), dtype=returns.dtype)
    return (1.0 - torch.var(r - v) / (torch.var(r) + 1e-5)).to(returns.dtype)
