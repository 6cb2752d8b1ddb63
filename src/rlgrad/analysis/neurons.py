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

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from rlgrad import collectives
from rlgrad.analysis.engine import slice_gradients
from rlgrad.batch import Batch
from rlgrad.loss import LossFn, PerTokenLoss
from rlgrad.metrics import key

if TYPE_CHECKING:
    from rlgrad.analysis_config import NeuronHealthConfig

NULL_EPS = 1e-5  # λ_k < NULL_EPS² · λ_max counts as a null direction


# ----------------------------------------------------------------------------- structure
@dataclass
class NeuronLayer:
    name: str  # module name, e.g. model.layers.0.mlp
    kind: str  # mlp | attn
    n: int  # neurons
    width: int  # rows (incoming) / columns (outgoing) per neuron: 1 for an MLP unit, head_dim for a head
    incoming: list[tuple[str, nn.Parameter]]  # weights [n·width, in] and biases [n·width]
    outgoing: list[tuple[str, nn.Parameter]]  # weights [out, n·width]
    act_module: nn.Module  # its input [..., n·width] is the neurons' activation


def _linear_params(prefix: str, lin: nn.Linear) -> list[tuple[str, nn.Parameter]]:
    out = [(f"{prefix}.weight", lin.weight)]
    if lin.bias is not None:
        out.append((f"{prefix}.bias", lin.bias))
    return out


def _head_dim(attn: nn.Module) -> int:
    hd = getattr(attn, "head_dim", None) or getattr(getattr(attn, "config", None), "head_dim", None)
    if hd:
        return int(hd)
    heads = getattr(attn, "num_heads", None) or getattr(getattr(attn, "config", None), "num_attention_heads", None)
    if not heads:
        raise ValueError(f"cannot tell the head size of attention module {type(attn).__name__}")
    return attn.q_proj.out_features // int(heads)


def find_neurons(model: nn.Module) -> list[NeuronLayer]:
    """Every neuron layer of ``model`` with trainable incoming weights, in module order."""
    layers: list[NeuronLayer] = []
    def has(mod: nn.Module, *ks: str) -> bool:
        return all(isinstance(getattr(mod, k, None), nn.Linear) for k in ks)

    for name, mod in model.named_modules():
        if has(mod, "gate_proj", "up_proj", "down_proj"):
            inc = _linear_params(f"{name}.gate_proj", mod.gate_proj) + _linear_params(f"{name}.up_proj", mod.up_proj)
            layers.append(NeuronLayer(name, "mlp", mod.gate_proj.out_features, 1, inc,
                                      [(f"{name}.down_proj.weight", mod.down_proj.weight)], mod.down_proj))
        elif has(mod, "q_proj", "k_proj", "v_proj", "o_proj"):
            hd = _head_dim(mod)
            heads, kv = mod.q_proj.out_features // hd, mod.k_proj.out_features // hd
            inc = _linear_params(f"{name}.q_proj", mod.q_proj)
            if kv == heads:  # one KV head per query head: k and v rows are the head's own
                inc += _linear_params(f"{name}.k_proj", mod.k_proj) + _linear_params(f"{name}.v_proj", mod.v_proj)
            layers.append(NeuronLayer(name, "attn", heads, hd, inc,
                                      [(f"{name}.o_proj.weight", mod.o_proj.weight)], mod.o_proj))
        elif isinstance(mod, nn.Sequential):
            prev: tuple[str, nn.Linear] | None = None
            for k, sub in mod.named_children():
                full = f"{name}.{k}" if name else k
                if isinstance(sub, nn.Linear):
                    if prev is not None and prev[1].out_features == sub.in_features:
                        layers.append(NeuronLayer(prev[0], "mlp", prev[1].out_features, 1,
                                                  _linear_params(prev[0], prev[1]), [(f"{full}.weight", sub.weight)],
                                                  sub))
                    prev = (full, sub)
                elif any(True for _ in sub.parameters()):
                    prev = None  # a module with weights in between: not a plain pair
    return [la for la in layers if all(p.requires_grad for _, p in la.incoming)]


# ----------------------------------------------------------------------------- gradient statistics
def _shard(t: torch.Tensor) -> tuple[torch.Tensor, int, bool]:
    """``(local tensor, global index of its first row, sharded?)`` of a parameter, gradient or optimizer state.

    A plain tensor is whole. An FSDP2 DTensor is sharded along dim 0 in rank order (torch.chunk sizes): the
    local tensor is this rank's rows and shares its storage, so in-place writes to it change the DTensor.
    """
    if not hasattr(t, "to_local"):
        return t.detach(), 0, False
    if len(t.placements) != 1 or not t.placements[0].is_shard(0):
        raise NotImplementedError(f"neuron health supports DTensors sharded along dim 0 on one mesh dimension "
                                  f"(FSDP2's default), not {t.placements}")
    # torch.chunk's layout (what Shard(0) uses), computed here: the public helper is missing from older torch.
    n, chunk = t.shape[0], -(-t.shape[0] // t.device_mesh.size())
    offset = min(t.device_mesh.get_local_rank() * chunk, n)
    size = max(0, min(chunk, n - offset))
    local = t.to_local().detach()
    if local.shape[0] != size:  # a layout other than torch.chunk's: row offsets would be wrong
        raise NotImplementedError(f"unexpected FSDP2 shard: {local.shape[0]} rows where {size} were expected")
    return local, int(offset), True


def _local_grad(p: nn.Parameter) -> tuple[torch.Tensor | None, int, bool]:
    """The gradient this process holds for ``p``: (local tensor, global index of its first row, sharded?).

    Single process and DDP: the full gradient (every DDP rank holds the same one after its all-reduce),
    so statistics need no reduction and the ranks agree. FSDP2: ``p.grad`` is a DTensor holding rows
    ``[offset, offset + rows)``; the per-neuron sums built from it are partial and must be all-reduced.
    """
    if p.grad is None:
        return None, 0, hasattr(p, "to_local")
    return _shard(p.grad)


@dataclass
class LayerStats:
    layer: NeuronLayer
    grad_sum: torch.Tensor  # [n] Σ|g| over incoming elements (float64, global)
    grad_count: torch.Tensor  # [n] incoming elements
    act_sum: torch.Tensor | None = None  # [n] Σ|activation| over response tokens and the neuron's channels
    act_count: torch.Tensor | None = None  # [n]

    @property
    def score(self) -> torch.Tensor:
        """GraMa s_i = a_i / mean_k a_k (all 0 when the whole layer has zero gradient)."""
        return _normalised(self.grad_sum / self.grad_count)

    @property
    def act_score(self) -> torch.Tensor | None:
        if self.act_sum is None:
            return None
        return _normalised(self.act_sum / self.act_count.clamp_min(1))


def _normalised(a: torch.Tensor) -> torch.Tensor:
    mean = a.mean()
    return a / mean if mean > 0 else torch.zeros_like(a)


@dataclass
class NeuronReport:
    """Neuron-health statistics of one model at one step (role: actor | critic)."""

    role: str
    tau: float
    mode: str
    layers: list[LayerStats]
    param_zero: float  # elements of trainable parameters with exactly zero gradient
    param_numel: float
    grad_total: float  # Σ|g| over every neuron's incoming weights: 0 (or non-finite) means no signal to reset on
    nullspace_ratio: float | None = None
    nullspace_samples: int = 0
    gram: torch.Tensor | None = None  # K = G Gᵀ of the sampled sequences' gradients (unnormalised), for tests
    sample_rows: torch.Tensor | None = None  # global positions in the mini-batch (``global_sample``)
    reset: dict[str, int] = field(default_factory=dict)  # layer name -> neurons reset
    sharded: bool = False  # measured on FSDP2 shards: a reset writes shards and the replica needs a refresh

    def _counts(self, s: LayerStats) -> dict:
        act = s.act_score
        return {"kind": s.layer.kind, "neurons": s.layer.n, "dormant": int((s.score <= self.tau).sum()),
                "dormant_ratio": float((s.score <= self.tau).double().mean()),
                "act_dormant": int((act <= self.tau).sum()) if act is not None else None,
                "zero_grad": int((s.grad_sum == 0).sum()), "reset": self.reset.get(s.layer.name, 0)}

    def metrics(self) -> dict[str, float]:
        r = self.role
        total = sum(s.layer.n for s in self.layers)
        rows = [self._counts(s) for s in self.layers]
        out = {key("{role}/param/zero_grad_ratio", role=r): self.param_zero / max(self.param_numel, 1.0)}
        if total:
            out[key("{role}/neuron/dormant_ratio", role=r)] = sum(c["dormant"] for c in rows) / total
            out[key("{role}/neuron/zero_grad_ratio", role=r)] = sum(c["zero_grad"] for c in rows) / total
            if rows and all(c["act_dormant"] is not None for c in rows):
                out[key("{role}/neuron/act_dormant_ratio", role=r)] = sum(c["act_dormant"] for c in rows) / total
        if self.nullspace_ratio is not None:
            out[key("{role}/neuron/nullspace_ratio", role=r)] = self.nullspace_ratio
        return out

    def to_json(self) -> dict:
        m = self.metrics()
        g = {k.split("/")[-1]: m.get(key(k, role=self.role)) for k in (
            "{role}/neuron/dormant_ratio", "{role}/neuron/act_dormant_ratio", "{role}/neuron/zero_grad_ratio")}
        g["param_zero_grad_ratio"] = m[key("{role}/param/zero_grad_ratio", role=self.role)]
        g["nullspace_ratio"] = self.nullspace_ratio
        g["reset_count"] = sum(self.reset.values())
        return {"tau": self.tau, "mode": self.mode, "global": g,
                "layers": {s.layer.name: self._counts(s) for s in self.layers}}


def gradient_stats(model: nn.Module, layers: list[NeuronLayer]) -> tuple[list[LayerStats], float, float]:
    """Per-neuron Σ|g| and counts from ``p.grad``, and the element-level zero count over trainable parameters."""
    sums, counts, sharded = [], [], False
    for la in layers:
        s = torch.zeros(la.n, dtype=torch.float64)
        c = torch.zeros(la.n, dtype=torch.float64)
        for _, p in la.incoming:
            per_row = math.prod(p.shape[1:])  # elements of one global row
            c += la.width * per_row
            g, off, sh = _local_grad(p)
            sharded |= sh
            if g is None:
                continue
            rows = g.abs().reshape(g.shape[0], -1).sum(1, dtype=torch.float64).cpu()
            s.index_add_(0, (off + torch.arange(len(rows))) // la.width, rows)
        sums.append(s)
        counts.append(c)
    zero, numel = torch.zeros((), dtype=torch.float64), 0.0
    for p in model.parameters():
        if not p.requires_grad:
            continue
        numel += p.numel()  # the global size: a DTensor parameter reports its full shape
        g, _, sh = _local_grad(p)
        sharded |= sh
        if g is None:  # no gradient: all zeros, counted once over the shards
            zero += float(_shard(p)[0].numel())
        else:
            zero += (g == 0).sum().double().cpu()
    flat = torch.cat([*sums, zero.view(1)]) if sums else zero.view(1)
    if sharded:  # partial sums over parameter shards -> global; DDP and one process: already global
        flat = collectives.all_reduce_sum(flat)
    parts = list(flat[:-1].split([la.n for la in layers])) if layers else []
    stats = [LayerStats(la, s, c) for la, s, c in zip(layers, parts, counts)]
    return stats, float(flat[-1]), numel


# ----------------------------------------------------------------------------- sampled sequences
def seed_of(*parts) -> int:
    """A stable 63-bit seed from (seed, step, role, name ...): the same on every process and every run."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def sample_rows(n: int, k: int, seed: int) -> torch.Tensor:
    """``min(k, n)`` distinct rows, sorted, from a generator of their own (the global RNG never moves)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[:min(k, n)].sort().values


def nullspace_ratio(K: torch.Tensor) -> float:
    """#{λ_k < NULL_EPS² · λ_max} / B of K normalised to unit diagonal (zero rows stay zero: null directions)."""
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
        return PerTokenLoss(fn, loss_fn.agg)

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
    ``model`` must be a plain module (FSDP2: the replica); its neuron layers are matched to ``stats`` by name.
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


def _is_sharded(model: nn.Module) -> bool:
    return any(hasattr(p, "to_local") for p in model.parameters())


def measure(model: nn.Module, batch: Batch | None, nc: NeuronHealthConfig, *, role: str, seed: int, step: int,
            loss_fn: LossFn | None = None, method: str = "fast", replica: nn.Module | None = None) -> NeuronReport:
    """Neuron health of ``model`` from its current ``.grad`` (and, with ``loss_fn``, a sample of ``batch``).

    ``nc``: the role's settings (tau, mode, nullspace_samples). Without ``loss_fn`` or with
    ``nullspace_samples=0`` only the gradient statistics are computed. Weights, gradients and the
    global RNG are left as they were. Data parallel: ``batch`` is this rank's share of the mini-batch and
    every rank calls this; under FSDP2 ``model`` is the sharded module and ``replica`` a plain module with
    the same weights, which the per-sequence pass runs on.
    """
    layers = find_neurons(model)
    stats, zero, numel = gradient_stats(model, layers)
    grad_total = float(sum(s.grad_sum.sum() for s in stats)) if stats else 0.0
    rep = NeuronReport(role, float(nc.tau), nc.mode, stats, float(zero), numel, grad_total,
                       sharded=_is_sharded(model))
    if loss_fn is not None and nc.nullspace_samples > 0 and batch is not None:
        runner = replica if replica is not None else model
        if _is_sharded(runner):
            raise ValueError("the nullspace pass needs a plain module: pass measure(..., replica=) under FSDP2")
        rows, local, slot = global_sample(batch, nc.nullspace_samples, seed_of(seed, step, role, "nullspace"))
        if len(rows):  # the global mini-batch is not empty (the same answer on every rank)
            K = sample_pass(runner, batch, loss_fn, stats, local, slot, len(rows), method)
            rep.gram, rep.sample_rows, rep.nullspace_samples = K, rows, len(rows)
            rep.nullspace_ratio = nullspace_ratio(K)
    return rep
