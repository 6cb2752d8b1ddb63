"""The oracle for per-sample gradients: every row's gradient by plain autograd, one backward per row."""

from __future__ import annotations

import torch

from rlgrad.algos.aggregation import denominator
from rlgrad.algos.objective import LossFn
from rlgrad.batch import Batch


def per_row_gradients(model: torch.nn.Module, batch: Batch, loss_fn: LossFn) -> dict[str, torch.Tensor]:
    """``{term: [N, |θ|]}`` (float64): row i's contribution g_i to the gradient of the batch loss
    ``Σ_i Σ_t ω ℓ / Σ_i u`` (the loss's own aggregation), from a backward of row i's part alone."""
    params = [p for p in model.parameters() if p.requires_grad]
    omega, share = loss_fn.agg.weights(batch.response_mask)
    denom = denominator(float(share.sum()))
    out: dict[str, list[torch.Tensor]] = {}
    for i in range(len(batch)):
        terms = loss_fn(model, batch.select(torch.tensor([i])))  # rows never interact in a forward
        for j, (term, per_token) in enumerate(terms.items()):
            loss = (per_token[0] * omega[i].to(per_token.dtype)).sum() / denom
            grads = torch.autograd.grad(loss, params, retain_graph=j < len(terms) - 1, allow_unused=True)
            flat = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double()
                              for p, g in zip(params, grads)])
            out.setdefault(term, []).append(flat)
    return {term: torch.stack(rows) for term, rows in out.items()}
