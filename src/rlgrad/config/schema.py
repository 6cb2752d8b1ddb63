"""The root of the config schema (``RLGradConfig``: one dataclass per section) and what is read off it: every
setting's dotted key, the sections, a resolved config as YAML with every setting's documentation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import yaml
from omegaconf import OmegaConf

from rlgrad.config.agent import AgentConfig, EnvConfig
from rlgrad.config.algorithm import (
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
    RewardConfig,
)
from rlgrad.config.analysis import AnalysisConfig
from rlgrad.config.data import DataConfig
from rlgrad.config.doctor import DoctorConfig
from rlgrad.config.model import ModelConfig
from rlgrad.config.rollout import RolloutConfig
from rlgrad.config.trainer import TrainerConfig


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
    doctor: DoctorConfig = field(default_factory=DoctorConfig)


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


# free-form mappings: their sub-keys are user data
_DICT_KEYS = {"reward.weights", "data.reasoning_gym.config", "reward.custom_reward_function.reward_kwargs"}


def _walk(node: Any, prefix: str = ""):
    for f in dataclasses.fields(node):
        v = getattr(node, f.name)
        if dataclasses.is_dataclass(v):
            yield from _walk(v, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, v


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


def to_yaml(cfg: RLGradConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
