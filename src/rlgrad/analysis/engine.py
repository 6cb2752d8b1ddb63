"""The gradient engine every instrument uses: gradients of many row-weighted losses at once.

Every loss the analyses ask about is a row-weighted sum of one per-token loss term:

    L_s(θ) = Σ_i W[s, i] · Σ_t ω_it · ℓ_it(θ)        (s = a bucket, a reward component, ...)

Rows (samples) never interact in a forward pass, so ``∂L_s/∂θ = Σ_i W[s, i] · g_i`` where g_i
is row i's gradient. ``fast`` therefore runs ONE forward and, per loss term, ONE backward of
``Σ_i Σ_t ω ℓ`` down to the input embeddings only, with the model's parameters frozen. Module
hooks see each layer's input ``x`` and output gradient ``δ`` and reduce them per slice:

    Linear      ∂L_s/∂W = Σ_i W[s,i] Σ_t δ_it x_itᵀ      ∂L_s/∂b = Σ_i W[s,i] Σ_t δ_it
    Embedding   ∂L_s/∂E[v] = Σ_i W[s,i] Σ_{t: id_it = v} δ_it      (v ≠ padding_idx)
    RMSNorm     ∂L_s/∂w = Σ_i W[s,i] Σ_t δ_it ⊙ x̂_it      (x̂ the normalised input; LayerNorm: + bias)

so a slice whose rows are disjoint from the others' costs only its share of one weight-gradient
computation, and the full-batch weight gradient is never formed separately. Tied input/output
embeddings receive both contributions. Derived slices (e.g. ``all`` = Σ_b c_b · bucket_b) are
linear combinations formed at the end. The result is, per term, the Gram matrix of the slices'
gradients for every layer group (norms on the diagonal, dot products off it), and optionally the
gradients themselves.

Only trainable parameters are measured. Under PEFT LoRA the adapters' ``lora_A`` / ``lora_B`` are the Linears
whose gradients are formed (their inputs and output gradients are seen like any Linear's), the frozen base
weights get none, and a frozen input embedding still gives the backward its leaf.

``reference`` does the literal thing: for each slice its own sub-batch, a forward and a backward
per term through plain autograd. It is the oracle the tests hold ``fast`` to.

``slice_gradients`` is the one entry point instruments call: it applies the loss's aggregation
weights ω, falls back from ``fast`` to ``reference`` for a model the hooks do not cover, runs a rank
that holds no row on one zero-loss blank row (the collectives stay in step), and leaves the RNG
streams as they were.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from rlgrad import collectives
from rlgrad.algos.logprobs import softmax_recomputed
from rlgrad.algos.objective import LossFn
from rlgrad.batch import Batch
from rlgrad.metrics import layer_group

# Overlapping slices: per-row Linear gradients are combined a chunk of rows at a time, at most this many
# elements per chunk (at least one row). At the bench's shapes (Linears of 64k-200k weights) 2M ran 2x
# faster than 16M; a Linear with more weights than this goes one row at a time.
ROW_CHUNK_ELEMENTS = 1 << 21
# Streaming: a parameter (with one use) whose slice gradients, all slices together, have more elements than this
# has them formed, summed over ranks and folded into the Gram a block of rows at a time (8 MB in fp32), not whole.
BLOCK_ELEMENTS = 1 << 21

# Overlapping slices (``_SliceReducer.combine``): a Linear's per-row gradients, formed once and combined, cost
# N·in·out·(T + S) multiply-adds against S·N·T·in·out for one product per slice, but write N·in·out floats of T
# multiply-adds each, which runs far below the products' speed where rows are short. Measured on one thread
# (bench/results/i49/grads_from_groups/combine_cost.txt): 128 rows of 9 tokens, a 128 x 128 Linear, 2 slices, 1.42 ms
# combined against 0.60 ms by slice; 32 rows of 92 tokens, 576 x 1536, 55.8 against 76.9 ms. The write is counted as
# this many tokens' multiply-adds (``combine_is_cheaper``).
COMBINE_WRITE_TOKENS = 16


def combine_is_cheaper(tokens: int, slices: int) -> bool:
    """Whether overlapping slices of rows of ``tokens`` tokens are cheaper from the rows' own gradients."""
    return tokens + slices + COMBINE_WRITE_TOKENS < slices * tokens


# Where a contribution to a parameter's slice gradients lies: the whole parameter (None), its rows
# ``start .. start + n - 1`` (``(start, n)``: a block), or the rows a sorted index tensor names (an embedding's
# rows at the batch's token ids, ``_present_rows``).
Rows = tuple[int, int] | torch.Tensor | None


@dataclass
class GradStats:
    """Per term: the slices' gradient Gram matrix for each layer group (and in total)."""

    slices: list[str]
    gram: dict[str, dict[str, torch.Tensor]]  # term -> layer group -> [S, S] (float64)
    grads: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # term -> param name -> [S, *shape]
    row_order: torch.Tensor | None = None  # fast: the row permutation its single forward ran on

    def total_gram(self, term: str) -> torch.Tensor:
        return sum(self.gram[term].values())

    def norm(self, term: str, s: str, group: str | None = None) -> float:
        k = self.slices.index(s)
        g = self.gram[term][group] if group else self.total_gram(term)
        return float(g[k, k].clamp_min(0).sqrt())


def _is_rmsnorm(m: nn.Module) -> bool:
    return "RMSNorm" in type(m).__name__ and isinstance(getattr(m, "weight", None), nn.Parameter) and (
        hasattr(m, "variance_epsilon") or hasattr(m, "eps"))


def _norm_input(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The normalised input x̂ that the norm's weight multiplies."""
    if isinstance(m, nn.LayerNorm):
        return nn.functional.layer_norm(x, m.normalized_shape, None, None, m.eps)
    eps = getattr(m, "variance_epsilon", getattr(m, "eps", 1e-6))
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _contiguous_range(rows: torch.Tensor) -> tuple[int, int] | None:
    """``(start, length)`` when ``rows`` are consecutive indices, else None."""
    if not len(rows):
        return None
    start = int(rows[0])
    consecutive = torch.arange(start, start + len(rows), device=rows.device)
    return (start, len(rows)) if bool((rows == consecutive).all()) else None


class _SliceReducer:
    """Accumulates per-slice parameter gradients from module hooks during one backward."""

    retains = False  # the backward under way retains the graph for another (``run_terms``: each term but the last)
    # A watched module ran without autograd in this forward (a reentrant activation checkpoint's first forward): its
    # backward is a backward of its own, which a backward to ``edges`` cannot run (torch.utils.checkpoint refuses it)
    ungraded = False

    def __init__(self, model: nn.Module, weights: torch.Tensor, watch: bool = True, leaf_embeddings: bool = True):
        """``watch=False``: no module hooks of its own; another reducer's hooks feed it (``side``).
        ``leaf_embeddings=False``: the input embeddings' outputs stay in the graph (riding on a training backward,
        which must reach their weights; ``groups.UpdatePass``) instead of becoming the leaves the engine's own
        backward stops at."""
        self.model = model
        self.leaf_embeddings = leaf_embeddings
        self.weights = weights  # [S, N]
        self.rows = [torch.nonzero(w).squeeze(-1) for w in weights]
        self.const = [len(r) > 0 and bool((w[r] == w[r[0]]).all()) for w, r in zip(weights, self.rows)]
        # Rows sorted by slice (fast_gradients does that) make each disjoint slice a contiguous range:
        # a view of δ and x, no gather.
        self.ranges = [_contiguous_range(r) for r in self.rows]
        # Each slice at most one row and each row in at most one slice (per-sample gradients, e.g. the
        # nullspace ratio; under data parallel a rank may hold only some of the sampled rows): every
        # module's reduction runs batched over rows and the results are placed in their slices.
        S, N = weights.shape
        nz = weights != 0
        self.place = None
        if bool((nz.sum(0) <= 1).all()) and bool((nz.sum(1) <= 1).all()):
            slot, col = torch.nonzero(nz, as_tuple=True)
            w = weights[slot, col]
            self.place = (None if torch.equal(col, torch.arange(N, device=col.device)) else col,
                          None if torch.equal(slot, torch.arange(S, device=slot.device)) else slot,
                          None if bool((w == 1).all()) else w)
        # Slices that overlap (reward components: every slice covers every row): a Linear's weight
        # gradient per slice costs a full weight-gradient matmul each, so form the per-row gradients
        # once (a batched matmul as large as ONE weight gradient) and combine them with the weights,
        # S·N·in·out more multiply-adds instead of (S - 1)·N·T·in·out, where rows are long enough
        # (``combine_is_cheaper``, decided per Linear).
        self.combine = self.place is None and int(nz.sum()) >= 1.5 * N
        self.weights_f32 = weights.to(torch.float32)
        # Otherwise a slice whose rows share one weight (a bucket) is reduced unweighted and scaled at
        # the end, in the small Gram (scale_i·scale_j·K_ij), never in each module's parameter-sized result.
        fold = self.place is None and not self.combine
        self.folded = [c and fold for c in self.const]
        self.scale = torch.tensor([float(w[r[0]]) if f else 1.0 for w, r, f in zip(weights, self.rows, self.folded)],
                                  dtype=torch.float64)
        # The weights a slice's reduction applies (a folded slice's are 1 on its rows): ``reduce_weights @ per_row``
        # gives the slices of a parameter from its rows' own gradients ``per_row`` ``[N, ...]`` (rows.RowNormReducer)
        self.reduce_weights = (weights / self.scale.to(weights)[:, None]).to(torch.float32)
        self._plan_tiles(weights)
        self.acc: dict[int, torch.Tensor] = {}
        self.names = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
        # FSDP2 swaps a module's registered (sharded) parameter for an unsharded one around its forward and
        # backward: the hooks map whatever a module holds then to the registered parameter's id.
        self.alias: dict[int, int] = {}
        # Streaming (``flush``): a parameter's slice gradients leave as soon as every call of its modules has
        # added to them (``calls``: per forward; ``remaining``: per backward), so at most the modules whose
        # backward is in flight hold slice gradients, never the whole model's.
        self.flush: Callable[[int, torch.Tensor], None] | None = None
        self.calls: dict[int, int] = {}
        self.remaining: dict[int, int] = {}
        self.block_elements: int | None = None  # streaming: form large parameters' slices by blocks (_blocks)
        self.block_slices = S  # the slices a block is sized for (a basis side: the groups', so its pieces pair up)
        self.handles = []
        self.backward_started = False
        # The modules whose outputs were hooked, with those outputs' places in the graph (``edges``)
        self.forward_modules: dict[int, list[GradientEdge]] = {}
        self.embed_leaf: list[tuple[nn.Embedding, torch.Tensor, torch.Tensor]] = []
        # The modules holding each parameter, and each input embedding's token ids of this forward with (once asked
        # for) every rank's distinct ones: the rows of an embedding gradient that can be nonzero (``_present_rows``).
        self.owners: dict[int, list[nn.Module]] = {}
        self.ids: dict[int, torch.Tensor] = {}
        self.present: dict[int, torch.Tensor] = {}
        # A second slice set reduced from the same backward (``attach_side``): its hooks are this reducer's.
        self.side: _SliceReducer | None = None
        for mod in model.modules() if watch else ():
            if isinstance(mod, nn.Linear):
                self._watch(mod, self._linear)
            elif isinstance(mod, nn.Embedding):
                # also a frozen one (LoRA): its output is a leaf the backward stops at, its weight gets nothing
                self._watch(mod, self._embedding, self._record_ids, leaf_only=not mod.weight.requires_grad)
            elif isinstance(mod, nn.LayerNorm) or _is_rmsnorm(mod):
                # x̂ formed in the backward from the input, which the norm's backward keeps anyway: one formed in the
                # forward stayed alive beside it from then on (every norm's at once: the riding pass's extra peak)
                self._watch(mod, self._norm, late=_norm_input)

    def _plan_tiles(self, weights: torch.Tensor) -> None:
        """Slices that tile the rows in order, all of one size (GRPO's prompt groups, buckets of equal groups): a
        module's slice gradients are its "per-row" reduction over [S, rows·tokens, ...], one batched call, not a
        loop of S small products (whose overhead exceeded the products at the embedded default's width) (``tiled``).
        Rows that arrive shuffled (an update's shuffled mini-batch, as TRL runs it) but tile in slice order are
        gathered into that order once per module (``gather``), then the one batched call."""
        S, N = weights.shape
        size = N // S if S and N % S == 0 else 0

        def tiles(ranges: list) -> bool:
            return bool(size) and all(self.folded) and all(rng == (k * size, size) for k, rng in enumerate(ranges))

        self.tiled = tiles(self.ranges)
        self.gather: torch.Tensor | None = None
        self.slot_of_row: torch.Tensor | None = None
        if not self.tiled and bool(size) and all(self.folded):
            slot = (weights != 0).to(torch.int8).argmax(0)
            order = torch.sort(slot, stable=True).indices
            if tiles([_contiguous_range(torch.nonzero(w[order]).squeeze(-1)) for w in weights]):
                self.tiled, self.gather, self.slot_of_row = True, order, slot

    def _watch(self, mod: nn.Module, fn: Callable, prep: Callable | None = None, leaf_only: bool = False,
               late: Callable | None = None) -> None:
        """``fn(module, x, g)`` at ``mod``'s output gradient g, x its input after ``prep`` (forward) or ``late``."""
        attrs = [(a, id(p)) for a, p in mod.named_parameters(recurse=False) if id(p) in self.names]
        for _, k in attrs:
            self.owners.setdefault(k, []).append(mod)
        if not attrs and not leaf_only:
            return

        def fwd(module, inputs, output):
            if self._recomputed(module):
                return output
            self.ungraded |= not torch.is_grad_enabled()
            x = self._read_rows(inputs[0].detach())
            x = x if prep is None else prep(module, x)
            if isinstance(module, nn.Embedding) and self.leaf_embeddings:
                # The input embedding: the leaf the backward stops at. Token ids carry no gradient, so its output
                # depends on the parameters only through the weight, whose slice gradients the hook forms (its
                # output may require grad: a hook such as transformers' enable_input_require_grads, or FSDP2's
                # unsharded weight, which fast_gradients cannot freeze).
                output = output.detach().requires_grad_(True)
                self.embed_leaf.append((module, x, output))
            if not leaf_only and output.requires_grad:
                self.forward_modules.setdefault(id(module), []).append(get_gradient_edge(output))
                for _, k in attrs:
                    self.calls[k] = self.calls.get(k, 0) + 1
                held = [x]  # its input (``_input``)
                output.register_hook(lambda g: self._on_grad(module, attrs, fn, self._input(module, held, late), g))
            return output

        self.handles.append(mod.register_forward_hook(fwd))

    def _read_rows(self, t: torch.Tensor) -> torch.Tensor:
        """The rows of a module's input or output gradient that this reducer reads: all (``rows.RowNormReducer``:
        those it was given)."""
        return t

    @property
    def edges(self) -> list[GradientEdge]:
        """The hooked outputs' places in the graph: a backward to them alone reaches every hook and forms no
        parameter gradient (``groups.UpdatePass``: the hooks form them)."""
        return [edge for edges in self.forward_modules.values() for edge in edges]

    def _input(self, module: nn.Module, held: list[torch.Tensor], late: Callable | None) -> torch.Tensor:
        """A hook's input ``held[0]`` after ``late``. Kept, with ``late``'s result (``held[1]``, formed once), where
        more backwards of the graph follow (``retains``: the engine's terms but the last); else dropped: the graph
        outlives the backward (riding, until the update's optimizer step), and what it held would stay alive."""
        if not held:
            raise RuntimeError("a module's output gradient came twice to backwards that did not retain the graph")
        x = held[-1] if late is None or len(held) > 1 else late(module, held[0])
        if not self.retains:
            held.clear()
        elif len(held) == 1 and late is not None:
            held.append(x)
        return x

    def _on_grad(self, module: nn.Module, attrs: list[tuple[str, int]], fn: Callable, x: torch.Tensor,
                 g: torch.Tensor) -> None:
        """``module``'s output gradient ``g`` (its input ``x``) reduced by ``fn`` into its parameters' slices."""
        self.backward_started = True
        for a, k in attrs:  # the parameters the module holds now (FSDP2: unsharded) are the registered ones
            self.alias[id(getattr(module, a))] = k
        served_side = fn(module, x, g)  # True where the module's reduction also gave the side's slices
        if self.side is not None and not served_side:  # the side's own reduction (its base class's)
            getattr(_SliceReducer, fn.__name__)(self.side, module, x, g)

    def _recomputed(self, module: nn.Module) -> bool:
        """Whether this forward of ``module`` is activation checkpointing's recompute (without reentry) inside the
        backward, refilling what the layer saved: the gradient flows through the first forward's outputs, already
        hooked, so it is not watched again. With reentry the first forward runs without grad (nothing hooked) and the
        recompute is the forward the backward goes through: watched."""
        return self.backward_started and id(module) in self.forward_modules

    def _record_ids(self, mod: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        self.ids[id(mod)] = ids
        self.present.pop(id(mod), None)  # a new forward's tokens
        return ids

    def attach_side(self, weights: torch.Tensor) -> _SliceReducer:
        """A reducer of the slices ``weights`` ``[S', N]`` (the same rows) fed by this reducer's hooks while
        ``self.side`` is it: one backward gives both slice sets (``groups.py``: the reward components on the
        prompt-group pass). It shares this reducer's parameter map, forward call counts and token ids."""
        side = _SliceReducer(self.model, weights, watch=False)
        side.alias, side.calls, side.owners, side.ids, side.present = (self.alias, self.calls, self.owners, self.ids,
                                                                       self.present)
        return side

    def _add(self, p: nn.Parameter, per_slice: torch.Tensor, whole: bool = True, at: Rows = None) -> None:
        """``per_slice`` ``[S, ...]``: a contribution to ``p``'s slice gradients at its rows ``at`` (``Rows``)."""
        k = self.alias.get(id(p), id(p))
        if k not in self.names:
            return
        if not whole:  # a block of rows (``_blocks``): flushed as it is, its Gram adds over blocks
            self.flush(k, per_slice)
            return
        self.acc[k] = self.acc[k] + per_slice if k in self.acc else per_slice
        if self.flush is not None:
            self.remaining[k] = self.remaining.get(k, self.calls.get(k, 1)) - 1
            if self.remaining[k] <= 0:
                self.flush(k, self.acc.pop(k))

    def _slices(self, g: torch.Tensor, x: torch.Tensor, reduce: Callable, rows: Callable | None = None,
                combine: bool = False) -> torch.Tensor:
        """Per-slice gradients [S, *shape] from δ ``g`` and input ``x`` (rows first).

        ``reduce(g [n, out], x [n, in] | ids [n])`` sums over tokens; ``rows(g [R, T, out], x [R, T, in])``
        gives each row's own gradient [R, *shape]. ``combine``: this module's per-row gradients are worth
        forming for overlapping slices (see ``self.combine``).
        """
        if rows is not None and self.tiled:
            if self.gather is not None:
                g, x = g.index_select(0, self.gather), x.index_select(0, self.gather)
            slices = len(self.weights)
            return rows(g.reshape(slices, -1, g.shape[-1]),
                        x.reshape(slices, -1, x.shape[-1]) if x.is_floating_point() else x.reshape(slices, -1))
        if rows is None or (self.place is None and not (combine and self.combine)):
            return self._disjoint_slices(g, x, reduce)
        g3 = g.reshape(g.shape[0], -1, g.shape[-1])
        x3 = x.reshape(x.shape[0], -1, x.shape[-1]) if x.is_floating_point() else x.reshape(x.shape[0], -1)
        if self.place is not None:
            return self._placed_rows(g3, x3, rows)
        return self._combined_rows(g3, x3, rows)

    def _small_slices(self, g: torch.Tensor, x: torch.Tensor, reduce: Callable, rows: Callable) -> torch.Tensor:
        """``_slices`` of a parameter whose per-row gradient is small (a norm's weight, a bias): rows that arrive
        shuffled are reduced each on its own and added into their slices, instead of gathering δ and x back into
        slice order first."""
        if self.slot_of_row is None:
            return self._slices(g, x, reduce, rows)
        per_row = rows(g.reshape(g.shape[0], -1, g.shape[-1]), x.reshape(x.shape[0], -1, x.shape[-1]))
        return per_row.new_zeros(len(self.weights), *per_row.shape[1:]).index_add_(0, self.slot_of_row, per_row)

    def _placed_rows(self, g3: torch.Tensor, x3: torch.Tensor, rows: Callable) -> torch.Tensor:
        """Slices of at most one row each: the rows' own gradients, weighted and put in their slices."""
        col, slot, w = self.place
        per_row = rows(g3, x3) if col is None else rows(g3.index_select(0, col), x3.index_select(0, col))
        if w is not None:
            per_row = per_row * w.to(per_row.dtype).view(-1, *([1] * (per_row.dim() - 1)))
        if slot is None:  # slice k is row k
            return per_row
        out = per_row.new_zeros(len(self.weights), *per_row.shape[1:])
        return out.index_copy_(0, slot, per_row)

    def _combined_rows(self, g3: torch.Tensor, x3: torch.Tensor, rows: Callable) -> torch.Tensor:
        """Overlapping slices: each chunk of rows' own gradients, combined with the slice weights."""
        weights = self.weights_f32
        out = None
        step = max(1, ROW_CHUNK_ELEMENTS // (g3.shape[-1] * x3.shape[-1]))
        for i in range(0, g3.shape[0], step):
            per_row = rows(g3[i:i + step], x3[i:i + step])
            flat = per_row.reshape(per_row.shape[0], -1)
            chunk_weights = weights[:, i:i + step]
            out = chunk_weights @ flat if out is None else out.addmm_(chunk_weights, flat)
        return out.view(len(weights), *per_row.shape[1:])

    def _disjoint_slices(self, g: torch.Tensor, x: torch.Tensor, reduce: Callable) -> torch.Tensor:
        """Each slice only touches its own rows: disjoint slices cost one weight gradient in total."""

        def flat(gs: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
            return reduce(gs.flatten(0, -2), xs.flatten(0, -2) if xs.dim() > 2 else xs)

        out = []
        for w, idx, const, folded, rng in zip(self.weights, self.rows, self.const, self.folded, self.ranges):
            if len(idx) == 0:
                out.append(flat(g[:0], x[:0]))
                continue
            if not const and rng is None and 2 * len(idx) >= len(w):
                # rows of weight 0 add nothing: weighing every row costs less than gathering the slice's
                idx = torch.arange(len(w), device=w.device)
            gs, xs = self._rows_of(g, x, idx, rng)
            if const:
                reduced = flat(gs, xs)
                out.append(reduced if folded else reduced * w[idx[0]])
            else:
                out.append(flat(gs * w[idx].to(g.dtype).view(-1, *([1] * (g.dim() - 1))), xs))
        return torch.stack(out)

    @staticmethod
    def _rows_of(g: torch.Tensor, x: torch.Tensor, idx: torch.Tensor,
                 rng: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """δ and x of a slice's rows: the whole batch, a contiguous view, or a gather."""
        if len(idx) == g.shape[0]:
            return g, x
        if rng is not None:
            return g.narrow(0, rng[0], rng[1]), x.narrow(0, rng[0], rng[1])
        return g.index_select(0, idx), x.index_select(0, idx)

    def _blocks(self, p: nn.Parameter) -> list[tuple[int, int]]:
        """``(first row, rows)`` blocks of ``p`` whose slice gradients are formed and flushed one at a time: the
        whole parameter, except while streaming (``block_elements`` set) a parameter whose slice gradients have
        more than ``block_elements`` elements (an LM head, an MLP projection) with one use, or tied to the input
        embedding (``_present_rows``): the Gram and the sum over ranks add over disjoint blocks of rows, so only
        one block's slice gradients exist at once."""
        rows = p.shape[0]
        k = self.alias.get(id(p), id(p))
        if self.block_elements is None or (self.calls.get(k, 1) > 1 and self._present_rows(p) is None):
            return [(0, rows)]
        step = max(1, self.block_elements // max(self.block_slices * (p.numel() // max(rows, 1)), 1))
        return [(i, min(step, rows - i)) for i in range(0, rows, step)]

    def _present_rows(self, p: nn.Parameter) -> torch.Tensor | None:
        """While streaming, for an input embedding's weight (tied or not to one Linear, each called once): the token
        ids of this forward on every rank, sorted; its rows that can have a nonzero gradient. Else None.

        The embedding's slice gradients are formed at those rows only (never vocabulary x hidden per slice), and a
        tied LM head's part at those rows joins them there (``_add``: summed, then flushed) while the head's other
        rows go by blocks: the Gram of the tied weight's gradient is the sum over the two disjoint sets of rows.
        A collective the first time per forward (the head's or the embedding's backward: the same on every rank)."""
        k = self.alias.get(id(p), id(p))
        owners = self.owners.get(k, [])
        emb = [m for m in owners if isinstance(m, nn.Embedding)]
        if (self.block_elements is None or len(emb) != 1 or id(emb[0]) not in self.ids or len(owners) > 2
                or not all(isinstance(m, (nn.Embedding, nn.Linear)) for m in owners)
                or self.calls.get(k, 1) != len(owners)):
            return None
        if id(emb[0]) not in self.present:
            mine = torch.unique(self.ids[id(emb[0])])
            self.present[id(emb[0])] = torch.unique(collectives.all_gather_cat(mine))
        return self.present[id(emb[0])]

    def _linear(self, m: nn.Linear, x: torch.Tensor, g: torch.Tensor) -> None:
        self._linear_weight(m, x, g)
        if m.bias is not None:
            self._add(m.bias, self._small_slices(g.detach(), x, lambda gg, xx: gg.float().sum(0),
                                                 lambda gg, xx: gg.float().sum(1)))

    def _linear_weight(self, m: nn.Linear, x: torch.Tensor, g: torch.Tensor) -> None:
        g = g.detach()
        out = g.shape[-1]
        combine = combine_is_cheaper(g.numel() // max(g.shape[0] * out, 1), len(self.weights))

        def slices(gg: torch.Tensor) -> torch.Tensor:
            return self._slices(gg, x, lambda gg, xx: gg.t().float() @ xx.float(),
                                lambda gg, xx: gg.float().transpose(1, 2) @ xx.float(), combine=combine)

        present = self._present_rows(m.weight)
        if present is not None:  # a tied head: its rows at the batch's tokens join the embedding's part
            self._add(m.weight, slices(g.index_select(-1, present.to(g.device))), at=present)
        for start, n in self._blocks(m.weight):
            gb = g if n == out else g[..., start:start + n]
            if present is not None:  # those rows left with the embedding's part
                inside = present[(present >= start) & (present < start + n)] - start
                gb = gb.index_fill(-1, inside.to(g.device), 0)
            self._add(m.weight, slices(gb), whole=n == out and present is None, at=None if n == out else (start, n))

    def _embedding(self, m: nn.Embedding, ids: torch.Tensor, g: torch.Tensor) -> None:
        g = g.detach()
        if m.padding_idx is not None:  # autograd never updates the padding row
            g = g * (ids != m.padding_idx).unsqueeze(-1).to(g.dtype)
        present = self._present_rows(m.weight)
        if present is not None:  # rows of the tokens present only: the others are zero in every slice
            present = present.to(ids.device)
            self._add(m.weight, self._embedding_slices(g, torch.searchsorted(present, ids), len(present)),
                      at=present)
            return
        vocab = m.weight.shape[0]
        for start, V in self._blocks(m.weight):
            gb, ib = g, ids
            if V != vocab:  # rows start .. start + V - 1 only: other tokens add zeros to row 0 of the block
                local = ids - start
                inside = (local >= 0) & (local < V)
                gb, ib = g * inside.unsqueeze(-1).to(g.dtype), local.clamp(0, V - 1)
            self._add(m.weight, self._embedding_slices(gb, ib, V), whole=V == vocab,
                      at=None if V == vocab else (start, V))

    def _embedding_slices(self, g: torch.Tensor, ids: torch.Tensor, V: int) -> torch.Tensor:
        """Slice gradients ``[S, V, dim]`` of an embedding of ``V`` rows read at ``ids`` (< V), output gradient g."""
        return self._slices(
            g, ids, lambda gg, ii: torch.zeros(V, gg.shape[-1], dtype=torch.float32, device=gg.device)
            .index_add_(0, ii.reshape(-1), gg.float()),
            lambda gg, ii: torch.zeros(len(ii) * V, gg.shape[-1], dtype=torch.float32, device=gg.device)
            .index_add_(0, (ii + V * torch.arange(len(ii), device=ii.device)[:, None]).reshape(-1),
                        gg.reshape(-1, gg.shape[-1]).float()).view(len(ii), V, gg.shape[-1]))

    def _norm(self, m: nn.Module, xh: torch.Tensor, g: torch.Tensor) -> None:
        g = g.detach()
        self._add(m.weight, self._small_slices(g, xh, lambda gg, xx: (gg.float() * xx.float()).sum(0),
                                               lambda gg, xx: (gg.float() * xx.float()).sum(1)))
        if getattr(m, "bias", None) is not None:
            self._add(m.bias, self._small_slices(g, xh, lambda gg, xx: gg.float().sum(0),
                                                 lambda gg, xx: gg.float().sum(1)))

    def close(self) -> None:
        """Removes the hooks; drops the graph's edges, which hold its nodes and, through their hooks, this reducer."""
        for h in self.handles:
            h.remove()
        self.forward_modules.clear()


def _gram_f64(flat: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """``flat @ flat.T`` accumulated in float64, converting a cache-sized block of columns at a time."""
    K = torch.zeros(flat.shape[0], flat.shape[0], dtype=torch.float64, device=flat.device)
    for i in range(0, flat.shape[1], chunk):
        d = flat[:, i:i + chunk].double()
        K.addmm_(d, d.t())
    return K


def with_derived(derived: dict[str, dict[str, float]], base: list[str]) -> torch.Tensor:
    """``[len(base) + len(derived), len(base)]`` float64: the identity, then each derived slice's coefficients on the
    base slices (``base + derived`` as combinations of ``base``)."""
    unknown = sorted({b for combo in derived.values() for b in combo} - set(base))
    if unknown:
        raise ValueError(f"derived slices name unknown slice(s) {', '.join(unknown)}")
    C = torch.tensor([[combo.get(b, 0.0) for b in base] for combo in derived.values()],
                     dtype=torch.float64).reshape(len(derived), len(base))
    return torch.cat([torch.eye(len(base), dtype=torch.float64), C])


def _gram(grads: dict[str, torch.Tensor], derived: dict[str, dict[str, float]], base: list[str],
          scale: torch.Tensor | None = None, keep: bool = False
          ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Gram matrices per layer group of the slices ``base + derived``; with ``keep`` their gradients too.

    ``grads[name]`` is ``[len(base), *shape]``, slice b's gradient divided by ``scale[b]``. With
    A = [diag(scale); C·diag(scale)] (C: the derived slices' coefficients) every slice's gradient
    is a row of A·G, so its Gram is A (G Gᵀ) Aᵀ: the base Gram in float64, then a tiny product,
    and the derived gradients are formed only when they are kept.

    Data parallel: each rank's slice gradients cover its own rows, so they are summed over ranks
    first (one all-reduce per term, every rank calls it in the same order, with zeros for slices it
    holds no row of). Gram matrices are NOT additive over ranks; they are formed from the sums.
    """
    S = len(base)
    scale = torch.ones(S, dtype=torch.float64) if scale is None else scale.to(torch.float64)
    if collectives.world_size() > 1 and not bool((scale == 1).all()):
        # Ranks may disagree on which slices are scaled (a rank without a slice's rows): sum scaled gradients.
        grads = {n: g.mul_(scale.to(g.device, g.dtype).view(-1, *([1] * (g.dim() - 1)))) for n, g in grads.items()}
        scale = torch.ones(S, dtype=torch.float64)
    grads = collectives.all_reduce_sum_dict(grads)
    A = with_derived(derived, base) * scale[None, :]
    full: dict[str, torch.Tensor] = {}
    base_gram: dict[str, torch.Tensor] = {}
    for name, g in grads.items():
        grp = layer_group(name)
        k = _gram_f64(g.reshape(S, -1))
        base_gram[grp] = base_gram[grp] + k if grp in base_gram else k
        if keep:
            full[name] = (A.to(g.device, g.dtype) @ g.reshape(S, -1)).view(len(A), *g.shape[1:])
    return full, {grp: A @ k.cpu() @ A.t() for grp, k in base_gram.items()}


def _weighted_terms(loss_fn: LossFn, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    """Each term's per-token loss times its aggregation weight ω: ``Σ_i W[s,i] Σ_t`` of it is slice s's loss."""
    terms = loss_fn(model, batch)
    if not terms:
        return terms
    first = next(iter(terms.values()))
    omega, _ = loss_fn.agg.weights(batch.response_mask.to(first.device))
    return {k: v * omega.to(v.dtype) for k, v in terms.items()}


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are FSDP2 shards (DTensors): the fast engine runs on it as it is, each
    layer's slice gradients formed from its unsharded forward and backward and summed over ranks."""
    return any(hasattr(p, "to_local") for p in model.parameters())


def fast_unsupported(model: nn.Module) -> str | None:
    """Why the fast engine cannot run on ``model`` (None: it can), decided before any forward."""
    names: dict[int, str] = {}  # every trainable parameter by its first name (a tied one is named once)
    covered = set()
    embedding = False
    for prefix, mod in model.named_modules():  # one walk: called at every analysed step by several instruments
        supported = isinstance(mod, (nn.Linear, nn.Embedding, nn.LayerNorm)) or _is_rmsnorm(mod)
        embedding |= isinstance(mod, nn.Embedding)
        for name, p in mod.named_parameters(prefix=prefix, recurse=False):
            if p.requires_grad:
                names.setdefault(id(p), name)
            if supported:
                covered.add(id(p))
    missing = [n for k, n in names.items() if k not in covered]
    if missing:
        return f"the fast gradient engine does not cover parameter(s) {', '.join(missing[:3])}"
    if not embedding:
        return "the fast gradient engine needs an nn.Embedding input layer"
    return None


def run_terms(model: nn.Module, batch: Batch, loss_fn: LossFn, reducer: _SliceReducer,
              on_term: Callable[[str, torch.Tensor, list[torch.Tensor], bool], None]) -> None:
    """The fast engine's passes: ONE forward of ``loss_fn`` (parameters frozen, so weight gradients come only from
    ``reducer``'s module hooks), then per term ``on_term(term, total, leaves, retain_graph)``, which runs ONE
    backward of ``total = Σ ω·term`` down to the input embeddings ``leaves`` (``backward``) and reads what the
    hooks left in ``reducer``. The hooks are removed and the parameters' ``requires_grad`` restored afterwards,
    whatever happens. An entropy term's softmax is formed again in its own backward (``softmax_recomputed``), not
    kept through the other terms'."""
    params = [p for p in model.parameters() if p.requires_grad]
    flags = [p.requires_grad for p in model.parameters()]
    try:
        for p in params:
            p.requires_grad_(False)  # weight gradients come from the hooks, never from autograd
        with softmax_recomputed():
            terms = _weighted_terms(loss_fn, model, batch)
        if not reducer.embed_leaf:
            raise NotImplementedError("the fast gradient engine needs an nn.Embedding input layer; "
                                      "use analysis.method=reference")
        leaves = [leaf for _, _, leaf in reducer.embed_leaf]
        for i, (term, per_token) in enumerate(terms.items()):
            reducer.retains = i < len(terms) - 1
            on_term(term, per_token.sum(), leaves, reducer.retains)
    finally:
        reducer.close()
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)


def backward(total: torch.Tensor, leaves: list[torch.Tensor], retain_graph: bool) -> None:
    """One term's backward to the input embeddings: the module hooks see every layer's gradient on the way."""
    if total.requires_grad:
        torch.autograd.grad(total, leaves, retain_graph=retain_graph, allow_unused=True)


def fast_gradients(model: nn.Module, batch: Batch, loss_fn: LossFn, weights: torch.Tensor, slices: list[str],
                   derived: dict[str, dict[str, float]] | None = None, keep_grads: bool = False) -> GradStats:
    """One forward, one backward per term; per-slice gradients reduced in module hooks.

    ``loss_fn(model, batch)`` returns each term's per-token loss; the engine multiplies it by the
    aggregation weights ω of ``loss_fn.agg`` (so ``Σ_i W[s,i] Σ_t ω·term`` is slice s's loss).
    ``weights`` is ``[S, N]``.
    """
    derived = derived or {}
    if len(weights) == 0:  # nothing to measure: no pass at all, as the reference engine does
        return reference_gradients(model, batch, loss_fn, weights, slices, derived, keep_grads)
    # Order rows by the first slice they belong to, so disjoint slices become contiguous row ranges.
    owner = torch.where(weights != 0, torch.arange(len(weights))[:, None], len(weights)).min(0).values
    perm = torch.sort(owner, stable=True).indices
    batch, weights = batch.select(perm), weights[:, perm]
    why = fast_unsupported(model)
    if why:
        raise NotImplementedError(f"{why}; use analysis.method=reference")
    reducer = _SliceReducer(model, weights.to(next(model.parameters()).device))
    stats = GradStats(slices + list(derived), {}, {}, row_order=perm)
    params = [p for p in model.parameters() if p.requires_grad]
    names_in_order = [reducer.names[id(p)] for p in params]

    def on_term(term: str, total: torch.Tensor, leaves: list[torch.Tensor], retain_graph: bool) -> None:
        full, gram = _streamed_term(reducer, total, leaves, params, derived, slices, keep_grads, retain_graph)
        stats.gram[term] = gram
        if keep_grads:
            stats.grads[term] = {name: full[name] for name in names_in_order}

    run_terms(model, batch, loss_fn, reducer, on_term)
    return stats


def _streamed_term(reducer: _SliceReducer, total: torch.Tensor, leaves: list[torch.Tensor], params: list,
                   derived: dict[str, dict[str, float]], slices: list[str], keep_grads: bool, retain_graph: bool
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One term's backward, each parameter's slice gradients reduced over ranks and folded into the Gram as
    soon as its modules' hooks have all run (``_SliceReducer.flush``): what is held at once is the slice
    gradients of the modules in flight, one layer's at most, not the model's. Every rank flushes the
    parameters in the same order (the backward's), then those the backward never reached, in ``params`` order.
    """
    finish = stream(reducer, derived, slices, keep_grads)
    try:
        backward(total, leaves, retain_graph)
    finally:
        reducer.flush = None
    return finish(params)


def stream(reducer: _SliceReducer, derived: dict[str, dict[str, float]], slices: list[str], keep_grads: bool
           ) -> Callable[[list], tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
    """Sets ``reducer`` to fold each parameter's slice gradients into the Gram as they complete (``_streamed_term``);
    returns ``finish(params)``, to call after the backward: the parameters the backward never reached get zero
    gradients, and it gives ``(kept gradients, {layer group: Gram})``."""
    full: dict[str, torch.Tensor] = {}
    gram: dict[str, torch.Tensor] = {}
    done: set[int] = set()

    def flush(k: int, g: torch.Tensor) -> None:
        done.add(k)
        kept, part = _gram({reducer.names[k]: g}, derived, slices, reducer.scale, keep_grads)
        full.update(kept)
        for grp, m in part.items():
            gram[grp] = gram[grp] + m if grp in gram else m

    def finish(params: list) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        reducer.flush = None
        for p in params:
            g = reducer.acc.pop(id(p), None)
            if g is not None or id(p) not in done:  # also a tied weight's rows at the tokens whose part came alone
                flush(id(p), g if g is not None else torch.zeros(len(slices), *p.shape, device=p.device))
        return full, gram

    reducer.acc, reducer.remaining, reducer.flush = {}, {}, flush
    reducer.block_elements = None if keep_grads else BLOCK_ELEMENTS
    return finish


def reference_gradients(model: nn.Module, batch: Batch, loss_fn: LossFn, weights: torch.Tensor, slices: list[str],
                        derived: dict[str, dict[str, float]] | None = None, keep_grads: bool = False) -> GradStats:
    """Each slice as its own sub-batch: a forward and a backward per term, plain autograd."""
    derived = derived or {}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    per_term: dict[str, dict[str, list[torch.Tensor]]] = {}
    for w in weights:
        rows = torch.nonzero(w).squeeze(-1)
        if len(rows) == 0:
            # (A rank holding) no row of this slice: a zero-loss blank row gives its zero gradient and, unlike
            # a real row at weight 0, adds nothing to what forward hooks observe (activation statistics).
            sub, rows, w = batch.blank_rows(1), torch.zeros(1, dtype=torch.long), torch.zeros(1)
        else:
            sub = batch.select(rows)
        first = _weighted_terms(loss_fn, model, sub)
        for j, term in enumerate(first):
            # a forward per term, as RAGEN's per-component backward passes do
            per_token = first[term] if j == 0 else _weighted_terms(loss_fn, model, sub)[term]
            loss = (per_token * w[rows].to(per_token.device, per_token.dtype)[:, None]).sum()
            gs = (torch.autograd.grad(loss, [p for _, p in named], allow_unused=True) if loss.requires_grad
                  else [None] * len(named))
            store = per_term.setdefault(term, {n: [] for n, _ in named})
            for (n, p), g in zip(named, gs):
                store[n].append(torch.zeros_like(p, dtype=torch.float32) if g is None else g.detach().float())
    stats = GradStats(slices + list(derived), {}, {})
    for term, store in per_term.items():
        grads = {n: torch.stack(v) for n, v in store.items()}
        full, gram = _gram(grads, derived, slices, keep=keep_grads)
        stats.gram[term] = gram
        if keep_grads:
            stats.grads[term] = full
    return stats


def slice_gradients(method: str, model: nn.Module, batch: Batch, loss_fn: LossFn, weights: torch.Tensor,
                    slices: list[str], derived: dict[str, dict[str, float]] | None = None,
                    keep_grads: bool = False) -> GradStats:
    """The gradients of every slice's loss (``fast`` or ``reference``): what every instrument calls.

    A batch with no row (a rank holding none of the rows under data parallel) runs one zero-loss blank
    row, so the engine's collectives stay in step. ``fast`` on a model its hooks do not cover warns and
    runs ``reference`` (the same numbers, slower). The global RNG streams are left as they were.
    """
    if method not in ("fast", "reference"):
        raise ValueError(f"unknown analysis.method '{method}' (fast | reference)")
    if len(batch) == 0:
        batch, weights = batch.blank_rows(1), weights.new_zeros(len(weights), 1)
    if method == "fast":
        why = fast_unsupported(model)
        if why and is_sharded(model):
            raise NotImplementedError(f"{why}, and analysis.method=reference needs a plain (unsharded) module")
        if why:
            warnings.warn(f"{why}; falling back to analysis.method=reference", stacklevel=2)
            method = "reference"
    elif is_sharded(model):  # autograd of the sharded parameters would be zero: FSDP2 computes with unsharded ones
        raise NotImplementedError("analysis.method=reference needs a plain (unsharded) module; use fast")
    engine = fast_gradients if method == "fast" else reference_gradients
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # nothing random should happen
        return engine(model, batch, loss_fn, weights, slices, derived, keep_grads)
