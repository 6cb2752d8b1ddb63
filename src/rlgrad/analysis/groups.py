"""The prompt-group pass: ONE engine pass (one forward, one backward per loss term) with the prompt groups as
slices, which the instruments due at one step share (the per-sample norms, the bucket analysis, the reward
components; issue 49).

``group_pass`` gives, per term, every row's squared gradient norm and the Gram matrix of the prompt groups' gradient
sums per layer group (``rows.RowNormReducer``), both of the unnormalised loss ``Σ_i Σ_t ω ℓ``, and keeps the
forward's loss output. Every bucket is a union of prompt groups and its loss the groups' losses over its
denominator, so a bucket's gradient is ``Σ_{g ∈ b} G_g / D_b`` and the buckets' Gram is ``A K Aᵀ`` with
``A[b, g] = 1/D_b`` (``buckets.analyse_buckets`` with ``groups=``): the same numbers as the bucket engine's own
pass, from the pass the per-sample norms run anyway. (Not under RAGEN's ``dp_trim``: a trimmed bucket is no longer
a union of whole groups; the bucket analysis then runs its own pass.)

The reward components (``components.py``) ride on the same backward where that is exact: the task term's
per-token gradient is ``A_i`` times the unit loss's (``ActorTerms.task_unit``), so with one advantage per
response, component c's gradient ``Σ_i (A_c,i / D) h_i`` is ``Σ_i (A_c,i / (A_i D)) g_i`` of the rows' task
gradients g_i, provided no row with ``A_i = 0`` has a component advantage (its g_i is 0); a ``Side`` of those
weights is reduced on the task backward (``_SliceReducer.attach_side``). Where a row breaks that, the components
run their own pass. Where those weights are one number per prompt group on the rows with a gradient (one component
varies: its advantage is the update's), the slices are combinations of the groups' gradients and their Grams come
from the groups' (``Side.from_groups``): no slice is reduced on the backward.

verl's variance proxy is read from the same forward (a hook on the LM head, ``logit_grad_sq``).

``SharedPass`` hands one step's pass from the hook that ran it to the others due at that step on that batch.
Memory: the groups' gradients of a large Linear are formed by blocks of rows and an input embedding's at the
batch's tokens only, a tied LM head's rows there joining them (``rows.RowNormReducer``, ``engine._present_rows``):
never a group's dense vocabulary x hidden gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlgrad.algos.aggregation import denominator
from rlgrad.algos.objective import FunctionLoss, LossFn
from rlgrad.analysis.engine import (
    BLOCK_ELEMENTS,
    GradStats,
    _SliceReducer,
    backward,
    run_terms,
    stream,
    with_derived,
)
from rlgrad.analysis.instrument import Deferred, fast_unsupported_at
from rlgrad.analysis.rows import RowNormReducer
from rlgrad.batch import Batch
from rlgrad.collectives import all_gather_cat, all_reduce_max, all_reduce_sum
from rlgrad.hooks import Schedule, StepContext
from rlgrad.metrics import key


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
    side: GradStats | None = None  # the side slices' Grams (``group_pass``'s ``side``), term ``task``
    proxy_tokens: torch.Tensor | None = None  # [N, L] (batch order): ``logit_grad_sq`` of the pass's forward


def logged_values(out: dict) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """A loss output's logged per-token values (detached) and their coefficients in the total: the loss's
    ``logged`` / ``total`` (``rlgrad.loss.Terms``), else its terms, each with coefficient 1."""
    logged = getattr(out, "logged", None) or {k: v.detach() for k, v in out.items()}
    return {k: v.detach() for k, v in logged.items()}, getattr(out, "total", None) or {k: 1.0 for k in logged}


# How far a side weight may vary within a prompt group and still count as one number (``Side.from_groups``): the
# weights are ratios of float32 advantages (a component's over the update's), equal up to a few float32 roundings
GROUP_CONSTANT_RTOL = 1e-5


@dataclass
class Side:
    """More slices of the ``task`` term reduced on the same backward: ``weights`` ``[S, N]`` (batch order) on
    the rows' task gradients, ``slices`` their names and ``derived`` linear combinations of them (``engine``).
    ``carrying`` ``[N]``: the rows whose task gradient can be non-zero (``A_i ≠ 0``), where known; with it, slices
    whose weights are one number per prompt group on those rows come from the groups' Gram (``from_groups``)."""

    weights: torch.Tensor
    slices: list[str]
    derived: dict[str, dict[str, float]]
    carrying: torch.Tensor | None = None

    def from_groups(self, inverse: torch.Tensor, groups: int) -> torch.Tensor | None:
        """``V`` ``[S, P]`` with ``weights[s, i] = V[s, inverse[i]]`` on every carrying row of every rank (to within
        float32 rounding: ``GROUP_CONSTANT_RTOL``), else None. Then slice s is ``Σ_p V[s, p] G_p`` of the prompt
        groups' gradients and the slices' Gram is ``V K Vᵀ`` of the groups' Gram K: the backward reduces no slice of
        its own (one weight gradient per slice saved). The case of a single reward component that varies, whose
        advantage is then the update's own: its weight on the task rows is 1/D everywhere. Every rank decides alike
        (data parallel: ``inverse`` indexes every rank's groups)."""
        if self.carrying is None:
            return None
        V, constant = self._per_group(self.weights, inverse, groups)
        return V if bool(constant.all()) else None

    def _per_group(self, weights: torch.Tensor, inverse: torch.Tensor, groups: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Of ``weights`` ``[S, N]`` on the carrying rows, per slice and group: the one number they are there
        (within ``GROUP_CONSTANT_RTOL``; 0 where they vary, or where the group has no carrying row: its gradient is 0,
        any number does) ``[S, P]``, and where they are one number ``[S, P]`` (every rank's rows: alike on every
        rank)."""
        rows = self.carrying.cpu()
        w = weights.detach().cpu().double()[:, rows]
        at = inverse.cpu()[rows].expand(len(w), -1)
        hi = torch.full((len(w), groups), -math.inf, dtype=torch.float64).scatter_reduce(1, at, w, "amax")
        lo = torch.full((len(w), groups), math.inf, dtype=torch.float64).scatter_reduce(1, at, w, "amin")
        hi, lo = all_reduce_max(hi), -all_reduce_max(-lo)
        held = hi >= lo
        constant = ~held | (hi - lo <= GROUP_CONSTANT_RTOL * torch.maximum(hi.abs(), lo.abs()))
        return torch.where(held & constant, (hi + lo) / 2, 0.0), constant

    def basis_by_group(self, basis: torch.Tensor, inverse: torch.Tensor, groups: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """The basis slices' weights ``basis`` ``[r, N]`` (``SideSplit.basis``, batch order) as ``by_group[:, inverse]``
        plus ``rest``: on the carrying rows of a group where a slice's weights are one number ``by_group`` ``[r, P]``
        holds it and ``rest`` ``[r, N]`` is 0; on a group where they vary ``by_group`` is 0 and ``rest`` holds them
        (0 on every row that carries no gradient). Basis slice j is then ``Σ_p by_group[j, p] G_p`` of the groups'
        gradients plus the slice of ``rest``, reduced on the backward over the rows of the groups where the reward
        components vary against each other: a few of the live groups, where one weight-gradient product over every
        live row was."""
        by_group, constant = self._per_group(basis, inverse, groups)
        at = inverse.cpu()
        rest = torch.where(constant[:, at] | ~self.carrying.cpu(), 0.0, basis.detach().cpu().double())
        return by_group, rest.to(basis.dtype)

    def grams_from_groups(self, V: torch.Tensor, group_grams: dict[str, torch.Tensor]) -> GradStats:
        """The slices' (and derived slices') Grams per layer group from the groups' (``from_groups``), or, for ``V``
        ``[S, 1 + r]`` (``SideSplit.mix`` with a basis), from the joint Gram of the groups' sum and the basis slices."""
        A = with_derived(self.derived, self.slices) @ V
        return GradStats(self.slices + list(self.derived), {"task": {g: A @ K @ A.t() for g, K in group_grams.items()}})

    def split(self, inverse: torch.Tensor, groups: int) -> SideSplit | None:
        """The slices from the prompt groups' gradients where they can be (``from_groups``), else from the groups' sum
        T (the update's gradient, at hand) and as few of the slices themselves as the rest need (``SideSplit``);
        None where the carrying rows are not known or no slice is saved.

        On the carrying rows each slice's weights are ``a_s · 1 + Σ_j R[s, j] w_{b_j}`` for the basis slices b_j,
        chosen greedily from the smallest weights up (a slice whose weights lie within ``GROUP_CONSTANT_RTOL`` of
        the span of 1 and those before it, in norm, stays out). Under shared_std the components' advantages add up
        to the update's, so their weights add up to 1/D on every carrying row: of K components that vary, K - 1 are
        reduced on the backward and the largest is T/D minus them (a small one formed so would be a difference of
        large ones, its float32 rounding theirs). Every slice's reconstruction is checked row by row, to that
        tolerance of the row's largest weight. Every rank decides alike (Gram and maxima over ranks; a rank holding
        no row adds zeros)."""
        V = self.from_groups(inverse, groups)
        if V is not None:
            return SideSplit(V, self.weights.new_zeros(0, self.weights.shape[1]))
        if self.carrying is None:
            return None
        rows = self.carrying.cpu().double()
        w = torch.cat([rows[None], self.weights.detach().cpu().double() * rows])  # [1 + S, N]: 1, then the slices
        gram = all_reduce_sum(w @ w.t())
        carried = float(gram[0, 0])
        scale = all_reduce_max(_row_max(w[1:].abs()))
        basis = [0]
        for s in sorted(range(1, len(w)), key=lambda s: float(gram[s, s])):
            left = gram[s, s] - gram[s, basis] @ torch.linalg.solve(gram[basis][:, basis], gram[basis, s])
            if float(left) > (GROUP_CONSTANT_RTOL * float(scale[s - 1])) ** 2 * carried:
                basis.append(s)
        if len(basis) == len(w):
            return None
        mix = torch.linalg.solve(gram[basis][:, basis], gram[basis]).t()[1:]  # [S, 1 + r]
        row_scale = w[1:].abs().amax(0)
        off = all_reduce_max(_row_max((w[1:] - mix @ w[basis]).abs() - GROUP_CONSTANT_RTOL * row_scale))
        if bool((off > 0).any()):
            return None
        return SideSplit(mix, self.weights[[s - 1 for s in basis[1:]]])


def _row_max(t: torch.Tensor) -> torch.Tensor:
    """Each row's largest entry, 0 for a row of no entries (a rank that holds no row of the batch)."""
    return t.amax(1) if t.shape[1] else t.new_zeros(len(t))


@dataclass
class SideSplit:
    """``Side.split``. No ``basis`` (r = 0): slice s is ``Σ_p mix[s, p] G_p`` of the prompt groups' gradients, its
    Gram from theirs. Else slice s is ``mix[s, 0] T + Σ_j mix[s, 1 + j] B_j`` of the groups' sum T and of the
    slices B_j of weights ``basis`` ``[r, N]`` (batch order), reduced on the backward beside the groups
    (``RowNormReducer.attach_basis``), the Gram of T and the B_j (``joint``) formed there in float64."""

    mix: torch.Tensor
    basis: torch.Tensor

    def by_group(self, side: Side, inverse: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``Side.basis_by_group`` of the basis: what the backward reduces of it beside the groups."""
        if not len(self.basis):
            return self.basis.new_zeros(0, groups, dtype=torch.float64), self.basis
        return side.basis_by_group(self.basis, inverse, groups)


# verl's proxy, where it runs its own no-grad forwards: rows per forward for at most this many logits (64 MB in fp32:
# 10 rows of SmolLM2's 49,152-word vocabulary at 32 tokens; the embedded default's whole batch in one forward)
PROXY_CHUNK_ELEMENTS = 1 << 24


def logit_grad_sq(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[n, L]``: at column t, ``1 − 2π(y_t) + Σ_v π(v)²`` (the squared norm of ∂log π(y_t)/∂logits, verl's
    variance proxy per token) from ``logits`` ``[n, K, V]`` at the last K positions (temperature 1); columns
    before ``L − K + 1`` are 0. A few rows at a time (``BLOCK_ELEMENTS`` logits: inside the pass's forward its
    temporaries add to the activations held)."""
    n, K, V = logits.shape
    L = ids.shape[1]
    out = torch.zeros(n, L, dtype=torch.float32, device=logits.device)
    step = max(1, BLOCK_ELEMENTS // max(K * V, 1))
    for i in range(0, n, step):
        probs = torch.softmax(logits[i:i + step, :-1].float(), dim=-1)
        picked = probs.gather(-1, ids[i:i + step, L - K + 1:, None]).squeeze(-1)
        out[i:i + step, L - K + 1:] = 1 - 2 * picked + probs.pow(2).sum(-1)
    return out


def lm_head(model: nn.Module) -> nn.Module | None:
    """The model's output embeddings (its LM head) as a module, or None (a model without ``get_output_embeddings``)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head if isinstance(head, nn.Module) else None


def _proxy_tap(model: nn.Module, ids: torch.Tensor, into: list) -> Callable[[], None] | None:
    """A forward hook on the model's LM head that puts ``logit_grad_sq`` of its output in ``into``: verl's proxy from
    the pass's own forward. None (no hook) for a model without ``get_output_embeddings``; returns the remover."""
    head = lm_head(model)
    if head is None:
        return None
    handle = head.register_forward_hook(lambda m, args, out: into.append(logit_grad_sq(out.detach(), ids)))
    return handle.remove


def group_pass(model: nn.Module, batch: Batch, loss_fn: LossFn, side: Side | None = None, proxy: bool = False,
               row_terms: Collection[str] | None = None) -> GroupPass:
    """Every term of ``loss_fn``: per-row squared norms and the prompt groups' Gram, from one forward and one
    backward per term (module docstring); with ``side``, also the Grams of those slices of the ``task`` term,
    reduced by the same backward (``GroupPass.side``); with ``proxy``, verl's per-token proxy from its forward's
    LM-head output (``GroupPass.proxy_tokens``; None where the model has no ``get_output_embeddings``);
    ``row_terms``: the terms whose per-row norms are formed (None: every term; the others' ``GroupPass.rows`` are
    absent: their groups' Grams alone). A rank holding no row runs one blank row (``Batch.blank_rows``: zero loss)
    in the collectives. Data parallel: every rank calls it."""
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
    split = side.split(inverse, groups) if side is not None else None
    extra = None
    if side is not None:
        by_group, side_weights = (None, side.weights) if split is None else split.by_group(side, inverse, groups)
        side_weights = side_weights if n else side_weights.new_zeros(len(side_weights), 1)
        extra = _attach(reducer, side_weights[:, perm].to(device), split, by_group)
    params = [p for p in model.parameters() if p.requires_grad]
    side_stats = GradStats(side.slices + list(side.derived), {}) if side is not None else None
    rows: dict[str, dict[str, torch.Tensor]] = {}
    grams: dict[str, dict[str, torch.Tensor]] = {}
    back = torch.argsort(perm)
    seen: list[tuple] = []

    def capture(m: nn.Module, b: Batch) -> dict[str, torch.Tensor]:
        out = loss_fn(m, b)
        seen.append(logged_values(out))  # detached: the pass keeps no graph
        return out

    joint: dict[str, dict[str, torch.Tensor]] = {}

    def on_term(term: str, total: torch.Tensor, leaves: list[torch.Tensor], retain_graph: bool) -> None:
        finish = _start_term(reducer, term, row_terms, extra, side)
        try:
            backward(total, leaves, retain_graph)
        finally:
            reducer.side = None
        if finish is not None:
            side_stats.gram["task"] = finish(params)[1]
        _read_term(reducer, term, rows, grams, back, n, groups, joint=joint)

    taps = _run(model, batch.select(perm), FunctionLoss(capture, loss_fn.agg), reducer, on_term, proxy)
    if split is not None:
        side_stats = side.grams_from_groups(split.mix, joint.get("task") or grams["task"])
    proxy_tokens = taps[0].cpu()[back][:n] if taps else None
    return GroupPass(group_ids, inverse, rows, grams, *seen[0], perm, side_stats, proxy_tokens)


def _start_term(reducer: RowNormReducer, term: str, row_terms: Collection[str] | None, extra: _SliceReducer | None,
                side: Side | None) -> Callable | None:
    """Readies ``reducer`` for one term's backward: its per-row norms where asked for, the side slices on the task
    term; returns the side's ``finish`` (``engine.stream``) where it rides along."""
    reducer.acc = {}
    reducer.row_norms = row_terms is None or term in row_terms
    reducer.side = extra if term == "task" else None
    if reducer.side is None or reducer.joining:  # (a basis side's pieces join the groups')
        return None
    return stream(extra, side.derived, side.slices, False)


def _attach(reducer: RowNormReducer, weights: torch.Tensor, split: SideSplit | None,
            by_group: torch.Tensor | None = None) -> _SliceReducer | None:
    """The side reducer of ``weights`` (run order) on ``reducer``'s backward: the side's own slices (no
    ``split``), its basis slices' rest beside their part ``by_group`` on the reducer's groups
    (``RowNormReducer.attach_basis``), or none (a split without basis)."""
    if split is None:
        return reducer.attach_side(weights)
    return reducer.attach_basis(weights, by_group) if len(weights) else None


def _read_term(reducer: RowNormReducer, term: str, rows: dict, grams: dict, back: torch.Tensor, n: int, groups: int,
               scale: float = 1.0, joint: dict | None = None, kept: torch.Tensor | None = None) -> None:
    """What one term's backward left in ``reducer``: per-row norms (batch order, ``back`` undoing the run's order)
    and the groups' Gram per layer group, times ``scale``² (``rows[term]``, ``grams[term]``; with a basis side, the
    joint Gram too: ``joint[term]``); empties it. ``kept``: the groups the reducer's slices are, of ``groups`` (the
    others' gradients are 0: ``UpdatePass.around``)."""
    reducer.settle()
    layer_groups = sorted(set(reducer.group_names.values()))
    zeros_rows = torch.zeros(len(back), dtype=torch.float64)
    sq = scale * scale

    def all_groups(K: torch.Tensor) -> torch.Tensor:
        if kept is None:
            return K
        full = torch.zeros(groups, groups, dtype=torch.float64)
        full[kept[:, None], kept] = K
        return full

    if reducer.row_norms:
        rows[term] = {g: (reducer.row_norms_of(g, len(back)).cpu()[back] * sq if g in reducer.row_sq
                          else zeros_rows)[:n] for g in layer_groups}
    grams[term] = {g: all_groups(reducer.gram[g].cpu() * sq) if g in reducer.gram
                   else torch.zeros(groups, groups, dtype=torch.float64) for g in layer_groups}
    if joint is not None and reducer.joint:
        size = next(iter(reducer.joint.values())).shape[0]
        zeros_joint = torch.zeros(size, size, dtype=torch.float64)
        joint[term] = {g: reducer.joint[g].cpu() * sq if g in reducer.joint else zeros_joint for g in layer_groups}
    reducer.reset()


def _run(model: nn.Module, run: Batch, loss_fn: LossFn, reducer: RowNormReducer, on_term: Callable, proxy: bool
         ) -> list[torch.Tensor]:
    """The engine's passes (``run_terms``) with the RNG streams left as they were; with ``proxy``, what the LM-head
    tap took from the forward (``_proxy_tap``)."""
    device = next(model.parameters()).device
    taps: list[torch.Tensor] = []
    untap = _proxy_tap(model, run.input_ids.to(device), taps) if proxy else None
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # nothing random happens
            run_terms(model, run, loss_fn, reducer, on_term)
    finally:
        if untap is not None:
            untap()
    return taps


class SharedPass:
    """One step's ``GroupPass`` for the instruments that can use it (``hooks_from_config`` gives them one).

    ``users``: each user's steps and the loss terms it needs (None: every term). At a step where at least two users
    are due (``serves``), the first to run runs the pass (``pass_for``) with every due user's terms, the reward
    components' slices as its ``side``, and the others take it: one forward and one backward per term for all.

    Where the loop's actor update takes its first optimizer step over the whole batch in one forward and backward
    (``StepContext.one_pass_update``) and that loss is the task term alone, the pass rides on the update's own
    forward and backward instead (``UpdatePass``, also for a single user): ``pass_for`` raises ``Deferred`` before
    the update, and after it hands out what the update's backward left. The numbers are the pass's own (the same
    gradients, at the weights before the update), and the update is bitwise unchanged (the hooks only read).
    """

    def __init__(self, users: dict[str, tuple[Schedule, Sequence[str] | None]], proxy: bool = False) -> None:
        """``proxy``: the pass also takes verl's proxy from its forward (at the per-sample norms' steps)."""
        self.users, self.proxy = users, proxy
        self.kept: tuple[int, int, GroupPass] | None = None
        self.planned: UpdatePass | None = None
        self.dropped: int | None = None  # a step whose update will not run (``drop``)
        self.ride_known: tuple[StepContext, bool] | None = None  # ``rides_on_update`` for a step: a walk of the model

    def serves(self, step: int, user: str, one_pass: bool = False) -> bool:
        """Whether ``user``'s measurement at ``step`` goes through the shared pass: it and another user are due, or
        (``one_pass``: ``rides``, and the user can wait) it alone, the pass then riding on the update."""
        due = [u for u, (at, _) in self.users.items() if at.due(step)]
        return user in due and (len(due) > 1 or one_pass)

    def pass_for(self, step: int, model: nn.Module, batch: Batch, loss_fn: LossFn, side: Side | None = None,
                 one_pass: bool = False) -> GroupPass | None:
        """The step's pass on ``batch``: the one kept, else a new one (kept for the next user); None where this user
        cannot wait for a pass planned on the update: then it runs its own. ``one_pass`` (``rides``:
        the user can wait for it too): the pass is planned on the update's backward and ``Deferred`` raised (the
        class docstring)."""
        if self.kept is not None and self.kept[:2] == (step, id(batch)):
            return self.kept[2]
        # (a plan of this step on another batch was left by an attempt that failed before its update: replaced)
        if self.planned is not None and self.planned.step == step and self.planned.batch is batch:
            if not one_pass:  # this user cannot wait for the update: its own pass, now
                return None
            self.planned.side = self.planned.side or side
            raise Deferred
        at, row_terms = self.users.get("per_sample", (None, ()))
        per_sample = at is not None and at.due(step)
        wanted = [terms for at, terms in self.users.values() if at.due(step)]
        keep = {t for terms in wanted for t in terms} if all(terms is not None for terms in wanted) else None
        rows = row_terms if per_sample else ()
        if one_pass:
            self.planned = UpdatePass(self, step, batch, loss_fn, keep, side, self.proxy and per_sample, rows)
            raise Deferred
        found = group_pass(model, batch, checked(loss_fn if keep is None else only_terms(loss_fn, keep)), side,
                           self.proxy and per_sample, row_terms=rows)
        self.kept = (step, id(batch), found)
        return found

    def rides(self, ctx: StepContext) -> bool:
        """Whether this step's pass can ride on its update: a one-pass update (``StepContext.one_pass_update``) whose
        loss is the task term alone (``rides_on_update``), and not dropped (``drop``)."""
        if not ctx.one_pass_update or self.dropped == ctx.step:
            return False
        if self.ride_known is None or self.ride_known[0] is not ctx:  # asked by every user, before and after
            self.ride_known = (ctx, rides_on_update(ctx, self.proxy))
        return self.ride_known[1]

    def drop(self, step: int) -> None:
        """No update will run at ``step``: its plan is dropped, and the users take a pass of their own before it."""
        self.planned, self.dropped = None, step

    def tap(self, step: int) -> UpdatePass | None:
        """The pass planned on the update of ``step`` (``hooks.UpdateTap``), if any."""
        return self.planned if self.planned is not None and self.planned.step == step else None


def rides_on_update(ctx: StepContext, proxy: bool = False) -> bool:
    """Whether the step's prompt-group pass can ride on the backward of a one-pass update: a loss whose update's
    backward is the task term's alone (``task_alone()``: rlgrad's actor loss or TRL's, without an entropy bonus or a
    KL term) and that reads a forward's per-token parts (``of``), on a model the fast engine covers (asked once a step:
    ``instrument.fast_unsupported_at``); with verl's ``proxy``, one with an LM head to read it from (else the proxy's
    own forwards would run after the update)."""
    loss_fn = ctx.actor_loss()
    task_alone = getattr(loss_fn, "task_alone", None)
    return (task_alone is not None and task_alone() and hasattr(loss_fn, "of") and not fast_unsupported_at(ctx)
            and (not proxy or lm_head(ctx.actor) is not None))


class UpdatePass:
    """The prompt-group pass riding on the actor update's first forward and backward (``hooks.UpdateTap``): the same
    ``RowNormReducer`` as ``group_pass``, its hooks reading the update's graph (the embeddings' outputs left in it),
    the side slices on the same backward, verl's proxy from the same LM-head output. The update's loss is the task
    term over its denominator D (``Aggregation.weights``), so what the hooks see is 1/D of the pass's unnormalised
    loss: its per-row norms and Grams are scaled by D². ``seen`` takes the update forward's per-token parts, which
    the loss's ``of`` turns into its terms (rlgrad's ``ActorTerms``; TRL's, from ``TRLLoss.fused_head``)."""

    def __init__(self, shared: SharedPass, step: int, batch: Batch, loss_fn: LossFn, keep: set[str] | None,
                 side: Side | None, proxy: bool, row_terms: Collection[str] | None) -> None:
        self.shared, self.step, self.batch, self.loss_fn, self.keep = shared, step, batch, loss_fn, keep
        self.side, self.proxy, self.row_terms = side, proxy, row_terms
        self.terms: Any = None
        self.active = False

    def seen(self, terms: Any) -> None:
        if self.active and self.terms is None:
            self.terms = terms

    def _groups(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's prompt groups ``[P]``, each row's place in them ``[N]``, and which groups are live ``[P]``: hold
        a row with an advantage not 0. A row whose every advantage is 0 has a task gradient of exactly 0 (``∇loss_t =
        A_t·∇u_t``, ``algos.surrogates``), so a group of such rows adds nothing to the update or to any slice."""
        group_ids = torch.unique(self.batch.group_ids.cpu())
        inverse = torch.searchsorted(group_ids, self.batch.group_ids.cpu())
        carrying = ((self.batch.advantages * self.batch.response_mask).cpu() != 0).any(-1)
        live = torch.zeros(len(group_ids), dtype=torch.bool).index_fill_(0, inverse[carrying], True)
        return group_ids, inverse, live

    def arrange(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` by prompt group (stably), the groups that are not live last (``_groups``): the reducer then reads
        each live group's rows as one contiguous block (``_SliceReducer.tiled``), with no gather of every hooked
        module's input and output gradient, and the others' not at all (``RowNormReducer``'s ``rows``)."""
        _, inverse, live = self._groups()
        group_of = inverse[rows.cpu()]
        key = group_of + len(live) * (~live[group_of]).long()
        return torch.sort(key, stable=True).indices.to(rows.device)

    @contextmanager
    def around(self, model: nn.Module, mb: Batch, rows: torch.Tensor) -> Iterator[Callable[[torch.Tensor], None]]:
        batch, order = self.batch, rows.cpu()
        if len(order) != len(batch) or not torch.equal(order.sort().values, torch.arange(len(batch))):
            raise RuntimeError(f"the update's first micro-batch holds {len(order)} of the batch's {len(batch)} rows: "
                               "the prompt-group pass planned on it needs them all (StepContext.one_pass_update)")
        group_ids, inverse, live = self._groups()
        group_of = inverse[order]
        # Arranged (the live groups' rows first), only those are read and only the live groups are slices
        read = int(live[group_of].sum())
        arranged = 0 < read < len(order) and bool(live[group_of[:read]].all())
        kept = torch.nonzero(live).squeeze(-1) if arranged else torch.arange(len(group_ids))
        slot = torch.full((len(group_ids),), -1, dtype=torch.long).index_copy_(0, kept, torch.arange(len(kept)))
        weights = torch.zeros(len(kept), len(order))
        in_kept = slot[group_of] >= 0
        weights[slot[group_of][in_kept], torch.nonzero(in_kept).squeeze(-1)] = 1.0
        device = next(model.parameters()).device
        reducer = RowNormReducer(model, weights.to(device), leaf_embeddings=False, rows=read if arranged else None)
        split = self.side.split(inverse, len(group_ids)) if self.side is not None else None
        extra = None
        if self.side is not None:
            by_group, side_weights = (None, self.side.weights) if split is None else split.by_group(
                self.side, inverse, len(group_ids))
            extra = _attach(reducer, side_weights[:, order].to(device), split,
                            None if by_group is None else by_group[:, kept])
        finish = _start_term(reducer, "task", self.row_terms, extra, self.side)
        taps: list[torch.Tensor] = []
        untap = _proxy_tap(model, mb.input_ids.to(device), taps) if self.proxy else None
        self.active = True
        try:
            yield lambda loss: self.backward(model, reducer, loss)  # the update's forward and backward
        except BaseException:
            # the update failed: a retry of its step plans anew (its batch, its forward's terms), not on this plan
            if self.shared.planned is self:
                self.shared.planned = None
            raise
        finally:
            self.active, reducer.side = False, None
            reducer.close()
            if untap is not None:
                untap()
        self._keep(model, reducer, finish, split, taps, group_ids, inverse, order, kept if arranged else None)

    @staticmethod
    def backward(model: nn.Module, reducer: RowNormReducer, loss: torch.Tensor) -> None:
        """The update's backward, run by the tap (rlgrad's trainer; TRL runs its own): to the hooked modules'
        outputs only (``_SliceReducer.edges``), so autograd forms no parameter gradient, and every parameter's
        gradient is the sum of the group gradients the hooks form anyway (``RowNormReducer.sum_groups``): the
        update's gradient up to float32 rounding (summed group by group, not in one product), for one weight
        gradient less. Under a reentrant activation checkpoint (``ungraded``) autograd's own backward runs, which the
        hooks read as they read TRL's."""
        if reducer.ungraded or not bool(torch.isfinite(loss)):
            # (non-finite: autograd's own gradient, non-finite where it is, also from rows the hooks do not read)
            loss.backward()
            return
        reducer.sum_groups(model)
        torch.autograd.backward(loss, inputs=reducer.edges)
        for p in model.parameters():
            total = reducer.sums.pop(id(p), None)
            if total is not None and p.grad is None:
                p.grad = total.to(p.dtype)

    def _keep(self, model: nn.Module, reducer: RowNormReducer, finish: Callable | None, split: SideSplit | None,
              taps: list[torch.Tensor], group_ids: torch.Tensor, inverse: torch.Tensor, order: torch.Tensor,
              kept: torch.Tensor | None) -> None:
        """The ``GroupPass`` the update's backward left, kept by the shared pass for the step's users."""
        _, u = self.loss_fn.agg.weights(self.batch.response_mask)
        scale = denominator(float(u.sum()))
        back = torch.argsort(order)
        side_stats = None
        if finish is not None:
            side_stats = GradStats(self.side.slices + list(self.side.derived), {})
            grams = finish([p for p in model.parameters() if p.requires_grad])[1]
            side_stats.gram["task"] = {g: k * scale * scale for g, k in grams.items()}
        rows: dict[str, dict[str, torch.Tensor]] = {}
        grams_of: dict[str, dict[str, torch.Tensor]] = {}
        joint: dict[str, dict[str, torch.Tensor]] = {}
        _read_term(reducer, "task", rows, grams_of, back, len(order), len(group_ids), scale, joint=joint, kept=kept)
        if split is not None:
            side_stats = self.side.grams_from_groups(split.mix, joint.get("task") or grams_of["task"])
        out = self.loss_fn.of(self.terms)
        if self.keep is not None:
            out = {k: v for k, v in out.items() if k in self.keep}
        found = GroupPass(group_ids, inverse, rows, grams_of, *logged_values(out), order, side_stats,
                          taps[0].cpu()[back] if taps else None)
        self.shared.kept, self.shared.planned = (self.step, id(self.batch), found), None


def only_terms(loss_fn: LossFn, terms: set[str]) -> LossFn:
    """``loss_fn`` with only ``terms`` (the engine backwards every term it returns)."""
    return FunctionLoss(lambda model, batch: {k: v for k, v in loss_fn(model, batch).items() if k in terms},
                        loss_fn.agg)


def checked(loss_fn: LossFn, seen: list | None = None) -> FunctionLoss:
    """``loss_fn`` failing on a term no metric key can hold, before any backward; ``seen`` gets each forward's
    loss values (``logged_values``)."""
    def fn(model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        out = loss_fn(model, batch)
        for term in out:
            key("grad_norm/{bucket}/{term}", bucket="all", term=term)
            key("grad_norm_sample/{bucket}/{term}", bucket="all", term=term)
        if seen is not None:
            seen.append(logged_values(out))
        return out
    return FunctionLoss(fn, loss_fn.agg)
