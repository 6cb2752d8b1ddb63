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

import io
import queue
import sys
import threading
import time
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlgrad import collectives
from rlgrad.analysis.cadence import schedules
from rlgrad.analysis.engine import GradStats, layer_group, slice_gradients
from rlgrad.batch import Batch
from rlgrad.config import OUTCOME_ESTIMATORS
from rlgrad.core import (
    Reduce,
    broadcast_to_tokens,
    compute_advantages,
    denominator,
    group_stats,
    grpo_advantages,
    rloo_advantages,
    sequence_scores,
    whiten_stats,
)
from rlgrad.hooks import Hook, HookResult, Schedule, StepContext
from rlgrad.loss import LossFn, LossSettings, PerTokenLoss, as_unit_loss
from rlgrad.metrics import key
from rlgrad.rundir import atomic_write_bytes, atomic_write_json

if TYPE_CHECKING:
    from rlgrad.config import RLGradConfig

MODES = ("shared_std", "own_std")
ESTIMATORS = OUTCOME_ESTIMATORS
TERM = "policy"


# ---- per-component advantages ------------------------------------------------------------------

def outcome_advantages(scores: torch.Tensor, group_ids: torch.Tensor, estimator: str, norm_by_std: bool,
                       response_mask: torch.Tensor | None = None, reduce: Reduce | None = None) -> torch.Tensor:
    """``[N]``: the trainer's advantage of per-sample scores (``core.compute_advantages``), one per response
    (reinforce_plus_plus with gamma 1). ``response_mask``: the whitening of REINFORCE++ weighs responses by length;
    ``reduce``: it whitens over the rows of every process."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"component advantages need one advantage per response ({', '.join(ESTIMATORS)}), "
                         f"got '{estimator}'")
    mask = response_mask if response_mask is not None else torch.ones(len(scores), 1)
    adv, _ = compute_advantages(estimator, scores, group_ids, mask, norm_by_std=norm_by_std, reduce=reduce)
    return row_values(adv, mask)


def component_advantages(components: dict[str, torch.Tensor], weights: dict[str, float], scores: torch.Tensor,
                         group_ids: torch.Tensor, *, mode: str, estimator: str, norm_by_std: bool,
                         eps: float = 1e-6, response_mask: torch.Tensor | None = None, reduce: Reduce | None = None
                         ) -> dict[str, torch.Tensor]:
    """``{c: [N]}`` per-component advantages (module docstring). ``scores`` is the total reward the update's
    advantage was computed from (Σ_c w_c r_c); ``response_mask`` is needed by the REINFORCE++ estimators, and
    ``reduce`` (``collectives.all_reduce_sum``) when the batch's rows are split over processes, as their whitening
    is over the whole batch."""
    if mode == "own_std":
        return {c: outcome_advantages(r.float(), group_ids, estimator, norm_by_std, response_mask, reduce)
                for c, r in components.items()}
    if mode != "shared_std":
        raise ValueError(f"unknown component mode '{mode}' ({' | '.join(MODES)})")
    missing = [c for c in components if c not in weights]
    if missing:
        raise ValueError(f"no reward weight for component(s) {', '.join(missing)}")
    if estimator == "rloo":  # linear in the reward: the baselines of w_c r_c add up to the total's
        return {c: rloo_advantages(weights[c] * r.float(), group_ids) for c, r in components.items()}
    if estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        return _whitened_split(components, weights, scores, group_ids, response_mask,
                               baseline=estimator.endswith("baseline"), reduce=reduce)
    if estimator != "grpo":
        raise ValueError(f"component advantages need one advantage per response ({', '.join(ESTIMATORS)}), "
                         f"got '{estimator}'")
    # GRPO: centre each weighted component in its group (a singleton keeps mean 0, as grpo_advantages does) ...
    out = {c: grpo_advantages(weights[c] * r.float(), group_ids, norm_by_std=False) for c, r in components.items()}
    if not norm_by_std:
        return out
    # ... and divide by the TOTAL reward's unbiased group std + eps (a singleton: std 1), grpo_advantages' convention.
    # A group whose total is constant has A = 0 exactly; its components get 0 as well (still a split of A):
    # components that vary but cancel would otherwise be blown up by 1/eps.
    _, std, size = group_stats(scores.float(), group_ids)
    std = torch.where(size <= 1, torch.ones_like(std), std)
    flat = (size > 1) & (std == 0)
    return {c: torch.where(flat, torch.zeros_like(a), a / (std + eps)) for c, a in out.items()}


def _whitened_split(components: dict[str, torch.Tensor], weights: dict[str, float], scores: torch.Tensor,
                    group_ids: torch.Tensor, response_mask: torch.Tensor | None, *, baseline: bool,
                    reduce: Reduce | None = None) -> dict[str, torch.Tensor]:
    """REINFORCE++(-baseline) split by component: whitening is x ↦ (x − μ)·rstd over the batch's response tokens,
    so A_c = (x_c − μ_c)·rstd(total), with x_c = w_c r_c (less its group mean with the baseline). Σ_c A_c = A."""
    if response_mask is None:
        raise ValueError("the REINFORCE++ component split needs the batch's response_mask")

    def tokens(x: torch.Tensor) -> torch.Tensor:
        x = grpo_advantages(x, group_ids, norm_by_std=False) if baseline else x
        return broadcast_to_tokens(x, response_mask)

    _, rstd = whiten_stats(tokens(scores.float()), response_mask, reduce=reduce)
    out = {}
    for c, r in components.items():
        x = tokens(weights[c] * r.float())
        out[c] = row_values(x - whiten_stats(x, response_mask, reduce=reduce)[0], response_mask) * rstd
    return out


def row_values(x: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[N, L]`` -> ``[N]``: each row's value at its first response token (0 for a row without one)."""
    mask = response_mask != 0
    first = mask.to(torch.int8).argmax(-1, keepdim=True)
    return x.gather(1, first).squeeze(1) * mask.any(-1)


def per_sequence_advantage(batch: Batch) -> torch.Tensor:
    """``[N]``: the advantage of each response; fails unless it is constant along the response."""
    mask = batch.response_mask != 0
    a = row_values(batch.advantages, batch.response_mask)
    spread = torch.where(mask, (batch.advantages - a[:, None]).abs(), 0.0)
    if mask.any() and float(spread.max()) > 1e-5 * (1.0 + float(a.abs().max())):
        raise ValueError("reward-component gradients need an advantage that is constant along each response "
                         f"(one per response: {', '.join(ESTIMATORS)}; reinforce_plus_plus with gamma 1)")
    return a


# ---- the analysis ------------------------------------------------------------------------------

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
    gram = {layer_group(n): torch.zeros(S, S, dtype=torch.float64) for n, _ in params}
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
                       advantages: dict[str, torch.Tensor] | None = None) -> ComponentReport:
    """Every reward component's policy gradient (and ``total``) in one engine call, and their geometry.

    ``batch`` is prepared (old log-probs, advantages) exactly as the update sees it; ``weights`` the task's
    reward weights; ``estimator`` / ``norm_by_std`` the trainer's advantage settings. ``loss``: the policy
    loss PER UNIT OF ADVANTAGE as a ``LossFn`` (its terms summed; REINFORCE: ``-log π``; see the module
    docstring), or rlgrad's PPO / CISPO loss as an ``ActorLoss`` or its ``LossSettings`` (default: its
    defaults), whose unit loss is then used. ``advantages``: the training loop's own split of the update's
    advantage by component (``{component: [N]}``, summing to it, e.g. TRL's normalisation); default: the
    split ``mode`` / ``estimator`` / ``norm_by_std`` define (``component_advantages``).
    """
    unit = as_unit_loss(loss)
    names = list(batch.components)
    if not names:
        raise ValueError("the batch carries no reward components")
    adv = per_sequence_advantage(batch)
    comp = advantages if advantages is not None else component_advantages(
        batch.components, weights, sequence_scores(batch.scores, batch.token_rewards, batch.response_mask),
        batch.group_ids, mode=mode, estimator=estimator, norm_by_std=norm_by_std, response_mask=batch.response_mask,
        reduce=collectives.all_reduce_sum)
    _, u = unit.agg.weights(batch.response_mask)
    denom = denominator(float(collectives.all_reduce_sum(u.sum().double())))  # the update's loss denominator
    rows = [comp[c] for c in names]
    slices, derived = list(names), {"total": {c: 1.0 for c in names}}
    if mode == "own_std":  # the components do not add up: the update's advantage is its own slice
        rows.append(adv)
        slices, derived = names + ["total"], {}
    W = torch.stack(rows).double().div(denom).float().reshape(len(rows), len(batch))

    def one_term(m: nn.Module, b: Batch) -> dict[str, torch.Tensor]:
        return {TERM: sum(unit(m, b).values())}

    # A slice with no non-zero weight on any rank (a component constant in every group) has a zero gradient:
    # the engine only sees the others. Decided over all ranks: the engine's all-reduce has one size everywhere.
    live_any = collectives.all_reduce_sum(W.ne(0).any(1).to(torch.float64))
    live = [k for k in range(len(slices)) if float(live_any[k]) > 0]
    live_names = [slices[k] for k in live]
    live_derived = {d: {c: v for c, v in combo.items() if c in live_names} for d, combo in derived.items()}
    live_derived = {d: combo for d, combo in live_derived.items() if combo}
    stats = GradStats([], {})  # every advantage 0: every gradient is 0
    if live:
        stats = slice_gradients(method, model, batch, PerTokenLoss(one_term, unit.agg), W[live], live_names,
                                live_derived, keep_grads=keep_grads)
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


def _group_order(g: str) -> tuple:
    if g == "embed":
        return (0, 0)
    if g.startswith("layer_") and g[6:].isdigit():
        return (1, int(g[6:]))
    return (2, {"final_norm": 0, "lm_head": 1}.get(g, 2), g)


# ---- background writer -------------------------------------------------------------------------

def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class BackgroundWriter:
    """Writes ``.npz`` files on a worker thread, so saving gradients never blocks training.

    ``submit`` only enqueues (tensors are moved to the CPU first, so the worker never touches the device).
    ``close`` writes whatever is queued and stops the thread. A failed write is reported at once (``log``)
    and kept in ``failures``; the writer goes on with the next file.
    """

    def __init__(self, log=_stderr):
        self.log = log
        self.failures: list[tuple[str, str]] = []
        self.written: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, path: str | Path, arrays: dict[str, torch.Tensor]) -> None:
        cpu = {k: v.detach().to("cpu", torch.float32) for k, v in arrays.items()}
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rlgrad-npz-writer", daemon=True)
            self._thread.start()
        self._queue.put((Path(path), cpu))

    def _run(self) -> None:
        import numpy as np

        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                path, arrays = item
                try:
                    buf = io.BytesIO()
                    np.savez_compressed(buf, **{k: v.numpy() for k, v in arrays.items()})
                    atomic_write_bytes(path, buf.getvalue())
                    self.written.append(str(path))
                except Exception as e:  # reported, never lost silently; the writer carries on
                    self.failures.append((str(path), f"{type(e).__name__}: {e}"))
                    self.log(f"rlgrad: failed to write {path}: {type(e).__name__}: {e}")
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until everything submitted so far is written (or has failed)."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> list[tuple[str, str]]:
        """Write what is queued, stop the worker; returns the failed writes (path, error)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        return self.failures


# ---- the hook ----------------------------------------------------------------------------------

class ComponentGeometryHook(Hook):
    """Reward-component gradient geometry at ``analysis.components`` steps, on the training batch
    before the actor update: metrics, ``analysis/step_N/components.json`` and, with
    ``analysis.components.save_gradients``, ``analysis/step_N/component_grads.npz`` (keys ``<slice>/<param>``)."""

    def __init__(self, cfg: RLGradConfig, schedule: Schedule | None = None, log=_stderr):
        self.cfg, self.log = cfg, log
        self.schedule = schedule or schedules(cfg)["components"]
        self.writer = BackgroundWriter(log) if cfg.analysis.components.save_gradients else None

    def before_update(self, ctx: StepContext) -> HookResult | None:
        if not self.schedule.due(ctx.step):
            return None
        t0 = time.perf_counter()
        c, cfg = self.cfg.analysis.components, self.cfg
        save = self.writer is not None
        split = ctx.component_advantages(ctx.batch) if ctx.component_advantages is not None else None
        rep = analyse_components(ctx.actor, ctx.batch, ctx.actor_loss(), weights=ctx.reward_weights, mode=c.mode,
                                 estimator=cfg.algorithm.adv_estimator,
                                 norm_by_std=cfg.algorithm.norm_adv_by_std_in_grpo, method=cfg.analysis.method,
                                 keep_grads=save, advantages=split)
        metrics = dict(rep.metrics)
        if ctx.is_main:
            step_dir = ctx.run_dir / "analysis" / f"step_{ctx.step}"
            atomic_write_json(step_dir / "components.json", {"step": ctx.step, **rep.summary})
            if save:
                grads = rep.stats.grads[TERM]
                arrays = {f"{sl}/{name}": g[k] for name, g in grads.items() for k, sl in enumerate(rep.stats.slices)}
                self.writer.submit(step_dir / "component_grads.npz", arrays)
        if save:
            metrics["grad_comp/save_failures"] = float(len(self.writer.failures))
        metrics["timing_s/analysis/components"] = time.perf_counter() - t0
        return HookResult(metrics=metrics)

    def close(self) -> None:
        if self.writer is None:
            return
        failed = self.writer.close()
        if failed:
            self.log(f"rlgrad: {len(failed)} component-gradient file(s) could not be written: "
                     + "; ".join(f"{p} ({e})" for p, e in failed))
