"""Pure-torch instruments. They see a Batch, a model and a loss, never the trainer.

``analyse_buckets``, ``analyse_components``, ``analyse_per_sample`` and ``neurons.measure`` run from any training
loop with any loss (``rlgrad.loss.LossFn``); the hooks below put them at rlgrad's trainer's hook points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlgrad.analysis.buckets import GradientAnalysisHook, analyse_buckets
from rlgrad.analysis.components import ComponentGeometryHook, analyse_components
from rlgrad.analysis.groups import SharedPass
from rlgrad.analysis.neurons import NeuronHealthHook
from rlgrad.analysis.per_sample import PerSampleHook, analyse_per_sample
from rlgrad.config.schedule import schedules
from rlgrad.hooks import Hook, Schedule

if TYPE_CHECKING:
    from rlgrad.config.schema import RLGradConfig

__all__ = ["analyse_buckets", "analyse_components", "analyse_per_sample", "hooks_from_config", "schedules"]


def hooks_from_config(cfg: RLGradConfig, at: dict[str, Schedule] | None = None) -> list[Hook]:
    """The instruments a config asks for, as hooks in the order they run at the hook point (``at``: the
    steps, default ``schedules(cfg)``). The one place that reads the whole config for them: each hook gets its
    own section, its ``Schedule`` and the few run settings it needs."""
    at = at or schedules(cfg)
    analysis, algorithm, trainer = cfg.analysis, cfg.algorithm, cfg.trainer
    hooks: list[Hook] = []
    # One prompt-group pass (analysis/groups.py) for the instruments due at one step, where it can serve them: the
    # bucket analysis on the training batch without dp_trim over ranks, the reward components with the fast engine.
    buckets = analysis.buckets
    users = {"per_sample": (at["per_sample"], analysis.per_sample.terms)}
    if analysis.method == "fast" and not (buckets.env_groups or buckets.group_size) and not (
            buckets.dp_trim and trainer.nnodes * trainer.n_gpus_per_node > 1):
        users["buckets"] = (at["buckets"], None)
    if analysis.method == "fast":
        users["components"] = (at["components"], ["task"])
    shared = SharedPass(users, proxy=analysis.per_sample.proxy_corr)
    # Before the bucket analysis: that one may stop the run at its step (analysis.buckets.exit_after).
    if at["components"].every > 0:
        hooks.append(ComponentGeometryHook(analysis.components, at["components"], estimator=algorithm.adv_estimator,
                                           norm_by_std=algorithm.norm_adv_by_std_in_grpo, method=analysis.method,
                                           shared=shared))
    if at["buckets"].every > 0:
        hooks.append(GradientAnalysisHook(analysis.buckets, at["buckets"], method=analysis.method,
                                          train_batch_size=cfg.data.train_batch_size, rollout_n=cfg.rollout.n,
                                          dp_size=trainer.nnodes * trainer.n_gpus_per_node, shared=shared))
    if at["per_sample"].every > 0:
        hooks.append(PerSampleHook(analysis.per_sample, at["per_sample"], bucket_mode=analysis.buckets.bucket_mode,
                                   num_buckets=analysis.buckets.num_buckets,
                                   mean_advantage=algorithm.adv_estimator == "gae", shared=shared))
    roles = ("actor", "critic")
    if any(at[f"neurons/{role}"].every > 0 or at[f"reset/{role}"].every > 0 for role in roles):
        hooks.append(NeuronHealthHook(analysis.neurons, {role: at[f"neurons/{role}"] for role in roles},
                                      {role: at[f"reset/{role}"] for role in roles}, seed=trainer.seed,
                                      method=analysis.method))
    return hooks
