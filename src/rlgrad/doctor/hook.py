"""The live doctor as a hook (``doctor.*``): rlgrad doctor's signatures on the run's own metrics at the end of every
step, in every loop that runs hooks through ``rlgrad.hooks.HookRunner`` (rlgrad's trainer, rlgrad's TRL
integration): one hook, no per-trainer code. The doctor itself (``rlgrad.doctor.live``) reads and writes run
files only; this module is where it meets the hook contract: the one module of ``doctor/`` that imports
``rlgrad.hooks`` (tests/test_layers.py), and none of ``doctor/`` imports it (the loops above do).
"""

from __future__ import annotations

import time
from pathlib import Path

from rlgrad.config import config_tree
from rlgrad.config.schema import RLGradConfig
from rlgrad.doctor.findings import SEVERITY, Thresholds
from rlgrad.doctor.live import LiveDoctor, halt_message, halts
from rlgrad.hooks import Hook, HookResult


class DoctorHook(Hook):
    """``after_step``: the step's metrics to the live doctor, which says each new finding once (console line,
    ``RUN/doctor.jsonl``); ``timing_s/doctor`` joins the row; a finding at or above ``doctor.halt_on`` stops the
    run after the step (``HookResult.stop``: the loop saves a checkpoint and says how it ends)."""

    def __init__(self, cfg: RLGradConfig, run_dir: Path, *, kind: str = "rlgrad", settings: dict | None = None,
                 is_main: bool = True, config: dict | None = None):
        t = Thresholds.from_file(cfg.doctor.thresholds) if cfg.doctor.thresholds else Thresholds()
        self.halt_on = cfg.doctor.halt_on
        own = config_tree(cfg) if kind == "rlgrad" else None  # another trainer's is its settings
        self.doctor = LiveDoctor(run_dir, config if config is not None else own, kind=kind, settings=settings,
                                 thresholds=t, is_main=is_main)
        self.last = time.perf_counter()

    def after_step(self, step: int, metrics: dict[str, float]) -> HookResult:
        now = time.perf_counter()
        step_seconds = metrics.get("timing_s/step", now - self.last)
        before = self.doctor.cost
        new = self.doctor.observe(step, metrics, step_seconds)
        self.last = time.perf_counter()
        stop = sorted((f for f in new if halts(f, self.halt_on)), key=lambda f: SEVERITY[f.severity])
        return HookResult(metrics={"timing_s/doctor": self.doctor.cost - before}, stop=bool(stop),
                          reason=halt_message(step, stop[0], self.doctor.run.run_dir, self.doctor.run.kind)
                          if stop else "")


    def close(self) -> None:
        """The run's end: the live doctor's final diagnosis, the one ``rlgrad doctor RUN`` gives afterwards."""
        self.doctor.finish()


def doctor_hooks(cfg: RLGradConfig, run_dir: Path, **kw) -> list[Hook]:
    """The live doctor's hook when ``doctor.live`` asks for it (the loops add it after their other hooks)."""
    return [DoctorHook(cfg, run_dir, **kw)] if cfg.doctor.live else []
