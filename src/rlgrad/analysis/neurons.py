"""Neuron health for any trained model (actor or critic): dormancy, zero gradients, nullspace.

The ReDo-style reset that acts on these scores, and the hook, are in ``rlgrad.analysis.redo``.

A *neuron* is a hidden unit that can die, found structurally (``find_neurons``):

    MLP unit i     (mlp.gate_proj, mlp.up_proj, mlp.down_proj)  incoming: row i of gate_proj and up_proj
                                                               outgoing: column i of down_proj
    attention head h (self_attn.q_proj, k_proj, v_proj, o_proj) incoming: its head_dim rows of q_proj, and of
                                                               k_proj / v_proj only when every head has its own
                                                               KV head (no GQA): a shared KV head feeds live heads
                                                               outgoing: its head_dim columns of o_proj
    plain MLP      consecutive nn.Linear pairs inside an nn.Sequential: rows of the first, columns of the second

Biases of incoming rows belong to their neuron. Rows of residual-stream matrices (o_proj, down_proj),
embeddings, norms and output heads are never neurons and never reset.

Scores (on the gradient the update uses, after backward and before clipping):

    GraMa     a_i = mean |∂L/∂w| over neuron i's incoming weights,   s_i = a_i / mean_k a_k   (k in i's layer)
    ReDo      the same normalisation of mean |activation_i| over response tokens (the input of down_proj /
              o_proj, a head's value its head_dim channels' mean)
    dormant   s_i <= tau;  zero-gradient: every incoming gradient element exactly 0
    nullspace K = G Gᵀ of B per-sequence gradients (G: B x params), normalised to unit diagonal;
              nullspace_ratio = #{λ_k(K) < (1e-5)² · λ_max} / B  (a zero gradient is a null direction)

Every gradient and activation statistic is a ratio of additive partial sums (per-neuron Σ|g| and element
counts, zero counts, Σ|activation| and token counts), so making it global is one ``collectives.all_reduce_sum``
before the division: see ``_local_grad`` for when a gradient sum needs it. The per-sequence gradients come
from the one gradient engine (``engine.slice_gradients``): the sample is drawn over the global mini-batch
(``global_sample``), each rank passes the sampled rows it holds as a partial one-hot slice matrix, and the
engine sums every sequence's gradient over ranks before forming K. Its single forward also yields the
activations; under FSDP2 it runs on the plain replica.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from rlgrad import collectives
from rlgrad.algos.objective import FunctionLoss, LossFn
from rlgrad.analysis.engine import slice_gradients
from rlgrad.analysis.instrument import InstrumentHook
from rlgrad.analysis.neuron_base import (
    LayerStats,
    NeuronLayer,
    NeuronReport,
    _is_sharded,
    _local_grad,
    _shard,
    find_neurons,
    is_lora_layer,
    seed_of,
)
from rlgrad.analysis.redo import reset_dormant
from rlgrad.batch import Batch
from rlgrad.errors import UserError
from rlgrad.hooks import Schedule, StepContext
from rlgrad.metrics import NEURONS, key

if TYPE_CHECKING:
    from rlgrad.config.analysis import NeuronHealthConfig, NeuronsConfig


NULL_EPS = 1e-5  # λ_k < NULL_EPS² · λ_max counts as a null direction


def gradient_stats(model: nn.Module, layers: list[NeuronLayer]) -> tuple[list[LayerStats], float, float]:
    """Per-neuron Σ|g| and counts from ``p.grad``, and the element-level zero count over trainable parameters."""
    sums, counts, sharded = [], [], False
    for la in layers:
        s = torch.zeros(la.n, dtype=torch.float64)
        per_neuron = 0
        for _, p in la.incoming:
            per_neuron += la.width * math.prod(p.shape[1:])  # elements of one neuron's global rows
            g, off, sh = _local_grad(p)
            sharded |= sh
            if g is None:
                continue
            rows = g.abs().reshape(g.shape[0], -1).sum(1, dtype=torch.float64).cpu()
            if la.width == 1 and off == 0 and len(rows) == la.n:
                s += rows  # one row per neuron, all of them here: index_add_'s sum without its index
            else:
                s.index_add_(0, (off + torch.arange(len(rows))) // la.width, rows)
        sums.append(s)
        counts.append(torch.full((la.n,), float(per_neuron), dtype=torch.float64))
    # the zero count is an integer: counted exactly in Python (one op a parameter, not four tensor ops)
    zero, numel = 0, 0.0
    for p in model.parameters():
        if not p.requires_grad:
            continue
        numel += p.numel()  # the global size: a DTensor parameter reports its full shape
        g, _, sh = _local_grad(p)
        sharded |= sh
        if g is None:  # no gradient: all zeros, counted once over the shards
            zero += _shard(p)[0].numel()
        else:
            zero += g.numel() - int(torch.count_nonzero(g))
    flat = torch.cat([*sums, torch.tensor([float(zero)], dtype=torch.float64)])
    if sharded:  # partial sums over parameter shards -> global; DDP and one process: already global
        flat = collectives.all_reduce_sum(flat)
    parts = list(flat[:-1].split([la.n for la in layers])) if layers else []
    stats = [LayerStats(la, s, c) for la, s, c in zip(layers, parts, counts)]
    return stats, float(flat[-1]), numel


def sample_rows(n: int, k: int, seed: int) -> torch.Tensor:
    """``min(k, n)`` distinct rows, sorted, from a generator of their own (the global RNG never moves)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[:min(k, n)].sort().values


def nullspace_ratio(K: torch.Tensor) -> float:
    """#{λ_k < NULL_EPS² · λ_max} / B of K normalised to unit diagonal (zero rows stay zero: null directions); NaN
    when K is not finite (a non-finite gradient, whose update the trainer skips: no spectrum to read)."""
    if not bool(torch.isfinite(K).all()):
        return math.nan
    d = K.diagonal()
    inv = torch.where(d > 0, d.clamp_min(1e-300).rsqrt(), torch.zeros_like(d))
    lam = torch.linalg.eigvalsh(inv[:, None] * K * inv[None, :])
    top = float(lam.max())
    if not top > 0:
        return 1.0
    return float((lam < NULL_EPS ** 2 * top).sum()) / len(d)


class _Activations:
    """Forward pre-hooks on each layer's ``act_module``: Σ|x| per neuron over the response tokens."""

    def __init__(self, layers: list[NeuronLayer]):
        self.layers = layers
        self.mask: torch.Tensor | None = None  # response_mask of the batch being forwarded
        self.sums = [torch.zeros(la.n, dtype=torch.float64) for la in layers]
        self.tokens = torch.zeros((), dtype=torch.float64)
        self.handles = [la.act_module.register_forward_pre_hook(self._hook(k)) for k, la in enumerate(layers)]

    def _hook(self, k: int) -> Callable:
        la = self.layers[k]

        def fn(module, args):
            x = args[0].detach()
            m = self.mask.to(x.device, x.dtype)
            per_channel = (x.abs() * m.unsqueeze(-1)).reshape(-1, x.shape[-1]).sum(0, dtype=torch.float64)
            self.sums[k] += per_channel.view(la.n, la.width).sum(1).cpu()
        return fn

    def watch(self, loss_fn: LossFn) -> LossFn:
        """``loss_fn`` with its terms summed into one, telling the hooks which tokens are response tokens
        (the engine may reorder rows)."""
        def fn(model: nn.Module, b: Batch) -> dict[str, torch.Tensor]:
            self.mask = b.response_mask
            self.tokens += float(b.response_mask.sum())
            return {"loss": sum(loss_fn(model, b).values())}
        return FunctionLoss(fn, loss_fn.agg)

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def global_sample(batch: Batch, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The nullspace sample, drawn over the GLOBAL mini-batch: ``(rows, local, slot)``.

    ``rows``: ``min(k, N)`` sorted global positions (N: rows over all ranks), the same on every rank, and
    in one process exactly ``sample_rows(len(batch), k, seed)``. ``local``: the rows of ``batch`` that were
    sampled, ``slot``: the index in ``rows`` of each (ascending). A row's global position is
    ``batch.global_index`` when set (``ppo_update``'s mini-batch: its place in the one-process mini-batch,
    which shuffled mini-batches need -- ranks interleave there), else ranks in order. Every rank must call it.
    """
    sizes = collectives.all_gather_sizes(len(batch))
    rows = sample_rows(sum(sizes), k, seed)
    if batch.global_index is not None:
        pos = batch.global_index.cpu()
    else:
        pos = sum(sizes[:collectives.rank()]) + torch.arange(len(batch))
    local = torch.nonzero(torch.isin(pos, rows)).squeeze(-1)
    slot = torch.searchsorted(rows, pos[local])
    order = torch.argsort(slot)
    return rows, local[order], slot[order]


def sample_pass(model: nn.Module, batch: Batch, loss_fn: LossFn, stats: list[LayerStats], local: torch.Tensor,
                slot: torch.Tensor, num_samples: int, method: str = "fast") -> torch.Tensor:
    """Per-sequence gradient Gram K of the sample from the gradient engine; fills each layer's activation sums.

    Rows ``local`` of ``batch`` are sampled sequences ``slot`` of ``num_samples`` (``global_sample``); the
    engine gets a partial one-hot weight matrix ``[num_samples, len(local)]`` and sums the slices over ranks,
    so slice j is sequence j's gradient wherever it lives. The loss's terms are summed, so K is the Gram
    of the gradients of the one loss the update optimises (each sequence's un-normalised aggregated loss).
    ``model``: a plain module or FSDP2 shards (the fast engine); its neuron layers are matched to ``stats`` by name.
    """
    S = num_samples
    weights = torch.zeros(S, len(local))
    weights[slot, torch.arange(len(local))] = 1.0
    by_name = {la.name: la for la in find_neurons(model)}
    missing = [s.layer.name for s in stats if s.layer.name not in by_name]
    if missing:
        raise ValueError(f"the model for the nullspace pass lacks neuron layer(s) {', '.join(missing[:3])}")
    acts = _Activations([by_name[s.layer.name] for s in stats])
    try:
        g = slice_gradients(method, model, batch.select(local), acts.watch(loss_fn), weights,
                            [f"seq_{i}" for i in range(S)])
    finally:
        acts.close()
    # K is already global: the engine summed each sequence's gradient over ranks before forming it.
    K = g.total_gram("loss") if "loss" in g.gram else torch.zeros(S, S, dtype=torch.float64)
    # Activation sums and token counts cover this rank's sampled rows only: summed over ranks.
    flat = collectives.all_reduce_sum(torch.cat([*acts.sums, acts.tokens.view(1)]))
    parts = flat[:-1].split([s.layer.n for s in stats])
    for s, a in zip(stats, parts):
        s.act_sum, s.act_count = a, flat[-1] * s.layer.width * torch.ones_like(a)
    return K


@dataclass
class Sampled:
    """What the sequence sample measured (``take_sample``): it reads the weights and the batch, never ``.grad``."""

    rows: torch.Tensor  # global positions in the mini-batch (``global_sample``)
    gram: torch.Tensor  # K of the sampled sequences' gradients
    acts: dict[str, tuple[torch.Tensor, torch.Tensor]]  # layer name -> (act_sum, act_count)


def take_sample(model: nn.Module, batch: Batch, nc: NeuronHealthConfig, *, role: str, seed: int, step: int,
                loss_fn: LossFn, method: str = "fast", replica: nn.Module | None = None) -> Sampled | None:
    """The nullspace sample of ``batch`` at the current weights (``measure``'s arguments); None when the
    global mini-batch is empty or ``nullspace_samples=0``. It does not read the gradient, so it gives the same
    numbers with or without one held (``NeuronHealthHook`` takes it before the mini-batch's backward)."""
    if nc.nullspace_samples <= 0:
        return None
    runner = replica if replica is not None else model  # FSDP2 shards: the fast engine runs on them as well
    rows, local, slot = global_sample(batch, nc.nullspace_samples, seed_of(seed, step, role, "nullspace"))
    if not len(rows):  # the global mini-batch is empty (the same answer on every rank)
        return None
    zero = torch.zeros(0, dtype=torch.float64)
    stats = [LayerStats(la, zero, zero) for la in find_neurons(model)]  # sample_pass fills the activation sums
    K = sample_pass(runner, batch, loss_fn, stats, local, slot, len(rows), method)
    return Sampled(rows, K, {s.layer.name: (s.act_sum, s.act_count) for s in stats})


def measure(model: nn.Module, batch: Batch | None, nc: NeuronHealthConfig, *, role: str, seed: int, step: int,
            loss_fn: LossFn | None = None, method: str = "fast", replica: nn.Module | None = None,
            sampled: Sampled | None = None) -> NeuronReport:
    """Neuron health of ``model`` from its current ``.grad`` (and, with ``loss_fn``, a sample of ``batch``).

    ``nc``: the role's settings (tau, mode, nullspace_samples). Without ``loss_fn`` or with
    ``nullspace_samples=0`` only the gradient statistics are computed. ``sampled``: the sample already taken
    (``take_sample``, at the same weights and batch), used instead of taking it here. Weights, gradients and the
    global RNG are left as they were. Data parallel: ``batch`` is this rank's share of the mini-batch and
    every rank calls this; under FSDP2 ``model`` is the sharded module and ``replica`` (optional) a plain module
    with the same weights, which the per-sequence pass then runs on (without it, on the shards: the fast engine).
    """
    layers = find_neurons(model)
    stats, zero, numel = gradient_stats(model, layers)
    grad_total = float(sum(s.grad_sum.sum() for s in stats)) if stats else 0.0
    rep = NeuronReport(role, float(nc.tau), nc.mode, stats, float(zero), numel, grad_total,
                       sharded=_is_sharded(model))
    if sampled is None and loss_fn is not None and batch is not None:
        sampled = take_sample(model, batch, nc, role=role, seed=seed, step=step, loss_fn=loss_fn, method=method,
                              replica=replica)
    if sampled is not None:
        for s in stats:
            s.act_sum, s.act_count = sampled.acts[s.layer.name]
        rep.gram, rep.sample_rows, rep.nullspace_samples = sampled.gram, sampled.rows, len(sampled.rows)
        rep.nullspace_ratio = nullspace_ratio(sampled.gram)
    return rep


class NeuronHealthHook(InstrumentHook):
    """Neuron health at ``on_grads`` (the first mini-batch of a due step, per role) and the reset at
    ``after_update``. The sequence sample (nullspace ratio, activation scores) at the role's metric steps at least
    ``nullspace_every`` steps apart (a multiple of the metric cadence), the first included; the gradient scores at
    each.

    Roles: ``actor`` (loss from ``ctx.loss_settings``; optimizer ``ctx.optimizer``) and ``critic``
    (loss ``ctx.critic_loss``; optimizer ``ctx.critic_optimizer``). ``settings``: the ``analysis.neurons``
    section (one ``NeuronHealthConfig`` per role); ``metrics[role]`` / ``resets[role]``: the steps each runs at
    (``schedules(cfg)``'s ``neurons/<role>`` and ``reset/<role>``; a role left out never runs); ``seed``: the
    run's seed (``trainer.seed``), which the nullspace sample and the reset draw from; ``method``: the gradient
    engine (``analysis.method``).

    Under FSDP2 ``on_grads`` sees the sharded module: the per-sequence pass runs on the plain replica
    (``ctx.actor`` / ``ctx.critic``, whose weights are the ones the gradient was taken at), and after a
    reset of the shards the replica is refreshed (``ctx.sync_actor`` / ``ctx.sync_critic``).
    """

    declared = NEURONS

    def __init__(self, settings: NeuronsConfig, metrics: dict[str, Schedule], resets: dict[str, Schedule], *,
                 seed: int, method: str):
        self.settings, self.seed, self.method = settings, seed, method
        self.metric_at, self.reset_at = dict(metrics), dict(resets)
        self.pending: dict[str, tuple[int, NeuronReport]] = {}
        self.taken: dict[str, tuple[int, Sampled | None, float]] = {}  # before_grads' sample: (step, it, seconds)

    def _role(self, role: str) -> NeuronHealthConfig:
        return getattr(self.settings, role)

    @staticmethod
    def loss_fn(ctx: StepContext, role: str) -> LossFn | None:
        return ctx.actor_loss() if role == "actor" else ctx.critic_loss

    def _due(self, ctx: StepContext, role: str) -> tuple[bool, bool, bool]:
        """(gradient scores, reset, sequence sample) due at this step for ``role``."""
        metric = self.metric_at.get(role, Schedule(0)).due(ctx.step)
        reset = self.reset_at.get(role, Schedule(0)).due(ctx.step)
        at = self.metric_at.get(role, Schedule(0))
        apart = -(-self._role(role).nullspace_every // max(at.every, 1)) * at.every  # a multiple of the cadence
        return metric, reset, metric and Schedule(apart, at.first).due(ctx.step)

    def _measured_at(self, ctx: StepContext, role: str) -> bool:
        return self.pending.get(role, (None,))[0] == ctx.step

    def before_grads(self, ctx: StepContext, model: nn.Module, minibatch: Batch, role: str = "actor") -> None:
        """The sequence sample of a due step's first mini-batch, taken before its forward: the same weights, batch
        and numbers as at ``on_grads`` (it never reads ``.grad``), without the update's gradient, one model copy,
        alive under the sample's own forward and backward. ``on_grads`` reports it."""
        if not self._due(ctx, role)[2] or self._measured_at(ctx, role) or self.taken.get(role, (None,))[0] == ctx.step:
            return  # not due, or a later mini-batch of the step
        timing: dict[str, float] = {}
        with self.timed(timing, role=role):
            got = self._sample(ctx, model, minibatch, role)
        self.taken[role] = (ctx.step, got, sum(timing.values()))

    def _sample(self, ctx: StepContext, model: nn.Module, minibatch: Batch, role: str) -> Sampled | None:
        """The sequence sample of ``minibatch`` at the current weights (FSDP2: its pass on the role's replica)."""
        replica = getattr(ctx, role, None) if _is_sharded(model) else model
        return take_sample(model, minibatch, self._role(role), role=role, seed=self.seed, step=ctx.step,
                           loss_fn=self.loss_fn(ctx, role), method=self.method, replica=replica)

    def on_grads(self, ctx: StepContext, model: nn.Module, minibatch: Batch, role: str = "actor"):
        metric, reset, sample = self._due(ctx, role)
        if not (metric or reset) or self._measured_at(ctx, role):
            return None  # later mini-batches of the step: the first one's gradient is the one measured
        if reset and any(is_lora_layer(m) for m in model.modules()):
            raise UserError(f"analysis.neurons.{role}.reset_every: the ReDo reset rewrites a neuron's weights, and "
                            "under LoRA those are frozen base weights the saved adapter does not hold; set it to 0 "
                            "(the neuron-health metrics work under LoRA)")
        step, sampled, before = self.taken.pop(role, (None, None, 0.0))
        if step != ctx.step:  # no before_grads call (TRL, verl, a direct call): the sample here, at the gradient
            sampled, before = None, 0.0
        timing: dict[str, float] = {}
        with self.timed(timing, role=role):
            if sample and step != ctx.step:
                sampled = self._sample(ctx, model, minibatch, role)
            rep = measure(model, minibatch, self._role(role), role=role, seed=self.seed, step=ctx.step,
                          sampled=sampled)
            self.pending[role] = (ctx.step, rep)
        return {**rep.metrics(), **{k: v + before for k, v in timing.items()}}

    def after_update(self, ctx: StepContext):
        out: dict[str, float] = {}
        doc: dict = {"step": ctx.step}
        optimizers = {"actor": ctx.optimizer, "critic": ctx.critic_optimizer}
        syncs = {"actor": ctx.sync_actor, "critic": ctx.sync_critic}
        for role, (step, rep) in sorted(self.pending.items()):
            if step != ctx.step:
                continue
            if self.reset_at.get(role, Schedule(0)).due(ctx.step):
                counts = reset_dormant(rep, optimizers.get(role), self._role(role), seed=self.seed, step=ctx.step)
                out[key("{role}/neuron/reset_count", role=role)] = float(sum(counts.values()))
                if rep.sharded and sum(counts.values()):  # the same decision on every rank: all join the gather
                    if syncs[role] is None:
                        raise RuntimeError(f"a neuron reset on FSDP2 shards needs ctx.sync_{role} to refresh the "
                                           "plain replica")
                    syncs[role]()
            doc[role] = rep.to_json()
        self.pending.clear()
        if len(doc) > 1:
            self.write(ctx, {"neurons.json": doc})
        return out or None
