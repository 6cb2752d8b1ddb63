"""Tasks: where prompts come from and how responses are rewarded.

A task hands out training prompts, a fixed validation set, and scores a decoded
response into named reward components in [0, 1]; the scalar reward is their
weighted sum. ``build_task`` is the only constructor the rest of rlgrad uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlgrad.errors import UserError
from rlgrad.tasks.base import (  # the task types, for `from rlgrad.tasks import Example` as the README shows
    LENGTH_UNITS,
    VAL_SEED_OFFSET,
    Example,
    Score,
    Task,
    make_score,
    make_val_set,
    resolve_weights,
    response_length,
    sample_excluding,
)
from rlgrad.tasks.extraction import EXTRACTION_MODES

TASK_NAMES = ("arithmetic", "countdown", "math", "reasoning_gym", "sokoban", "frozen_lake")


def task_from_config(cfg: Any) -> Task:
    """The task an ``RLGradConfig`` asks for (its ``data``, ``reward``, ``env`` and ``agent`` settings, seeded by
    ``trainer.seed``): what ``rlgrad train`` trains on."""
    return build_task(
        cfg.data.task, seed=cfg.trainer.seed, val_size=cfg.data.val_size, weights=dict(cfg.reward.weights),
        train_files=list(cfg.data.train_files), val_files=list(cfg.data.val_files),
        length_max=cfg.reward.length_max, length_unit=cfg.reward.length_unit,
        reasoning_gym=cfg.data.reasoning_gym, env=getattr(cfg.env, cfg.data.task, None), agent=cfg.agent,
        answer_extraction=cfg.reward.answer_extraction, partial_credit=cfg.reward.partial_credit,
        custom_reward=cfg.reward.custom_reward_function)


def _check_task_args(name: str, *, val_size: int, length_max: int, length_unit: str, answer_extraction: str,
                     has_files: bool) -> None:
    """The task settings every task shares, checked before any task is built."""
    if answer_extraction not in EXTRACTION_MODES:
        raise UserError(f"answer_extraction must be one of {', '.join(EXTRACTION_MODES)}, got {answer_extraction!r}")
    if length_unit not in LENGTH_UNITS:
        raise UserError(f"length_unit must be one of {', '.join(LENGTH_UNITS)}, got '{length_unit}'")
    if not length_max or length_max <= 0:
        raise UserError(f"length_max must be a positive integer, got {length_max!r}")
    if val_size < 0:
        raise UserError(f"val_size must be >= 0, got {val_size}")
    if name in ("arithmetic", "countdown", "reasoning_gym", "sokoban", "frozen_lake") and has_files:
        raise UserError(f"task '{name}' generates its own data; train_files/val_files are only for task 'math'")


def _reasoning_gym_settings(settings: Any) -> tuple[Any, Any]:
    """``(dataset, config)`` of ``data.reasoning_gym``: a mapping or an object (missing entries: None)."""
    settings = settings or {}
    if isinstance(settings, Mapping):
        return settings.get("dataset"), settings.get("config")
    return getattr(settings, "dataset", None), getattr(settings, "config", None)


def _setting(settings: Any, key: str, default: Any = None) -> Any:
    """``settings[key]`` of a mapping, or its attribute ``key`` (None settings: ``default``)."""
    if isinstance(settings, Mapping):
        return settings.get(key, default)
    return getattr(settings, key, default)


def _scored_by(task: Task, custom_reward: Any, weights: dict[str, float] | None) -> Task:
    """``task`` scored by the reward function ``custom_reward`` names."""
    from rlgrad.tasks.custom_reward import CustomRewardTask, load_reward_function

    if getattr(task, "multi_turn", False):
        raise UserError(f"reward.custom_reward_function needs a task with a ground truth; task '{task.name}' is "
                        "rewarded by its environment")
    function = load_reward_function(str(_setting(custom_reward, "path")),
                                    _setting(custom_reward, "name") or "compute_score",
                                    _setting(custom_reward, "reward_kwargs") or {})
    return CustomRewardTask(task, function, weights)


def build_task(name: str, *, seed: int = 0, val_size: int = 128, weights: dict[str, float] | None = None,
               train_files: list[str] | None = None, val_files: list[str] | None = None,
               length_max: int = 800, length_unit: str = "chars", reasoning_gym: Any = None, env: Any = None,
               agent: Any = None, answer_extraction: str = "auto", partial_credit: bool = False,
               custom_reward: Any = None) -> Task:
    """``reasoning_gym``: for task 'reasoning_gym', its settings (``data.reasoning_gym``): a mapping or an object
    with ``dataset`` (a reasoning-gym dataset name) and ``config`` (that dataset's generator options).
    ``env`` / ``agent``: for a multi-turn environment (sokoban, frozen_lake), its options (``env.<task>``) and the
    agent settings (``agent``). ``answer_extraction``: strict | flexible | auto, how math, countdown and
    reasoning_gym read the answer (``rlgrad.tasks.extraction``); ``partial_credit``: reasoning_gym passes its
    verifier's partial credit through (else 1 only at 1.0). ``custom_reward``: verl's ``custom_reward_function``
    settings (a mapping or an object with ``path``, ``name``, ``reward_kwargs``): with a ``path``, that function
    scores the task's responses and ``weights`` are for its dict's fields (``rlgrad.tasks.custom_reward``)."""
    if _setting(custom_reward, "path"):
        task = build_task(name, seed=seed, val_size=val_size, train_files=train_files, val_files=val_files,
                          length_max=length_max, length_unit=length_unit, reasoning_gym=reasoning_gym, env=env,
                          agent=agent, answer_extraction=answer_extraction, partial_credit=partial_credit)
        return _scored_by(task, custom_reward, weights)
    _check_task_args(name, val_size=val_size, length_max=length_max, length_unit=length_unit,
                     answer_extraction=answer_extraction, has_files=bool(train_files or val_files))
    # Imported here so the task modules can import Example/Score from this package.
    if name == "arithmetic":
        from rlgrad.tasks.arithmetic import ArithmeticTask
        return ArithmeticTask(seed=seed, val_size=val_size, weights=weights, length_unit=length_unit)
    if name == "countdown":
        from rlgrad.tasks.countdown import CountdownTask
        return CountdownTask(seed=seed, val_size=val_size, weights=weights, length_unit=length_unit,
                             answer_extraction=answer_extraction)
    if name == "math":
        from rlgrad.tasks.math import MathTask
        return MathTask(train_files=train_files or [], val_files=val_files or [], val_size=val_size,
                        weights=weights, length_max=length_max, length_unit=length_unit,
                        answer_extraction=answer_extraction)
    if name == "reasoning_gym":
        from rlgrad.tasks.reasoning_gym import ReasoningGymTask
        dataset, config = _reasoning_gym_settings(reasoning_gym)
        return ReasoningGymTask(dataset=dataset, config=config, seed=seed, val_size=val_size,
                                weights=weights, length_unit=length_unit, answer_extraction=answer_extraction,
                                partial_credit=partial_credit)
    if name in ("sokoban", "frozen_lake"):
        from rlgrad.tasks.environment import EnvTask
        return EnvTask(name, env, agent, seed=seed, val_size=val_size, weights=weights)
    raise UserError(f"unknown task '{name}' (known tasks: {', '.join(TASK_NAMES)})")


__all__ = ["LENGTH_UNITS", "TASK_NAMES", "VAL_SEED_OFFSET", "Example", "Score", "Task", "build_task", "make_score",
           "make_val_set", "resolve_weights", "response_length", "sample_excluding", "task_from_config"]
