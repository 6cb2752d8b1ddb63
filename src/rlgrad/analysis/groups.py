"""The prompt-group pass: ONE engine pass (one forward, one backward per loss term) with the prompt groups as
slices, which the per-sample norms and the bucket analysis share.

``group_pass`` gives, per term, every row's squared gradient norm and the Gram matrix of the prompt groups' gradient
sums per layer group (``rows.RowNormReducer``), both of the unnormalised loss ``Σ_i Σ_t ω ℓ``, and keeps the
forward's loss output. Every bucket is a union of prompt groups and its loss the groups' losses over its
denominator, so a bucket's gradient is ``Σ_{g ∈ b} G_g / D_b`` and the buckets' Gram is ``A K Aᵀ`` with
``A[b, g] = 1/D_b`` (``buckets.analyse_buckets`` with ``groups=``): the same numbers as the bucket engine's own
pass, from the pass the per-sample norms run anyway. (Not under RAGEN's ``dp_trim``: a trimmed bucket is no longer
a union of whole groups; the bucket analysis then runs its own pass.)

``SharedPass`` hands one step's pass from the hook that ran it to the next hook that asks for it at the same step
and on the same batch (``hooks_from_config`` gives the bucket analysis and the per-sample norms one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rlgrad.algos.objective import FunctionLoss, LossFn
from rlgrad.analysis.engine import backward, run_terms
from rlgrad.analysis.rows import RowNormReducer
from rlgrad.batch import Batch
from rlgrad.collectives import all_gather_cat


@dataclass
class GroupPass:
    """``group_ids`` ``[P]``: every rank's prompt groups (ascending); ``inverse`` ``[N]``: each row's place in them
    (this rank's rows, batch order); ``rows[term][layer group]`` ``[N]`` ``||raw_i||²`` (batch order);
    ``grams[term][layer group]`` ``[P, P]`` (global); ``logged`` / ``total``: the forward's loss values
    (``logged_values``) over the rows in ``row_order`` (the pass ran on ``batch.select(row_order)``)."""

    group_ids: torch.Tensor
    inverse: torch.Tensor
    rows: dict[str, dict[str, torch.Tensor]]
    grams: dict[str, dict[str, torch.Tensor]]
    logged: dict[str, torch.Tensor]
    total: dict[str, float]
    row_order: torch.Tensor


def logged_values(out: dict) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """A loss output's logged per-token values (detached) and their coefficients in the total: the loss's
    ``logged`` / ``total`` (``rlgrad.loss.Terms``), else its terms, each with coefficient 1."""
    logged = getattr(out, "logged", None) or {k: v.detach() for k, v in out.items()}
    return {k: v.detach() for k, v in logged.items()}, getattr(out, "total", None) or {k: 1.0 for k in logged}


def group_pass(model: nn.Module, batch: Batch, loss_fn: LossFn) -> GroupPass:
    """Every term of ``loss_fn``: per-row squared norms and the prompt groups' Gram, from one forward and one
    backward per term (module docstring). A rank holding no row runs one blank row (``Batch.blank_rows``: zero
    loss) in the collectives. Data parallel: every rank calls it."""
    group_ids = torch.unique(all_gather_cat(torch.unique(batch.group_ids.cpu())))  # every rank's groups
    inverse = torch.searchsorted(group_ids, batch.group_ids.cpu())
    groups, n = len(group_ids), len(batch)
    run_inverse = inverse
    if n == 0:
        batch, run_inverse = batch.blank_rows(1), torch.full((1,), -1, dtype=torch.long)
    perm = torch.sort(run_inverse, stable=True).indices  # rows grouped: each group a contiguous range
    device = next(model.parameters()).device
    held = run_inverse[perm] >= 0
    weights = torch.zeros(groups, len(perm))
    weights[run_inverse[perm][held], torch.nonzero(held).squeeze(-1)] = 1.0
    reducer = RowNormReducer(model, weights.to(device))
    layer_groups = sorted(set(reducer.group_names.values()))
    rows: dict[str, dict[str, torch.Tensor]] = {}
    grams: dict[str, dict[str, torch.Tensor]] = {}
    back = torch.argsort(perm)
    seen: list[tuple] = []

    def capture(m: nn.Module, b: Batch) -> dict[str, torch.Tensor]:
        out = loss_fn(m, b)
        seen.append(logged_values(out))  # detached: the pass keeps no graph
        return out

    def on_term(term: str, total: torch.Tensor, leaves: list[torch.Tensor], retain_graph: bool) -> None:
        reducer.acc = {}
        backward(total, leaves, retain_graph)
        zeros_rows = torch.zeros(len(perm), dtype=torch.float64)
        zeros_gram = torch.zeros(groups, groups, dtype=torch.float64)
        rows[term] = {g: (reducer.row_sq[g].cpu()[back] if g in reducer.row_sq else zeros_rows)[:n]
                      for g in layer_groups}
        grams[term] = {g: reducer.gram[g].cpu() if g in reducer.gram else zeros_gram for g in layer_groups}
        reducer.reset()

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # nothing random should happen
        run_terms(model, batch.select(perm), FunctionLoss(capture, loss_fn.agg), reducer, on_term)
    return GroupPass(group_ids, inverse, rows, grams, *seen[0], perm)


class SharedPass:
    """One step's ``GroupPass``, kept by the hook that ran it for the next hook at the same step and batch."""

    def __init__(self) -> None:
        self.kept: tuple[int, int, GroupPass] | None = None

    def keep(self, step: int, batch: Batch, found: GroupPass) -> None:
        self.kept = (step, id(batch), found)

    def take(self, step: int, batch: Batch) -> GroupPass | None:
        """The pass kept at ``step`` on ``batch`` (once: it is dropped), else None."""
        kept, self.kept = self.kept, None
        if kept is None or kept[:2] != (step, id(batch)):
            return None
        return kept[2]
