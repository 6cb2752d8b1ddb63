"""The update: ``ppo_update``, the one epoch / mini-batch / micro-batch / clip / optimizer loop.

The actor and the critic (``rlgrad.rl.critic``) each plug their per-micro-batch loss into it; the
loss math itself lives in ``algos/objective.py``, which the instruments import too, so they measure exactly the
loss the update optimises. Each micro-batch loss is taken against the denominators of its whole
mini-batch, so gradient accumulation gives the same update as one big batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import NamedTuple

import torch

from rlgrad.algos.aggregation import Denominators
from rlgrad.algos.objective import ActorTerms, LossSettings, actor_objective
from rlgrad.batch import Batch
from rlgrad.collectives import all_gather_sizes, all_reduce_max, all_reduce_sum, rank
from rlgrad.distributed import grad_sync
from rlgrad.errors import UserError
from rlgrad.hooks import UpdateTap
from rlgrad.metrics import key as metric_key
from rlgrad.metrics import layer_group


def minibatches(n: int, mini_size: int, shuffle: bool, generator: torch.Generator | None) -> list[torch.Tensor]:
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    return [order[i:i + mini_size] for i in range(0, n, mini_size)]


# (model, micro-batch, denominators of its mini-batch) -> (loss to backward, additive stats).
# Each stat must be this micro-batch's share of the mini-batch value, so the shares sum to it.
MicroLoss = Callable[[torch.nn.Module, Batch, Denominators], tuple[torch.Tensor, dict[str, float]]]


class UpdateKeys(NamedTuple):
    """The metric keys an update writes (declared in ``rlgrad.metrics``)."""

    grad_norm: str
    lr: str
    nonfinite: str


ACTOR_KEYS = UpdateKeys("actor/grad_norm", "actor/lr", "actor/nonfinite_grad_steps")


def ppo_update(model, optimizer, batch: Batch, micro_loss: MicroLoss, *, names: UpdateKeys, ppo_epochs: int,
               mini_batch_size: int, micro_batch_size: int, max_grad_norm: float, shuffle: bool, seed: int,
               scheduler=None, on_grads=None, tap: UpdateTap | None = None, before_grads=None) -> dict[str, float]:
    """The one update loop, for the actor and the critic alike: PPO-style epochs over shuffled
    mini-batches, each one optimizer step over accumulated micro-batches.

    ``micro_loss`` is evaluated against the denominators of the whole mini-batch, so the accumulated
    gradient equals the mini-batch loss's gradient. ``on_grads(model, minibatch)`` (optional) sees the
    accumulated gradient before clipping and the step; ``before_grads(model, minibatch)`` (optional) sees the same
    mini-batch at the same weights before its first forward, its gradient cleared (none held). A non-finite
    gradient norm skips that optimizer step (counted in ``names.nonfinite``, no crash). Stats are averaged over
    mini-batches; ``names.grad_norm`` is the pre-clip norm, ``names.lr`` the learning rate after the update.

    Data parallel (``model`` wrapped by ``rlgrad.distributed.wrap``, which SUMS gradients over ranks):
    ``batch`` is this rank's contiguous share of the global batch, ranks in order, and
    ``mini_batch_size`` is global. Mini-batches are drawn over the global row indices exactly as in one
    process and each rank takes the rows it holds; denominators are global (``Denominators.global_of``),
    every rank runs the same number of micro-batches (padding with ``Batch.blank_rows``, zero loss) and
    reduces gradients on the last one only. The step then equals the one-process step, and the logged
    stats are summed over ranks. The mini-batch ``on_grads`` sees carries ``global_index``: each row's
    position in the one-process mini-batch.

    ``tap`` (``hooks.UpdateTap``): wraps the first micro-batch's forward and backward (instruments riding on the
    update's own pass), and runs that backward where it yields one.
    """
    model.train()
    gen = torch.Generator().manual_seed(seed)
    sums: dict[str, float] = {}
    count = 0
    skipped = 0
    params = [p for p in model.parameters() if p.requires_grad]
    sizes = all_gather_sizes(len(batch))
    offset, n_global = sum(sizes[:rank()]), sum(sizes)
    untapped = tap is not None
    for _ in range(ppo_epochs):
        for gidx in minibatches(n_global, mini_batch_size, shuffle, gen):
            held = (gidx >= offset) & (gidx < offset + len(batch))
            rows = gidx[held] - offset
            mini = batch.select(rows)
            # Where each row sits in the mini-batch one process would hold: ranks interleave when shuffled.
            mini.global_index = torch.nonzero(held).squeeze(-1).to(mini.input_ids.device)
            optimizer.zero_grad(set_to_none=True)
            if before_grads is not None:
                before_grads(model, mini)
            stats = _accumulate(model, batch, mini, rows, micro_loss, micro_batch_size, tap if untapped else None)
            untapped = False
            keys = sorted(stats)  # the same keys on every rank: the loss function's, in a fixed order
            stats = dict(zip(keys, all_reduce_sum(
                torch.tensor([stats[k] for k in keys], dtype=torch.float64)).tolist()))
            if on_grads is not None:
                on_grads(model, mini)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            # FSDP2: a DTensor
            grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
            stats[names.grad_norm] = grad_norm
            if math.isfinite(grad_norm):
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
            else:
                skipped += 1
                optimizer.zero_grad(set_to_none=True)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
            count += 1
    out = {k: v / max(count, 1) for k, v in sums.items()}
    out[names.lr] = optimizer.param_groups[0]["lr"]
    out[names.nonfinite] = float(skipped)
    return out


def _accumulate(model, batch: Batch, mini: Batch, rows: torch.Tensor, micro_loss: MicroLoss, micro_batch_size: int,
                tap: UpdateTap | None) -> dict[str, float]:
    """One mini-batch's gradient, accumulated a micro-batch at a time against the whole mini-batch's denominators
    (reduced over ranks on the last one only); ``tap`` wraps the first micro-batch and runs its backward where it
    yields one. Returns the loss's stats summed over the micro-batches, this rank's."""
    den = Denominators.global_of(mini)
    n_micro = max(int(all_reduce_max(torch.tensor(-(-len(mini) // micro_batch_size)))), 1)
    stats: dict[str, float] = {}
    for k in range(n_micro):
        start = k * micro_batch_size
        mb = (mini.select(torch.arange(start, min(start + micro_batch_size, len(mini)))) if start < len(mini)
              # this rank is out of rows: a zero-loss pass keeps the collectives in step
              else batch.blank_rows(1))
        tapped = nullcontext()
        if tap is not None and k == 0:
            mb_rows = rows[start:start + len(mb)]
            if len(mb_rows) == len(mb):  # (the loss sums over rows: their order moves only its float32 rounding)
                order = tap.arrange(mb_rows)
                mb, mb_rows = mb.select(order), mb_rows[order]
            tapped = tap.around(model, mb, mb_rows)
        with grad_sync(model, k == n_micro - 1), tapped as tap_backward:
            loss, shares = micro_loss(model, mb, den)
            if tap_backward is None:
                loss.backward()
            else:  # the tap forms the weight gradients itself (``hooks.UpdateTap``)
                tap_backward(loss)
        for key, v in shares.items():
            stats[key] = stats.get(key, 0.0) + v
    return stats


def actor_micro_loss(s: LossSettings, seen: Callable[[ActorTerms], None] | None = None) -> MicroLoss:
    """The actor's per-micro-batch loss for :func:`ppo_update`, with its metrics as additive shares; ``seen`` gets
    each forward's per-token terms."""

    def loss(model, mb: Batch, den: Denominators) -> tuple[torch.Tensor, dict[str, float]]:
        terms = actor_objective(model, mb, s, den)
        if seen is not None:
            seen(terms.terms)
        # pg / entropy / kl are already normalised by the mini-batch denominators: they sum to the mini value;
        # the clip fractions and ppo_kl are token means of this micro-batch, weighted by its token share.
        w = float(mb.response_mask.sum()) / max(den.num_tokens, 1.0)
        stats = {"actor/pg_loss": float(terms.task.detach()), "actor/pg_clipfrac": float(terms.clipfrac) * w,
                 "actor/pg_clipfrac_lower": float(terms.clipfrac_lower) * w, "actor/ppo_kl": float(terms.ppo_kl) * w,
                 "actor/entropy": float(terms.entropy.detach())}
        if terms.kl is not None:
            stats["actor/kl_loss"] = float(terms.kl.detach())
        return terms.total(s), stats

    return loss


def update_actor(model, optimizer, batch: Batch, s: LossSettings, *, ppo_epochs: int, mini_batch_size: int,
                 micro_batch_size: int, max_grad_norm: float, shuffle: bool, seed: int,
                 scheduler=None, on_grads=None, tap: UpdateTap | None = None,
                 before_grads=None) -> dict[str, float]:
    """PPO-style epochs over mini-batches, each one AdamW step over accumulated micro-batches.

    ``on_grads(model, minibatch)`` (optional) sees the accumulated gradient before clipping
    and the step; ``before_grads(model, minibatch)`` the mini-batch before its forward (``ppo_update``). A
    non-finite gradient norm skips that optimizer step (logged, no crash). ``tap``: see ``ppo_update``; it also
    sees the tapped forward's per-token terms.
    """
    micro = actor_micro_loss(s, tap.seen if tap is not None else None)
    return ppo_update(model, optimizer, batch, micro, names=ACTOR_KEYS, ppo_epochs=ppo_epochs,
                      mini_batch_size=mini_batch_size, micro_batch_size=micro_batch_size,
                      max_grad_norm=max_grad_norm, shuffle=shuffle, seed=seed, scheduler=scheduler,
                      on_grads=on_grads, tap=tap, before_grads=before_grads)


@contextmanager
def update_size(model: torch.nn.Module, metrics: dict[str, float]) -> Iterator[None]:
    """Around a step's update of ``model`` (a plain module holding the full weights after the update: the
    trainer's policy replica): ``actor/update_ratio`` = ‖θ_after − θ_before‖ / ‖θ_before‖ over its trainable
    parameters, and ``actor/update_ratio/{layer}`` per layer group (``metrics.layer_group``), into
    ``metrics``. It costs one copy of the trainable weights during the update and one norm of their difference."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    before = [p.detach().clone() for _, p in named]
    yield
    metrics.update(update_ratios(named, before))


@torch.no_grad()
def update_ratios(named: list[tuple[str, torch.Tensor]], before: list[torch.Tensor]) -> dict[str, float]:
    """‖Δθ‖ / ‖θ_before‖ in total and per layer group, ``named`` the parameters now, ``before`` their values
    before the update (the same order); a group whose weights are all zero is left out."""
    delta: dict[str, torch.Tensor] = {}
    weight: dict[str, torch.Tensor] = {}
    for (name, p), b in zip(named, before):
        g = layer_group(name)
        delta[g] = delta.get(g, 0.0) + (p.detach().double() - b.double()).pow(2).sum()
        weight[g] = weight.get(g, 0.0) + b.double().pow(2).sum()
    sq = {g: (float(delta[g]), float(weight[g])) for g in delta}
    out = {metric_key("actor/update_ratio/{layer}", layer=g): math.sqrt(d / w) for g, (d, w) in sq.items() if w > 0}
    total_d, total_w = sum(d for d, _ in sq.values()), sum(w for _, w in sq.values())
    if total_w > 0:
        out[metric_key("actor/update_ratio")] = math.sqrt(total_d / total_w)
    return out


def build_optimizer(model: torch.nn.Module, o) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and its linear warm-up schedule from an ``OptimConfig`` (actor.optim, critic.optim)."""
    # the trainable parameters only: under LoRA (actor.lora) the frozen base weights hold no optimizer state
    trainable = [p for p in model.parameters() if p.requires_grad]
    if any(p.dtype == torch.float16 for p in trainable):
        # pure float16 AdamW: eps and the small second moments underflow (no fp32 master weights, no loss scale),
        # so the first update turns weights into NaN and sampling fails a step later
        raise UserError(f"'model.dtype=float16' cannot be trained: AdamW's eps ({o.eps:g}) and second moments "
                        "underflow in float16 parameters without fp32 master weights, and the first update makes "
                        "the weights NaN; use model.dtype=bfloat16 (what verl trains in) or float32")
    optimizer = torch.optim.AdamW(trainable, lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                                  weight_decay=o.weight_decay)
    warm = o.lr_warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / warm) if warm > 0 else 1.0)
    return optimizer, scheduler
