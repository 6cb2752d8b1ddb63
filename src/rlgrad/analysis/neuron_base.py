"""What neuron health's measurement (``neurons.py``) and the ReDo reset (``redo.py``) share: a model's neurons found
by structure (``find_neurons``), where a parameter's rows sit under FSDP2 (``_shard``), and the measured report.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
from torch import nn

from rlgrad.analysis.engine import is_sharded
from rlgrad.metrics import key


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


def _base_linear(mod: nn.Module | None) -> nn.Linear | None:
    """The ``nn.Linear`` that ``mod`` is: itself, or the frozen base layer of a PEFT LoRA layer."""
    if isinstance(mod, nn.Linear):
        return mod
    base = getattr(mod, "base_layer", None)
    return base if isinstance(base, nn.Linear) and isinstance(getattr(mod, "lora_B", None), nn.ModuleDict) else None


def is_lora_layer(mod: nn.Module) -> bool:
    """A PEFT LoRA layer around an ``nn.Linear`` (its ``lora_A`` / ``lora_B`` adapters next to ``base_layer``)."""
    return not isinstance(mod, nn.Linear) and _base_linear(mod) is not None


def _adapters(prefix: str, mod: nn.Module, which: str) -> list[tuple[str, nn.Parameter]]:
    """``lora_A`` or ``lora_B`` weights of every adapter of a LoRA layer (none for a plain Linear)."""
    if not is_lora_layer(mod):
        return []
    return [(f"{prefix}.{which}.{name}.weight", lin.weight) for name, lin in getattr(mod, which).items()]


def _linear_params(prefix: str, mod: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The parameters whose rows are the Linear's output units: weight and bias, and under LoRA the rows of each
    ``lora_B`` ([out, r]: row i feeds output i alone); the base layer's names, ``{prefix}.base_layer.weight``."""
    lin = _base_linear(mod)
    base = f"{prefix}.base_layer" if lin is not mod else prefix
    out = [(f"{base}.weight", lin.weight)]
    if lin.bias is not None:
        out.append((f"{base}.bias", lin.bias))
    return out + _adapters(prefix, mod, "lora_B")


def _outgoing_params(prefix: str, mod: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The parameters whose columns are the Linear's input units: its weight, and under LoRA each ``lora_A``
    ([r, in]: column j reads input j alone)."""
    lin = _base_linear(mod)
    return [(f"{prefix}.base_layer.weight" if lin is not mod else f"{prefix}.weight", lin.weight)] + _adapters(
        prefix, mod, "lora_A")


def _head_dim(attn: nn.Module) -> int:
    hd = getattr(attn, "head_dim", None) or getattr(getattr(attn, "config", None), "head_dim", None)
    if hd:
        return int(hd)
    heads = getattr(attn, "num_heads", None) or getattr(getattr(attn, "config", None), "num_attention_heads", None)
    if not heads:
        raise ValueError(f"cannot tell the head size of attention module {type(attn).__name__}")
    return _base_linear(attn.q_proj).out_features // int(heads)


def _has_linear(mod: nn.Module, *names: str) -> bool:
    return all(_base_linear(getattr(mod, k, None)) is not None for k in names)


def _incoming(name: str, mod: nn.Module, projections: tuple[str, ...]) -> list[tuple[str, nn.Parameter]] | None:
    """The trainable incoming parameters of ``projections`` (in order); None when one of them has none (a frozen
    projection without an adapter: its rows carry no gradient to score)."""
    out = []
    for k in projections:
        params = _trainable(_linear_params(f"{name}.{k}", getattr(mod, k)))
        if not params:
            return None
        out += params
    return out


def _trainable(params: list[tuple[str, nn.Parameter]]) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in params if p.requires_grad]


def _gated_mlp_layer(name: str, mod: nn.Module) -> NeuronLayer | None:
    """A gated MLP (gate_proj, up_proj, down_proj): one neuron per gate row."""
    incoming = _incoming(name, mod, ("gate_proj", "up_proj"))
    if incoming is None:
        return None
    return NeuronLayer(name=name, kind="mlp", n=_base_linear(mod.gate_proj).out_features, width=1,
                       incoming=incoming, outgoing=_trainable(_outgoing_params(f"{name}.down_proj", mod.down_proj)),
                       act_module=mod.down_proj)


def _attention_layer(name: str, mod: nn.Module) -> NeuronLayer | None:
    """An attention module (q/k/v/o_proj): one neuron per query head, ``head_dim`` rows wide."""
    head_dim = _head_dim(mod)
    heads = _base_linear(mod.q_proj).out_features // head_dim
    kv_heads = _base_linear(mod.k_proj).out_features // head_dim
    # one KV head per query head: k and v rows are the head's own
    incoming = _incoming(name, mod, ("q_proj", "k_proj", "v_proj") if kv_heads == heads else ("q_proj",))
    if incoming is None:
        return None
    return NeuronLayer(name=name, kind="attn", n=heads, width=head_dim, incoming=incoming,
                       outgoing=_trainable(_outgoing_params(f"{name}.o_proj", mod.o_proj)), act_module=mod.o_proj)


def _sequential_layers(name: str, mod: nn.Sequential) -> list[NeuronLayer]:
    """Each pair of Linears in a Sequential with only parameter-free modules between them."""
    layers = []
    prev: tuple[str, nn.Linear] | None = None
    for k, sub in mod.named_children():
        full = f"{name}.{k}" if name else k
        if isinstance(sub, nn.Linear):
            if prev is not None and prev[1].out_features == sub.in_features:
                prev_name, prev_linear = prev
                layers.append(NeuronLayer(name=prev_name, kind="mlp", n=prev_linear.out_features, width=1,
                                          incoming=_linear_params(prev_name, prev_linear),
                                          outgoing=[(f"{full}.weight", sub.weight)], act_module=sub))
            prev = (full, sub)
        elif any(True for _ in sub.parameters()):
            prev = None  # a module with weights in between: not a plain pair
    return layers


def find_neurons(model: nn.Module) -> list[NeuronLayer]:
    """Every neuron layer of ``model`` with trainable incoming weights, in module order.

    A neuron's incoming (and outgoing) parameters are its trainable ones: all of them in full fine-tuning, the rows
    of the ``lora_B`` adapters (the columns of ``lora_A``) under PEFT LoRA, whose base weights are frozen. A layer
    is kept when every incoming projection has a trainable part (an adapter, or its own weights)."""
    layers: list[NeuronLayer | None] = []
    for name, mod in model.named_modules():
        if _has_linear(mod, "gate_proj", "up_proj", "down_proj"):
            layers.append(_gated_mlp_layer(name, mod))
        elif _has_linear(mod, "q_proj", "k_proj", "v_proj", "o_proj"):
            layers.append(_attention_layer(name, mod))
        elif isinstance(mod, nn.Sequential):
            layers += _sequential_layers(name, mod)
    return [la for la in layers if la is not None and all(p.requires_grad for _, p in la.incoming)]


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
        act, dormant = s.act_score, s.score <= self.tau
        return {"kind": s.layer.kind, "neurons": s.layer.n, "dormant": int(dormant.sum()),
                "dormant_ratio": float(dormant.double().mean()),
                "act_dormant": int((act <= self.tau).sum()) if act is not None else None,
                "zero_grad": int((s.grad_sum == 0).sum()), "reset": self.reset.get(s.layer.name, 0)}

    def metrics(self, rows: list[dict] | None = None) -> dict[str, float]:
        """The role's metrics; ``rows``: ``_counts`` of every layer, where the caller has them already."""
        r = self.role
        total = sum(s.layer.n for s in self.layers)
        rows = [self._counts(s) for s in self.layers] if rows is None else rows
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
        rows = [self._counts(s) for s in self.layers]  # once, for the metrics and the layers both
        m = self.metrics(rows)
        g = {k.split("/")[-1]: m.get(key(k, role=self.role)) for k in (
            "{role}/neuron/dormant_ratio", "{role}/neuron/act_dormant_ratio", "{role}/neuron/zero_grad_ratio")}
        g["param_zero_grad_ratio"] = m[key("{role}/param/zero_grad_ratio", role=self.role)]
        g["nullspace_ratio"] = self.nullspace_ratio
        g["reset_count"] = sum(self.reset.values())
        return {"tau": self.tau, "mode": self.mode, "global": g,
                "layers": {s.layer.name: c for s, c in zip(self.layers, rows)}}


# ----------------------------------------------------------------------------- sampled sequences
def seed_of(*parts) -> int:
    """A stable 63-bit seed from (seed, step, role, name ...): the same on every process and every run."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _is_sharded(model: nn.Module) -> bool:
    return is_sharded(model)
