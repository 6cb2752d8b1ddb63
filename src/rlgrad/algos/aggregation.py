"""Masked reductions and loss aggregation: verl's five ``loss_agg_mode``s, as a loss (``agg_loss``) and as
per-token weights (``agg_token_weights``), and the denominators of the batch being optimised (``Denominators``),
so micro-batch losses sum exactly to the mini-batch loss.

Shapes follow :mod:`rlgrad.batch`: per-token tensors are ``[N, L]`` over prompt+response and ``mask`` marks the
tokens whose log-prob enters the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlgrad.batch import Batch
from rlgrad.collectives import all_reduce_sum
from rlgrad.config.algorithm import AGG_MODES


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·mask (over ``dim`` or everything). Entries outside the mask never leak, even inf/nan."""
    mask = mask.to(x.dtype)
    xm = torch.where(mask != 0, x * mask, torch.zeros((), dtype=x.dtype, device=x.device))
    return xm.sum() if dim is None else xm.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·mask / Σ mask; 0 where the mask sums to 0 (the numerator is then 0 as well)."""
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1e-8)


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


@dataclass(frozen=True)
class Aggregation:
    """How per-token losses become one number: verl's ``loss_agg_mode`` (``horizon``: the constant of
    ``seq-mean-token-sum-norm``, the response-length budget)."""

    mode: str = "token-mean"
    horizon: int = 1

    def weights(self, mask: Tensor) -> tuple[Tensor, Tensor]:
        """``(ω [N, L], u [N])``: a row subset R's loss is ``Σ_{i∈R,t} ω·ℓ / Σ_{i∈R} u``
        (``core.agg_token_weights``)."""
        return agg_token_weights(mask, self.mode, horizon=self.horizon)


@dataclass
class Denominators:
    """Response tokens and sequences of the whole batch an optimizer step (or a probe) covers."""

    num_tokens: float
    num_seqs: float

    @classmethod
    def of(cls, batch: Batch) -> Denominators:
        return cls(float(batch.response_mask.sum()), float(len(batch)))

    @classmethod
    def global_of(cls, batch: Batch) -> Denominators:
        """Totals over every rank's part of the batch (``of`` in one process): local losses then sum to the
        global loss over ranks."""
        t = all_reduce_sum(torch.tensor([float(batch.response_mask.sum()), float(len(batch))], dtype=torch.float64))
        return cls(float(t[0]), float(t[1]))
