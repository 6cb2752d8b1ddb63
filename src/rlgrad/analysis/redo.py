"""ReDo-style reset of dormant neurons (``analysis.neurons.<role>``); the neuron-health hook
(``rlgrad.analysis.neurons.NeuronHealthHook``) calls it.

The scores come from ``rlgrad.analysis.neurons.measure`` on the gradient of the step's first mini-batch;
``NeuronHealthHook`` measures at ``on_grads`` and resets at ``after_update``. A reset gives each chosen
neuron fresh incoming weights ~ N(0, RMS²), zero incoming biases, zero (or small) outgoing weights and
zero optimizer moments; draws are seeded by (seed, step, role, parameter name), so a resumed run redoes
the same reset.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from rlgrad import collectives
from rlgrad.analysis.neuron_base import NeuronLayer, NeuronReport, _shard, seed_of

if TYPE_CHECKING:
    from rlgrad.config.analysis import NeuronHealthConfig


SMALL_OUTGOING = 0.01  # reset_outgoing=small: N(0, (SMALL_OUTGOING · RMS of the surviving columns)²)


def select_reset(score: torch.Tensor, tau: float, mode: str, max_frac: float) -> torch.Tensor:
    """Indices of the neurons to reset (sorted): threshold | percentage | hybrid, ties by index."""
    cap = math.floor(max_frac * len(score) + 1e-9)
    order = torch.sort(score, stable=True).indices  # NaN scores sort last and are never below tau
    if mode == "percentage":
        idx = order[:cap]
    else:
        idx = order[score[order] <= tau]
        if mode == "hybrid":
            idx = idx[:cap]
    return idx.sort().values


def _zero_moments(optimizer: torch.optim.Optimizer | None, p: nn.Parameter, idx: torch.Tensor, dim: int) -> None:
    """Zero the rows (dim 0) / columns (dim 1) ``idx`` (global indices) of every per-element optimizer state
    of ``p``; a sharded state (FSDP2) zeroes those in its local rows.

    AdamW: exp_avg, exp_avg_sq (and max_exp_avg_sq); the scalar ``step`` is left alone."""
    if optimizer is None:
        return
    for v in optimizer.state.get(p, {}).values():
        if torch.is_tensor(v) and v.shape == p.shape:
            local, off, _ = _shard(v)
            if dim == 0:
                idx_here = idx[(idx >= off) & (idx < off + local.shape[0])] - off
            else:  # sharding splits rows: every column is whole in each shard
                idx_here = idx
            local.index_fill_(dim, idx_here.to(local.device), 0)


def _sq_sums(x: torch.Tensor, keep: torch.Tensor) -> list[float]:
    """[Σx², count] over the rows of ``x`` that ``keep`` marks, then over all its rows."""
    x = x.double()
    kept = x[keep]
    return [float(kept.pow(2).sum()), float(kept.numel()), float(x.pow(2).sum()), float(x.numel())]


def _survivor_rms(incoming: list, outgoing_shards: list, keep: torch.Tensor,
                  outgoing: str) -> list[tuple[float, float]]:
    """(RMS over the surviving rows, RMS over all rows) of each matrix a reset draws into, in draw order:
    the incoming weight matrices, then (``outgoing="small"``) the outgoing ones, from additive sums of
    squares (all-reduced when any parameter is sharded)."""
    sums = []
    for _, p, local, off, _ in incoming:
        if p.dim() > 1:
            sums.append(_sq_sums(local, keep[off:off + local.shape[0]].to(local.device)))
    if outgoing == "small":
        for *_, local, _, _ in outgoing_shards:
            sums.append(_sq_sums(local.t(), keep.to(local.device)))  # columns are neurons; rows may be sharded
    if not sums:
        return []
    totals = torch.tensor(sums, dtype=torch.float64)
    if any(sharded for *_, sharded in incoming + outgoing_shards):
        totals = collectives.all_reduce_sum(totals)
    return [(float((a / n) ** 0.5) if n else 0.0, float((b / m) ** 0.5) if m else 0.0)
            for a, n, b, m in totals.tolist()]


def _reset_incoming(incoming: list, cols: torch.Tensor, rms: Iterator[tuple[float, float]],
                    optimizer: torch.optim.Optimizer | None, seed_parts: tuple[int, int, str]) -> None:
    """Fresh rows ~ N(0, RMS²) in each incoming weight, zero in each incoming bias; their moments zeroed."""
    for name, p, local, off, _ in incoming:
        mine = (cols >= off) & (cols < off + local.shape[0])
        rows = (cols[mine] - off).to(local.device)
        if p.dim() == 1:
            local.index_fill_(0, rows, 0.0)
        else:
            keep_rms, all_rms = next(rms)
            scale = keep_rms or all_rms or p.shape[1] ** -0.5
            gen = torch.Generator().manual_seed(seed_of(*seed_parts, name))
            fresh = torch.randn(len(cols), *p.shape[1:], generator=gen, dtype=torch.float32) * scale
            local.index_copy_(0, rows, fresh[mine].to(local.device, local.dtype))
        _zero_moments(optimizer, p, cols, 0)


def _reset_outgoing(outgoing_shards: list, cols: torch.Tensor, rms: Iterator[tuple[float, float]],
                    optimizer: torch.optim.Optimizer | None, seed_parts: tuple[int, int, str], outgoing: str) -> None:
    """Zero (or small random) columns in each outgoing weight; their moments zeroed."""
    for name, p, local, off, _ in outgoing_shards:
        idx = cols.to(local.device)
        if outgoing == "small":
            keep_rms, all_rms = next(rms)
            gen = torch.Generator().manual_seed(seed_of(*seed_parts, name))
            fresh = torch.randn(p.shape[0], len(cols), generator=gen, dtype=torch.float32) * (
                SMALL_OUTGOING * (keep_rms or all_rms))
            local.index_copy_(1, idx, fresh[off:off + local.shape[0]].to(local.device, local.dtype))
        else:
            local.index_fill_(1, idx, 0.0)
        _zero_moments(optimizer, p, cols, 1)


@torch.no_grad()
def reset_layer(layer: NeuronLayer, neurons: torch.Tensor, optimizer: torch.optim.Optimizer | None, *,
                seed: int, step: int, role: str, outgoing: str = "zero") -> None:
    """Fresh incoming weights ~ N(0, RMS²) (RMS of the matrix's surviving rows), zero incoming biases,
    outgoing columns zero (or small random), and the matching optimizer moments zeroed.

    Draws come from a CPU generator seeded by (seed, step, role, parameter name): identical on every
    process, and torch's global RNG stream is not touched. FSDP2 (parameters and optimizer states are
    row shards): every rank draws the whole block, the RMS comes from sums over all shards (one
    all-reduce per layer), and each rank writes the rows it holds.
    """
    if len(neurons) == 0:
        return
    w = layer.width
    cols = (neurons[:, None] * w + torch.arange(w)).reshape(-1)  # the neurons' rows/columns (global)
    keep = torch.ones(layer.n * w, dtype=torch.bool)
    keep[cols] = False
    # (name, parameter, local rows, global index of the first, sharded?)
    incoming = [(name, p, *_shard(p)) for name, p in layer.incoming]
    outgoing_shards = [(name, p, *_shard(p)) for name, p in layer.outgoing]
    rms = iter(_survivor_rms(incoming, outgoing_shards, keep, outgoing))
    _reset_incoming(incoming, cols, rms, optimizer, (seed, step, role))
    _reset_outgoing(outgoing_shards, cols, rms, optimizer, (seed, step, role), outgoing)


def reset_dormant(rep: NeuronReport, optimizer: torch.optim.Optimizer | None, nc: NeuronHealthConfig, *, seed: int,
                  step: int) -> dict[str, int]:
    """Reset each layer's dormant neurons by ``rep``'s GraMa scores; returns layer name -> count.

    A step whose whole gradient is zero or non-finite carries no information about which neurons
    are dead (e.g. all advantages zero): nothing is reset then.
    """
    rep.reset = {}
    if not (rep.grad_total > 0 and math.isfinite(rep.grad_total)):
        return rep.reset
    for s in rep.layers:
        idx = select_reset(s.score, nc.tau, nc.mode, nc.max_reset_frac)
        reset_layer(s.layer, idx, optimizer, seed=seed, step=step, role=rep.role, outgoing=nc.reset_outgoing)
        rep.reset[s.layer.name] = len(idx)
    return rep.reset
