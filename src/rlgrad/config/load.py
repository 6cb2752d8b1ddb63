"""Loading a config: schema defaults < preset (``--config-name`` / ``--config``) < ``key=value`` overrides, verl's
and RAGEN's spellings mapped to ours (``aliases``), unknown keys answered with the closest settings.
"""

from __future__ import annotations

import copy
import difflib
import functools
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlgrad.config.aliases import ALIASES, NOT_HERE, PROBE_ONLY_KEY, resolve_alias
from rlgrad.config.schema import _DICT_KEYS, SCHEMA_KEYS, SECTIONS, RLGradConfig, _walk
from rlgrad.config.validate import check_bool, is_bool_field, validate
from rlgrad.errors import UserError

CONFIG_DIRS = [Path.cwd() / "configs", Path(__file__).resolve().parents[3] / "configs"]


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
    if ours in NOT_HERE:
        raise UserError(f"{origin}: '{key}': {NOT_HERE[ours]}")
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


def read_yaml_mapping(path: Path, what: str = "config file") -> dict:
    """The mapping a YAML file the user names holds (a config file, ``--thresholds``); a one-line error naming
    ``what`` and the file when it cannot be read or holds something else."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise UserError(f"{what} {path} is a directory") from None
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not UTF-8 text") from None
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise UserError(f"{what} {path}{where} is not valid YAML") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} must hold a mapping of settings")
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


def _layers(preset: str | None, config_file: str | None, overrides: list[str] | None,
            base_file: str | None) -> list[tuple[str, dict[str, Any]]]:
    """``(origin, flat settings)`` of each layer a config is built from, lowest first."""
    layers: list[tuple[str, dict[str, Any]]] = []
    if base_file:
        layers.append((base_file, _flatten(read_yaml_mapping(Path(base_file)))))
    if preset:
        path = find_preset(preset)
        layers.append((str(path), _flatten(read_yaml_mapping(path))))
    if config_file:
        layers.append((config_file, _flatten(read_yaml_mapping(Path(config_file)))))
    layers.append(("override", dict(parse_override(item) for item in overrides or [])))
    return layers


def _probe_only(origin: str, key: str, value: Any, probe: bool) -> bool:
    """Whether ``key`` is RAGEN's probe-mode switch (then skipped); set true outside `rlgrad probe`, an error."""
    if resolve_alias(key) != PROBE_ONLY_KEY:
        return False
    if value and not probe:  # false (as a saved run config holds it) changes nothing; probe=True is that mode
        raise UserError(f"{origin}: '{key}' is RAGEN's checkpoint-probe mode; run "
                        "`rlgrad probe --resume-from-path RUN/global_step_N` instead")
    return True


@functools.cache
def _bool_keys() -> frozenset[str]:
    """The keys of the settings that are bools."""
    return frozenset(key for key, f, _ in _walk(RLGradConfig()) if is_bool_field(f))


def _apply_layer(cfg: DictConfig, origin: str, flat: dict[str, Any], spelled: dict[str, str], probe: bool) -> None:
    """Set each of a layer's settings in ``cfg``; ``spelled`` keeps the alias the user wrote for each key."""
    for key, value in flat.items():
        if _probe_only(origin, key, value, probe):
            continue
        ours = check_key(key, origin)
        if ours != key:
            spelled[ours] = key
        else:  # a later layer's own spelling wins: errors name it
            spelled.pop(ours, None)
        if ours in _bool_keys():
            try:
                check_bool(key, value)
            except UserError as e:
                raise UserError(f"{origin}: {e}") from None
        try:
            OmegaConf.update(cfg, ours, value, merge=False)
        except OmegaConfBaseException as e:
            reason = str(e).splitlines()[0]
            raise UserError(f"{origin}: bad value {value!r} for '{key}': {reason}") from None


@functools.cache
def _schema_defaults() -> DictConfig:
    """The schema's defaults as a DictConfig, built once: ``OmegaConf.structured`` takes ~60 ms (it walks every
    dataclass), a deep copy ~8 ms, and every load starts from a copy (the defaults do not depend on the
    environment, so one build serves the whole process)."""
    return OmegaConf.structured(RLGradConfig)


def load_config(preset: str | None = None, config_file: str | None = None,
                overrides: list[str] | None = None, base_file: str | None = None,
                probe: bool = False) -> RLGradConfig:
    """Schema defaults < base_file < preset < config_file < overrides, validated.

    Every error is a one-line UserError. ``base_file`` is a run's saved config.yaml (``rlgrad probe``, which
    passes ``probe=True``: RAGEN's ``trainer.gradient_analysis_only`` is then what it runs anyway).
    """
    cfg: DictConfig = copy.deepcopy(_schema_defaults())  # never the cached one: layers are set on it
    spelled: dict[str, str] = {}  # our key -> the alias the user wrote, so errors name what they wrote
    for origin, flat in _layers(preset, config_file, overrides, base_file):
        _apply_layer(cfg, origin, flat, spelled, probe)
    obj = OmegaConf.to_object(cfg)
    try:
        validate(obj)
    except UserError as e:
        msg = str(e)
        for ours, theirs in spelled.items():
            msg = msg.replace(f"'{ours}'", f"'{theirs}' ({ours})", 1)
        raise UserError(msg) from None
    return obj


def preset_description(text: str) -> str:
    """A preset's description: the prose its file opens with, as one paragraph: the leading comment lines up to
    the first command line (indented, ``#   rlgrad train ...``), blank comment line or setting."""
    lines = []
    for line in text.splitlines():
        body = line[1:] if line.startswith("#") else None
        if body is None or body.startswith(("   ", "\t")) or not body.strip():
            break
        lines.append(body.strip())
    return " ".join(lines)


def presets() -> list[tuple[str, str]]:
    """``(name, description)`` of every preset ``--config-name`` finds, by name (``preset_description``)."""
    found: dict[str, str] = {}
    for d in CONFIG_DIRS:
        for p in sorted(d.glob("*.yaml")) if d.is_dir() else []:
            found.setdefault(p.stem, preset_description(p.read_text()))
    return sorted(found.items())
