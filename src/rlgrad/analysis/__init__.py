"""Pure-torch instruments. They see a Batch, a model and the loss settings, never the trainer."""

from __future__ import annotations


def hooks_from_config(cfg) -> list:
    """The analysis hooks a config asks for, in the order they run at the hook point."""
    from rlgrad.analysis.gradient_probe import GradientAnalysisHook

    hooks = []
    if cfg.trainer.gradient_analysis_mode:
        hooks.append(GradientAnalysisHook(cfg))
    return hooks
