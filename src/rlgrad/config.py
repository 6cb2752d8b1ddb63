"""Typed configuration: dataclass schema, YAML presets, verl-style ``key=value`` overrides.

The field docs below are the user documentation of every setting. Key names follow
verl where one exists (``actor.ppo_mini_batch_size``, ``rollout.n`` ...); verl's and RAGEN's
spellings (``actor_rollout_ref.actor.*``, ``es_manager.train.*``, ``trainer.gradient_analysis_*``,
``actor_rollout_ref.actor.redo_*`` ...) are accepted as aliases, see ``ALIASES``. Every instrument's
settings live under ``analysis.``.

Resolution order: schema defaults < preset (``--config-name`` / ``--config``) < overrides.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlgrad.algorithm_config import (  # noqa: F401  (re-exported: the schema is read from rlgrad.config)
    OUTCOME_ESTIMATORS,
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
    CriticModelConfig,
    OptimConfig,
    RewardConfig,
    per_response_advantage,
    validate_algorithm,
)
from rlgrad.aliases import ALIASES, PROBE_ONLY_KEY, resolve_alias
from rlgrad.analysis_config import AnalysisConfig
from rlgrad.envs.config import AgentConfig, EnvConfig
from rlgrad.errors import UserError
from rlgrad.fields import setting as _f


@dataclass
class TinyModelConfig:
    """Architecture of the embedded default model (a Qwen2 built locally; used when model.path is null)."""

    hidden_size: int = _f(128, "Width of the residual stream.", ge=1)
    num_hidden_layers: int = _f(4, "Transformer blocks.", ge=1)
    num_attention_heads: int = _f(4, "Query heads.", ge=1)
    num_key_value_heads: int = _f(2, "Key/value heads (grouped-query attention).", ge=1)
    intermediate_size: int = _f(384, "MLP width.", ge=1)
    max_position_embeddings: int = _f(256, "Longest prompt+response the model accepts.", ge=2)


@dataclass
class ModelConfig:
    path: str | None = _f(None, "Local Hugging Face causal-LM directory (with its tokenizer), or a .gguf file "
                          "(dequantised once, cached as a Hugging Face directory). null: the embedded default. "
                          "Never fetched from a hub.")
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    warmstart_steps: int = _f(1500, "Supervised warm-start steps for the "
                              "embedded default (0: RL from scratch). Cached.", ge=0)
    warmstart_lr: float = _f(2e-3, "Learning rate of the warm start.", gt=0)
    warmstart_batch_size: int = _f(64, "Examples per warm-start step.", ge=1)
    warmstart_seed: int | None = _f(1, "Seed of the embedded default's initial weights and warm start, apart from "
                                    "trainer.seed: runs that differ only in trainer.seed share one cached warm "
                                    "start. null: trainer.seed (each seed builds its own initial model).",
                                    ge=0, le=2**32 - 1)
    cache_dir: str | None = _f(None, "Where warm-started default models and dequantised .gguf models are "
                               "cached (default: $RLGRAD_CACHE or ~/.cache/rlgrad).")
    dtype: str = _f("float32", "Parameter dtype.", choices=("float32", "bfloat16", "float16"))


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


@dataclass
class RolloutConfig:
    n: int = _f(8, "Samples per prompt (the GRPO group size).", ge=1)
    temperature: float = _f(1.0, "Sampling temperature of training rollouts (> 0; greedy validation is "
                            "rollout.val_do_sample=false).", gt=0,
                            why="0 would be greedy decoding: every sample of a group the same, no reward variance "
                            "and no GRPO signal, and no sampling distribution for the log-probs; use a small "
                            "temperature such as 0.1 (validation is greedy already: rollout.val_do_sample=false)")
    top_p: float = _f(1.0, "Nucleus sampling threshold of training rollouts.", gt=0, le=1)
    top_k: int = _f(0, "Top-k sampling (0: off).", ge=0)
    response_length: int = _f(8, "Maximum response tokens (verl: data.max_response_length).", ge=1)
    val_do_sample: bool = _f(False, "Sample during validation (false: greedy, as verl's val_kwargs default).")
    log_prob_micro_batch_size: int = _f(64, "Sequences per forward when computing old/ref "
                                        "log-probs (and, with gae, the critic's old values).", ge=1)
    recompute_log_probs: bool = _f(False, "Recompute old log-probs with a separate forward "
                                   "(verl's default) instead of taking them from the rollout.")
    engine: str = _f("auto", "Rollout engine: hf (transformers generate) | "
                     "native (rlgrad's decode loop for Qwen2/Llama/Mistral) | "
                     "auto (native when the model supports it, else hf).", choices=("auto", "hf", "native"))
    rollout_filter_strategy: str = _f("top_p", "Group filter: top_p | top_k | top_k_abs | min_p.",
                                      choices=("top_p", "top_k", "top_k_abs", "min_p"))
    rollout_filter_value: float = _f(1.0, "Filter threshold (1.0 with top_p keeps every group).", ge=0)
    rollout_filter_type: str = _f("largest", "Keep the groups with the largest or smallest metric.",
                                  choices=("largest", "smallest"))
    rollout_filter_metric: str = _f("reward_variance", "Group metric the filter ranks by.",
                                    choices=("reward_variance", "reward", "reward_sum", "entropy", "entropy_variance",
                                             "length"))
    rollout_filter_top_p_prob_mode: str = _f("linear", "top_p probabilities: metric/sum (linear) or softmax.",
                                             choices=("linear", "softmax"))
    rollout_filter_include_zero: bool = _f(True, "Keep groups whose metric is exactly zero.")
    rollout_filter_selection_eps: float = _f(0.01, "top_p with linear probabilities: the prefix stops once its "
                                             "metric sum reaches value x the total minus this slack (metric "
                                             "units; RAGEN's selection_eps).", ge=0)
    rollout_filter_empty_stop_steps: int = _f(5, "Stop the run after this many consecutive "
                                              "steps whose filter kept nothing.", ge=1)
    group_seeded_sampling: bool | None = _f(None, "Draw each prompt group's samples from its own "
                                            "generator seeded by (seed, step, group id), so the global "
                                            "batch does not depend on how groups are split over ranks (a "
                                            "1-process run with true reproduces an N-process run). null: "
                                            "on whenever torchrun launches rlgrad (any number of processes, "
                                            "so torchrun with 1 and with N processes sample the same batch), "
                                            "off in a plain one-process run.")


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
                                    ge=1, also=(-1,), why="-1 or null keeps every checkpoint; 0 would delete the "
                                    "newest")
    logger: list[str] = _f(["console", "jsonl"], "Metric sinks: console, jsonl, tensorboard, wandb.")
    seed: int = _f(1, "Seed of data, sampling and initialisation.", ge=0, le=2**32 - 1)
    rollout_data_dir: str | None = _f(None, "Where each step's completions are written, one JSONL file per step "
                                            "(verl's key; null: RUN/rollouts/).")
    device: str = _f("auto", "cpu | cuda | auto.", choices=("auto", "cpu", "cuda"))
    num_threads: int | None = _f(None, "torch CPU threads (null: torch's default).", ge=1)
    strategy: str = _f("ddp", "Data parallelism under torchrun: ddp (replicated weights) | fsdp2 (torch fully_shard "
                       "on each decoder layer and the root). Unused in one process.", choices=("ddp", "fsdp2"))
    nnodes: int = _f(1, "Nodes (verl key). Under torchrun the environment wins: WORLD_SIZE / LOCAL_WORLD_SIZE.", ge=1)
    n_gpus_per_node: int = _f(1, "Processes per node (verl key). Under torchrun the environment wins: "
                              "LOCAL_WORLD_SIZE. Also the divisor of analysis.buckets.dp_trim (x nnodes).", ge=1)
    dist_timeout_s: float = _f(600.0, "Collective timeout in seconds: a rank that died or hangs "
                               "ends the run with an error after this long instead of a hang.", gt=0)


@dataclass
class RLGradConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    env: EnvConfig = field(default_factory=EnvConfig)


CONFIG_DIRS = [Path.cwd() / "configs", Path(__file__).resolve().parents[2] / "configs"]


def _schema_keys(node: Any, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(node):
        v = getattr(node, f.name)
        full = f"{prefix}{f.name}"
        keys.append(full)
        if dataclasses.is_dataclass(v):
            keys.extend(_schema_keys(v, full + "."))
    return keys


SCHEMA_KEYS = _schema_keys(RLGradConfig())
SECTIONS = {k for k in SCHEMA_KEYS if any(o.startswith(k + ".") for o in SCHEMA_KEYS)}
_DICT_KEYS = {"reward.weights", "data.reasoning_gym.config"}  # free-form mappings: their sub-keys are user data


# Words that name the same thing in different frameworks' keys (verl's ``*_freq`` are rlgrad's ``*_every``).
_SYNONYMS = {"freq": "every", "frequency": "every", "every": "freq", "learning_rate": "lr", "steps": "every"}


def suggest_keys(key: str, n: int = 3) -> list[str]:
    """The settings most likely meant by an unknown ``key``: a synonym's spelling (``..._freq`` -> ``..._every``),
    the same last word in any section (``actor.lr`` -> ``actor.optim.lr``; plain ``lr`` -> every ``*.lr``), then
    the closest spellings of the whole key among the schema and the aliases, those in the key's section first."""
    names = SCHEMA_KEYS + [a for a in ALIASES if not a.endswith(".")]
    leaf, section = key.rsplit(".", 1)[-1], key.split(".", 1)[0]
    swapped = [key[: len(key) - len(leaf)] + leaf.replace(a, b) for a, b in _SYNONYMS.items() if a in leaf]
    out = [k for k in swapped if k in names]
    same_leaf = sorted((k for k in SCHEMA_KEYS if k.rsplit(".", 1)[-1] == leaf),
                       key=lambda k: (not k.startswith(section + "."), k.count("."), k))
    names = [k for k in names if k not in SECTIONS]  # settings, not the sections holding them
    scored = sorted(((difflib.SequenceMatcher(None, key, k).ratio(), k) for k in names), reverse=True)
    best = scored[0][0] if scored else 0.0
    close = [k for r, k in scored if r >= max(0.6, best - 0.08)]  # only the near-best spellings, not padding
    for k in same_leaf + close:
        if k not in out and k != key:
            out.append(k)
    return out[:n]


def check_key(key: str, origin: str) -> str:
    """Map an alias to our key and fail with suggestions if the key does not exist."""
    ours = resolve_alias(key)
    if ours in SCHEMA_KEYS or any(ours.startswith(d + ".") for d in _DICT_KEYS):
        return ours
    hints = suggest_keys(ours)
    alias = f" (alias of '{ours}')" if ours != key else ""
    what = "a setting rlgrad does not support" if alias else "an unknown config key"
    msg = f"{origin}: '{key}'{alias} is {what}"
    if hints:
        msg += "; did you mean " + " or ".join(f"'{h}'" for h in hints) + "?"
    raise UserError(msg + " (`rlgrad train --show-config` lists every setting)")


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        full = f"{prefix}{k}"
        if isinstance(v, dict) and v and resolve_alias(full) not in _DICT_KEYS:
            out.update(_flatten(v, full + "."))
        else:
            out[full] = v
    return out


def find_preset(name: str) -> Path:
    for d in CONFIG_DIRS:
        p = d / f"{name}.yaml"
        if p.is_file():
            return p
    known = sorted({p.stem for d in CONFIG_DIRS if d.is_dir() for p in d.glob("*.yaml")})
    hint = difflib.get_close_matches(name, known, n=1)
    raise UserError(f"--config-name: no preset '{name}' (known: {', '.join(known) or 'none'})"
                    + (f"; did you mean '{hint[0]}'?" if hint else ""))


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise UserError(f"config file {path} is a directory") from None
    except UnicodeDecodeError:
        raise UserError(f"config file {path} is not UTF-8 text") from None
    except OSError as e:
        raise UserError(f"cannot read config file {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise UserError(f"config file {path}{where} is not valid YAML") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of settings")
    return data


def parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item or item.startswith("="):
        raise UserError(f"override '{item}' is not of the form key=value")
    key, raw = item.split("=", 1)
    key = key.strip().lstrip("+")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise UserError(f"override '{item}': cannot parse the value '{raw}'") from None
    return key, value


def load_config(preset: str | None = None, config_file: str | None = None,
                overrides: list[str] | None = None, base_file: str | None = None,
                probe: bool = False) -> RLGradConfig:
    """Schema defaults < base_file < preset < config_file < overrides, validated.

    Every error is a one-line UserError. ``base_file`` is a run's saved config.yaml (``rlgrad probe``, which
    passes ``probe=True``: RAGEN's ``trainer.gradient_analysis_only`` is then what it runs anyway).
    """
    layers: list[tuple[str, dict[str, Any]]] = []
    if base_file:
        layers.append((base_file, _flatten(_read_yaml(Path(base_file)))))
    if preset:
        path = find_preset(preset)
        layers.append((str(path), _flatten(_read_yaml(path))))
    if config_file:
        layers.append((config_file, _flatten(_read_yaml(Path(config_file)))))
    ov: dict[str, Any] = {}
    for item in overrides or []:
        k, v = parse_override(item)
        ov[k] = v
    layers.append(("override", ov))

    cfg: DictConfig = OmegaConf.structured(RLGradConfig)
    spelled: dict[str, str] = {}  # our key -> the alias the user wrote, so errors name what they wrote
    for origin, flat in layers:
        for key, value in flat.items():
            if resolve_alias(key) == PROBE_ONLY_KEY:  # false (as a saved run config holds it) changes nothing
                if value and not probe:  # what `rlgrad probe` (probe=True) is anyway
                    raise UserError(f"{origin}: '{key}' is RAGEN's checkpoint-probe mode; run "
                                    "`rlgrad probe --resume-from-path RUN/global_step_N` instead")
                continue
            ours = check_key(key, origin)
            if ours != key:
                spelled[ours] = key
            else:  # a later layer's own spelling wins: errors name it
                spelled.pop(ours, None)
            try:
                OmegaConf.update(cfg, ours, value, merge=False)
            except OmegaConfBaseException as e:
                reason = str(e).splitlines()[0]
                raise UserError(f"{origin}: bad value {value!r} for '{key}': {reason}") from None
    obj = OmegaConf.to_object(cfg)
    try:
        validate(obj)
    except UserError as e:
        msg = str(e)
        for ours, theirs in spelled.items():
            msg = msg.replace(f"'{ours}'", f"'{theirs}' ({ours})", 1)
        raise UserError(msg) from None
    return obj


def _walk(node: Any, prefix: str = ""):
    for f in dataclasses.fields(node):
        v = getattr(node, f.name)
        if dataclasses.is_dataclass(v):
            yield from _walk(v, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, v


_OPS = {"ge": (">=", lambda v, b: v >= b), "gt": (">", lambda v, b: v > b), "le": ("<=", lambda v, b: v <= b),
        "lt": ("<", lambda v, b: v < b)}


def check_field(key: str, f: dataclasses.Field, v: Any) -> None:
    """One setting against what its field declares (``_f``): choices, finiteness, bounds."""
    if v is None:  # an Optional key left unset
        return
    choices = f.metadata.get("choices")
    if choices and v not in choices:
        hint = difflib.get_close_matches(str(v), choices, n=1)
        raise UserError(f"'{key}' must be one of {', '.join(choices)}, got '{v}'"
                        + (f"; did you mean '{hint[0]}'?" if hint else ""))
    numbers = [v] if isinstance(v, int | float) and not isinstance(v, bool) else []
    if isinstance(v, list | dict):  # a list of numbers (betas) or a mapping to numbers (reward weights)
        numbers = [x for x in (v.values() if isinstance(v, dict) else v)
                   if isinstance(x, int | float) and not isinstance(x, bool)]
    why = f.metadata.get("why")
    for x in numbers:
        if not math.isfinite(x):
            raise UserError(f"'{key}' must be a finite number, got {x}")
        if x in f.metadata.get("also", ()):
            continue
        for op, bound in f.metadata.get("bounds", {}).items():
            sign, ok = _OPS[op]
            if not ok(x, bound):
                allowed = " and ".join(f"{_OPS[o][0]} {b:g}" for o, b in f.metadata["bounds"].items())
                extra = "".join(f" or {a}" for a in f.metadata.get("also", ()))
                raise UserError(f"'{key}' must be {allowed}{extra}, got {x}" + (f": {why}" if why else ""))


def validate(cfg: RLGradConfig) -> None:
    """Every field against its declaration (``check_field``), then the relations between fields."""
    cfg.data.apply_chat_template = str(cfg.data.apply_chat_template).lower()  # YAML true/false arrive as bools
    for key, f, v in _walk(cfg):
        check_field(key, f, v)
    betas = cfg.actor.optim.betas, cfg.critic.optim.betas
    for name, b in zip(("actor.optim.betas", "critic.optim.betas"), betas):
        if len(b) != 2 or not all(0 <= x < 1 for x in b):
            raise UserError(f"'{name}' must be two numbers in [0, 1), got {list(b)}")
    t = cfg.model.tiny
    if t.num_attention_heads % t.num_key_value_heads or t.hidden_size % t.num_attention_heads:
        raise UserError(f"'model.tiny' needs num_key_value_heads ({t.num_key_value_heads}) to divide "
                        f"num_attention_heads ({t.num_attention_heads}) and that to divide hidden_size "
                        f"({t.hidden_size})")
    validate_algorithm(cfg)
    for role in ("actor", "critic"):  # the critic's mini-batch matters only with gae
        mb = getattr(cfg, role).ppo_mini_batch_size
        if mb is not None and cfg.data.train_batch_size % mb and (role == "actor" or cfg.algorithm.adv_estimator
                                                                  == "gae"):
            raise UserError(f"'{role}.ppo_mini_batch_size' ({mb}) must divide "
                            f"data.train_batch_size ({cfg.data.train_batch_size})")
    for s in cfg.trainer.logger:
        if s not in ("console", "jsonl", "tensorboard", "wandb"):
            raise UserError(f"'trainer.logger' entry '{s}' is not one of console, jsonl, tensorboard, wandb")
    if cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        raise UserError("'trainer.resume_mode=resume_path' needs 'trainer.resume_from_path'")
    p = cfg.critic.model.path
    if cfg.algorithm.adv_estimator == "gae" and p is not None and not (Path(p) / "config.json").is_file():
        raise UserError(f"'critic.model.path' '{p}' is not a local Hugging Face model directory (no config.json)")
    if cfg.agent.use_turn_scores and cfg.agent.window is not None:
        raise UserError("'agent.use_turn_scores' needs every turn in the trained sequence "
                        "(agent.context_window_mode=full); a window drops the earlier turns' rewards")
    if cfg.data.task == "math" and not cfg.data.train_files:
        raise UserError("'data.task=math' needs 'data.train_files' (local .jsonl or .parquet)")


def flat_settings(cfg: RLGradConfig) -> dict[str, Any]:
    """Every setting by its dotted key (mappings such as reward.weights as one value)."""
    return {k: v for k, _, v in _walk(cfg)}


def documented_yaml(node: Any, indent: int = 0) -> str:
    """``node`` (the resolved config) as YAML with every setting's documentation above it, as ``rlgrad train
    --show-config`` prints it; it loads back as the same settings."""
    import textwrap

    pad, out = "  " * indent, []
    for f in dataclasses.fields(node):
        v = getattr(node, f.name)
        doc = f.metadata.get("help") or (dataclasses.is_dataclass(v) and (type(v).__doc__ or "").strip())
        if doc and not str(doc).startswith(type(v).__name__ + "("):  # dataclasses' own signature docstring
            if dataclasses.is_dataclass(v):
                doc = " ".join(doc.split())
            out += [f"{pad}# {line}" for line in textwrap.wrap(str(doc), max(40, 110 - len(pad)))]
        if dataclasses.is_dataclass(v):
            out += [f"{pad}{f.name}:", documented_yaml(v, indent + 1).rstrip("\n")]
        else:
            value = yaml.safe_dump(v, default_flow_style=True, allow_unicode=True).strip()
            out.append(f"{pad}{f.name}: {value.removesuffix(chr(10) + '...').strip()}")
    return "\n".join(out) + "\n"


def presets() -> list[tuple[str, str]]:
    """``(name, first comment line)`` of every preset ``--config-name`` finds, by name."""
    found: dict[str, str] = {}
    for d in CONFIG_DIRS:
        for p in sorted(d.glob("*.yaml")) if d.is_dir() else []:
            first = next((ln.lstrip("# ").strip() for ln in p.read_text().splitlines() if ln.startswith("#")), "")
            found.setdefault(p.stem, first)
    return sorted(found.items())


def to_yaml(cfg: RLGradConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_yaml_file(path: str | os.PathLike) -> RLGradConfig:
    """Reload a config.yaml written to a run directory (all keys present, no aliases)."""
    base = OmegaConf.structured(RLGradConfig)
    try:
        merged = OmegaConf.merge(base, OmegaConf.load(path))
    except (OSError, OmegaConfBaseException, yaml.YAMLError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read config {path}: {str(e).splitlines()[0]}") from None
    return OmegaConf.to_object(merged)
