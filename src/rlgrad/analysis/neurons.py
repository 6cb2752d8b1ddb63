"""Neuron health for any trained model (actor or critic): dormancy, zero gradients, nullspace, ReDo-style reset.

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
counts, zero counts, Σ|activation| and token counts), so making it global is one ``dist.all_reduce_sum``
before the division: see ``_local_grad`` for when a gradient sum needs it. The per-sequence gradients come
from the one gradient engine (``engine.slice_gradients``): the sample is drawn over the global mini-batch
(``global_sample``), each rank passes the sampled rows it holds as a partial one-hot slice matrix, and the
engine sums every sequence's gradient over ranks before forming K. Its single forward also yields the
activations; under FSDP2 it runs on the plain replica.
"""

from __future__ import annotations

import hashlib
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from rlgrad.analysis import dist
from rlgrad.analysis.engine import LossFn, slice_gradients
from rlgrad.batch import Batch
from rlgrad.hooks import Hook, StepContext
from rlgrad.rundir import atomic_write_json

NULL_EPS = 1e-5  # λ_k < NULL_EPS² · λ_max counts as a null direction
SMALL_OUTGOING = 0.01  # redo_reset_outgoing=small: N(0, (SMALL_OUTGOING · RMS of the surviving columns)²)


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
        out = {f"{r}/param/zero_grad_ratio": self.param_zero / max(self.param_numel, 1.0)}
        if total:
            out[f"{r}/neuron/dormant_ratio"] = sum(c["dormant"] for c in rows) / total
            out[f"{r}/neuron/zero_grad_ratio"] = sum(c["zero_grad"] for c in rows) / total
            if rows and all(c["act_dormant"] is not None for c in rows):
                out[f"{r}/neuron/act_dormant_ratio"] = sum(c["act_dormant"] for c in rows) / total
        if self.nullspace_ratio is not None:
            out[f"{r}/neuron/nullspace_ratio"] = self.nullspace_ratio
        return out

    def to_json(self) -> dict:
        m = self.metrics()
        g = {k: m.get(f"{self.role}/neuron/{k}") for k in ("dormant_ratio", "act_dormant_ratio", "zero_grad_ratio")}
        g["param_zero_grad_ratio"] = m[f"{self.role}/param/zero_grad_ratio"]
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
        flat = dist.all_reduce_sum(flat)
    parts = list(flat[:-1].split([la.n for la in layers])) if layers else []
    stats = [LayerStats(la, s, c) for la, s, c in zip(layers, parts, counts)]
    return stats, float(flat[-1]), numel


# ----------------------------------------------------------------------------- sampled sequences
def _seed(*parts) -> int:
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
        """``loss_fn`` that tells the hooks which tokens are response tokens (the engine may reorder rows)."""
        def fn(model, b: Batch):
            self.mask = b.response_mask
            self.tokens += float(b.response_mask.sum())
            return loss_fn(model, b)
        return fn

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
    sizes = dist.all_gather_sizes(len(batch))
    rows = sample_rows(sum(sizes), k, seed)
    if batch.global_index is not None:
        pos = batch.global_index.cpu()
    else:
        pos = sum(sizes[:dist.rank()]) + torch.arange(len(batch))
    local = torch.nonzero(torch.isin(pos, rows)).squeeze(-1)
    slot = torch.searchsorted(rows, pos[local])
    order = torch.argsort(slot)
    return rows, local[order], slot[order]


def sample_pass(model: nn.Module, batch: Batch, loss_fn: LossFn, stats: list[LayerStats], local: torch.Tensor,
                slot: torch.Tensor, num_samples: int, method: str = "fast") -> torch.Tensor:
    """Per-sequence gradient Gram K of the sample from the gradient engine; fills each layer's activation sums.

    Rows ``local`` of ``batch`` are sampled sequences ``slot`` of ``num_samples`` (``global_sample``); the
    engine gets a partial one-hot weight matrix ``[num_samples, len(local)]`` and sums the slices over ranks,
    so slice j is sequence j's gradient wherever it lives. ``loss_fn(model, batch)`` returns per-token losses
    already multiplied by their aggregation weights; its terms are summed, so K is the Gram of the
    gradients of the one loss the update optimises. ``model`` must be a plain module (FSDP2: the replica);
    its neuron layers are matched to ``stats`` by name.
    """
    S = num_samples
    if len(local):
        sample = batch.select(local)
        weights = torch.zeros(S, len(local))
        weights[slot, torch.arange(len(local))] = 1.0
    else:  # none of the sample is here: a zero-loss row keeps this rank in the engine's collectives
        sample, weights = batch.blank_rows(1), torch.zeros(S, 1)
    by_name = {la.name: la for la in find_neurons(model)}
    missing = [s.layer.name for s in stats if s.layer.name not in by_name]
    if missing:
        raise ValueError(f"the model for the nullspace pass lacks neuron layer(s) {', '.join(missing[:3])}")
    acts = _Activations([by_name[s.layer.name] for s in stats])
    summed = acts.watch(lambda m, b: {"loss": sum(loss_fn(m, b).values())})
    names = [f"seq_{i}" for i in range(S)]
    device = next(model.parameters()).device
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            try:
                g = slice_gradients(method, model, sample, summed, weights, names)
            except NotImplementedError as e:  # a model the fast hooks do not cover: same numbers, S passes
                warnings.warn(f"{e}; neuron health falls back to analysis.method=reference", stacklevel=2)
                acts.sums = [torch.zeros_like(s) for s in acts.sums]
                acts.tokens.zero_()
                g = slice_gradients("reference", model, sample, summed, weights, names)
    finally:
        acts.close()
    # K is already global: the engine summed each sequence's gradient over ranks before forming it.
    K = g.total_gram("loss") if "loss" in g.gram else torch.zeros(S, S, dtype=torch.float64)
    # Activation sums and token counts cover this rank's sampled rows only: summed over ranks.
    flat = dist.all_reduce_sum(torch.cat([*acts.sums, acts.tokens.view(1)]))
    parts = flat[:-1].split([s.layer.n for s in stats])
    for s, a in zip(stats, parts):
        s.act_sum, s.act_count = a, flat[-1] * s.layer.width * torch.ones_like(a)
    return K


def actor_loss_fn(s) -> LossFn:
    """The actor's per-token loss terms with their aggregation weights (``s``: rl.actor.LossSettings)."""
    from rlgrad.rl.actor import token_losses
    from rlgrad.rl.core import agg_token_weights

    def fn(model, b: Batch) -> dict[str, torch.Tensor]:
        t = token_losses(model, b, s)
        w, _ = agg_token_weights(t.mask, s.loss_agg_mode, horizon=s.horizon)
        return {k: v * w.to(v.dtype) for k, v in t.components(s).items()}
    return fn


def _is_sharded(model: nn.Module) -> bool:
    return any(hasattr(p, "to_local") for p in model.parameters())


def measure(model: nn.Module, batch: Batch | None, rc, *, role: str, seed: int, step: int,
            loss_fn: LossFn | None = None, method: str = "fast", replica: nn.Module | None = None) -> NeuronReport:
    """Neuron health of ``model`` from its current ``.grad`` (and, with ``loss_fn``, a sample of ``batch``).

    ``rc``: a RedoConfig (redo_tau, redo_mode, redo_nullspace_samples). Without ``loss_fn`` or with
    ``redo_nullspace_samples=0`` only the gradient statistics are computed. Weights, gradients and the
    global RNG are left as they were. Data parallel: ``batch`` is this rank's share of the mini-batch and
    every rank calls this; under FSDP2 ``model`` is the sharded module and ``replica`` a plain module with
    the same weights, which the per-sequence pass runs on.
    """
    layers = find_neurons(model)
    stats, zero, numel = gradient_stats(model, layers)
    grad_total = float(sum(s.grad_sum.sum() for s in stats)) if stats else 0.0
    rep = NeuronReport(role, float(rc.redo_tau), rc.redo_mode, stats, float(zero), numel, grad_total,
                       sharded=_is_sharded(model))
    if loss_fn is not None and rc.redo_nullspace_samples > 0 and batch is not None:
        runner = replica if replica is not None else model
        if _is_sharded(runner):
            raise ValueError("the nullspace pass needs a plain module: pass measure(..., replica=) under FSDP2")
        rows, local, slot = global_sample(batch, rc.redo_nullspace_samples, _seed(seed, step, role, "nullspace"))
        if len(rows):  # the global mini-batch is not empty (the same answer on every rank)
            K = sample_pass(runner, batch, loss_fn, stats, local, slot, len(rows), method)
            rep.gram, rep.sample_rows, rep.nullspace_samples = K, rows, len(rows)
            rep.nullspace_ratio = nullspace_ratio(K)
    return rep


# ----------------------------------------------------------------------------- reset
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
            tot = dist.all_reduce_sum(tot)
        rms = [(float((a / n) ** 0.5) if n else 0.0, float((b / m) ** 0.5) if m else 0.0) for a, n, b, m in tot.tolist()]
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
            gen = torch.Generator().manual_seed(_seed(seed, step, role, name))
            fresh = torch.randn(len(cols), *p.shape[1:], generator=gen, dtype=torch.float32) * scale
            local.index_copy_(0, rows, fresh[mine].to(local.device, local.dtype))
        _zero_moments(optimizer, p, cols, 0)
    for name, p, local, off, _ in out:
        idx = cols.to(local.device)
        if outgoing == "small":
            keep_rms, all_rms = rms[k]
            k += 1
            gen = torch.Generator().manual_seed(_seed(seed, step, role, name))
            fresh = torch.randn(p.shape[0], len(cols), generator=gen, dtype=torch.float32) * (
                SMALL_OUTGOING * (keep_rms or all_rms))
            local.index_copy_(1, idx, fresh[off:off + local.shape[0]].to(local.device, local.dtype))
        else:
            local.index_fill_(1, idx, 0.0)
        _zero_moments(optimizer, p, cols, 1)


def reset_dormant(rep: NeuronReport, optimizer: torch.optim.Optimizer | None, rc, *, seed: int, step: int
                  ) -> dict[str, int]:
    """Reset each layer's dormant neurons by ``rep``'s GraMa scores; returns layer name -> count.

    A step whose whole gradient is zero or non-finite carries no information about which neurons
    are dead (e.g. all advantages zero): nothing is reset then.
    """
    rep.reset = {}
    if not (rep.grad_total > 0 and math.isfinite(rep.grad_total)):
        return rep.reset
    for s in rep.layers:
        idx = select_reset(s.score, rc.redo_tau, rc.redo_mode, rc.redo_max_reset_frac)
        reset_layer(s.layer, idx, optimizer, seed=seed, step=step, role=rep.role, outgoing=rc.redo_reset_outgoing)
        rep.reset[s.layer.name] = len(idx)
    return rep.reset


# ----------------------------------------------------------------------------- the hook
class NeuronHealthHook(Hook):
    """Neuron health at ``on_grads`` (the first mini-batch of a due step, per role) and the reset at ``after_update``.

    Roles: ``actor`` (loss from ``ctx.loss_settings``; optimizer ``ctx.optimizer``) and ``critic``
    (loss from ``ctx.extras["critic_loss_fn"]``, a LossFn like ``actor_loss_fn``'s; optimizer
    ``ctx.critic_optimizer``). Config: ``<role>.redo_*``.

    Under FSDP2 ``on_grads`` sees the sharded module: the per-sequence pass runs on the plain replica
    (``ctx.actor`` / ``ctx.critic``, whose weights are the ones the gradient was taken at), and after a
    reset of the shards the replica is refreshed (``ctx.extras["sync_policy"]`` / ``["sync_critic"]``).
    """

    SYNC = {"actor": "sync_policy", "critic": "sync_critic"}

    def __init__(self, cfg):
        self.cfg = cfg
        self.pending: dict[str, tuple[int, NeuronReport]] = {}

    @staticmethod
    def _due(freq: int, step: int) -> bool:
        return freq > 0 and step % freq == 0

    def loss_fn(self, ctx: StepContext, role: str) -> LossFn | None:
        if role == "actor":
            return actor_loss_fn(ctx.loss_settings)
        return ctx.extras.get(f"{role}_loss_fn")

    def on_grads(self, ctx: StepContext, model: nn.Module, minibatch: Batch, role: str = "actor"):
        rc = getattr(self.cfg, role)
        metric, reset = self._due(rc.redo_metric_freq, ctx.step), self._due(rc.redo_reset_freq, ctx.step)
        if not (metric or reset) or self.pending.get(role, (None,))[0] == ctx.step:
            return None  # later mini-batches of the step: the first one's gradient is the one measured
        t0 = time.perf_counter()
        replica = getattr(ctx, role, None) if _is_sharded(model) else model
        rep = measure(model, minibatch, rc, role=role, seed=self.cfg.trainer.seed, step=ctx.step,
                      loss_fn=self.loss_fn(ctx, role) if metric else None, method=self.cfg.analysis.method,
                      replica=replica)
        self.pending[role] = (ctx.step, rep)
        return {**rep.metrics(), f"timing_s/neuron/{role}": time.perf_counter() - t0}

    def after_update(self, ctx: StepContext):
        out: dict[str, float] = {}
        doc: dict = {"step": ctx.step}
        optimizers = {"actor": ctx.optimizer, "critic": ctx.critic_optimizer}
        for role, (step, rep) in sorted(self.pending.items()):
            if step != ctx.step:
                continue
            rc = getattr(self.cfg, role)
            if self._due(rc.redo_reset_freq, ctx.step):
                counts = reset_dormant(rep, optimizers.get(role), rc, seed=self.cfg.trainer.seed, step=ctx.step)
                out[f"{role}/neuron/reset_count"] = float(sum(counts.values()))
                if rep.sharded and sum(counts.values()):  # the same decision on every rank: all join the gather
                    sync = ctx.extras.get(self.SYNC[role])
                    if sync is None:
                        raise RuntimeError(f"neuron reset on FSDP2 shards needs ctx.extras['{self.SYNC[role]}'] "
                                           "to refresh the replica")
                    sync()
            doc[role] = rep.to_json()
        self.pending.clear()
        if ctx.is_main and len(doc) > 1:
            atomic_write_json(ctx.run_dir / "analysis" / f"step_{ctx.step}" / "neurons.json", doc)
        return out or None
