"""Every check of a config: each field against its declaration (``check_field``: type, choices, bounds), then
the relations between fields (``validate``). One line of ``UserError`` per fault, naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from pathlib import Path
from typing import Any

from rlgrad.config.algorithm import (
    per_response_advantage,
)
from rlgrad.config.analysis import PER_SAMPLE_TERMS
from rlgrad.config.model import not_local_hint
from rlgrad.config.schema import RLGradConfig, _walk
from rlgrad.errors import UserError

_OPS = {"ge": (">=", lambda v, b: v >= b), "gt": (">", lambda v, b: v > b), "le": ("<=", lambda v, b: v <= b),
        "lt": ("<", lambda v, b: v < b)}


# What OmegaConf turns into a bool besides true/false (a quoted YAML string): these keep working.
_BOOL_WORDS = ("true", "false", "yes", "no", "y", "n", "on", "off", "1", "0")


def is_bool_field(f: dataclasses.Field) -> bool:
    return f.type in (bool, "bool", "bool | None", "Optional[bool]")


def check_bool(key: str, v: Any) -> None:
    """A bool setting as written (before OmegaConf, which takes any number for a bool): a bool, or one of the words
    OmegaConf reads as one; ``2`` is refused rather than read as true."""
    if v is None or isinstance(v, bool) or (isinstance(v, str) and v.strip().lower() in _BOOL_WORDS):
        return
    raise UserError(f"'{key}' must be true or false, got {v!r}" if isinstance(v, str) else
                    f"'{key}' must be true or false, got {v}")


def check_field(key: str, f: dataclasses.Field, v: Any) -> None:
    """One setting against what its field declares (``_f``): type (a bool field holds a bool), choices,
    finiteness, bounds."""
    if v is None:  # an Optional key left unset
        return
    if is_bool_field(f) and not isinstance(v, bool):
        raise UserError(f"'{key}' must be true or false, got {v!r}")
    choices = f.metadata.get("choices")
    if choices and v not in choices:
        hint = difflib.get_close_matches(str(v), choices, n=1)
        raise UserError(f"'{key}' must be one of {', '.join(choices)}, got '{v}'"
                        + (f"; did you mean '{hint[0]}'?" if hint else ""))
    if isinstance(v, dict):  # a mapping to numbers (reward weights): each value named by its own key
        items = [(f"{key}.{k}", x) for k, x in v.items()]
    else:  # a number, or a list of numbers (betas)
        items = [(key, x) for x in (v if isinstance(v, list) else [v])]
    numbers = [(name, x) for name, x in items if isinstance(x, int | float) and not isinstance(x, bool)]
    why = f.metadata.get("why")
    for name, x in numbers:
        if not math.isfinite(x):
            raise UserError(f"'{name}' must be a finite number, got {x}")
        if x in f.metadata.get("also", ()):
            continue
        for op, bound in f.metadata.get("bounds", {}).items():
            sign, ok = _OPS[op]
            if not ok(x, bound):
                allowed = " and ".join(f"{_OPS[o][0]} {b:g}" for o, b in f.metadata["bounds"].items())
                extra = "".join(f" or {a}" for a in f.metadata.get("also", ()))
                raise UserError(f"'{name}' must be {allowed}{extra}, got {x}" + (f": {why}" if why else ""))


def validate(cfg: RLGradConfig) -> None:
    """Every field against its declaration (``check_field``), then the relations between fields, in ``RELATIONS``
    order; the first fault raises."""
    cfg.data.apply_chat_template = str(cfg.data.apply_chat_template).lower()  # YAML true/false arrive as bools
    for key, f, v in _walk(cfg):
        check_field(key, f, v)
    for check in RELATIONS:
        check(cfg)


def _optimizer_betas(cfg: RLGradConfig) -> None:
    betas = cfg.actor.optim.betas, cfg.critic.optim.betas
    for name, b in zip(("actor.optim.betas", "critic.optim.betas"), betas):
        if len(b) != 2 or not all(0 <= x < 1 for x in b):
            raise UserError(f"'{name}' must be two numbers in [0, 1), got {list(b)}")


def _tiny_model_shape(cfg: RLGradConfig) -> None:
    tiny = cfg.model.tiny
    if tiny.num_attention_heads % tiny.num_key_value_heads or tiny.hidden_size % tiny.num_attention_heads:
        raise UserError(f"'model.tiny' needs num_key_value_heads ({tiny.num_key_value_heads}) to divide "
                        f"num_attention_heads ({tiny.num_attention_heads}) and that to divide hidden_size "
                        f"({tiny.hidden_size})")


def _algorithm(cfg: RLGradConfig) -> None:
    """The estimator against the instruments and the agent; DAPO's filter and overlong buffer against the rest."""
    algo = cfg.algorithm
    if cfg.analysis.components.every > 0 and (why := per_response_advantage(algo, cfg.agent.use_turn_scores)):
        raise UserError(f"'analysis.components.every' {why}")
    if cfg.agent.use_turn_scores and algo.adv_estimator not in ("gae", "reinforce_plus_plus"):
        raise UserError("'agent.use_turn_scores' gives per-turn rewards, which only gae and reinforce_plus_plus turn "
                        f"into per-token advantages; algorithm.adv_estimator is '{algo.adv_estimator}'")
    filter_groups = algo.filter_groups
    if filter_groups.enable and filter_groups.metric == "seq_final_reward" and algo.use_kl_in_reward:
        raise UserError("'algorithm.filter_groups.metric' seq_final_reward with algorithm.use_kl_in_reward: the KL "
                        "penalty is applied after the groups are chosen here; use seq_reward")
    overlong = cfg.reward.overlong_buffer
    if overlong.enable and overlong.len >= cfg.rollout.response_length:
        raise UserError(f"'reward.overlong_buffer.len' ({overlong.len}) must be below rollout.response_length "
                        f"({cfg.rollout.response_length})")
    if overlong.enable and cfg.data.task in ("sokoban", "frozen_lake"):
        raise UserError("'reward.overlong_buffer' shapes single-turn responses; an episode of "
                        f"data.task={cfg.data.task} has many")


def _mini_batches(cfg: RLGradConfig) -> None:
    for role in ("actor", "critic"):  # the critic's mini-batch matters only with gae
        mini_batch = getattr(cfg, role).ppo_mini_batch_size
        uses_it = role == "actor" or cfg.algorithm.adv_estimator == "gae"
        if mini_batch is not None and cfg.data.train_batch_size % mini_batch and uses_it:
            raise UserError(f"'{role}.ppo_mini_batch_size' ({mini_batch}) must divide "
                            f"data.train_batch_size ({cfg.data.train_batch_size})")


def _trainer(cfg: RLGradConfig) -> None:
    for sink in cfg.trainer.logger:
        if sink not in ("console", "jsonl", "tensorboard", "wandb"):
            raise UserError(f"'trainer.logger' entry '{sink}' is not one of console, jsonl, tensorboard, wandb")
    if cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        raise UserError("'trainer.resume_mode=resume_path' needs 'trainer.resume_from_path'")


def _critic_model(cfg: RLGradConfig) -> None:
    path = cfg.critic.model.path
    if cfg.algorithm.adv_estimator == "gae" and path is not None and not (Path(path) / "config.json").is_file():
        if hint := not_local_hint(path, "critic.model.path"):
            raise UserError(hint)
        raise UserError(f"'critic.model.path' '{path}' is not a local Hugging Face model directory (no config.json)")


def _agent_and_data(cfg: RLGradConfig) -> None:
    if cfg.agent.use_turn_scores and cfg.agent.window is not None:
        raise UserError("'agent.use_turn_scores' needs every turn in the trained sequence "
                        "(agent.context_window_mode=full); a window drops the earlier turns' rewards")
    if cfg.data.task == "math" and not cfg.data.train_files:
        raise UserError("'data.task=math' needs 'data.train_files' (local .jsonl or .parquet)")


def _custom_reward(cfg: RLGradConfig) -> None:
    """A reward function needs a ground truth to score against: the single-turn tasks have one."""
    fn = cfg.reward.custom_reward_function
    if fn.path and cfg.data.task in ("sokoban", "frozen_lake"):
        raise UserError(f"'reward.custom_reward_function.path' scores a response against a ground truth; "
                        f"data.task={cfg.data.task} is rewarded by its environment (tasks with a ground truth: "
                        "arithmetic, countdown, math, reasoning_gym)")
    if fn.path and not str(fn.name or "").strip():
        raise UserError("'reward.custom_reward_function.name' must name the function in "
                        f"{fn.path} (verl's default: compute_score)")


def _lora(cfg: RLGradConfig) -> None:
    lora = cfg.actor.lora
    targets = lora.target_modules
    if not (isinstance(targets, str) and targets.strip()) and not (
            isinstance(targets, list | tuple) and targets and all(isinstance(t, str) and t for t in targets)):
        raise UserError(f"'actor.lora.target_modules' must be all-linear or a list of module names, got {targets!r}")
    if lora.rank > 0 and cfg.analysis.neurons.actor.reset_every > 0:
        raise UserError("'analysis.neurons.actor.reset_every' with actor.lora.rank > 0: the ReDo reset rewrites "
                        "frozen base weights the saved adapter does not hold; set it to 0 (the neuron-health "
                        "metrics work under LoRA)")
    if lora.rank > 0 and cfg.analysis.buckets.save_model:
        raise UserError("'analysis.buckets.save_model' with actor.lora.rank > 0 is not supported yet: the "
                        "checkpoints (trainer.save_freq) hold the adapter")


def _per_sample_terms(cfg: RLGradConfig) -> None:
    terms = cfg.analysis.per_sample.terms
    if not isinstance(terms, list | tuple) or not terms or any(t not in PER_SAMPLE_TERMS for t in terms):
        raise UserError(f"'analysis.per_sample.terms' must be a list of {', '.join(PER_SAMPLE_TERMS)}, got {terms!r}")


RELATIONS = (_optimizer_betas, _tiny_model_shape, _algorithm, _mini_batches, _trainer, _critic_model, _agent_and_data,
             _custom_reward, _lora, _per_sample_terms)
