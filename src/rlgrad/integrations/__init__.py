"""rlgrad's instruments inside other trainers, through their documented extension points only.

``rlgrad.integrations.trl``: TRL's ``GRPOTrainer`` (``from rlgrad.integrations.trl import GRPOTrainer``).
``rlgrad.integrations.verl``: verl's actor worker (``python -m rlgrad.integrations.verl_main`` + verl's overrides).
Each integration turns the trainer's own batch and loss into a ``Batch`` and a ``LossFn`` and runs the same
hooks rlgrad's trainer runs (``rlgrad.analysis.hooks_from_config``) through the same ``rlgrad.hooks.HookRunner``,
writing the same run files, plus the hooks' tables in ``tables.jsonl`` (rlgrad's trainer logs them to W&B).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from rlgrad.config.load import load_config
from rlgrad.config.schema import RLGradConfig, flat_settings
from rlgrad.errors import UserError
from rlgrad.logging.sinks import JsonlSink, metrics_sink
from rlgrad.runfiles import METRICS_FILE, read_jsonl, truncate_jsonl_after


def instrument_settings(overrides: list[str], unsupported: dict[str, object], trainer: str) -> RLGradConfig:
    """rlgrad's settings for the instruments inside another trainer; a one-line error for one that needs
    rlgrad's own trainer (``unsupported``: key -> the only value allowed)."""
    cfg = load_config(None, None, overrides)
    values = flat_settings(cfg)
    for k, default in unsupported.items():
        if values[k] != default:
            raise UserError(f"'{k}' needs rlgrad's own trainer; with {trainer} leave it at {default}")
    return cfg


def open_metrics(run_dir: Path, resumed_step: int, new_dir: str, also: tuple[Path, ...] = ()) -> JsonlSink:
    """``run_dir/metrics.jsonl`` for appending: another run's is refused (``new_dir`` says how to choose a new
    directory), a resumed run's (and ``also``'s) rows after ``resumed_step`` are dropped, as it recomputes them."""
    path = run_dir / METRICS_FILE
    if resumed_step == 0 and path.exists() and read_jsonl(path):
        raise UserError(f"'{run_dir}' already holds an rlgrad metrics.jsonl of another run: {new_dir}, or resume "
                        "that run")
    for f in (path, *also):
        if f.exists():
            truncate_jsonl_after(f, resumed_step)
    return metrics_sink(run_dir)



@contextmanager
def activation_checkpointing_off(model: torch.nn.Module, enable_kwargs: dict | None) -> Iterator[None]:
    """Grad mode on and the Hugging Face model's activation checkpointing off for the instruments' forwards
    (as TRL turns it off for its own extra forwards): the fast engine's hooks must see each forward once.
    The analysis then holds a whole batch's activations. ``enable_kwargs``: what the host trainer turns it
    back on with (TRL's ``gradient_checkpointing_kwargs``; verl's engine passes ``use_reentrant=False``)."""
    new = hasattr(model, "activation_checkpointing_disable")  # transformers 5 (earlier: gradient_checkpointing_*)
    on = bool(getattr(model, "is_activation_checkpointing" if new else "is_gradient_checkpointing", False))
    if on:
        (model.activation_checkpointing_disable if new else model.gradient_checkpointing_disable)()
    try:
        with torch.enable_grad():
            yield
    finally:
        if on:
            (model.activation_checkpointing_enable if new else model.gradient_checkpointing_enable)(enable_kwargs)
