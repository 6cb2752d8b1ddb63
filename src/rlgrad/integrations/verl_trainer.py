"""The verl trainer and task runner that ``rlgrad.integrations.verl_main`` starts (verl 0.9's V1 trainer).

Ray ships an actor class to its process by value (cloudpickle of the class Ray derives from it), which
imports nothing: the ``register_trainer`` call of the module that defined it never ran in the task runner's
process (``ValueError: Unknown trainer 'rlgrad_sync'``). ``TaskRunner.__init__`` therefore imports this module
by name in its own process before verl looks the trainer up.

The live doctor (``doctor.*``, ``rlgrad.doctor.hook.DoctorHook``) runs here, in verl's trainer process: it is the one
place that sees all of a step's metrics (verl's data, timing and validation metrics, the actor worker's, rlgrad's
instruments'), at the end of verl's ``_compute_metrics``, before verl logs the step.
"""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path

import ray
from omegaconf import OmegaConf
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer

from rlgrad.config.load import load_config
from rlgrad.config.schema import RLGradConfig
from rlgrad.doctor.hook import doctor_hooks
from rlgrad.hooks import HookRunner
from rlgrad.integrations.verl import ActorRolloutRefWorker, flatten_settings, stop_requested
from rlgrad.metrics import foreign_key
from rlgrad.runfiles import DOCTOR_HALT_FILE, checkpoint_dir, checkpoint_due

TRAINER = "rlgrad_sync"
ACTOR_ROLES = (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor)


def rlgrad_settings(config) -> RLGradConfig:
    """rlgrad's settings of a verl launch (``actor_rollout_ref.rlgrad.*`` but ``dir``), checked as rlgrad's
    command line checks them (``UserError`` naming the culprit)."""
    rl = config.actor_rollout_ref.get("rlgrad", None) or {}
    return load_config(None, None, [f"{k}={v}" for k, v in flatten_settings(rl).items() if k != "dir"])


def rlgrad_names(metrics: dict) -> dict[str, float]:
    """A step's metrics as verl's trainer holds them, under rlgrad's names (``rlgrad.metrics.foreign_key``); verl's
    own value wins where the actor worker reported the same quantity (``critic/score/mean``)."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        name = foreign_key(k, "verl")
        if name is not None and isinstance(v, int | float) and (name == k or name not in out):
            out[name] = float(v)
    return out


@register_trainer(TRAINER)
class RlgradPPOTrainer(PPOTrainerSync):
    """verl's synchronous PPO trainer whose actor worker is rlgrad's, whose loop ends after a step at which
    one of rlgrad's hooks asked to stop (``rlgrad.hooks.HookRunner``), and which runs the live doctor at the end of
    each step: ``timing_s/doctor`` joins the step's metrics, and a finding at or above ``doctor.halt_on`` (before
    the last step) saves verl's checkpoint ``global_step_N`` (unless verl saved it already), ends verl's loop after
    logging the step and leaves ``RUN/doctor_halt.json`` for ``verl_main``, which exits with status 3."""

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        for role in ACTOR_ROLES:
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(ActorRolloutRefWorker)

    def step(self, metrics: dict, timing_raw: dict):
        # what verl's loop decided for this step, before anything below moves its bound
        self.rlgrad_last = self.global_steps >= self.total_training_steps
        self.rlgrad_saves = checkpoint_due(self.global_steps, self.config.trainer.save_freq, self.rlgrad_last)
        batch = super().step(metrics, timing_raw)
        if stop_requested(metrics):
            # verl's loop runs while global_steps <= total_training_steps and counts this step after logging it:
            # this step becomes the last (its checkpoint and validation were decided by the old bound).
            self.total_training_steps = self.global_steps
        return batch

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        self.after_step(global_steps, metrics)

    def _doctor(self) -> HookRunner:
        """The live doctor's hook (none with ``doctor.live=false``), made at the first step: verl's config whole
        (resolved) is the run's config that the signatures read (``actor_rollout_ref.actor.optim.lr`` ...)."""
        if getattr(self, "rlgrad_doctor", None) is None:
            cfg = rlgrad_settings(self.config)
            run_dir = Path(self.config.actor_rollout_ref.rlgrad.dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            self.rlgrad_doctor = HookRunner(doctor_hooks(cfg, run_dir, kind="verl",
                                                         config=OmegaConf.to_container(self.config, resolve=True)))
        return self.rlgrad_doctor

    def after_step(self, step: int, metrics: dict) -> None:
        """The live doctor on the step's metrics (``metrics`` as verl is about to log them, updated in place)."""
        doctor = self._doctor()
        if not len(doctor):
            return
        res = doctor.after_step(step, rlgrad_names(metrics))
        metrics.update(res.metrics)
        if res.stop and not getattr(self, "rlgrad_last", False):  # at the last step the run ends as planned
            self._halt(step, res.reason, metrics)

    def _halt(self, step: int, reason: str, metrics: dict) -> None:
        """End verl's loop after this step, with a checkpoint to resume from, and say why."""
        if not getattr(self, "rlgrad_saves", False):
            t0 = time.perf_counter()
            self._save_checkpoint()  # verl's own: actor, critic, dataloader state, latest_checkpointed_iteration
            metrics["timing_s/save_checkpoint"] = time.perf_counter() - t0
        self.total_training_steps = step  # verl's loop ends once it has logged this step
        run_dir = Path(self.config.actor_rollout_ref.rlgrad.dir)
        # RUN/doctor_halt.json: verl's run_ppo returns nothing from the trainer's process; verl_main reads
        # this file after it to exit with HALTED_STATUS
        (run_dir / DOCTOR_HALT_FILE).write_text(json.dumps({"step": step, "reason": reason}) + "\n")
        print(f"[rlgrad] stopped by the doctor after step {step}, checkpoint "
              f"{checkpoint_dir(self.config.trainer.default_local_dir, step)}: {reason}", flush=True)


@ray.remote(num_cpus=1)
class TaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's V1 task runner whose Ray process holds the registration of ``rlgrad_sync``."""

    def __init__(self):
        importlib.import_module(__name__)  # runs in Ray's process, where the class arrived by value
        super().__init__()
