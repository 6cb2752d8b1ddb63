"""Pure-torch instruments. They see a Batch, a model and a loss, never the trainer.

``analyse_buckets``, ``analyse_components`` and ``neurons.measure`` run from any training loop with
any loss (``rlgrad.loss.LossFn``); the hooks below put them at rlgrad's trainer's hook points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlgrad.analysis.buckets import GradientAnalysisHook, analyse_buckets
from rlgrad.analysis.components import ComponentGeometryHook, analyse_components
from rlgrad.analysis.neurons import NeuronHealthHook
from rlgrad.config.analysis import schedules
from rlgrad.hooks import Hook, Schedule

if TYPE_CHECKING:
    from rlgrad.config.schema import RLGradConfig

__all__ = ["analyse_buckets", "analyse_components", "hooks_from_config", "schedules"]


def hooks_from_config(cfg: RLGradConfig, at: dict[str, Schedule] | None = None) -> list[Hook]:
    """The instruments a config asks for, as hooks in the order they run at the hook point (``at``: the
    steps, default ``schedules(cfg)``)."""
    at = at or schedules(cfg)
    hooks: list[Hook] = []
    # Before the bucket analysis: that one may stop the run at its step (analysis.buckets.exit_after).
    if at["components"].every > 0:
        hooks.append(ComponentGeometryHook(cfg, at["components"]))
    if at["buckets"].every > 0:
        hooks.append(GradientAnalysisHook(cfg, at["buckets"]))
    roles = ("actor", "critic")
    if any(at[f"neurons/{r}"].every > 0 or at[f"reset/{r}"].every > 0 for r in roles):
        hooks.append(NeuronHealthHook(cfg, {r: at[f"neurons/{r}"] for r in roles},
                                      {r: at[f"reset/{r}"] for r in roles}))
    return hooks
