"""The update's advantage split by reward component, for the reward-component gradient geometry
(``analysis.components``).

With one advantage per response (GRPO, RLOO, REINFORCE++-baseline, REINFORCE++ with γ = 1) the policy loss's
gradient is, token by token, ``A_i`` times the gradient of a unit loss, so any split of ``A_i`` into per-component
advantages ``A_c,i`` splits the gradient the same way. ``shared_std`` divides each centred, weighted component
reward by the std of the TOTAL reward (the splits sum to the update's advantage); ``own_std`` runs the estimator on
each unweighted component alone (rldynamic's split).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlgrad.algos.advantages import (
    Reduce,
    broadcast_to_tokens,
    compute_advantages,
    group_stats,
    grpo_advantages,
    rloo_advantages,
    whiten_stats,
)
from rlgrad.batch import Batch
from rlgrad.config.algorithm import COMPONENT_MODES, OUTCOME_ESTIMATORS

if TYPE_CHECKING:
    pass






def outcome_advantages(scores: torch.Tensor, group_ids: torch.Tensor, estimator: str, norm_by_std: bool,
                       response_mask: torch.Tensor | None = None, reduce: Reduce | None = None) -> torch.Tensor:
    """``[N]``: the trainer's advantage of per-sample scores (``core.compute_advantages``), one per response
    (reinforce_plus_plus with gamma 1). ``response_mask``: the whitening of REINFORCE++ weighs responses by length;
    ``reduce``: it whitens over the rows of every process."""
    if estimator not in OUTCOME_ESTIMATORS:
        raise ValueError(f"component advantages need one advantage per response ({', '.join(OUTCOME_ESTIMATORS)}), "
                         f"got '{estimator}'")
    mask = response_mask if response_mask is not None else torch.ones(len(scores), 1)
    adv, _ = compute_advantages(estimator, scores, group_ids, mask, norm_by_std=norm_by_std, reduce=reduce)
    return row_values(adv, mask)


def component_advantages(components: dict[str, torch.Tensor], weights: dict[str, float], scores: torch.Tensor,
                         group_ids: torch.Tensor, *, mode: str, estimator: str, norm_by_std: bool,
                         eps: float = 1e-6, response_mask: torch.Tensor | None = None, reduce: Reduce | None = None
                         ) -> dict[str, torch.Tensor]:
    """``{c: [N]}`` per-component advantages (module docstring). ``scores`` is the total reward the update's
    advantage was computed from (Σ_c w_c r_c); ``response_mask`` is needed by the REINFORCE++ estimators, and
    ``reduce`` (``collectives.all_reduce_sum``) when the batch's rows are split over processes, as their whitening
    is over the whole batch."""
    if mode == "own_std":
        return {c: outcome_advantages(r.float(), group_ids, estimator, norm_by_std, response_mask, reduce)
                for c, r in components.items()}
    if mode != "shared_std":
        raise ValueError(f"unknown component mode '{mode}' ({' | '.join(COMPONENT_MODES)})")
    missing = [c for c in components if c not in weights]
    if missing:
        unknown = [w for w in weights if w not in components]
        raise ValueError(f"no reward weight for component(s) {', '.join(missing)}"
                         + (f"; weights were given for unknown component(s) {', '.join(unknown)}" if unknown else "")
                         + f" (the components: {', '.join(components)})")
    if estimator == "rloo":  # linear in the reward: the baselines of w_c r_c add up to the total's
        return {c: rloo_advantages(weights[c] * r.float(), group_ids) for c, r in components.items()}
    if estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        return _whitened_split(components, weights, scores, group_ids, response_mask,
                               baseline=estimator.endswith("baseline"), reduce=reduce)
    if estimator != "grpo":
        raise ValueError(f"component advantages need one advantage per response ({', '.join(OUTCOME_ESTIMATORS)}), "
                         f"got '{estimator}'")
    # GRPO: centre each weighted component in its group (a singleton keeps mean 0, as grpo_advantages does) ...
    out = {c: grpo_advantages(weights[c] * r.float(), group_ids, norm_by_std=False) for c, r in components.items()}
    if not norm_by_std:
        return out
    # ... and divide by the TOTAL reward's unbiased group std + eps (a singleton: std 1), grpo_advantages' convention.
    # A group whose total is constant has A = 0 exactly; its components get 0 as well (still a split of A):
    # components that vary but cancel would otherwise be blown up by 1/eps.
    _, std, size = group_stats(scores.float(), group_ids)
    std = torch.where(size <= 1, torch.ones_like(std), std)
    flat = (size > 1) & (std == 0)
    return {c: torch.where(flat, torch.zeros_like(a), a / (std + eps)) for c, a in out.items()}


def _whitened_split(components: dict[str, torch.Tensor], weights: dict[str, float], scores: torch.Tensor,
                    group_ids: torch.Tensor, response_mask: torch.Tensor | None, *, baseline: bool,
                    reduce: Reduce | None = None) -> dict[str, torch.Tensor]:
    """REINFORCE++(-baseline) split by component: whitening is x ↦ (x − μ)·rstd over the batch's response tokens,
    so A_c = (x_c − μ_c)·rstd(total), with x_c = w_c r_c (less its group mean with the baseline). Σ_c A_c = A."""
    if response_mask is None:
        raise ValueError("the REINFORCE++ component split needs the batch's response_mask")

    def tokens(x: torch.Tensor) -> torch.Tensor:
        x = grpo_advantages(x, group_ids, norm_by_std=False) if baseline else x
        return broadcast_to_tokens(x, response_mask)

    _, rstd = whiten_stats(tokens(scores.float()), response_mask, reduce=reduce)
    out = {}
    for c, r in components.items():
        x = tokens(weights[c] * r.float())
        out[c] = row_values(x - whiten_stats(x, response_mask, reduce=reduce)[0], response_mask) * rstd
    return out


def row_values(x: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[N, L]`` -> ``[N]``: each row's value at its first response token (0 for a row without one)."""
    mask = response_mask != 0
    first = mask.to(torch.int8).argmax(-1, keepdim=True)
    return x.gather(1, first).squeeze(1) * mask.any(-1)


def per_sequence_advantage(batch: Batch) -> torch.Tensor:
    """``[N]``: the advantage of each response; fails unless it is constant along the response."""
    mask = batch.response_mask != 0
    a = row_values(batch.advantages, batch.response_mask)
    spread = torch.where(mask, (batch.advantages - a[:, None]).abs(), 0.0)
    if mask.any() and float(spread.max()) > 1e-5 * (1.0 + float(a.abs().max())):
        raise ValueError("reward-component gradients need an advantage that is constant along each response "
                         f"(one per response: {', '.join(OUTCOME_ESTIMATORS)}; reinforce_plus_plus with gamma 1)")
    return a
