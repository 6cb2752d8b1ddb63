"""The step rule (``config/schedule.py``) as the hooks ``hooks_from_config`` builds follow it.
"""

from __future__ import annotations

from rlgrad.analysis.buckets import GradientAnalysisHook
from tests.helpers.batches import built_hook


def test_cadence():
    from rlgrad.config.load import load_config
    hook = built_hook(load_config(overrides=["trainer.gradient_analysis_every=3"]), GradientAnalysisHook)
    assert [s for s in range(1, 11) if hook.schedule.due(s)] == [1, 4, 7, 10]


def test_hooks_follow_the_config_schedule():
    from rlgrad.analysis.components import ComponentGeometryHook
    from rlgrad.analysis.neurons import NeuronHealthHook
    from rlgrad.config.load import load_config
    from rlgrad.config.schedule import schedules

    off_cfg = load_config(overrides=["analysis.buckets.enable=false"])
    off = GradientAnalysisHook(off_cfg.analysis.buckets, schedules(off_cfg)["buckets"], method="fast",
                               train_batch_size=off_cfg.data.train_batch_size, rollout_n=off_cfg.rollout.n)
    assert not any(off.schedule.due(s) for s in range(1, 100))
    cfg = load_config(overrides=["analysis.every=4"])
    assert [s for s in range(1, 10) if built_hook(cfg, GradientAnalysisHook).schedule.due(s)] == [1, 5, 9]
    assert [s for s in range(1, 10) if built_hook(cfg, ComponentGeometryHook).schedule.due(s)] == [1, 5, 9]
    assert [s for s in range(1, 10) if built_hook(cfg, NeuronHealthHook).metric_at["actor"].due(s)] == [1, 5, 9]
