"""Typed configuration: one dataclass per section, YAML presets, verl-style ``key=value`` overrides.

The field docs are the user documentation of every setting. Key names follow verl where one exists
(``actor.ppo_mini_batch_size``, ``rollout.n`` ...); verl's and RAGEN's spellings are accepted as aliases
(``aliases.py``). Resolution order: schema defaults < preset (``--config-name`` / ``--config``) < overrides.

    model.py  data.py  rollout.py  algorithm.py (actor.*, critic.*, algorithm.*, reward.*; every list of allowed
    values)  analysis.py (the instruments)  schedule.py (the step rule: when each runs)  agent.py (agent.*, env.*)
    trainer.py   schema.py (the root, ``RLGradConfig``)  fields.py  aliases.py  load.py  validate.py

Nothing here imports above ``rlgrad.errors``.
"""

from rlgrad.config.agent import AgentConfig, EnvConfig, FrozenLakeConfig, SokobanConfig
from rlgrad.config.algorithm import (
    AGG_MODES,
    COMPONENT_MODES,
    ESTIMATORS,
    KL_TYPES,
    OUTCOME_ESTIMATORS,
    PER_TOKEN,
    VERL_KL_TYPES,
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
    CriticModelConfig,
    FilterGroupsConfig,
    KLControlConfig,
    LoRAConfig,
    OptimConfig,
    OverlongBufferConfig,
    RewardConfig,
    per_response_advantage,
)
from rlgrad.config.aliases import ALIASES, PROBE_ONLY_KEY, resolve_alias
from rlgrad.config.analysis import (
    AnalysisConfig,
    BucketAnalysisConfig,
    ComponentAnalysisConfig,
    NeuronHealthConfig,
    NeuronsConfig,
    PerSampleConfig,
)
from rlgrad.config.data import DataConfig, ReasoningGymConfig
from rlgrad.config.doctor import HALT_ON, DoctorConfig
from rlgrad.config.load import (
    CONFIG_DIRS,
    check_key,
    find_preset,
    load_config,
    parse_override,
    presets,
    suggest_keys,
)
from rlgrad.config.model import ModelConfig, TinyModelConfig
from rlgrad.config.rollout import RolloutConfig
from rlgrad.config.saved import SavedConfig, config_tree, from_yaml_file, read_saved_config
from rlgrad.config.schedule import Schedule, schedules
from rlgrad.config.schema import SCHEMA_KEYS, SECTIONS, RLGradConfig, documented_yaml, flat_settings, to_yaml
from rlgrad.config.trainer import TrainerConfig
from rlgrad.config.validate import check_field, validate

__all__ = [
    "AGG_MODES", "ALIASES", "COMPONENT_MODES", "CONFIG_DIRS", "ESTIMATORS", "HALT_ON", "KL_TYPES",
    "OUTCOME_ESTIMATORS", "PER_TOKEN", "PROBE_ONLY_KEY", "SCHEMA_KEYS", "SECTIONS", "VERL_KL_TYPES", "ActorConfig",
    "AgentConfig", "AlgorithmConfig", "AnalysisConfig", "BucketAnalysisConfig", "ComponentAnalysisConfig",
    "CriticConfig", "CriticModelConfig", "DataConfig", "DoctorConfig", "EnvConfig", "FilterGroupsConfig",
    "FrozenLakeConfig", "KLControlConfig", "LoRAConfig", "ModelConfig", "NeuronHealthConfig", "NeuronsConfig",
    "OptimConfig", "OverlongBufferConfig", "PerSampleConfig", "RLGradConfig", "ReasoningGymConfig", "RewardConfig",
    "RolloutConfig", "SavedConfig", "Schedule", "SokobanConfig", "TinyModelConfig", "TrainerConfig", "check_field",
    "check_key", "config_tree", "documented_yaml", "find_preset", "flat_settings", "from_yaml_file", "load_config",
    "parse_override", "per_response_advantage", "presets", "read_saved_config", "resolve_alias", "schedules",
    "suggest_keys", "to_yaml", "validate",
]
