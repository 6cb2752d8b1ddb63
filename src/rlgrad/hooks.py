"""The trainer's hook points: the one interface analysis code plugs into.

Each training step runs ``rollout -> filter -> advantages -> (critic) -> before_update ->
actor update -> validation -> metrics -> checkpoint``. A hook sees the prepared batch,
the models, the optimizer and the step in a ``StepContext`` and answers with metrics
(and, optionally, a request to stop the run before the actor update). ``on_grads`` sees
the accumulated gradient of each mini-batch after backward, before clipping and the step.

The trainer is handed its hooks (``rlgrad train`` builds them from the config with
``rlgrad.analysis.hooks_from_config``); it never imports an instrument.

Hooks must be side-effect free unless they say otherwise: they must not change weights,
optimizer state, gradients or RNG streams (``torch.random.fork_rng`` helps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlgrad.algos.objective import ActorLoss, LossFn, LossSettings
from rlgrad.batch import Batch
from rlgrad.config.analysis import Schedule  # noqa: F401  (hooks' step rule, re-exported)

if TYPE_CHECKING:
    from rlgrad.config.schema import RLGradConfig


@dataclass
class StepContext:
    """What a hook sees of one training step. Under torchrun ``batch`` is this rank's share and ``actor`` /
    ``critic`` are plain modules with the current weights (FSDP2: full replicas)."""

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

    def actor_loss(self) -> LossFn:
        """The loss the actor update optimises: ``loss`` if the loop gave one, else rlgrad's actor loss."""
        return self.loss if self.loss is not None else ActorLoss(self.loss_settings)


@dataclass
class HookResult:
    metrics: dict[str, float] = field(default_factory=dict)
    stop: bool = False  # stop the run before the actor update, checkpoint and validation
    reason: str = ""
    tables: dict[str, tuple[list[str], list[list]]] = field(default_factory=dict)  # W&B tables: key -> (columns, rows)


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

    def after_update(self, ctx: StepContext) -> dict[str, float] | None:
        """After the step's actor (and critic) updates, before validation and the checkpoint.

        The one place a hook may change weights and optimizer state on purpose (e.g. a neuron reset);
        it must say so in its metrics."""
        return None

    def close(self) -> None:
        return None
