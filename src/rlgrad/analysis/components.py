"""Gradient geometry of reward components: how correctness, format and length pull on the policy.

With one advantage per response (GRPO, RLOO, REINFORCE++-baseline, REINFORCE++ with γ = 1), A_i, the policy
loss's gradient is, token by token, A_i times the gradient of a "unit" loss u (``core.policy_loss``):

    ∇L_pg = Σ_i (A_i / D) Σ_t ω_it ∇u_it            (ω, D: the loss aggregation, ``agg_token_weights``)

So any split of A_i into per-component advantages A_c,i splits the gradient the same way, and ALL
the component gradients come from one engine call: rows weighted W[c, i] = A_c,i / D, one forward,
one backward (``analysis.engine``). Two splits:

* ``shared_std``: A_c,i = w_c (r_c,i − mean_g r_c) / (std_g(total) + eps), the GRPO advantage with the
  total reward's group std (RLOO: the leave-one-out baseline of w_c r_c; REINFORCE++(-baseline): the batch
  whitening of w_c r_c (less its group mean) with the total's token std). Linear in the reward, so
  Σ_c A_c = A exactly and Σ_c g_c is the update's policy gradient; ``total`` is that sum. (A group whose
  total reward is constant has A = 0, and all its A_c are set to 0.)
* ``own_std``: A_c = the advantage estimator applied to the unweighted component reward alone (GRPO:
  divided by the component's own group std), as rldynamic's custom_main_ppo.py does. The components no
  longer add up; ``total`` is the update's own advantage, as one more slice.

Reported: norms, pairwise cosines (all trainable parameters, and per layer group), and each
component's share of the update, share_c = <g_c, g_total> / |g_total|² (the shares sum to 1 in
``shared_std``). The clip decisions (PPO, GSPO's per-sequence clip) are those of the update's own advantage, so
the split stays exact under clipping; the gradients are
the policy-loss gradients before clipping of the gradient norm. No optimizer step is taken; weights,
optimizer state, ``.grad`` and RNG streams are left as they were.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlgrad import collectives
from rlgrad.algos.advantages import sequence_scores
from rlgrad.algos.aggregation import denominator
from rlgrad.algos.component_advantages import component_advantages, per_sequence_advantage
from rlgrad.algos.objective import FunctionLoss, LossFn, LossSettings, as_loss_fn, as_unit_loss
from rlgrad.analysis.engine import GradStats, layer_group, slice_gradients
from rlgrad.analysis.groups import SharedPass, Side
from rlgrad.analysis.instrument import InstrumentHook, fast_unsupported_at
from rlgrad.analysis.writer import BackgroundWriter, _stderr
from rlgrad.batch import Batch
from rlgrad.hooks import HookResult, Schedule, StepContext
from rlgrad.metrics import COMPONENTS, key

if TYPE_CHECKING:
    from rlgrad.config.analysis import ComponentAnalysisConfig

TERM = "task"  # the policy loss per unit of advantage: the term the component split measures


@dataclass
class ComponentReport:
    metrics: dict[str, float]  # grad_sim/<a>__<b>, grad_comp/<c>/norm|share, grad_comp/total/norm
    summary: dict[str, Any]  # the content of analysis/step_N/components.json (without "step")
    stats: GradStats  # slices: components..., total
    advantages: dict[str, torch.Tensor]  # component -> [N]; "total" -> the update's [N] advantage


def _with_zero_slices(stats: GradStats, model, slices: list[str], keep: bool) -> GradStats:
    """``stats`` over ``slices``: the slices it lacks get zero gradients (Gram rows and columns of 0)."""
    idx = torch.tensor([slices.index(x) for x in stats.slices], dtype=torch.long)
    S = len(slices)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    gram = {g: torch.zeros(S, S, dtype=torch.float64) for g in dict.fromkeys(layer_group(n) for n, _ in params)}
    for g, m in stats.gram.get(TERM, {}).items():
        gram[g][idx[:, None], idx[None, :]] = m.to("cpu", torch.float64)
    grads = {}
    if keep:
        for n, p in params:
            full = torch.zeros(S, *p.shape, dtype=torch.float32, device=p.device)
            if n in stats.grads.get(TERM, {}):
                full[idx.to(p.device)] = stats.grads[TERM][n].to(p.device, torch.float32)
            grads[n] = full
    return GradStats(list(slices), {TERM: gram}, {TERM: grads} if keep else {}, stats.row_order)


def _geometry(gram: torch.Tensor, slices: list[str], names: list[str]) -> dict[str, dict[str, float | None]]:
    """Norms, pairwise cosines of the components and shares of ``total`` from one Gram matrix."""
    k = {s: i for i, s in enumerate(slices)}
    norm = {s: float(gram[k[s], k[s]].clamp_min(0).sqrt()) for s in slices}

    def cos(a: str, b: str) -> float | None:
        d = norm[a] * norm[b]
        return float(gram[k[a], k[b]]) / d if d > 0 else None

    tt = float(gram[k["total"], k["total"]])
    share = {c: (float(gram[k[c], k["total"]]) / tt if tt > 0 else None) for c in names}
    return {"norm": norm, "cosine": {f"{a}__{b}": cos(a, b) for a, b in combinations(names, 2)}, "share": share}


def analyse_components(model: nn.Module, batch: Batch, loss: LossFn | LossSettings | None = None, *,
                       weights: dict[str, float], mode: str = "shared_std", estimator: str = "grpo",
                       norm_by_std: bool = True, method: str = "fast", keep_grads: bool = False,
                       advantages: dict[str, torch.Tensor] | None = None,
                       shared: Callable[[Side], GradStats | None] | None = None) -> ComponentReport:
    """Every reward component's policy gradient (and ``total``) in one engine call, and their geometry.

    ``batch`` is prepared (old log-probs, advantages) exactly as the update sees it; ``weights`` the task's
    reward weights; ``estimator`` / ``norm_by_std`` the trainer's advantage settings. ``loss``: the policy
    loss PER UNIT OF ADVANTAGE as a ``LossFn`` (its terms summed; REINFORCE: ``-log π``; see the module
    docstring), or rlgrad's PPO / CISPO loss as an ``ActorLoss`` or its ``LossSettings`` (default: its
    defaults), whose unit loss is then used. ``advantages``: the training loop's own split of the update's
    advantage by component (``{component: [N]}``, summing to it, e.g. TRL's normalisation); default: the
    split ``mode`` / ``estimator`` / ``norm_by_std`` define (``component_advantages``). ``shared``: runs the
    prompt-group pass of ``loss`` with a ``Side`` and gives the side's Grams (``groups.py``; None: not run); used
    where that is exact (``loss`` has a ``unit()``, no row with a zero advantage has a component advantage; fast,
    no ``keep_grads``). Given only for a model the fast engine covers (``engine.fast_unsupported``: its caller asks,
    ``ComponentGeometryHook`` once a step, not here again).
    """
    has_unit = callable(getattr(as_loss_fn(loss), "unit", None))
    unit = as_unit_loss(loss)
    names = list(batch.components)
    if not names:
        raise ValueError("the batch carries no reward components")
    adv = per_sequence_advantage(batch)
    comp = advantages if advantages is not None else split_advantages(batch, weights, mode=mode, estimator=estimator,
                                                                      norm_by_std=norm_by_std)
    _, u = unit.agg.weights(batch.response_mask)
    denom = denominator(float(collectives.all_reduce_sum(u.sum().double())))  # the update's loss denominator
    rows = [comp[c] for c in names]
    slices, derived = list(names), {"total": {c: 1.0 for c in names}}
    if mode == "own_std":  # the components do not add up: the update's advantage is its own slice
        rows.append(adv)
        slices, derived = names + ["total"], {}
    W = torch.stack(rows).double().div(denom).float().reshape(len(rows), len(batch))

    exact = has_unit and method == "fast" and not keep_grads
    stats = _component_grams(model, batch, unit, W, adv, slices, derived, method, keep_grads,
                             shared if exact else None)
    # The engine summed every slice's gradient over ranks before forming its Grams: they are global already.
    stats = _with_zero_slices(stats, model, slices + list(derived), keep_grads)
    all_slices = stats.slices
    groups = stats.gram[TERM]
    total_gram = sum(groups.values())
    glob = _geometry(total_gram, all_slices, names)
    layers = {}
    for g in sorted(groups, key=_group_order):
        geo = _geometry(groups[g], all_slices, names)
        layers[g] = {"norm": geo["norm"], "cosine": geo["cosine"]}
    metrics: dict[str, float] = {}
    for c in names:
        metrics[key("grad_comp/{component}/norm", component=c)] = glob["norm"][c]
        if glob["share"][c] is not None:
            metrics[key("grad_comp/{component}/share", component=c)] = glob["share"][c]
    metrics["grad_comp/total/norm"] = glob["norm"]["total"]
    for pair, v in glob["cosine"].items():
        if v is not None:  # a zero gradient has no direction
            metrics[key("grad_sim/{pair}", pair=pair)] = v
    summary = {"mode": mode, "components": names, "global": glob, "layers": layers}
    return ComponentReport(metrics, summary, stats, {**comp, "total": adv})


def split_advantages(batch: Batch, weights: dict[str, float], *, mode: str = "shared_std", estimator: str = "grpo",
                     norm_by_std: bool = True) -> dict[str, torch.Tensor]:
    """The split of the update's advantage by component that ``analyse_components`` takes by default (``mode``,
    ``estimator``, ``norm_by_std``: its arguments); data parallel: a collective."""
    return component_advantages(
        batch.components, weights, sequence_scores(batch.scores, batch.token_rewards, batch.response_mask),
        batch.group_ids, mode=mode, estimator=estimator, norm_by_std=norm_by_std, response_mask=batch.response_mask,
        reduce=collectives.all_reduce_sum)


def _component_grams(model: nn.Module, batch: Batch, unit: LossFn, W: torch.Tensor, adv: torch.Tensor,
                     slices: list[str], derived: dict[str, dict[str, float]], method: str, keep_grads: bool,
                     shared: Callable[[Side], GradStats | None] | None) -> GradStats:
    """The live slices' gradient Grams: on the shared prompt-group pass where that is exact (``_on_task_rows``),
    else from the engine's own pass of the unit loss."""

    def one_term(m: nn.Module, b: Batch) -> dict[str, torch.Tensor]:
        return {TERM: sum(unit(m, b).values())}

    # A slice with no non-zero weight on any rank (a component constant in every group) has a zero gradient:
    # the engine only sees the others. Decided over all ranks: the engine's all-reduce has one size everywhere.
    live_any = collectives.all_reduce_sum(W.ne(0).any(1).to(torch.float64))
    live = [k for k in range(len(slices)) if float(live_any[k]) > 0]
    live_names = [slices[k] for k in live]
    live_derived = {d: {c: v for c, v in combo.items() if c in live_names} for d, combo in derived.items()}
    live_derived = {d: combo for d, combo in live_derived.items() if combo}
    if not live:
        return GradStats([], {})  # every advantage 0: every gradient is 0
    if shared is not None and _on_task_rows(W, adv):
        # the task term's row gradients are A_i times the unit loss's: weights W / A_i on them (groups.py)
        on_task = torch.where(adv != 0, W / torch.where(adv != 0, adv, 1.0).to(W.dtype), 0.0)
        stats = shared(Side(on_task[live], live_names, live_derived, carrying=adv != 0))
        if stats is not None:  # None: the shared pass was not run (groups.SharedPass.pass_for)
            return stats
    return slice_gradients(method, model, batch, FunctionLoss(one_term, unit.agg), W[live], live_names,
                           live_derived, keep_grads=keep_grads)


def _on_task_rows(W: torch.Tensor, adv: torch.Tensor) -> bool:
    """Whether no row with a zero advantage has a component advantage, on any rank (the same answer everywhere):
    then every component's gradient is a weighted sum of the rows' task gradients."""
    lost = (W[:, adv == 0] != 0).sum().to(torch.float64)
    return float(collectives.all_reduce_sum(lost)) == 0


def _group_order(g: str) -> tuple:
    if g == "embed":
        return (0, 0)
    if g.startswith("layer_") and g[6:].isdigit():
        return (1, int(g[6:]))
    return (2, {"final_norm": 0, "lm_head": 1}.get(g, 2), g)


class ComponentGeometryHook(InstrumentHook):
    """Reward-component gradient geometry at ``analysis.components`` steps, on the training batch
    before the actor update: metrics, ``analysis/step_N/components.json`` and, with
    ``analysis.components.save_gradients``, ``analysis/step_N/component_grads.npz`` (keys ``<slice>/<param>``)."""

    declared = COMPONENTS

    def __init__(self, settings: ComponentAnalysisConfig, schedule: Schedule, *, estimator: str, norm_by_std: bool,
                 method: str, log: Callable[[str], Any] = _stderr, shared: SharedPass | None = None):
        """``settings``: the ``analysis.components`` section; ``schedule``: the steps it runs at (``schedules(cfg)``'s
        ``components``); ``estimator`` / ``norm_by_std``: the run's advantage (``algorithm.adv_estimator``,
        ``algorithm.norm_adv_by_std_in_grpo``), which ``own_std`` applies to each component; ``method``: the
        gradient engine (``analysis.method``); ``shared``: the prompt-group pass it shares with the other
        instruments due at its step (``groups.py``)."""
        self.settings, self.schedule, self.log = settings, schedule, log
        self.shared = shared
        self.estimator, self.norm_by_std, self.method = estimator, norm_by_std, method
        self.writer = BackgroundWriter(log) if settings.save_gradients else None
        self.split: tuple[int, int, dict[str, torch.Tensor]] | None = None  # (step, id(batch), _split's answer)

    def measure(self, ctx: StepContext) -> tuple[HookResult, dict]:
        save = self.writer is not None
        split = self._split(ctx)
        shared = None
        ride = self.shared is not None and self.shared.rides(ctx)
        if self.shared is not None and self.shared.serves(ctx.step, "components", ride) \
                and not fast_unsupported_at(ctx):  # analyse_components' shared pass: the fast engine's
            def shared(side: Side) -> GradStats | None:
                found = self.shared.pass_for(ctx.step, ctx.actor, ctx.batch, ctx.actor_loss(), side, ride)
                return found.side if found is not None else None
        rep = analyse_components(ctx.actor, ctx.batch, ctx.actor_loss(), weights=ctx.reward_weights,
                                 mode=self.settings.mode, estimator=self.estimator, norm_by_std=self.norm_by_std,
                                 method=self.method, keep_grads=save, advantages=split, shared=shared)
        metrics = dict(rep.metrics)
        if ctx.is_main and save:
            grads = rep.stats.grads[TERM]
            arrays = {f"{sl}/{name}": g[k] for name, g in grads.items() for k, sl in enumerate(rep.stats.slices)}
            self.writer.submit(self.path(ctx, "component_grads.npz"), arrays)
        if save:
            metrics["grad_comp/save_failures"] = float(len(self.writer.failures))
        return HookResult(metrics=metrics), {"components.json": {"step": ctx.step, **rep.summary}}

    def _split(self, ctx: StepContext) -> dict[str, torch.Tensor]:
        """The advantage split by component of the step's batch: the loop's (``ctx.component_advantages``), else
        ``split_advantages``'. Worked out once a step (about 0.9 ms of the embedded default's): a measurement that
        rides on the update plans its side at ``before_update`` and is taken at ``after_update``, on the same batch
        (the update changes the weights, not the batch)."""
        if self.split is None or self.split[:2] != (ctx.step, id(ctx.batch)):
            split = ctx.component_advantages(ctx.batch) if ctx.component_advantages is not None else split_advantages(
                ctx.batch, ctx.reward_weights, mode=self.settings.mode, estimator=self.estimator,
                norm_by_std=self.norm_by_std)
            self.split = (ctx.step, id(ctx.batch), split)  # the id, not the batch: no step's batch kept alive
        return self.split[2]

    def close(self) -> None:
        if self.writer is None:
            return
        failed = self.writer.close()
        if failed:
            self.log(f"rlgrad: {len(failed)} component-gradient file(s) could not be written: "
                     + "; ".join(f"{p} ({e})" for p, e in failed))
