"""``trainer.*``: steps, checkpoints, validation, sinks, devices and processes (verl's ``trainer.*``). Part of the
config schema; the field docs are the user documentation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlgrad.config.fields import setting as _f


@dataclass
class TrainerConfig:
    total_training_steps: int = _f(20, "Training steps (counted from 1).", ge=1)
    save_freq: int = _f(-1, "Checkpoint every N steps (-1: only at the end).", ge=1, also=(-1,))
    test_freq: int = _f(-1, "Validate every N steps (-1: only at the end).", ge=1, also=(-1,))
    val_before_train: bool = _f(True, "Validate before the first step.")
    project_name: str = _f("rlgrad", "Project (W&B project, run-directory parent).")
    experiment_name: str = _f("default", "Run name.")
    default_local_dir: str | None = _f(None, "Run directory (default: runs/<project_name>/<experiment_name>).")
    resume_mode: str = _f("auto", "auto: resume from the newest complete checkpoint if any; disable: "
                          "start fresh (refuses a used directory); resume_path: trainer.resume_from_path.",
                          choices=("auto", "disable", "resume_path"))
    resume_from_path: str | None = _f(None, "A global_step_N directory to resume from (resume_mode=resume_path).")
    critic_warmup: int = _f(0, "adv_estimator=gae: the first N steps update "
                            "only the critic (the actor update is skipped).", ge=0)
    max_ckpt_to_keep: int | None = _f(None, "Keep only the newest N checkpoints (null or -1: keep all).",
                                      ge=1, also=(-1,), why="-1 or null keeps every checkpoint; 0 would delete "
                                                            "the newest")
    logger: list[str] = _f(["console", "jsonl"], "Metric sinks: console, jsonl, tensorboard, wandb.")
    seed: int = _f(1, "Seed of data, sampling and initialisation.", ge=0, le=2**32 - 1)
    rollout_data_dir: str | None = _f(None, "Where each step's completions are written, one JSONL file per step "
                                            "(verl's key; null: RUN/rollouts/).")
    device: str = _f("auto", "cpu | cuda | auto.", choices=("auto", "cpu", "cuda"))
    num_threads: int | None = _f(None, "torch CPU threads (null: 1 for the embedded default, whose tensors are too "
                                 "small for a second thread to pay, torch's default for a model.path).", ge=1)
    strategy: str = _f("ddp", "Data parallelism under torchrun: ddp (replicated weights) | fsdp2 (torch fully_shard "
                       "on each decoder layer and the root). Unused in one process.", choices=("ddp", "fsdp2"))
    nnodes: int = _f(1, "Nodes (verl key). Under torchrun the environment wins: WORLD_SIZE / LOCAL_WORLD_SIZE.", ge=1)
    n_gpus_per_node: int = _f(1, "Processes per node (verl key). Under torchrun the environment wins: "
                              "LOCAL_WORLD_SIZE. Also the divisor of analysis.buckets.dp_trim (x nnodes).", ge=1)
    dist_timeout_s: float = _f(600.0, "Collective timeout in seconds: a rank that died or hangs "
                               "ends the run with an error after this long instead of a hang.", gt=0)


def cpu_threads(cfg: Any) -> int | None:
    """torch's CPU threads for a run of ``cfg`` (None: leave torch's default). The embedded default gets one: on 2
    cores shared with other jobs its demo took 64 s on one thread (24 CPU-s) and over 15 minutes on two, whose
    threads spin-wait for a core at every one of its many tiny operations."""
    if cfg.trainer.num_threads:
        return cfg.trainer.num_threads
    return 1 if cfg.model.path is None else None
