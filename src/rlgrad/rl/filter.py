"""RAGEN-style rollout filter: keep the prompt groups whose rollouts carry learning signal.

RAGEN (StarPO-S) ranks prompt groups by the spread of their rewards and trains only on the most
"uncertain" ones: a group whose samples all got the same reward has zero GRPO advantage anyway,
and low-spread groups mostly add noise. Semantics follow RAGEN's ``ragen/trainer/rollout_filter.py``:

* metric ``reward_variance`` is the UNBIASED STANDARD DEVIATION of the group's scores (RAGEN calls it
  "reward variance" but computes ``torch.std``); a singleton group gets 0 here (RAGEN: nan).
* ``include_zero=False`` drops groups whose metric is 0 (|m| <= 1e-10) before any strategy runs;
  ``rollout/filter_zero_count`` counts those groups whether or not they are dropped.
* ``top_k``: ``value`` is always a FRACTION: k = int(value · num_groups + 1e-9) (rounded down; the 1e-9
  keeps 0.29 · 100 = 28.999... at 29), num_groups counting all groups (also the dropped zero ones),
  clamped to [1, #candidates]. ``top_k_abs``: k = int(value),
  clamped the same way. So both keep at least one group unless no candidate is left.
* ``top_p``: value >= 1 keeps every candidate. Otherwise the smallest prefix of the ranked groups
  whose cumulative probability reaches ``value``: ``softmax`` mode p = softmax(±m) (−m for
  "smallest"); ``linear`` mode p ∝ m (negative m counts as 0 mass), with RAGEN's slack: the prefix
  stops once its metric sum >= value·Σm − ``selection_eps`` (in metric units;
  ``rollout.rollout_filter_selection_eps``, RAGEN's ``selection_eps``). Both compare with a 1e-9
  tolerance for round-off: six groups of probability 1/12 reach 0.5.
* ``min_p``: largest keeps m >= value·max m (⇔ linear probability >= value·max probability);
  smallest keeps m <= min m / value (inclusive; RAGEN's min/(value + 1e-10) can drop a group sitting
  exactly on the bound). Ignores ``top_p_prob_mode``, as in RAGEN.

Where RAGEN's linear ``top_p`` is loose we define: the prefix always holds at least one group
(RAGEN can return none when value·Σm <= selection_eps), zero-mass groups are passed over rather
than ending the scan (RAGEN stops at the first, so "smallest" with any zero group kept nothing),
and if every candidate's metric is 0 (Σm = 0, no probabilities exist) nothing is kept -- in
RAGEN's main case (reward std) such groups have zero advantage, so the step carries no signal.
Ties are broken by group id ascending; a group's metric is computed from its samples in sorted order, so
groups with the same values tie exactly whatever their samples' order. An empty result means ``keep`` is
all False; the trainer skips such a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlgrad.algos.advantages import group_reward_std, group_stats

STRATEGIES = ("top_k", "top_k_abs", "top_p", "min_p")
METRICS = ("reward_variance", "reward", "reward_sum", "entropy", "entropy_variance", "length")
FILTER_TYPES = ("largest", "smallest")
PROB_MODES = ("linear", "softmax")
_ZERO = 1e-10  # RAGEN's |m| <= 1e-10 test for a "zero" group
TOLERANCE = 1e-9  # round-off allowance of the top_k count and the top_p cumulative comparison


@dataclass
class FilterResult:
    keep: Tensor  # [N] bool over samples
    kept_groups: list[int]  # group ids kept, ascending
    metrics: dict[str, float]  # rollout/filter_{kept_ratio,kept_count,zero_count}


def group_metric(
    name: str,
    group_ids: Tensor,
    scores: Tensor,
    entropies: Tensor | None = None,
    lengths: Tensor | None = None,
) -> tuple[list[int], Tensor]:
    """(sorted unique group ids, per-group metric ``[G]``) for one of :data:`METRICS`.

    reward_variance: unbiased std of scores; reward: mean score; reward_sum: Σ scores;
    entropy / entropy_variance: mean / unbiased std of per-sample ``entropies``; length: mean ``lengths``.
    """
    if name not in METRICS:
        raise ValueError(f"unknown rollout filter metric {name!r}; expected one of {METRICS}")
    uniq, inv = torch.unique(group_ids, sorted=True, return_inverse=True)
    if name.startswith("entropy"):
        if entropies is None:
            raise ValueError(f"rollout filter metric {name!r} needs per-sample entropies")
        values = entropies
    elif name == "length":
        if lengths is None:
            raise ValueError("rollout filter metric 'length' needs per-sample lengths")
        values = lengths
    else:
        values = scores
    values = values.double()  # rankings should not flip on fp32 round-off
    # Each group's samples summed in sorted order: a group's metric is then a function of its multiset of
    # values, bitwise (else [1, 0, 1] and [0, 1, 1] differ at 1e-16 and break "ties by group id").
    order = torch.argsort(values, stable=True)
    order = order[torch.argsort(inv[order], stable=True)]
    values, group_ids, inv = values[order], group_ids[order], inv[order]
    per_group = torch.zeros(uniq.numel(), dtype=values.dtype, device=values.device)
    if name == "reward_sum":
        per_group = per_group.index_add(0, inv, values)
    else:
        mean, std, _ = group_stats(values, group_ids)
        per_sample = std if name in ("reward_variance", "entropy_variance") else mean
        per_group = per_group.scatter(0, inv, per_sample)  # every member holds the same value
    return uniq.tolist(), per_group


def _select(
    m: Tensor,
    *,
    strategy: str,
    value: float,
    largest: bool,
    prob_mode: str,
    num_groups: int,
    selection_eps: float,
) -> Tensor:
    """Positions into ``m`` (the candidate groups, in id order) that the strategy keeps."""
    n = m.numel()
    if n == 0:
        return torch.empty(0, dtype=torch.long, device=m.device)
    # Stable sort on the id-ordered candidates -> ties go to the smaller group id.
    order = torch.sort(-m if largest else m, stable=True).indices
    ranked = m[order]

    if strategy in ("top_k", "top_k_abs"):
        k = int(value * num_groups + TOLERANCE) if strategy == "top_k" else int(value)
        return order[: min(max(k, 1), n)]

    if strategy == "top_p":
        if value >= 1.0:
            return order
        if prob_mode == "softmax":
            cum = torch.softmax(ranked if largest else -ranked, dim=0).cumsum(0)
            target = value - TOLERANCE  # 6 x (1/12) sums to 0.49999999999999994, which reaches 0.5
        else:
            mass = ranked.clamp_min(0.0)
            if mass.sum() <= 0:
                return order[:0]
            cum = mass.cumsum(0)
            target = value * mass.sum().item() - selection_eps - TOLERANCE * mass.sum().item()
        # First prefix whose cumulative mass reaches the target (at least one group).
        target_t = torch.tensor([target], dtype=cum.dtype, device=cum.device)
        k = int(torch.searchsorted(cum, target_t).item()) + 1
        return order[: min(k, n)]

    # min_p
    if largest:
        keep = m >= value * m.max() - _ZERO
    else:
        keep = value * m <= m.min() + _ZERO  # m <= min/value, inclusive, and no division by value
    return keep.nonzero().flatten()


def rollout_filter(
    group_ids: Tensor,
    scores: Tensor,
    *,
    strategy: str,
    value: float,
    filter_type: str = "largest",
    metric: str = "reward_variance",
    top_p_prob_mode: str = "linear",
    include_zero: bool = True,
    entropies: Tensor | None = None,
    lengths: Tensor | None = None,
    selection_eps: float = 0.01,
) -> FilterResult:
    """Rank prompt groups by ``metric`` and keep those chosen by ``strategy`` (see module docstring).

    ``filter_type="largest"`` ranks descending (keep high-spread groups), ``"smallest"`` ascending.
    ``selection_eps`` is RAGEN's slack for linear ``top_p``, in metric units.
    """
    for arg, v, options in (
        ("strategy", strategy, STRATEGIES),
        ("filter_type", filter_type, FILTER_TYPES),
        ("top_p_prob_mode", top_p_prob_mode, PROB_MODES),
    ):
        if v not in options:
            raise ValueError(f"unknown rollout filter {arg} {v!r}; expected one of {options}")
    gids, m = group_metric(metric, group_ids, scores, entropies=entropies, lengths=lengths)
    num_groups = len(gids)

    zero = m.abs() <= _ZERO
    cand = torch.arange(num_groups, device=m.device)
    if not include_zero:
        cand = cand[~zero]
    picked = _select(
        m[cand],
        strategy=strategy,
        value=value,
        largest=filter_type == "largest",
        prob_mode=top_p_prob_mode,
        num_groups=num_groups,
        selection_eps=selection_eps,
    )
    kept_groups = sorted(gids[i] for i in cand[picked].tolist())

    keep = torch.isin(group_ids, torch.tensor(kept_groups, dtype=group_ids.dtype, device=group_ids.device))
    metrics = {
        "rollout/filter_kept_ratio": len(kept_groups) / num_groups if num_groups else 0.0,
        "rollout/filter_kept_count": float(len(kept_groups)),
        "rollout/filter_zero_count": float(zero.sum().item()),
    }
    return FilterResult(keep=keep, kept_groups=kept_groups, metrics=metrics)


__all__ = ["FilterResult", "group_metric", "group_reward_std", "rollout_filter"]
