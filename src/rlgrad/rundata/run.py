"""A run as the readers see it: :class:`RunData` (metric rows by step, the saved config, where its files are) and the
lookups on its rows: a metric's series, the buckets of a bucket-analysis row, whether a run is unfinished."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlgrad.config.saved import SavedConfig
from rlgrad.metrics import parse
from rlgrad.runfiles import step_dir

PREFIX = "grad_norm"  # bucket metrics: grad_norm/{bucket}/... (rlgrad.metrics); layers.json's section
GRAD_COMPONENTS = ("task", "entropy", "kl")
LOSS_TERMS = ("policy", "entropy", "kl", "total")
ROLES = ("actor", "critic")


@dataclass
class RunData:
    name: str  # run directory name or W&B run name
    source: str  # where it came from (a path or entity/project/run_id), for titles
    rows: dict[int, dict[str, float]]  # step -> {metric: value}, finite numbers only
    config: dict | None = None  # the saved config's tree (SavedConfig.tree): config.yaml, verl's Hydra config, W&B's
    config_text: str | None = None
    run_dir: Path | None = None  # None for a W&B run
    rv_tables: dict[int, list[tuple[str, int, float]]] = field(default_factory=dict)  # W&B group tables
    nonfinite: dict[int, list[str]] = field(default_factory=dict)  # step -> metrics logged as NaN / inf
    kind: str = "rlgrad"  # rlgrad | trl | verl | wandb: whose trainer (and metric names) the run came from
    labels: dict[str, str] = field(default_factory=dict)  # component key -> its original name (another trainer's)
    # the host trainer's own settings under its own names (TRL's args that rlgrad's TRL integration records in
    # run_source.json: optim, learning_rate, max_grad_norm ...), read where the run's config lacks a key
    settings: dict[str, Any] = field(default_factory=dict)

    def metrics(self, step: int) -> dict[str, float]:
        return self.rows.get(step, {})

    def analysis_dir(self, step: int) -> Path | None:
        return None if self.run_dir is None else step_dir(self.run_dir, step)

    @property
    def saved(self) -> SavedConfig:
        """The run's config read the one way (``rlgrad.config.saved``): built once per run, again only when
        ``config`` is replaced."""
        cached = self.__dict__.get("_saved")
        if cached is None or cached.tree is not self.config:
            cached = self.__dict__["_saved"] = SavedConfig(self.config, self.config_text)
        return cached


def finite(v: Any) -> float | None:
    """A logged value as a float; None for NaN, inf and anything not a number (a bool counts as 0 / 1)."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float) and math.isfinite(float(v)):
        return float(v)
    return None


def series(run: RunData, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric over the run, where it was logged."""
    steps = [s for s, m in run.rows.items() if key in m]
    return steps, [run.rows[s][key] for s in steps]


def metric_keys(run: RunData) -> set[str]:
    return {k for m in run.rows.values() for k in m}


def config_get(run: RunData, dotted: str, default: Any = None) -> Any:
    """A setting of the run's config by its key (``SavedConfig.get``: a key saved before it moved read under its
    earlier name)."""
    return run.saved.get(dotted, default)


def unfinished(run: RunData) -> tuple[int, int] | None:
    """(last logged step, trainer.total_training_steps) of an rlgrad run short of its last step: still training,
    or stopped (a crash, a signal, a run the filter emptied); a resume continues it. None for a finished run, one
    that ended where it was told to (``analysis.buckets.exit_after``, ``rlgrad probe``), another trainer's run
    (TRL's and verl's own step counts are not in rlgrad's config), or one without a config."""
    total = config_get(run, "trainer.total_training_steps")
    steps = set(run.rows) | set(run.nonfinite)
    if run.kind != "rlgrad" or not isinstance(total, int) or not steps:
        return None
    last = max(steps)
    if last >= total or any("trainer/exited_after_gradient_analysis" in m for m in run.rows.values()):
        return None
    return last, total


def bucket_order(name: str) -> tuple:
    """The sort key of a bucket name: ``bucket_1``, ``bucket_2``, ..., then any other name."""
    m = re.fullmatch(r"bucket_(\d+)", name)
    return (0, int(m.group(1)), name) if m else (1, 0, name)


def sort_buckets(names) -> list[str]:
    """Bucket names, lowest reward variance first (``bucket_1``, ``bucket_2``, ..., then any other name)."""
    return sorted(set(names), key=bucket_order)


def bucket_names(metrics: dict[str, float]) -> list[str]:
    """Real buckets present in a metric row, lowest reward variance first (``all`` excluded)."""
    names = {f["bucket"] for k in metrics if (f := parse("grad_norm/{bucket}/sample_count", k))}
    names |= {f["bucket"] for k in metrics if (f := parse("grad_norm/{bucket}/{term}", k))}
    return sorted(names - {"all"}, key=bucket_order)


def analysis_steps(run: RunData) -> list[int]:
    """Steps whose row holds bucket metrics (as RAGEN's plotting script decides: a ``grad_norm/bucket_*`` value)."""
    return [s for s, m in run.rows.items() if bucket_names(m)]


def bucket_value(metrics: dict[str, float], bucket: str, name: str, default: float = math.nan) -> float:
    """``grad_norm/{bucket}/<name>``, ``name`` being the rest of a bucket template (``task``, ``loss/kl`` ...)."""
    return metrics.get(f"grad_norm/{bucket}/{name}", default)


def has_component(metrics: dict[str, float], comp: str) -> bool:
    """Was this gradient term computed (entropy needs entropy_coeff > 0, kl needs the KL loss)?"""
    return any((f := parse("grad_norm/{bucket}/{term}", k)) and f["term"] == comp for k in metrics)
