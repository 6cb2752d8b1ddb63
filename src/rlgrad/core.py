"""Core RL math: masked reductions, loss aggregation, outcome advantages, GAE, KL, policy and value losses.

Pure functions on tensors, no trainer or config imports. Names follow verl's ``core_algos.py``.
Shapes follow :mod:`rlgrad.batch`: per-token tensors are ``[N, L]`` over prompt+response and
``mask`` / ``response_mask`` marks the tokens whose log-prob enters the loss; per-sample tensors
are ``[N]``; ``group_ids`` ``[N]`` are prompt-group ids (arbitrary ints, need not be contiguous).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

# ---------------------------------------------------------------------------------------------
# Masked reductions
# ---------------------------------------------------------------------------------------------


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·mask (over ``dim`` or everything). Entries outside the mask never leak, even inf/nan."""
    mask = mask.to(x.dtype)
    xm = torch.where(mask != 0, x * mask, torch.zeros((), dtype=x.dtype, device=x.device))
    return xm.sum() if dim is None else xm.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·mask / Σ mask; 0 where the mask sums to 0 (the numerator is then 0 as well)."""
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1e-8)


# ---------------------------------------------------------------------------------------------
# Loss aggregation
# ---------------------------------------------------------------------------------------------

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    *,
    horizon: int,
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
) -> Tensor:
    """Aggregate a per-token loss ``[N, L]`` into a scalar.

    With ``ℓ`` the loss, ``m`` the mask, ``T`` = ``num_tokens``, ``S`` = ``num_seqs``, ``H`` = ``horizon``:

    * ``token-mean``:              Σ_{i,t} ℓ·m / T
    * ``token-sum``:               Σ_{i,t} ℓ·m             (no normaliser: the gradient grows with the batch)
    * ``seq-mean-token-sum``:      Σ_i (Σ_t ℓ·m) / S
    * ``seq-mean-token-mean``:     Σ_i (Σ_t ℓ·m / max(Σ_t m, 1)) / S
    * ``seq-mean-token-sum-norm``: Σ_{i,t} ℓ·m / (S·H)   (Dr. GRPO)

    ``T`` and ``S`` are the GLOBAL denominators of the batch being optimised (defaults: ``mask.sum()``
    and ``N``, every row counts). Passing the mini-batch totals while feeding micro-batches makes the
    micro-batch losses -- and their gradients -- sum exactly to the full mini-batch loss, so gradient
    accumulation (and data parallel) gives the same update as one big batch. Each formula above is a
    sum over rows divided by a constant, which is what makes that true.

    ``H`` is the response-length budget, a constant: our tensors include the prompt, so the tensor width
    would make the normaliser depend on prompt padding. Older verl divides Σ_{i,t} ℓ·m by the tensor
    width ``loss_mask.shape[-1]`` (and not by the number of sequences); newer verl takes a
    ``loss_scale_factor`` and also divides by the global batch size, as here.
    """
    mask = mask.to(loss_mat.dtype)

    def denom(d: float | Tensor | None, default: float | Tensor) -> Tensor:
        d = default if d is None else d
        # Clamp only guards an all-masked batch (numerator 0 -> loss 0 instead of nan).
        return torch.as_tensor(d, dtype=loss_mat.dtype, device=loss_mat.device).clamp_min(1e-8)

    seq_sum = masked_sum(loss_mat, mask, dim=-1)  # [N]
    if mode == "token-mean":
        return seq_sum.sum() / denom(num_tokens, mask.sum())
    if mode == "token-sum":
        return seq_sum.sum()
    seqs = denom(num_seqs, float(loss_mat.shape[0]))
    if mode == "seq-mean-token-sum":
        return seq_sum.sum() / seqs
    if mode == "seq-mean-token-mean":
        return (seq_sum / mask.sum(-1).clamp_min(1.0)).sum() / seqs
    if mode == "seq-mean-token-sum-norm":
        return seq_sum.sum() / (seqs * horizon)
    raise ValueError(f"unknown loss aggregation mode {mode!r}; expected one of {AGG_MODES}")


def agg_token_weights(mask: Tensor, mode: str, *, horizon: int) -> tuple[Tensor, Tensor]:
    """``agg_loss`` as a weighted sum: ``agg(rows R) = Σ_{i∈R,t} ω·ℓ / Σ_{i∈R} u``.

    Returns ``ω`` ``[N, L]`` (per-token weights, independent of which rows are aggregated) and
    ``u`` ``[N]`` (each row's share of the denominator). This is what lets one backward pass give
    the gradient of any subset's loss: the subset only changes the denominator. ``token-sum`` has no
    denominator: its ``u`` is 0, and a subset whose ``Σ u`` is 0 divides by 1 (``denominator``).
    """
    mask = mask.to(torch.float32) if not mask.is_floating_point() else mask
    lengths = mask.sum(-1)
    ones = torch.ones_like(lengths)
    if mode == "token-mean":
        return mask, lengths
    if mode == "token-sum":
        return mask, torch.zeros_like(lengths)
    if mode == "seq-mean-token-sum":
        return mask, ones
    if mode == "seq-mean-token-mean":
        return mask / lengths.clamp_min(1.0)[:, None], ones
    if mode == "seq-mean-token-sum-norm":
        return mask / horizon, ones
    raise ValueError(f"unknown loss aggregation mode {mode!r}; expected one of {AGG_MODES}")


def denominator(u_sum: float) -> float:
    """A row subset's loss denominator from its ``Σ u`` (``agg_token_weights``): 1 where that is 0
    (``token-sum``, or a subset without response tokens, whose loss is 0 either way)."""
    return u_sum if u_sum > 0 else 1.0


# ---------------------------------------------------------------------------------------------
# Outcome advantages (one scalar score per sample, baselined within its prompt group)
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# GAE: per-token advantages from a value model (PPO with a critic)
# ---------------------------------------------------------------------------------------------


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


ESTIMATORS = ("grpo", "rloo", "gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
PER_TOKEN = ("gae", "reinforce_plus_plus")  # advantages that may change along a response (the rest: one per response)


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


# ---------------------------------------------------------------------------------------------
# KL penalty (per token, http://joschu.net/blog/kl-approx.html)
# ---------------------------------------------------------------------------------------------


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate between the policy and the reference, from sampled-token log-probs.

    * ``kl`` / ``k1``:  logp − ref
    * ``abs``:          |logp − ref|
    * ``mse`` / ``k2``: ½ (logp − ref)²
    * ``low_var_kl`` / ``low-var-kl`` / ``k3``: with k = ref − logp, exp(k) − k − 1 clamped to [−10, 10].
      k is first clamped to [−20, 20] (as newer verl does): the value is unchanged (the result
      saturates at 10 long before) but exp never overflows, so the backward pass never sees inf·0.
    * any of these with ``+`` (``k1+``, ``abs+``, ``low_var_kl+``, ``k3+`` ...): straight-through, verl's
      ``kl_penalty``: the value of the named estimator with the gradient of k2, ½ (logp − ref)²,

          kl_t = sg(est_t) + k2_t − sg(k2_t)

      whose expected gradient is the gradient of KL(π‖π_ref) (k1's and k3's are not).
    """
    if kind.endswith("+"):
        value = kl_penalty(log_probs, ref_log_probs, kind[:-1]).detach()
        k2 = 0.5 * (log_probs - ref_log_probs).square()
        return value + k2 - k2.detach()
    delta = log_probs - ref_log_probs
    if kind in ("kl", "k1"):
        return delta
    if kind == "abs":
        return delta.abs()
    if kind in ("mse", "k2"):
        return 0.5 * delta.square()
    if kind in ("low_var_kl", "low-var-kl", "k3"):
        k = (-delta).clamp(-20.0, 20.0)
        return (torch.exp(k) - k - 1).clamp(-10.0, 10.0)
    raise ValueError(f"unknown kl_penalty kind {kind!r}; expected kl/k1, abs, mse/k2, low_var_kl/k3 (each "
                     "optionally with +)")


# ---------------------------------------------------------------------------------------------
# Logits -> per-token quantities
# ---------------------------------------------------------------------------------------------


def entropy_from_logits(logits: Tensor, lse: Tensor | None = None) -> Tensor:
    """``[..., V]`` -> ``[...]``: H = logsumexp(l) − Σ_v softmax(l)_v · l_v  (= −Σ p log p).

    ``lse``: logsumexp(l) when the caller already has it. Without a graph to build (no grad mode, or
    ``logits`` not requiring grad) it runs a few rows at a time, so each slice of p = exp(l − lse)
    stays in the CPU's cache instead of a ``[..., V]`` temporary going through memory twice (6x
    faster for a 49k vocabulary on CPU); with a graph, in one piece for autograd.
    """
    if lse is None:
        lse = torch.logsumexp(logits, dim=-1)
    if torch.is_grad_enabled() and (logits.requires_grad or lse.requires_grad):
        return lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    vocab = logits.shape[-1]
    flat, flat_lse = logits.reshape(-1, vocab), lse.reshape(-1)
    out = torch.empty_like(flat_lse)
    rows = max(1, (1 << 20) // vocab)  # ~4 MiB of fp32 per slice
    for i in range(0, flat.shape[0], rows):
        chunk, c_lse = flat[i : i + rows], flat_lse[i : i + rows]
        p = torch.sub(chunk, c_lse.unsqueeze(-1)).exp_()
        out[i : i + rows] = c_lse - torch.linalg.vecdot(p, chunk.to(p.dtype))
    return out.reshape(lse.shape)


def logprobs_from_logits(logits: Tensor, labels: Tensor, lse: Tensor | None = None) -> Tensor:
    """log softmax(logits)[label] without materialising the ``[..., V]`` log-softmax.

    log p_y = l_y − logsumexp(l) (``lse``: that logsumexp, when the caller already has it). For
    half-precision logits the logsumexp is done in float32, a chunk of rows at a time so only a
    bounded slice of V is upcast; the result is then float32.
    """
    if logits.dtype in (torch.float32, torch.float64):
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - (torch.logsumexp(logits, dim=-1) if lse is None else lse)
    vocab = logits.shape[-1]
    flat, flat_labels = logits.reshape(-1, vocab), labels.reshape(-1)
    rows = max(1, (1 << 25) // vocab)  # ~128 MiB of fp32 per chunk
    out = [
        logprobs_from_logits(flat[i : i + rows].float(), flat_labels[i : i + rows])
        for i in range(0, flat.shape[0], rows)
    ]
    return torch.cat(out).reshape(labels.shape)


# ---------------------------------------------------------------------------------------------
# Policy losses
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Value loss (the critic)
# ---------------------------------------------------------------------------------------------


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
