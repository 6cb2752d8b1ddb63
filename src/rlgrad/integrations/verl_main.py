"""``python -m rlgrad.integrations.verl_main``: verl's ``main_ppo`` with rlgrad's actor worker.

Takes verl's own Hydra config (``ppo_trainer``) and overrides, plus ``+actor_rollout_ref.rlgrad.*`` (rlgrad's
``analysis.*`` settings and ``dir``). It registers a trainer ``rlgrad_sync`` through verl's
``register_trainer`` (``PPOTrainerSync`` whose actor role gets ``rlgrad.integrations.verl.ActorRolloutRefWorker``),
selects it with ``trainer.v1.trainer_mode``, and starts verl's ``run_ppo`` with a task runner whose Ray
process imports the registration (both in ``rlgrad.integrations.verl_trainer``). Nothing of verl is edited
or patched.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import OmegaConf, open_dict
from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

from rlgrad.errors import UserError
from rlgrad.integrations.verl import ActorRolloutRefWorker, check_verl_version
from rlgrad.integrations.verl_trainer import ACTOR_ROLES, TRAINER, RlgradPPOTrainer, TaskRunner

__all__ = ["ACTOR_ROLES", "TRAINER", "ActorRolloutRefWorker", "RlgradPPOTrainer", "TaskRunner", "main", "prepare"]
VERL_CONFIG = str(Path(__import__("verl.trainer", fromlist=["x"]).__file__).parent / "config")


def prepare(config) -> None:
    """Check the config for rlgrad and point it at rlgrad's trainer and run directory (in place)."""
    check_verl_version()
    if not config.trainer.get("use_v1", True):
        raise UserError("rlgrad.integrations.verl runs verl's V1 trainer: leave trainer.use_v1=true")
    mode = config.trainer.v1.trainer_mode
    if mode not in ("sync", TRAINER):
        raise UserError(f"rlgrad.integrations.verl supports trainer.v1.trainer_mode=sync, not '{mode}'")
    with open_dict(config):
        config.trainer.v1.trainer_mode = TRAINER
        rl = config.actor_rollout_ref.get("rlgrad", None)
        if rl is None:
            config.actor_rollout_ref.rlgrad = {}
            rl = config.actor_rollout_ref.rlgrad
        # Ray workers do not share the launcher's working directory: the run directory is made absolute here.
        rl.dir = os.path.abspath(rl.get("dir", None) or os.path.join(config.trainer.default_local_dir, "rlgrad"))


@hydra.main(config_path=VERL_CONFIG, config_name="ppo_trainer", version_base=None)
def main(config) -> None:
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    try:
        prepare(config)
    except UserError as e:  # one line and exit status 2, as the rlgrad command line answers bad input
        print(f"rlgrad: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"[rlgrad] instruments in verl's actor worker; run files in {config.actor_rollout_ref.rlgrad.dir}")
    OmegaConf.set_struct(config, True)
    run_ppo(config, task_runner_class=TaskRunner)


if __name__ == "__main__":
    main()
