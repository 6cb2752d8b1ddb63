"""Short recipes that compose the trainer and the instruments (what the ``rlgrad`` commands run).

The trainer is handed its hooks; the instruments never see the trainer. This module is the one place
that knows both, so a training loop of your own can take the same instruments
(``rlgrad.analysis.analyse_buckets`` ...) without rlgrad's trainer.
"""

from __future__ import annotations

from collections.abc import Callable

from rlgrad.analysis import hooks_from_config, schedules
from rlgrad.config.schema import RLGradConfig
from rlgrad.distributed import env_rank
from rlgrad.doctor.hook import doctor_hooks
from rlgrad.hooks import Hook, Schedule
from rlgrad.rl.resume import resolve_run_dir
from rlgrad.rl.trainer import Trainer


def make_trainer(cfg: RLGradConfig, hooks: list[Hook] | None = None, log: Callable = print) -> Trainer:
    """rlgrad's trainer with the instruments ``cfg`` asks for, then ``hooks`` (``rlgrad train``), then the live
    doctor (``doctor.live``: it reads every step's whole row, the other hooks' metrics included)."""
    doctor = doctor_hooks(cfg, resolve_run_dir(cfg), is_main=env_rank() == 0)
    return Trainer(cfg, hooks=hooks_from_config(cfg) + list(hooks or []) + doctor, log=log)


def make_prober(cfg: RLGradConfig, log: Callable = print) -> Trainer:
    """The trainer for ``rlgrad probe`` (``Trainer.probe``): ``cfg`` resumes from the probed checkpoint, and
    the bucket analysis runs at the probed step (RAGEN's probe: every step); the other instruments keep
    their own steps."""
    at = schedules(cfg)
    at["buckets"] = Schedule(1)
    return Trainer(cfg, hooks=hooks_from_config(cfg, at), log=log)
