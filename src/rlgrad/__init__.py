"""rlgrad: gradient-level analysis of RL fine-tuning of language models.

The public API, importable from here (each name is loaded on first use, so ``import rlgrad`` stays cheap):

- the instruments, from any training loop with any loss: ``analyse_buckets``, ``analyse_components``,
  ``measure_neurons``; a loss for them: ``per_token_loss`` (a loop's own), ``ActorLoss`` (rlgrad's), ``LossFn``;
- the batch they read: ``Batch``;
- the configuration: ``load_config``, ``RLGradConfig``;
- rlgrad's trainer with the instruments the config asks for: ``make_trainer``; the hook contract: ``Hook``,
  ``HookResult``, ``StepContext``, ``Schedule``;
- ``UserError``: every fault of a user's input (one line, exit status 2 on the command line).

The TRL and verl integrations need their own extras and are imported from ``rlgrad.integrations.trl`` /
``rlgrad.integrations.verl``.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_WHERE = {
    "analyse_buckets": ("rlgrad.analysis.buckets", "analyse_buckets"),
    "analyse_components": ("rlgrad.analysis.components", "analyse_components"),
    "measure_neurons": ("rlgrad.analysis.neurons", "measure"),
    "per_token_loss": ("rlgrad.algos.objective", "per_token_loss"),
    "ActorLoss": ("rlgrad.algos.objective", "ActorLoss"),
    "LossFn": ("rlgrad.algos.objective", "LossFn"),
    "LossSettings": ("rlgrad.algos.objective", "LossSettings"),
    "Batch": ("rlgrad.batch", "Batch"),
    "load_config": ("rlgrad.config.load", "load_config"),
    "RLGradConfig": ("rlgrad.config.schema", "RLGradConfig"),
    "make_trainer": ("rlgrad.recipes", "make_trainer"),
    "Hook": ("rlgrad.hooks", "Hook"),
    "HookResult": ("rlgrad.hooks", "HookResult"),
    "StepContext": ("rlgrad.hooks", "StepContext"),
    "Schedule": ("rlgrad.config.schedule", "Schedule"),
    "UserError": ("rlgrad.errors", "UserError"),
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'rlgrad' has no attribute {name!r}")
    module, attr = _WHERE[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
