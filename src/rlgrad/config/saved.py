"""A run's saved config, read one way. Every reader of a run (the report, the figures, the doctor, the reward
export) gets a :class:`SavedConfig`: the file's tree as saved, its text, a setting looked up by today's key (a run
saved before a key moved holds it under its earlier name, ``aliases``) and the schema's object built from it once.
Reading is lenient: a hand-edited or damaged file never stops a reader, it only lacks what it cannot give.
``from_yaml_file`` is the strict reload that a resume compares its settings with (a damaged file is an error there).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlgrad.config.aliases import ALIASES, resolve_alias
from rlgrad.config.schema import SCHEMA_KEYS, SECTIONS, RLGradConfig
from rlgrad.errors import UserError

_UNSET = object()


@dataclass(frozen=True)
class SavedConfig:
    """A run's config as saved: ``tree`` (None when absent or unreadable) and ``text`` (None when absent)."""

    tree: Any = None
    text: str | None = None

    def get(self, dotted: str, default: Any = None) -> Any:
        """A setting by its key; a run saved before a key moved holds it under an alias
        (``trainer.gradient_analysis_every`` for ``analysis.buckets.every``), which is read then."""
        for spelling in (dotted, *_earlier_names(dotted)):
            node: Any = self.tree or {}
            for part in spelling.split("."):
                if not isinstance(node, dict) or part not in node:
                    break
                node = node[part]
            else:
                return node
        return default

    @functools.cached_property
    def settings(self) -> RLGradConfig:
        """The run's settings as the schema holds them: the saved values over the schema's defaults. A value the
        schema refuses (a hand-edited file) leaves that setting at its default rather than hide what the rest
        says."""
        settings = OmegaConf.structured(RLGradConfig)
        for key in SCHEMA_KEYS:
            if key in SECTIONS:
                continue
            value = self.get(key, _UNSET)
            if value is _UNSET:
                continue
            try:
                OmegaConf.update(settings, key, value, merge=False)
            except OmegaConfBaseException:
                continue
        return OmegaConf.to_object(settings)


@functools.cache
def _earlier_names(dotted: str) -> tuple[str, ...]:
    return tuple(a for a in ALIASES if not a.endswith(".") and resolve_alias(a) == dotted)


def read_saved_config(path: str | os.PathLike) -> SavedConfig:
    """The config saved at ``path`` (a run's config.yaml, verl's Hydra config.yaml), leniently: nothing when
    there is no file, the text alone when it does not parse."""
    p = Path(path)
    if not p.is_file():
        return SavedConfig()
    text = p.read_text(errors="replace")
    try:
        return SavedConfig(OmegaConf.to_container(OmegaConf.load(p), resolve=False), text)
    except Exception:  # a hand-edited, broken config.yaml should not stop a reader
        return SavedConfig(None, text)


def config_tree(cfg: RLGradConfig) -> dict:
    """``cfg`` as the tree its saved config.yaml holds (what ``SavedConfig.tree`` reads back)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def from_yaml_file(path: str | os.PathLike) -> RLGradConfig:
    """Reload a config.yaml written to a run directory (all keys present, no aliases); a one-line error when it
    cannot be read or the schema refuses a value."""
    base = OmegaConf.structured(RLGradConfig)
    try:
        merged = OmegaConf.merge(base, OmegaConf.load(path))
    except (OSError, OmegaConfBaseException, yaml.YAMLError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read config {path}: {str(e).splitlines()[0]}") from None
    return OmegaConf.to_object(merged)
