"""The clipped surrogates per token: the policy loss (PPO-clip, dual-clip, CISPO, GSPO) and the value loss.

    policy  L_pg = max(-A·r, -A·clip(r, 1-ε_low, 1+ε_high))      (PPO; dual-clip bounds it by -A·c for A < 0)
    value   L_V  = ½ · max((V − R)², (clip(V, V_old ± c) − R)²)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlgrad.algos.aggregation import agg_loss, masked_mean, masked_sum


@dataclass
class PolicyLossOutput:
    loss: Tensor  # aggregated scalar
    clipfrac: Tensor  # fraction of response tokens where the clip was active (detached)
    clipfrac_lower: Tensor  # dual-clip lower fraction (detached; 0 for cispo)
    ppo_kl: Tensor  # masked mean of (old_logp - logp) (detached)
    loss_mat: Tensor | None = None  # per-token loss before aggregation (differentiable)
    # Per-token "unit-advantage" loss u: ∇loss_mat = A · ∇u token by token (see policy_loss).
    unit_loss_mat: Tensor | None = None


def policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    kind: str,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    agg_mode: str,
    horizon: int,
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
) -> PolicyLossOutput:
    """Per-token policy-gradient loss, aggregated with :func:`agg_loss`.

    r = exp(clamp(logp − logp_old, −20, 20)) (the clamp keeps a stale token from overflowing).

    ``ppo`` -- vanilla PPO-clip with dual clip (verl; Ye et al. 2019, arXiv:1912.09729):
        pg1 = −A·r,  pg2 = −A·clip(r, 1−ε_low, 1+ε_high),  clipped = max(pg1, pg2)
        loss_t = min(clipped, −A·c) if A < 0 else clipped
      The dual clip bounds the loss of a negative-advantage token whose ratio has blown up.
      clipfrac = mean[pg2 > pg1]; clipfrac_lower = mean[clipped > −A·c and A < 0].

    ``cispo`` -- MiniMax-M1 (arXiv:2506.13585): clip the importance weight, not the update:
        loss_t = −sg(min(r, 1+ε_high)) · A · logp
      so every token keeps a gradient −min(r, 1+ε_high)·A·∇logp. clipfrac = mean[r > 1+ε_high].

    ``unit_loss_mat`` u is the loss per unit of advantage: ∇loss_t = A_t·∇u_t exactly, with the clip
    decisions of the advantage actually used. Which branch is live depends on A only through its sign:

        ppo:   u = −r·live,  live = [r ≤ 1+ε_high] (A > 0),  [1−ε_low ≤ r ≤ c] (A < 0),
                                    [1−ε_low ≤ r ≤ 1+ε_high] (A = 0)
        cispo: u = −sg(min(r, 1+ε_high))·logp
        gspo:  u = −s_it·live, live as for ppo with s_i for r and no dual clip

    So the gradient of Σ A'·u for any other advantage A' (a reward component's share of A) is that
    advantage's policy gradient under the update's clipping; the shares of A sum to the update's gradient.

    ``gspo`` -- GSPO (Zheng et al. 2025, arXiv:2507.18071), in its token form (verl's ``gspo`` policy loss,
    TRL's ``importance_sampling_level="sequence"``): the sequence ratio is the geometric mean of the token
    ratios, s_i = exp(Σ_t m·(logp − logp_old) / Σ_t m), carried by every token with the token's own gradient,
        s_it = sg(s_i) · π(y_t) / sg(π(y_t)),   log s_it clamped at 10
        loss_t = max(−A·s_it, −A·clip(s_it, 1−ε_low, 1+ε_high))
      The clip is decided per sequence (s_it = s_i in value), and there is no dual clip. clipfrac =
      mean[clipped term larger]; clipfrac_lower = 0, as verl reports them.

    ppo_kl = mean(logp_old − logp). Metrics are masked means over this (micro-)batch, detached.
    """
    mask = mask.to(log_probs.dtype)
    log_ratio = (log_probs - old_log_probs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, mask).detach()

    if kind == "ppo":
        if clip_ratio_c <= 1.0:
            raise ValueError(f"dual-clip clip_ratio_c must be > 1, got {clip_ratio_c}")
        loss_mat, unit, clipfrac, clipfrac_lower = _clipped_surrogate(ratio, advantages, mask, clip_ratio_low,
                                                                      clip_ratio_high, clip_ratio_c)
    elif kind == "cispo":
        weight = ratio.detach().clamp(max=1.0 + clip_ratio_high)
        loss_mat = -weight * advantages * log_probs
        unit = -weight * log_probs
        clipfrac = masked_mean((ratio > 1.0 + clip_ratio_high).to(mask.dtype), mask)
        clipfrac_lower = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    elif kind == "gspo":
        seq_log_ratio = masked_sum(log_probs - old_log_probs, mask, -1) / mask.sum(-1).clamp_min(1.0)
        # s_it: the value of s_i, the gradient of the token's own log-prob; past the clamp no gradient at all
        ratio_s = torch.exp((log_probs - log_probs.detach() + seq_log_ratio.detach()[:, None]).clamp(max=10.0))
        loss_mat, unit, clipfrac, clipfrac_lower = _clipped_surrogate(ratio_s, advantages, mask, clip_ratio_low,
                                                                      clip_ratio_high, None)
    else:
        raise ValueError(f"unknown policy loss kind {kind!r}; expected 'ppo', 'cispo' or 'gspo'")

    loss = agg_loss(loss_mat, mask, agg_mode, horizon=horizon, num_tokens=num_tokens, num_seqs=num_seqs)
    return PolicyLossOutput(loss, clipfrac.detach(), clipfrac_lower.detach(), ppo_kl, loss_mat, unit)


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, mask: Tensor, low: float, high: float,
                       dual_c: float | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO's clipped surrogate max(−A·r, −A·clip(r, 1−low, 1+high)), with the dual clip min(·, −A·c) where A < 0
    when ``dual_c`` is set: ``(loss_mat, unit_loss_mat, clipfrac, clipfrac_lower)`` (``policy_loss``)."""
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    clipped = torch.maximum(pg1, pg2)
    neg = advantages < 0
    r = ratio.detach()
    low_ok, high_ok = r >= 1.0 - low, r <= 1.0 + high
    neg_ok, loss_mat = low_ok, clipped
    clipfrac_lower = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    if dual_c is not None:
        pg3 = -advantages * dual_c
        loss_mat = torch.where(neg, torch.minimum(clipped, pg3), clipped)
        clipfrac_lower = masked_mean(((clipped > pg3) & neg).to(mask.dtype), mask)
        neg_ok = low_ok & (r <= dual_c)
    live = torch.where(advantages > 0, high_ok, torch.where(neg, neg_ok, low_ok & high_ok))
    return loss_mat, -ratio * live.to(ratio.dtype), masked_mean((pg2 > pg1).to(mask.dtype), mask), clipfrac_lower


@dataclass
class ValueLossOutput:
    loss: Tensor  # aggregated scalar
    clipfrac: Tensor  # fraction of response tokens where the clipped term was the larger (detached)
    loss_mat: Tensor  # per-token loss before aggregation (differentiable)


def value_loss(
    vpreds: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    cliprange_value: float,
    agg_mode: str,
    horizon: int,
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
) -> ValueLossOutput:
    """PPO's clipped value loss (verl ``compute_value_loss``), aggregated with :func:`agg_loss`:

        V_clip = clip(V, V_old − c, V_old + c)
        ℓ_t    = ½ · max((V − R)², (V_clip − R)²)

    so the value cannot profit from moving more than ``c`` away from the value that computed the
    advantages. clipfrac = mean[(V_clip − R)² > (V − R)²] over the masked tokens of this (micro-)batch.
    """
    mask = mask.to(vpreds.dtype)
    clipped = torch.maximum(torch.minimum(vpreds, old_values + cliprange_value), old_values - cliprange_value)
    l1 = (vpreds - returns) ** 2
    l2 = (clipped - returns) ** 2
    loss_mat = 0.5 * torch.maximum(l1, l2)
    loss = agg_loss(loss_mat, mask, agg_mode, horizon=horizon, num_tokens=num_tokens, num_seqs=num_seqs)
    clipfrac = masked_mean((l2 > l1).to(mask.dtype), mask).detach()
    return ValueLossOutput(loss, clipfrac, loss_mat)
