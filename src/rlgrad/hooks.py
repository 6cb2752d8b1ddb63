"""The trainer's hook points: the one interface analysis code plugs into.

Each training step runs ``rollout -> filter -> advantages -> (critic) -> before_update ->
actor update -> validation -> metrics -> checkpoint``. A hook sees the prepared batch,
the models, the optimizer and the step in a ``StepContext`` and answers with metrics
(and, optionally, a request to stop the run before the actor update). ``on_grads`` sees
the accumulated gradient of each mini-batch after backward, before clipping and the step.

Hooks must be side-effect free unless they say otherwise: they must not change weights,
optimizer state, gradients or RNG streams (``torch.random.fork_rng`` helps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlgrad.batch import Batch


@dataclass
class StepContext:
    step: int
    batch: Batch  # the filtered batch with advantages: exactly what the actor update will see
    actor: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_settings: Any  # rlgrad.rl.actor.LossSettings: the loss the update optimises
    config: Any  # rlgrad.config.RLGradConfig
    run_dir: Path
    ref: torch.nn.Module | None = None
    critic: torch.nn.Module | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    tokenizer: Any = None
    is_main: bool = True  # rank 0: the only process that writes files
    # "unfiltered_batch": the batch before the rollout filter (not prepared);
    # "prepare": Batch -> Batch, adds old/ref log-probs and advantages;
    # "sample_batch": (groups, group_size) -> (prepared filtered batch, unfiltered batch), a separate
    #   rollout that leaves the training batch, data stream and RNG untouched.
    # "reward_weights": {component: weight}, the task's reward weights (total = Σ weight · component).
    extras: dict[str, Any] = field(default_factory=dict)


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
