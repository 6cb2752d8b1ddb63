"""``rows.RowNormReducer`` against plain autograd, row by row: the prompt groups' Gram, every row's squared gradient
norm and a side's slices (``attach_side``) from one backward, on a model whose norm and Linear carry biases."""

import pytest
import torch
from torch import nn

from rlgrad.analysis.rows import RowNormReducer
from rlgrad.metrics.fields import layer_group


class Tiny(nn.Module):
    def __init__(self, vocab: int = 11, dim: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, 5)
        self.head = nn.Linear(5, 3, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.proj(self.norm(self.embed(ids)))))


def _row_losses(model: Tiny, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)  # [N, T, 3]
    return (out.pow(2).sum(-1) * torch.linspace(0.5, 1.5, ids.shape[1])).sum(-1)  # [N]


def _per_row_grads(model: Tiny, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every row's gradient by name, ``[N, *shape]``, one autograd backward per row (the oracle)."""
    params = dict(model.named_parameters())
    rows = []
    for i in range(len(ids)):
        grads = torch.autograd.grad(_row_losses(model, ids[i:i + 1]).sum(), list(params.values()))
        rows.append(dict(zip(params, grads)))
    return {n: torch.stack([r[n] for r in rows]).double() for n in params}


@pytest.mark.parametrize("shuffled", [False, True])
def test_groups_rows_and_side_match_autograd(shuffled: bool) -> None:
    torch.manual_seed(0)
    model = Tiny()
    with torch.no_grad():  # a norm whose weight and bias are not 1 and 0, so their gradients are not the plain sums
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    N, T = 8, 4
    ids = torch.randint(0, 11, (N, T))
    group = torch.arange(N) // 2  # 4 groups of 2 rows
    if shuffled:
        group = group[torch.randperm(N)]
    weights = (group[None, :] == torch.arange(4)[:, None]).float()
    side_weights = torch.zeros(2, N)
    side_weights[0, [0, 2, 5]] = 0.5  # one weight on its rows: folded (reduced unweighted, scaled in its Gram)
    side_weights[1, [1, 3, 4, 7]] = torch.tensor([0.3, -1.2, 2.0, 0.7])  # weights that vary

    reducer = RowNormReducer(model, weights, leaf_embeddings=False)
    side = reducer.attach_side(side_weights)
    assert side.folded == [True, False]
    reducer.side = side
    try:
        _row_losses(model, ids).sum().backward()
    finally:
        reducer.close()

    per_row = _per_row_grads(model, ids)
    names = dict(model.named_parameters())
    for name, grads in per_row.items():
        k = id(names[name])
        expected = torch.einsum("sn,n...->s...", side_weights.double(), grads)
        got = side.acc[k].double() * side.scale.view(-1, *[1] * (grads.dim() - 1))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=f"side slices of {name}")
    for lg in {layer_group(n) for n in names}:
        flat = torch.cat([g.flatten(1) for n, g in per_row.items() if layer_group(n) == lg], 1)  # [N, params]
        by_group = weights.double() @ flat
        torch.testing.assert_close(reducer.gram[lg], by_group @ by_group.t(), rtol=1e-5, atol=1e-8,
                                   msg=f"group Gram of {lg}")
        torch.testing.assert_close(reducer.row_sq[lg], flat.pow(2).sum(1), rtol=1e-5, atol=1e-8,
                                   msg=f"per-row norms of {lg}")
