"""Per-row gradient norms from the gradient engine's hooks (``engine.py``), never a backward per row.

With the loss ``Σ_i Σ_t ω_it ℓ_it`` (rows never interact in a forward), row i's gradient is
``g_i = Σ_t ∂(ω_it ℓ_it)/∂θ``. The engine's module hooks see each layer's input ``x_it`` and output
gradient ``δ_it`` for every row at once, which is all a per-row norm needs:

    Linear     ||Σ_t δ_t x_tᵀ||² = Σ_{t,t'} (δ_t·δ_t')(x_t·x_t')     (ghost norm: Goodfellow 2015, Li et al. 2022)
               or the row's own weight gradient, a chunk of rows at a time, whichever costs less:
               T²·(in + out) against T·in·out multiply-adds per row;
    bias       ||Σ_t δ_t||²;
    Embedding  ||Σ_v (Σ_{t: id_t = v} δ_t)²||: δ summed per (row, token id), padding_idx left out;
    norms      ||Σ_t δ_t ⊙ x̂_t||² (and the bias's);
    tied input/output embeddings: ||E_i + L_i||² = ||E_i||² + ||L_i||² + 2<E_i, L_i> with
               <E_i, L_i> = Σ_{s,t} δᴸ_{s, id_t} (x_s·δᴱ_t) (s: the output layer's positions, t: the input's).

The reducer also keeps the engine's slice gradients for the prompt groups (disjoint slices: together one weight
gradient per layer; equal groups in order, as GRPO makes them, in one batched product per layer) and folds each
parameter's into a group Gram matrix as soon as all of its contributions have arrived, so no more than one
layer's group gradients (and never a per-row gradient of more than one layer, a chunk of rows) exist at a time.
Where a Linear's rows' own weight gradients are formed anyway (the ghost norm costs more), its group gradients
and a side's slices are sums of them instead (``_by_rows``). An embedding's group gradients are formed at the token
ids the batch holds only, a tied output layer's rows at those ids added to them and its other rows folded by
blocks (``engine._present_rows``). Sums of rows over any union of groups (a bucket, the batch) follow from it.
The ghost norms' input Grams x·xᵀ are taken once per forward input: the Linears that read one input (q/k/v,
gate/up) and every term's backward share them. The last backward of a forward (the only one, riding on an update,
whose graph outlives it) drops each with its input once every Linear that read that input is served.

Data parallel: each rank's hooks see only its own rows, so its per-row norms are exact as they are; a prompt
group's gradient sum is not (a group may be split over ranks, and the Gram pairs groups of different ranks), so
each parameter's group gradients are summed over ranks (``collectives.all_reduce_sum``, in the backward's order
on every rank, as the slice engine does) before they enter the Gram. Under FSDP2 the hooks see a layer's
unsharded parameter, mapped to the registered one (``_SliceReducer.alias``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from torch import nn

from rlgrad import collectives
from rlgrad.analysis.engine import BLOCK_ELEMENTS, ROW_CHUNK_ELEMENTS, Rows, _SliceReducer
from rlgrad.metrics import layer_group


def _rows3(t: torch.Tensor) -> torch.Tensor:
    """``[N, ..., d]`` as ``[N, T, d]`` (float tensors) or ``[N, T]`` (token ids)."""
    return t.reshape(t.shape[0], -1, t.shape[-1]) if t.is_floating_point() else t.reshape(t.shape[0], -1)


def ghost_is_cheaper(tokens: int, fan_in: int, fan_out: int) -> bool:
    """Per row, the ghost norm costs T²·(in + out) multiply-adds, the row's own weight gradient T·in·out."""
    return tokens * (fan_in + fan_out) < fan_in * fan_out


def input_gram(x3: torch.Tensor) -> torch.Tensor:
    """``[N, T, T]``: each row's ``x_t·x_t'``, the input half of a ghost norm."""
    x3 = x3.float()
    return torch.bmm(x3, x3.transpose(1, 2))


def linear_row_sq(g3: torch.Tensor, x3: torch.Tensor, x_gram: Callable[[], torch.Tensor] | None = None
                  ) -> torch.Tensor:
    """``[N]``: each row's ``||Σ_t δ_t x_tᵀ||²`` from ``δ [N, T, out]`` and ``x [N, T, in]``. ``x_gram``: where the
    ghost norm is chosen, gives ``input_gram(x3)`` (a cached one: Linears that share an input share it)."""
    g3 = g3.float()
    if ghost_is_cheaper(g3.shape[1], x3.shape[-1], g3.shape[-1]):
        xx = x_gram() if x_gram is not None else input_gram(x3)
        # float32 products, summed per row in float64 (the T² terms may cancel)
        return (torch.bmm(g3, g3.transpose(1, 2)) * xx).flatten(1).sum(1, dtype=torch.float64)
    x3 = x3.float()
    step = max(1, ROW_CHUNK_ELEMENTS // (g3.shape[-1] * x3.shape[-1]))
    return torch.cat([row_sq(torch.bmm(g3[i:i + step].transpose(1, 2), x3[i:i + step]))
                      for i in range(0, g3.shape[0], step)])


def row_sq(per_row: torch.Tensor) -> torch.Tensor:
    """``[N]`` float64: each row's squared norm of ``per_row`` ``[N, ...]`` (float32). A sum of squares cancels
    nothing, so float32 accumulation (BLAS-style, in blocks) holds it to about 1e-7; a float64 copy of every row's
    gradient cost 13x as much (4.5 against 0.35 ms for 128 rows x 128 x 128)."""
    return torch.linalg.vector_norm(per_row.reshape(len(per_row), -1), dim=1).double().pow(2)


def embedding_row_sq(g3: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[N]``: each row's squared embedding-gradient norm, δ ``[N, T, d]`` summed per (row, token id)."""
    n = g3.shape[0]
    pair = (ids + vocab * torch.arange(n, device=ids.device)[:, None]).reshape(-1)
    uniq, inverse = torch.unique(pair, return_inverse=True)
    sums = torch.zeros(len(uniq), g3.shape[-1], dtype=torch.float64, device=g3.device)
    sums.index_add_(0, inverse, g3.reshape(-1, g3.shape[-1]).double())
    return torch.zeros(n, dtype=torch.float64, device=g3.device).index_add_(0, uniq // vocab, sums.pow(2).sum(-1))


def _where(x: torch.Tensor) -> tuple:
    """An input's identity while it is alive: its storage and layout (Linears that read it share its Gram)."""
    return x.data_ptr(), tuple(x.shape), x.stride(), x.dtype


class RowNormReducer(_SliceReducer):
    """The engine's reducer, slices = the prompt groups (``weights [P, N]``, 0/1, rows sorted by group), that
    also takes every row's squared gradient norm per layer group.

    After a backward: ``row_sq[layer group]`` ``[N]`` and ``gram[layer group]`` ``[P, P]`` (float64), both of
    the unnormalised loss ``Σ_i Σ_t ω ℓ``; ``reset()`` empties them for the next term. Data parallel: ``P`` is
    every rank's groups, ``row_sq`` this rank's rows, ``gram`` global (the same on every rank).
    """

    def __init__(self, model: nn.Module, weights: torch.Tensor, leaf_embeddings: bool = True, rows: int | None = None):
        """``rows``: the first rows of every module's input and output gradient are the ones read, the others carry no
        gradient (a riding update's rows whose advantages are all 0, in groups left out of ``weights``, placed last
        by ``groups.UpdatePass.arrange``): nothing is formed for them, their norms are 0 (``row_norms_of``)."""
        if rows is not None:
            if bool(weights[:, rows:].any()):
                raise ValueError("rows past the ones read cannot belong to a group")
            weights = weights[:, :rows]
        self.read = rows
        # False: the prompt groups' Gram alone (``row_sq`` stays empty), for a term whose per-row norms no instrument
        # asks for at this step (``groups.py``: the bucket analysis and the reward components share the pass)
        self.row_norms = True
        super().__init__(model, weights, leaf_embeddings=leaf_embeddings)
        self.group_names = {k: layer_group(n) for k, n in self.names.items()}
        self.row_group = weights.argmax(0)  # [N]: each row's prompt group
        self.one_group_each = bool(((weights != 0).sum(0) == 1).all())
        # Ghost norms' input Grams x·xᵀ, by input storage: they depend on the forward only, so Linears that read one
        # input (q/k/v, gate/up) and every term's backward share one. Smaller than that input where the ghost norm
        # is chosen (T < in·out / (in + out) < in), and the input itself is kept by the backward's graph anyway.
        self.x_grams: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        # ... dropped (with their input) once every Linear that read the input in the forward (``readers``) has had
        # its backward, in a backward that does not retain the graph (``unserved``: per backward)
        self.readers: dict[tuple, int] = defaultdict(int)
        # A Linear with one use has its group gradients formed and folded a block of rows at a time (``_blocks``):
        # P groups x an LM head's weight at once would be P copies of it.
        self.block_elements = BLOCK_ELEMENTS
        # Set (``sum_groups``): every parameter's gradient, the sum of its group gradients, formed as they fold.
        self.sums: dict[int, torch.Tensor] | None = None
        self.shapes: dict[int, torch.Size] = {}
        self.basis: _SliceReducer | None = None  # ``attach_basis``
        self.basis_mix: torch.Tensor | None = None  # ``attach_basis``: the basis slices' part on the groups, [r, P]
        self.reset()

    def reset(self) -> None:
        self.row_sq: dict[str, torch.Tensor] = {}
        self.gram: dict[str, torch.Tensor] = {}
        self.seen: dict[int, int] = defaultdict(int)
        self.tied: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.acc = {}
        self.acc_at: dict[int, Rows] = {}
        self.unserved: dict[tuple, int] = {}
        # With a basis side: each parameter's pieces waiting for their partner (groups', basis'), and the joint Gram
        self.waiting: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        self.joint: dict[str, torch.Tensor] = {}

    def _watch(self, mod: nn.Module, fn: Callable, prep: Callable | None = None, leaf_only: bool = False,
               late: Callable | None = None) -> None:
        super()._watch(mod, fn, self._read if isinstance(mod, nn.Linear) else prep, leaf_only, late)

    def _read_rows(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.read is None else t.narrow(0, 0, self.read)

    def row_norms_of(self, group: str, rows: int) -> torch.Tensor:
        """``row_sq[group]`` over all ``rows`` rows of the modules' inputs (0 past the ones read: ``read``)."""
        sq = self.row_sq[group]
        return sq if len(sq) == rows else torch.cat([sq, sq.new_zeros(rows - len(sq))])

    def attach_side(self, weights: torch.Tensor) -> _SliceReducer:
        """``_SliceReducer.attach_side`` on the rows read (``read``): the side's rows past them must weigh 0."""
        if self.read is not None:
            if bool(weights[:, self.read:].any()):
                raise ValueError("a side slice weighs rows past the ones read")
            weights = weights[:, :self.read]
        return super().attach_side(weights)

    def _read(self, m: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """A Linear's input in the forward, counted (``readers``)."""
        self.readers[_where(x)] += 1
        return x

    def _on_grad(self, module: nn.Module, attrs: list[tuple[str, int]], fn: Callable, x: torch.Tensor,
                 g: torch.Tensor) -> None:
        super()._on_grad(module, attrs, fn, x, self._read_rows(g))
        if isinstance(module, nn.Linear):
            where = _where(x)
            self.unserved[where] = self.unserved.get(where, self.readers[where]) - 1
            if self.unserved[where] <= 0 and not self.retains:
                self.x_grams.pop(where, None)  # (a later reader, were there one, would form it again)

    def _arrived(self, k: int) -> bool:
        """Count one module's contribution to parameter ``k``; True once all its modules have contributed."""
        self.seen[k] += 1
        if self.seen[k] > len(self.owners[k]):
            raise NotImplementedError(f"per-sample norms: parameter {self.names[k]} was used more than once in "
                                      "the forward (a module called twice); its per-row norm is not a sum of parts")
        return self.seen[k] == len(self.owners[k])

    def sum_groups(self, model: nn.Module) -> None:
        """Form every parameter's gradient too, as the sum of its group gradients (``sums``, float32): the groups
        partition the rows, so it is the batch's gradient up to float32 rounding (``groups.UpdatePass``: the update's
        own, which autograd then need not form)."""
        if not self.one_group_each or not bool((self.weights.sum(0) == 1).all()):
            raise ValueError("the sum of the group gradients is the batch's gradient only for 0/1 groups that "
                             "partition the rows")
        self.sums, self.shapes = {}, {id(p): p.shape for p in model.parameters() if id(p) in self.names}

    def _fold(self, k: int, per_group: torch.Tensor, at: Rows = None) -> None:
        """``per_group`` (``[P, ...]``, parameter ``k``'s group gradients at its rows ``at``) into the group Gram
        (and into its gradient: ``sum_groups``; with a basis side, their sum joins its piece: ``_join``). float32
        products (summed by BLAS in blocks): a float64 copy of every group gradient cost more than the weight
        gradients themselves at the bench's shapes."""
        flat = collectives.all_reduce_sum(per_group.reshape(len(self.weights), -1))
        self._into(self.gram, self.group_names[k], (flat @ flat.t()).double())
        joining = self.joining
        if self.sums is None and not joining:
            return
        summed = per_group.sum(0)
        if joining:  # T, and the basis slices' part on the groups (``attach_basis``): local, summed over ranks there
            self._join(k, 0, torch.cat([summed.reshape(1, -1), self.basis_mix @ per_group.reshape(len(per_group), -1)]))
        if self.sums is None:
            return
        total = self.sums.get(k)
        if at is None and total is None:  # the whole parameter, its first piece (a tied head's comes before its rows
            self.sums[k] = summed         # at the tokens: the embedding's backward is the last)
            return
        if total is None:
            total = self.sums[k] = torch.zeros(self.shapes[k], dtype=torch.float32, device=per_group.device)
        if at is None:
            total.add_(summed)
        elif isinstance(at, tuple):
            total.narrow(0, *at).add_(summed)
        else:
            total.index_add_(0, at.to(total.device), summed)

    def attach_basis(self, weights: torch.Tensor, by_group: torch.Tensor) -> _SliceReducer:
        """A side of basis slices B_j = ``Σ_p by_group[j, p] G_p`` + the slice of ``weights`` ``[r, N]`` (the rest of
        ``groups.Side.basis_by_group``; ``by_group`` ``[r, P]`` on this reducer's groups). Every piece of a parameter
        joins the groups' sum T over the same rows of it, into the float64 Gram of T and the B_j (``joint``): the
        cross products ⟨T, B_j⟩ the side's other slices need. Its blocks are the groups' (``block_slices``), so both
        give a parameter's pieces alike and in the same order."""
        if by_group.shape != (len(weights), len(self.weights)):
            raise ValueError(f"the basis slices' part on the groups is {tuple(by_group.shape)}, not "
                             f"{(len(weights), len(self.weights))}")
        self.basis_mix = by_group.to(self.weights.device, torch.float32)
        side = self.attach_side(weights)
        side.block_slices, side.block_elements = len(self.weights), self.block_elements
        side.acc, side.remaining = {}, {}
        side.flush = lambda k, piece: self._join(k, 1, piece.reshape(len(piece), -1) * side.scale.to(piece)[:, None])
        self.basis = side
        return side

    @property
    def joining(self) -> bool:
        """Whether the backward under way feeds a basis side (``attach_basis``), whose pieces join the groups'."""
        return self.side is not None and self.side is self.basis

    def _join(self, k: int, which: int, flat: torch.Tensor) -> None:
        """A piece of parameter ``k``: from the groups (``which`` 0, ``[1 + r, n]``: their sum T, the basis slices'
        part on them) or from the side (1, ``[r, n]``: the basis slices' rest); each pair of pieces (of the same rows)
        folds into the joint Gram ``[1 + r, 1 + r]`` of T and the B_j."""
        waiting = self.waiting.setdefault(k, ([], []))
        waiting[which].append(flat)
        while waiting[0] and waiting[1]:
            groups, rest = waiting[0].pop(0), waiting[1].pop(0)
            if groups.shape[1] != rest.shape[1]:
                raise RuntimeError(f"parameter {self.names[k]}: the groups' and the basis slices' pieces differ")
            self._fold_joint(k, groups[:1], groups[1:] + rest)

    def _fold_joint(self, k: int, total: torch.Tensor, basis: torch.Tensor) -> None:
        flat = total.new_empty(1 + len(basis), total.shape[1], dtype=torch.float64)
        flat[:1].copy_(total)  # (each piece converted as it is copied: no float32 concatenation first)
        flat[1:].copy_(basis)
        flat = collectives.all_reduce_sum(flat)
        self._into(self.joint, self.group_names[k], flat @ flat.t())

    def settle(self) -> None:
        """After a backward with a basis side: its pieces still summing (a parameter some call of whose modules never
        had a backward) join, and any piece without a partner pairs with zeros."""
        if self.basis is None:
            return
        for k in list(self.basis.acc):
            self.basis.flush(k, self.basis.acc.pop(k))
        for k, (groups, rests) in self.waiting.items():
            for flat in groups:
                self._fold_joint(k, flat[:1], flat[1:])
            for flat in rests:
                self._fold_joint(k, flat.new_zeros(1, flat.shape[1]), flat)
        self.waiting = {}

    def _add(self, p: nn.Parameter, per_slice: torch.Tensor, whole: bool = True, at: Rows = None) -> None:
        """A contribution to ``p``'s group gradients; the Gram once all its modules have contributed. A block of rows
        of a parameter with one use (``_blocks``: its group gradients over ``block_elements`` at once) goes into the
        Gram as it is: the Gram adds over disjoint blocks."""
        k = self._key(p)
        if k not in self.names:
            return
        if not whole:
            self._fold(k, per_slice, at)
            return
        done = self._arrived(k)
        super()._add(p, per_slice)
        self.acc_at[k] = at  # (a tied weight's two parts lie at the same rows)
        if done:
            self._fold(k, self.acc.pop(k), self.acc_at.pop(k))

    def _key(self, p: nn.Parameter) -> int:
        """The registered parameter's id (FSDP2: ``p`` may be the unsharded parameter the module holds now)."""
        return self.alias.get(id(p), id(p))

    @staticmethod
    def _into(store: dict[str, torch.Tensor], group: str, value: torch.Tensor) -> None:
        store[group] = store[group] + value if group in store else value

    def _row(self, p: nn.Parameter | None, sq: torch.Tensor) -> None:
        if p is not None and self._key(p) in self.names:
            self._into(self.row_sq, self.group_names[self._key(p)], sq.double())

    def _tied_embedding(self, p: nn.Parameter) -> nn.Embedding | None:
        """The input embedding that shares ``p`` with a Linear (tied input/output embeddings), if any."""
        owners = self.owners.get(self._key(p), [])
        if len(owners) == 1:
            return None
        emb = [m for m in owners if isinstance(m, nn.Embedding)]
        if len(owners) != 2 or len(emb) != 1:
            raise NotImplementedError(f"per-sample norms: parameter {self.names[self._key(p)]} is shared by "
                                      f"{len(owners)} modules; only a tied Embedding + Linear pair is supported")
        return emb[0]

    def _input_gram(self, x: torch.Tensor, x3: torch.Tensor) -> torch.Tensor:
        where = _where(x)
        if where not in self.x_grams:  # (x kept with its Gram: its storage cannot be reused meanwhile)
            self.x_grams[where] = (x, input_gram(x3))
        return self.x_grams[where][1]

    def _linear(self, m: nn.Linear, x: torch.Tensor, g: torch.Tensor) -> bool:
        """The weight's group gradients and side slices each from their own product of δ and x (its per-row norm
        from the ghost norm); the bias's all three from its rows' own gradients Σ_t δ_t (``_from_rows``), in the order
        of ``_by_rows`` (this reducer's weight and bias, then the side's: the sums over ranks are collectives, called
        alike on every rank). Returns True: the side's slices are given."""
        g3, x3 = _rows3(g.detach()), _rows3(x)
        if self._from_row_gradients(m, g3, x3):
            return self._by_rows(m, g3, x3)
        self._linear_weight(m, x, g)
        if self.row_norms:
            self._row(m.weight, linear_row_sq(g3, x3, lambda: self._input_gram(x, x3)))
            emb = self._tied_embedding(m.weight) if self._key(m.weight) in self.names else None
            if emb is not None:  # δᴸ at the input's token ids, for the cross term at the embedding's backward
                ids = _rows3(self.ids[id(emb)])
                picked = g3.gather(2, ids[:, None, :].expand(-1, g3.shape[1], -1))  # [N, T_out, T_in]
                self.tied[self._key(m.weight)] = (picked, x3)
        bias_rows = self._bias(m, g3)
        if self.side is not None:
            _SliceReducer._linear_weight(self.side, m, x, g)
            if bias_rows is not None:
                self._side_from_rows(m.bias, bias_rows)
        return True

    def _bias(self, m: nn.Linear, g3: torch.Tensor) -> torch.Tensor | None:
        """A Linear's bias from its rows' own gradients Σ_t δ_t (``_from_rows``); those ``[N, out]``, for the side's
        slices (None: no bias)."""
        if m.bias is None:
            return None
        per_row = g3.float().sum(1)
        self._from_rows(m.bias, per_row)
        return per_row

    def _from_row_gradients(self, m: nn.Linear, g3: torch.Tensor, x3: torch.Tensor) -> bool:
        """Whether this Linear's group gradients, per-row norms and side slices all come from its rows' own weight
        gradients h_i (``_by_rows``): where the per-row norm forms the h_i anyway (the ghost norm costs more: long
        rows against the layer's width), the weight is not tied and its group gradients fit in one block. The
        groups' own product over their tokens (and, for shuffled rows, their gather) and the side's own products are
        saved. Where the ghost norm is cheaper the h_i are not formed at all: with few tokens per row, writing
        rows x in x out floats costs more than the products (measured: 2.9x a plain step against 1.9x at the
        embedded default's 10 tokens a row)."""
        k = self._key(m.weight)
        if not (self.row_norms and self.one_group_each and k in self.names and len(self.owners.get(k, [])) == 1
                and len(self.weights) * m.weight.numel() <= self.block_elements
                and not ghost_is_cheaper(g3.shape[1], x3.shape[-1], g3.shape[-1])):
            return False
        # the side's slices Σ_i w_si h_i: exact unless a slice's weight is folded into its Gram; one block, as its own
        # path would flush them (the same collectives on a rank that takes that path)
        side = self.side
        return side is None or (side.place is None and not any(side.folded) and (
            side.block_elements is None or len(side.weights) * m.weight.numel() <= side.block_elements))

    def _by_rows(self, m: nn.Linear, g3: torch.Tensor, x3: torch.Tensor) -> bool:
        """Each row's weight gradient h_i = Σ_t δ_t x_tᵀ, a chunk of rows at a time, gives all three: the group
        gradients Σ_{i∈k} h_i (added by each row's group, in any row order), ||h_i||², and the side's overlapping
        slices Σ_i w_si h_i. Biases the same way from Σ_t δ_t. Returns True: the side's slices are given."""
        P, (out, fan_in), rows = len(self.weights), m.weight.shape, g3.shape[0]
        groups = torch.zeros(P, out, fan_in, dtype=torch.float32, device=g3.device)
        side = None if self.side is None else torch.zeros(len(self.side.weights), out * fan_in, dtype=torch.float32,
                                                          device=g3.device)
        sq = []
        step = max(1, ROW_CHUNK_ELEMENTS // (out * fan_in))
        for i in range(0, rows, step):
            h = torch.bmm(g3[i:i + step].float().transpose(1, 2), x3[i:i + step].float())  # [chunk, out, in]
            groups.index_add_(0, self.row_group[i:i + step], h)
            sq.append(row_sq(h))
            if side is not None:
                side.addmm_(self.side.weights_f32[:, i:i + step], h.view(len(h), -1))
        # in the order of the other path (this reducer's weight and bias, then the side's), which another rank may
        # take (its rows' length or groups differ): the sums over ranks are collectives, called alike on every rank
        self._add(m.weight, groups)
        self._row(m.weight, torch.cat(sq))
        bias_rows = self._bias(m, g3)
        if side is not None:
            self.side._add(m.weight, side.view(-1, out, fan_in))
            if bias_rows is not None:
                self._side_from_rows(m.bias, bias_rows)
        return True

    def _embedding(self, m: nn.Embedding, ids: torch.Tensor, g: torch.Tensor) -> None:
        super()._embedding(m, ids, g)  # the group gradients, at the batch's token ids (``_present_rows``)
        g3, ids3 = _rows3(g.detach()), _rows3(ids)
        if m.padding_idx is not None:  # autograd never updates the padding row
            g3 = g3 * (ids3 != m.padding_idx).unsqueeze(-1).to(g3.dtype)
        if not self.row_norms:
            return
        sq = embedding_row_sq(g3, ids3, m.weight.shape[0])
        if self._key(m.weight) in self.tied:
            picked, x_out = self.tied.pop(self._key(m.weight))
            cross = torch.bmm(x_out.float(), g3.float().transpose(1, 2)).double() * picked.double()
            sq = sq + 2 * cross.sum((1, 2))
        self._row(m.weight, sq)

    def _norm(self, m: nn.Module, xh: torch.Tensor, g: torch.Tensor) -> bool:
        """A norm's rows' own gradients are small (``[N, dim]``: Σ_t δ_t ⊙ x̂_t, and Σ_t δ_t for a bias): the group
        gradients, the per-row norms and the side's slices all come from them, one product of δ and x̂ for the three.
        Returns True: the side's slices are given."""
        g3, x3 = _rows3(g.detach()).float(), _rows3(xh).float()
        per_row = {m.weight: (g3 * x3).sum(1)}
        if getattr(m, "bias", None) is not None:
            per_row[m.bias] = g3.sum(1)
        for p, rows in per_row.items():  # (this reducer's weight and bias, then the side's: as ``_linear``)
            self._from_rows(p, rows)
        for p, rows in per_row.items() if self.side is not None else ():
            self._side_from_rows(p, rows)
        return True

    def _from_rows(self, p: nn.Parameter, per_row: torch.Tensor) -> None:
        """Parameter ``p``'s group gradients and per-row norms from its rows' own gradients ``per_row`` ``[N, ...]``."""
        self._add(p, self.reduce_weights @ per_row)
        if self.row_norms:
            self._row(p, per_row.double().pow(2).sum(-1))

    def _side_from_rows(self, p: nn.Parameter, per_row: torch.Tensor) -> None:
        """The side's slices of parameter ``p`` from its rows' own gradients ``per_row``."""
        self.side._add(p, self.side.reduce_weights @ per_row)
