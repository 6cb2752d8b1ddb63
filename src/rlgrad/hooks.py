"""The trainer's hook points: the one interface analysis code plugs into.

Each training step runs ``rollout -> filter -> advantages -> (critic) -> before_update ->
actor update -> validation -> metrics -> checkpoint``. A hook sees the prepared batch,
the models, the optimizer and the step in a ``StepContext`` and answers with metrics
(and, optionally, a request to stop the run before the actor update). ``on_grads`` sees
the accumulated gradient of each mini-batch after backward, before clipping and the step; ``before_grads`` sees
the same mini-batch at the same weights before its forward, while no gradient is held.

The trainer is handed its hooks (``rlgrad train`` builds them from the config with
``rlgrad.analysis.hooks_from_config``); it never imports an instrument. Every loop that runs hooks (rlgrad's
trainer, the TRL and verl integrations) runs them through one ``HookRunner``.

Hooks must be side-effect free unless they say otherwise: they must not change weights,
optimizer state, gradients or RNG streams (``torch.random.fork_rng`` helps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from rlgrad.algos.objective import ActorLoss, LossFn, LossSettings
from rlgrad.batch import Batch
from rlgrad.config.schedule import Schedule  # noqa: F401  (hooks' step rule, re-exported)

if TYPE_CHECKING:
    from rlgrad.config.schema import RLGradConfig


@dataclass
class StepContext:
    """What a hook sees of one training step. Under torchrun ``batch`` is this rank's share and ``actor`` /
    ``critic`` are plain modules with the current weights (FSDP2: full replicas; in verl's worker ``actor`` is
    verl's FSDP2 module itself, which the fast gradient engine runs on as it is)."""

    step: int
    batch: Batch  # the filtered batch with advantages: exactly what the actor update will see
    actor: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_settings: LossSettings  # the actor loss the update optimises
    config: RLGradConfig
    run_dir: Path
    ref: torch.nn.Module | None = None
    critic: torch.nn.Module | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    critic_loss: LossFn | None = None  # the critic's per-token value loss (adv_estimator=gae)
    tokenizer: Any = None  # a Hugging Face tokenizer
    is_main: bool = True  # rank 0: the only process that writes files
    unfiltered_batch: Batch | None = None  # the batch before the rollout filter (not prepared)
    reward_weights: dict[str, float] = field(default_factory=dict)  # total = Σ weight · component (+ shaping, weight 1)
    # Batch -> Batch: adds old/ref log-probs (critic values) and advantages, as for the training batch.
    prepare: Callable[[Batch], Batch] | None = None
    # (groups, group_size) -> (prepared filtered batch or None when the filter kept nothing, unfiltered batch):
    # a separate rollout that leaves the training batch, the data stream and the RNG untouched.
    sample_batch: Callable[[int, int], tuple[Batch | None, Batch]] | None = None
    # FSDP2: refresh the plain replica from the sharded module after a hook changed weights on purpose
    # (None: no replica to refresh; a hook that would need one fails loudly instead of leaving it stale).
    sync_actor: Callable[[], None] | None = None
    sync_critic: Callable[[], None] | None = None
    # Another training loop's actor loss (e.g. TRL's GRPO loss) and its split of the advantage by reward
    # component (``{component: [N]}``, summing to the advantage); None: rlgrad's ``ActorLoss(loss_settings)`` and
    # the split ``analyse_components`` derives from ``reward_weights`` and the config's estimator.
    loss: LossFn | None = None
    component_advantages: Callable[[Batch], dict[str, torch.Tensor]] | None = None
    # True where the loop's actor update at this step runs its first optimizer step over the whole ``batch`` in ONE
    # forward and backward at the current weights, in one process, and takes an ``update_tap`` for it (rlgrad's
    # trainer with one mini-batch and one micro-batch; TRL's with one accumulation step and no activation
    # checkpointing, ``integrations.trl.one_pass_update``): instruments may then ride on that backward
    # (``analysis/groups.py``, "the update's own pass") and measure at ``after_update``.
    one_pass_update: bool = False

    def actor_loss(self) -> LossFn:
        """The loss the actor update optimises: ``loss`` if the loop gave one, else rlgrad's actor loss."""
        return self.loss if self.loss is not None else ActorLoss(self.loss_settings)


@dataclass
class HookResult:
    """What ``before_update`` answers. ``stop``: end the run at this step (in rlgrad's trainer before the actor
    update, checkpoint and validation; inside TRL and verl after the step, ``HookRunner``). ``tables``: key ->
    (columns, rows), logged where the loop logs tables (rlgrad's trainer: W&B; TRL and verl: tables.jsonl)."""

    metrics: dict[str, float] = field(default_factory=dict)
    stop: bool = False
    reason: str = ""
    tables: dict[str, tuple[list[str], list[list]]] = field(default_factory=dict)

    def add(self, other: HookResult | dict[str, float] | None) -> None:
        """Another hook's answer merged in: its metrics and tables (a plain dict: metrics alone); not its stop."""
        if isinstance(other, HookResult):
            self.metrics.update(other.metrics)
            self.tables.update(other.tables)
        else:
            self.metrics.update(other or {})


class UpdateTap(Protocol):
    """What rides on the update's own forward and backward (``StepContext.one_pass_update``): ``around`` wraps the
    first micro-batch's forward and backward (``rows``: its rows' places in the step's batch), ``seen`` gets that
    forward's per-token loss terms (what the loss's ``of`` reads: rlgrad's ``ActorTerms``, TRL's per-token parts).
    ``around`` yields the backward to run in place of ``loss.backward()`` (rlgrad's trainer does; TRL runs its own
    and the tap only reads it): the update's gradient up to float32 rounding, its weight gradients formed once, by
    the tap's hooks, for the instruments and the update alike."""

    def around(self, model: torch.nn.Module, mb: Batch, rows: torch.Tensor) -> AbstractContextManager: ...

    def arrange(self, rows: torch.Tensor) -> torch.Tensor:
        """The order (positions in ``rows``) the tap reads the first micro-batch's rows fastest in; a loop whose loss is
        a sum over rows may run them so (rlgrad's trainer does; TRL keeps its own order)."""
        ...

    def seen(self, terms: Any) -> None: ...


class Hook:
    """Base with no-op defaults: override only what you need."""

    def before_update(self, ctx: StepContext) -> HookResult | None:
        return None

    def on_grads(self, ctx: StepContext, model: torch.nn.Module, minibatch: Batch,
                 role: str = "actor") -> dict[str, float] | None:
        """After a mini-batch's backward, before clipping and the optimizer step; ``role``: actor | critic.

        Under torchrun ``minibatch`` is this rank's share and ``minibatch.global_index`` the positions of its
        rows in the mini-batch one process would see; ``model`` is DDP's inner module or the FSDP2 module."""
        return None

    def before_grads(self, ctx: StepContext, model: torch.nn.Module, minibatch: Batch, role: str = "actor") -> None:
        """Before a mini-batch's forward and backward, once its gradient is cleared (``zero_grad(set_to_none=True)``):
        the same ``model``, weights, training mode and ``minibatch`` that this mini-batch's ``on_grads`` sees, with
        no gradient held. A measurement of ``on_grads`` that does not read the gradient can run here instead, so
        that the gradient (a model copy) is not alive under its own passes; it answers at ``on_grads``. Only
        rlgrad's trainer calls it (TRL and verl do not: a hook must still work when ``on_grads`` comes alone)."""
        return None

    def update_tap(self, ctx: StepContext) -> UpdateTap | None:
        """Where ``ctx.one_pass_update``: what this hook has ride on the actor update's backward (None: nothing)."""
        return None

    def update_skipped(self, ctx: StepContext) -> HookResult | None:
        """A hook stopped the run at ``before_update``: this step's update will not run. A measurement that was
        waiting to ride on it is taken now instead (its metrics and tables)."""
        return None

    def after_update(self, ctx: StepContext) -> dict[str, float] | HookResult | None:
        """After the step's actor (and critic) updates, before validation and the checkpoint.

        The one place a hook may change weights and optimizer state on purpose (e.g. a neuron reset);
        it must say so in its metrics. A measurement that rode on the update's backward answers here, with its
        tables (a ``HookResult``; its ``stop`` is not read)."""
        return None

    def after_step(self, step: int, metrics: dict[str, float]) -> HookResult | None:
        """At the end of a step, with the step's metrics row as it is about to be logged (validation included; rlgrad
        names): read-only. Its ``metrics`` join the row; a ``stop`` ends the run after this step, with a checkpoint
        (the loop says how it stops: ``HookRunner``). The live doctor's hook point."""
        return None

    def close(self) -> None:
        return None


class HookRunner:
    """A loop's hooks, run in order at its hook points: the one copy of that loop, used by rlgrad's trainer and by
    the TRL and verl integrations, so each of them keeps the hooks' metrics, tables and stop requests alike.

    ``before_update`` merges the metrics and tables of the hooks it ran; the first hook that asks to stop ends
    it (the hooks after that one do not run at that step, the ones before it take what waited for the update:
    ``Hook.update_skipped``) and its reason is the merged result's. What a stop
    does is the loop's to say, and each says it in its docstring:

    * rlgrad's trainer: no actor update, after-update hooks, validation or checkpoint at that step; its metrics
      are logged and the run ends (``Trainer.fit``'s summary has ``stopped_at_step``). A stop from ``after_step``
      (the live doctor's ``doctor.halt_on``) ends the run after the whole step and its checkpoint
      (``rl.resume.Halted``: ``rlgrad train`` exits with status 3).
    * TRL (``rlgrad.integrations.trl``): the hooks run inside TRL's training step, between its generation and its
      update, where TRL has no way to skip the update; the step finishes, then ``TrainerControl.should_training_stop``
      ends training as TRL's own ``max_steps`` would; a stop from ``after_step`` (at TRL's logging of the step)
      also asks TRL to save a checkpoint (``TrainerControl.should_save``).
    * verl (``rlgrad.integrations.verl``): the hooks run inside the actor worker's update call; the update
      finishes, and rlgrad's verl trainer (``rlgrad_sync``) ends verl's loop after that step. ``after_step`` runs in
      that trainer (``rlgrad.integrations.verl_trainer``, the live doctor): its stop also saves verl's checkpoint
      of the step, and the launch exits with status 3.
    """

    def __init__(self, hooks: Iterable[Hook] = ()):
        self.hooks = list(hooks)

    def __iter__(self) -> Iterator[Hook]:
        return iter(self.hooks)

    def __len__(self) -> int:
        return len(self.hooks)

    def before_update(self, ctx: StepContext) -> HookResult:
        """Every hook's ``before_update`` up to the first that asks to stop: their metrics and tables merged."""
        merged = HookResult()
        ran: list[Hook] = []
        for hook in self.hooks:
            ran.append(hook)
            res = hook.before_update(ctx)
            if res is None:
                continue
            merged.add(res)
            if res.stop:
                merged.stop, merged.reason = True, res.reason or "requested by a hook"
                break
        for hook in ran if merged.stop else ():  # no update to ride on: what waited for it, now
            merged.add(hook.update_skipped(ctx))
        return merged

    def on_grads(self, ctx: StepContext, model: torch.nn.Module, minibatch: Batch,
                 role: str = "actor") -> dict[str, float]:
        """Every hook's ``on_grads`` (``Hook.on_grads``): their metrics merged."""
        out: dict[str, float] = {}
        for hook in self.hooks:
            out.update(hook.on_grads(ctx, model, minibatch, role=role) or {})
        return out

    def before_grads(self, ctx: StepContext, model: torch.nn.Module, minibatch: Batch, role: str = "actor") -> None:
        """Every hook's ``before_grads`` (``Hook.before_grads``)."""
        for hook in self.hooks:
            hook.before_grads(ctx, model, minibatch, role=role)

    def update_tap(self, ctx: StepContext) -> UpdateTap | None:
        """The one ``update_tap`` the hooks give for this step (hooks sharing one give the same), or None."""
        taps = {id(t): t for t in (hook.update_tap(ctx) for hook in self.hooks) if t is not None}
        if len(taps) > 1:
            raise RuntimeError(f"{len(taps)} hooks ride on one update's backward; at most one can")
        return next(iter(taps.values()), None)

    def after_update(self, ctx: StepContext) -> HookResult:
        """Every hook's ``after_update``: their metrics and tables merged."""
        merged = HookResult()
        for hook in self.hooks:
            merged.add(hook.after_update(ctx))
        return merged

    def after_step(self, step: int, metrics: dict[str, float]) -> HookResult:
        """Every hook's ``after_step``: their metrics merged; the first stop's reason is the result's (the later
        hooks still run: each sees the whole step)."""
        merged = HookResult()
        for hook in self.hooks:
            res = hook.after_step(step, metrics)
            if res is None:
                continue
            merged.metrics.update(res.metrics)
            if res.stop and not merged.stop:
                merged.stop, merged.reason = True, res.reason or "requested by a hook"
        return merged

    def close(self) -> None:
        """Every hook's ``close``, also when one of them fails (then the first failure is raised after the
        others closed): a hook that fails to close must not keep another's background files unwritten."""
        failure: BaseException | None = None
        for hook in self.hooks:
            try:
                hook.close()
            except Exception as e:  # noqa: BLE001 - re-raised below, once every hook had its turn
                failure = failure or e
        if failure is not None:
            raise failure
