"""Log-probs and entropies from logits, and the forwards that produce them (the policy's log-probs of a
batch's tokens, a value model's values) in the batch alignment of :mod:`rlgrad.batch`.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from rlgrad.batch import position_ids_from_mask

# Set by ``softmax_recomputed``: an entropy built with a graph saves no ``[..., V]`` softmax for its backward
_RECOMPUTE_SOFTMAX: ContextVar[bool] = ContextVar("rlgrad_recompute_softmax", default=False)


@contextmanager
def softmax_recomputed() -> Iterator[None]:
    """Within it, an entropy built with a graph (``entropy_from_logits``) keeps no ``[..., V]`` softmax for its
    backward, which forms it again from the logits (kept by the log-probs' graph anyway): a non-reentrant checkpoint,
    the same graph and the same softmax, so the same gradients bit for bit. For the gradient engine's backwards of one
    term at a time (``engine.run_terms``): the entropy's softmax, saved by its graph for its own backward, was alive
    through every other term's backward (192 MB on a Llama of SmolLM2's shapes, 32 rows x 32 tokens x 49,152 words),
    where one backward of the whole loss frees it before the logits' gradient is formed."""
    token = _RECOMPUTE_SOFTMAX.set(True)
    try:
        yield
    finally:
        _RECOMPUTE_SOFTMAX.reset(token)


def _entropy_graph(logits: Tensor, lse: Tensor) -> Tensor:
    return lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def entropy_from_logits(logits: Tensor, lse: Tensor | None = None) -> Tensor:
    """``[..., V]`` -> ``[...]``: H = logsumexp(l) − Σ_v softmax(l)_v · l_v  (= −Σ p log p).

    ``lse``: logsumexp(l) when the caller already has it. Without a graph to build (no grad mode, or
    ``logits`` not requiring grad) it runs a few rows at a time, so each slice of p = exp(l − lse)
    stays in the CPU's cache instead of a ``[..., V]`` temporary going through memory twice (6x
    faster for a 49k vocabulary on CPU); with a graph, in one piece for autograd (under ``softmax_recomputed``
    its softmax formed again in the backward, not kept).
    """
    if lse is None:
        lse = torch.logsumexp(logits, dim=-1)
    if torch.is_grad_enabled() and (logits.requires_grad or lse.requires_grad):
        if _RECOMPUTE_SOFTMAX.get():  # nothing random inside: no RNG state to keep
            return checkpoint(_entropy_graph, logits, lse, use_reentrant=False, preserve_rng_state=False)
        return _entropy_graph(logits, lse)
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


def forward_log_probs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, *, temperature: float = 1.0,
                      with_entropy: bool = False, entropy_grad: bool = True, start: int = 1,
                      mask_positions: bool = True) -> tuple[Tensor, Tensor | None]:
    """Per-token log-prob of ``input_ids[:, t]`` under the logits at ``t - 1``, for columns ``t >= start``.

    Columns before ``start`` (at least column 0) are 0; with ``start`` = the first response column,
    the LM head runs on the response positions only (``logits_to_keep``, as TRL does). Logits are
    divided by the rollout temperature, as verl does, so that old log-probs describe the
    distribution the samples were drawn from. ``entropy_grad=False``: the entropies are detached
    (computed outside the graph, which is cheaper). Positions count the attended tokens
    (``position_ids_from_mask``, as generation numbers them); ``mask_positions=False`` leaves them to the model
    (0, 1, ... over every column, left padding included), as TRL's training forward does.
    """
    L = input_ids.shape[1]
    start = min(max(start, 1), L)
    kwargs = {"logits_to_keep": L - start + 1} if start > 1 and _accepts_logits_to_keep(model) else {}
    if mask_positions:
        kwargs["position_ids"] = position_ids_from_mask(attention_mask)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs).logits
    return log_probs_of_output(logits, input_ids, temperature=temperature, with_entropy=with_entropy,
                               entropy_grad=entropy_grad, start=start)


def log_probs_of_output(logits: Tensor, input_ids: Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
                        entropy_grad: bool = True, start: int = 1) -> tuple[Tensor, Tensor | None]:
    """``forward_log_probs`` from a forward's output ``logits`` ``[N, K, V]`` at the last K positions, K at least
    ``L - start + 1`` (e.g. what an LM-head hook sees of a forward run with ``logits_to_keep``)."""
    L = input_ids.shape[1]
    start = min(max(start, 1), L)
    logits = logits[:, -(L - start + 1):-1].float()  # the logits at positions start-1 .. L-2
    if temperature != 1.0:
        logits = logits / temperature
    zero = torch.zeros_like(input_ids[:, :start], dtype=logits.dtype)
    lse = torch.logsumexp(logits, dim=-1)  # shared by the log-probs and the entropies
    logp = torch.cat([zero, logprobs_from_logits(logits, input_ids[:, start:], lse)], 1)
    ent = None
    if with_entropy:
        ent = entropy_from_logits(logits, lse) if entropy_grad else entropy_from_logits(logits.detach(), lse.detach())
        ent = torch.cat([zero, ent], 1)
    return logp, ent


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def forward_values(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """``[N, L]`` values (float32, differentiable): column t holds the head's output at position t − 1,
    the state from which token t is generated (the batch alignment, see ``rlgrad.batch``)."""
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask), use_cache=False).logits[..., 0].float()
    return torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], 1)
