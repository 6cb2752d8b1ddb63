"""``data.*``: the task, its data files and the prompt batch. Part of the config schema; the field docs are the
user documentation. Keys follow verl's ``data.*``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlgrad.config.fields import setting as _f


@dataclass
class ReasoningGymConfig:
    """``data.task=reasoning_gym``: a procedural dataset of the reasoning-gym library (optional extra)."""

    dataset: str | None = _f(None, "reasoning-gym dataset name, e.g. basic_arithmetic, chain_sum, countdown, "
                                   "gsm_symbolic.")
    config: dict[str, Any] = _f({}, "The dataset's own generator options (reasoning_gym.create_dataset keywords).")


@dataclass
class DataConfig:
    task: str = _f("arithmetic", "Task: arithmetic | countdown | math | reasoning_gym (single-turn), or a multi-turn "
                   "environment: sokoban | frozen_lake (agent.*, env.*).",
                   choices=("arithmetic", "countdown", "math", "reasoning_gym", "sokoban", "frozen_lake"))
    train_batch_size: int = _f(16, "Prompts per training step (each sampled rollout.n times).", ge=1)
    val_size: int = _f(128, "Validation prompts (generated tasks) or held-out rows (math without val_files).", ge=1)
    train_files: list[str] = _f([], "math: local .jsonl/.parquet training files.")
    val_files: list[str] = _f([], "math: local .jsonl/.parquet validation files.")
    max_prompt_length: int = _f(256, "Longest prompt in tokens; a longer prompt is an error naming it.", ge=1)
    apply_chat_template: str = _f("auto", "Render prompts through the tokenizer's chat template "
                                  "(apply_chat_template(messages, add_generation_prompt=True), as verl and TRL "
                                  "do): auto (when the tokenizer has one) | true (an error when it has none) | "
                                  "false.", choices=("auto", "true", "false"))
    system_prompt: str | None = _f(None, "A system turn put before every prompt's messages (chat template only).")
    gen_batch_size: int | None = _f(None, "algorithm.filter_groups: prompt groups per generation round (verl's "
                                    "data.gen_batch_size; null: train_batch_size).", ge=1)
    reasoning_gym: ReasoningGymConfig = field(default_factory=ReasoningGymConfig)
