"""Pure-torch instruments. They see a Batch, a model and the loss settings, never the trainer."""

from __future__ import annotations


def hooks_from_config(cfg) -> list:
    """The analysis hooks a config asks for, in the order they run at the hook point."""
    from rlgrad.analysis.components import ComponentGeometryHook
    from rlgrad.analysis.gradient_probe import GradientAnalysisHook
    from rlgrad.analysis.neurons import NeuronHealthHook

    hooks = []
    # Before the bucket analysis: that one may stop the run at its step (exit_after_gradient_analysis).
    if cfg.analysis.components_every > 0:
        hooks.append(ComponentGeometryHook(cfg))
    if cfg.trainer.gradient_analysis_mode:
        hooks.append(GradientAnalysisHook(cfg))
    if any(r.redo_metric_freq or r.redo_reset_freq for r in (cfg.actor, cfg.critic)):
        hooks.append(NeuronHealthHook(cfg))
    return hooks
