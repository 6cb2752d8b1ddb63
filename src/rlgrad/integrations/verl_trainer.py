"""The verl trainer and task runner that ``rlgrad.integrations.verl_main`` starts (verl 0.9's V1 trainer).

Ray ships an actor class to its process by value (cloudpickle of the class Ray derives from it), which
imports nothing: the ``register_trainer`` call of the module that defined it never ran in the task runner's
process (``ValueError: Unknown trainer 'rlgrad_sync'``). ``TaskRunner.__init__`` therefore imports this module
by name in its own process before verl looks the trainer up.
"""

from __future__ import annotations

import importlib

import ray
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer

from rlgrad.integrations.verl import ActorRolloutRefWorker, stop_requested

TRAINER = "rlgrad_sync"
ACTOR_ROLES = (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor)


@register_trainer(TRAINER)
class RlgradPPOTrainer(PPOTrainerSync):
    """verl's synchronous PPO trainer whose actor worker is rlgrad's, and whose loop ends after a step at which
    one of rlgrad's hooks asked to stop (``rlgrad.hooks.HookRunner``)."""

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        for role in ACTOR_ROLES:
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(ActorRolloutRefWorker)

    def step(self, metrics: dict, timing_raw: dict):
        batch = super().step(metrics, timing_raw)
        if stop_requested(metrics):
            # verl's loop runs while global_steps <= total_training_steps and counts this step after logging it:
            # this step becomes the last (its checkpoint and validation were decided by the old bound).
            self.total_training_steps = self.global_steps
        return batch


@ray.remote(num_cpus=1)
class TaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's V1 task runner whose Ray process holds the registration of ``rlgrad_sync``."""

    def __init__(self):
        importlib.import_module(__name__)  # runs in Ray's process, where the class arrived by value
        super().__init__()
