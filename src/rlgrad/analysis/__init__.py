"""Pure-torch instruments. They see a Batch, a model and a loss, never the trainer.

``analyse_buckets``, ``analyse_components`` and ``neurons.measure`` run from any training loop with
any loss (``rlgrad.loss.LossFn``); the hooks below put them at rlgrad's trainer's hook points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlgrad.analysis.components import ESTIMATORS, ComponentGeometryHook, analyse_components
from rlgrad.analysis.gradient_probe import GradientAnalysisHook, analyse_buckets
from rlgrad.analysis.redo import NeuronHealthHook
from rlgrad.hooks import Hook, Schedule

if TYPE_CHECKING:
    from rlgrad.config import RLGradConfig

__all__ = ["analyse_buckets", "analyse_components", "hooks_from_config", "schedules"]


def schedules(cfg: RLGradConfig) -> dict[str, Schedule]:
    """The steps each instrument runs at: ``buckets``, ``components``, ``neurons/<role>`` (metrics) and
    ``reset/<role>``. ``analysis.every`` puts every instrument that applies to the run on steps
    1, 1+every, ... (the reward components need outcome advantages, the critic exists with gae)."""
    a = cfg.analysis
    gae = cfg.algorithm.adv_estimator == "gae"
    out = {"buckets": Schedule(a.buckets.every if a.buckets.enable else 0),
           "components": Schedule(a.components.every)}
    for role in ("actor", "critic"):
        n = getattr(a.neurons, role)
        out[f"neurons/{role}"] = Schedule(n.metric_every, n.metric_every)
        out[f"reset/{role}"] = Schedule(n.reset_every, n.reset_every)
    if a.every is not None:
        out["buckets"] = Schedule(a.every)
        out["components"] = Schedule(0 if gae else a.every)
        out["neurons/actor"] = Schedule(a.every)
        out["neurons/critic"] = Schedule(a.every if gae else 0)
    return out


def hooks_from_config(cfg: RLGradConfig, at: dict[str, Schedule] | None = None) -> list[Hook]:
    """The instruments a config asks for, as hooks in the order they run at the hook point (``at``: the
    steps, default ``schedules(cfg)``)."""
    at = at or schedules(cfg)
    hooks: list[Hook] = []
    # Before the bucket analysis: that one may stop the run at its step (analysis.buckets.exit_after).
    if at["components"].every > 0 and cfg.algorithm.adv_estimator in ESTIMATORS:
        hooks.append(ComponentGeometryHook(cfg, at["components"]))
    if at["buckets"].every > 0:
        hooks.append(GradientAnalysisHook(cfg, at["buckets"]))
    roles = ("actor", "critic")
    if any(at[f"neurons/{r}"].every > 0 or at[f"reset/{r}"].every > 0 for r in roles):
        hooks.append(NeuronHealthHook(cfg, {r: at[f"neurons/{r}"] for r in roles},
                                      {r: at[f"reset/{r}"] for r in roles}))
    return hooks
