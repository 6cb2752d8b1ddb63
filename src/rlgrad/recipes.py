"""Short recipes that compose the trainer and the instruments (what the ``rlgrad`` commands run).

The trainer is handed its hooks; the instruments never see the trainer. This module is the one place
that knows both, so a training loop of your own can take the same instruments
(``rlgrad.analysis.analyse_buckets`` ...) without rlgrad's trainer.
"""

from __future__ import annotations

from collections.abc import Callable

from rlgrad.algos.objective import ActorLoss, LossSettings
from rlgrad.analysis import hooks_from_config, schedules
from rlgrad.config.schema import RLGradConfig
from rlgrad.distributed import env_rank, env_world_size
from rlgrad.doctor.hook import doctor_hooks
from rlgrad.hooks import Hook, Schedule
from rlgrad.rl.resume import resolve_run_dir
from rlgrad.rl.trainer import Trainer


def make_trainer(cfg: RLGradConfig, hooks: list[Hook] | None = None, log: Callable = print) -> Trainer:
    """rlgrad's trainer with the instruments ``cfg`` asks for, then ``hooks`` (``rlgrad train``), then the live
    doctor (``doctor.live``: it reads every step's whole row, the other hooks' metrics included)."""
    doctor = doctor_hooks(cfg, resolve_run_dir(cfg), is_main=env_rank() == 0)
    for hint in (ride_hint(cfg), sample_hint(cfg)):
        if hint and env_rank() == 0:
            log(hint)
    return Trainer(cfg, hooks=hooks_from_config(cfg) + list(hooks or []) + doctor, log=log)


def ride_hint(cfg: RLGradConfig) -> str | None:
    """One line for a run with the prompt-group pass due at every step (``analysis.every=1``) on the policy loss
    alone, in one process, whose actor update takes several micro-batches: the pass then runs before each update,
    where with one micro-batch it would ride on the update's own forward and backward (docs/instruments.md). None
    otherwise. Training itself never changes for the instruments: the micro-batch is the user's choice."""
    at = schedules(cfg)
    rows = cfg.data.train_batch_size * cfg.rollout.n
    micro = cfg.actor.ppo_micro_batch_size
    if (not any(at[k].every == 1 for k in ("buckets", "components", "per_sample")) or micro >= rows
            or env_world_size() > 1 or not ActorLoss(LossSettings.from_config(cfg)).task_alone()):
        return None
    return (f"note: the instruments run every step on {rows} rows in micro-batches of {micro}: each step runs their "
            f"pass before the update; actor.ppo_micro_batch_size={rows} (one micro-batch, if it fits in memory) lets "
            "them ride on the update's own forward and backward instead (docs/instruments.md, riding on the update)")


def sample_hint(cfg: RLGradConfig) -> str | None:
    """One line for a run with neuron health measured at every step and its nullspace sample with it: the sample is
    most of its cost, and ``nullspace_every`` keeps the gradient scores (what the doctor reads) at every step while
    sampling every tenth (docs/instruments.md). None otherwise."""
    at = schedules(cfg)
    roles = [role for role in ("actor", "critic") if at[f"neurons/{role}"].every == 1
             and getattr(cfg.analysis.neurons, role).nullspace_every == 1
             and getattr(cfg.analysis.neurons, role).nullspace_samples > 0]
    if not roles:
        return None
    settings = " ".join(f"analysis.neurons.{role}.nullspace_every=10" for role in roles)
    return (f"note: neuron health's nullspace sample runs every step, most of its cost; with {settings} its gradient "
            "scores (what the doctor reads) stay on every step and the sample runs every tenth (docs/instruments.md)")


def make_prober(cfg: RLGradConfig, log: Callable = print) -> Trainer:
    """The trainer for ``rlgrad probe`` (``Trainer.probe``): ``cfg`` resumes from the probed checkpoint, and
    the bucket analysis runs at the probed step (RAGEN's probe: every step); the other instruments keep
    their own steps."""
    at = schedules(cfg)
    at["buckets"] = Schedule(1)
    return Trainer(cfg, hooks=hooks_from_config(cfg, at), log=log)
