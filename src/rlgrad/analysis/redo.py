"""ReDo-style reset of dormant neurons, and the neuron-health hook (``analysis.neurons.<role>``).

The scores come from ``rlgrad.analysis.neurons.measure`` on the gradient of the step's first mini-batch;
``NeuronHealthHook`` measures at ``on_grads`` and resets at ``after_update``. A reset gives each chosen
neuron fresh incoming weights ~ N(0, RMS²), zero incoming biases, zero (or small) outgoing weights and
zero optimizer moments; draws are seeded by (seed, step, role, parameter name), so a resumed run redoes
the same reset.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import torch
from torch import nn

from rlgrad import collectives
from rlgrad.analysis.cadence import schedules
from rlgrad.analysis.neurons import NeuronLayer, NeuronReport, _is_sharded, _shard, measure, seed_of
from rlgrad.batch import Batch
from rlgrad.hooks import Hook, Schedule, StepContext
from rlgrad.loss import LossFn
from rlgrad.metrics import key
from rlgrad.rundir import atomic_write_json

if TYPE_CHECKING:
    from rlgrad.analysis_config import NeuronHealthConfig
    from rlgrad.config import RLGradConfig

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
    incoming = [(name, p, *_shard(p)) for name, p in layer.incoming]
    out = [(name, p, *_shard(p)) for name, p in layer.outgoing]
    # The RMS of each drawn-into matrix over the survivors, from additive sums of squares.
    sums = []
    for _, p, local, off, _ in incoming:
        if p.dim() > 1:
            sums.append(_sq_sums(local, keep[off:off + local.shape[0]].to(local.device)))
    if outgoing == "small":
        for *_, local, _, _ in out:
            sums.append(_sq_sums(local.t(), keep.to(local.device)))  # columns are neurons; rows may be sharded
    if sums:
        tot = torch.tensor(sums, dtype=torch.float64)
        if any(sh for *_, sh in incoming + out):
            tot = collectives.all_reduce_sum(tot)
        rms = [(float((a / n) ** 0.5) if n else 0.0, float((b / m) ** 0.5) if m else 0.0)
               for a, n, b, m in tot.tolist()]
    k = 0
    for name, p, local, off, _ in incoming:
        mine = (cols >= off) & (cols < off + local.shape[0])
        rows = (cols[mine] - off).to(local.device)
        if p.dim() == 1:
            local.index_fill_(0, rows, 0.0)
        else:
            keep_rms, all_rms = rms[k]
            k += 1
            scale = keep_rms or all_rms or p.shape[1] ** -0.5
            gen = torch.Generator().manual_seed(seed_of(seed, step, role, name))
            fresh = torch.randn(len(cols), *p.shape[1:], generator=gen, dtype=torch.float32) * scale
            local.index_copy_(0, rows, fresh[mine].to(local.device, local.dtype))
        _zero_moments(optimizer, p, cols, 0)
    for name, p, local, off, _ in out:
        idx = cols.to(local.device)
        if outgoing == "small":
            keep_rms, all_rms = rms[k]
            k += 1
            gen = torch.Generator().manual_seed(seed_of(seed, step, role, name))
            fresh = torch.randn(p.shape[0], len(cols), generator=gen, dtype=torch.float32) * (
                SMALL_OUTGOING * (keep_rms or all_rms))
            local.index_copy_(1, idx, fresh[off:off + local.shape[0]].to(local.device, local.dtype))
        else:
            local.index_fill_(1, idx, 0.0)
        _zero_moments(optimizer, p, cols, 1)


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


class NeuronHealthHook(Hook):
    """Neuron health at ``on_grads`` (the first mini-batch of a due step, per role) and the reset at
    ``after_update``.

    Roles: ``actor`` (loss from ``ctx.loss_settings``; optimizer ``ctx.optimizer``) and ``critic``
    (loss ``ctx.critic_loss``; optimizer ``ctx.critic_optimizer``). Config:
    ``analysis.neurons.<role>``; ``metrics[role]`` / ``resets[role]`` are the steps each runs at.

    Under FSDP2 ``on_grads`` sees the sharded module: the per-sequence pass runs on the plain replica
    (``ctx.actor`` / ``ctx.critic``, whose weights are the ones the gradient was taken at), and after a
    reset of the shards the replica is refreshed (``ctx.sync_actor`` / ``ctx.sync_critic``).
    """

    def __init__(self, cfg: RLGradConfig, metrics: dict[str, Schedule] | None = None,
                 resets: dict[str, Schedule] | None = None):
        self.cfg = cfg
        at = schedules(cfg)
        self.metric_at = metrics or {r: at[f"neurons/{r}"] for r in ("actor", "critic")}
        self.reset_at = resets or {r: at[f"reset/{r}"] for r in ("actor", "critic")}
        self.pending: dict[str, tuple[int, NeuronReport]] = {}

    @staticmethod
    def loss_fn(ctx: StepContext, role: str) -> LossFn | None:
        return ctx.actor_loss() if role == "actor" else ctx.critic_loss

    def on_grads(self, ctx: StepContext, model: nn.Module, minibatch: Batch, role: str = "actor"):
        metric = self.metric_at.get(role, Schedule(0)).due(ctx.step)
        reset = self.reset_at.get(role, Schedule(0)).due(ctx.step)
        if not (metric or reset) or self.pending.get(role, (None,))[0] == ctx.step:
            return None  # later mini-batches of the step: the first one's gradient is the one measured
        t0 = time.perf_counter()
        replica = getattr(ctx, role, None) if _is_sharded(model) else model
        rep = measure(model, minibatch, getattr(self.cfg.analysis.neurons, role), role=role,
                      seed=self.cfg.trainer.seed, step=ctx.step, loss_fn=self.loss_fn(ctx, role) if metric else None,
                      method=self.cfg.analysis.method, replica=replica)
        self.pending[role] = (ctx.step, rep)
        return {**rep.metrics(), key("timing_s/neuron/{role}", role=role): time.perf_counter() - t0}

    def after_update(self, ctx: StepContext):
        out: dict[str, float] = {}
        doc: dict = {"step": ctx.step}
        optimizers = {"actor": ctx.optimizer, "critic": ctx.critic_optimizer}
        syncs = {"actor": ctx.sync_actor, "critic": ctx.sync_critic}
        for role, (step, rep) in sorted(self.pending.items()):
            if step != ctx.step:
                continue
            if self.reset_at.get(role, Schedule(0)).due(ctx.step):
                counts = reset_dormant(rep, optimizers.get(role), getattr(self.cfg.analysis.neurons, role),
                                       seed=self.cfg.trainer.seed, step=ctx.step)
                out[key("{role}/neuron/reset_count", role=role)] = float(sum(counts.values()))
                if rep.sharded and sum(counts.values()):  # the same decision on every rank: all join the gather
                    if syncs[role] is None:
                        raise RuntimeError(f"a neuron reset on FSDP2 shards needs ctx.sync_{role} to refresh the "
                                           "plain replica")
                    syncs[role]()
            doc[role] = rep.to_json()
        self.pending.clear()
        if ctx.is_main and len(doc) > 1:
            atomic_write_json(ctx.run_dir / "analysis" / f"step_{ctx.step}" / "neurons.json", doc)
        return out or None
