"""Metric sinks. The trainer hands each step's flat ``{name: float}`` dict to every sink.

``jsonl`` writes verl's file-logger line format ``{"step": N, "data": {...}}``; it is always on.
TensorBoard and Weights & Biases are optional extras (W&B honours ``WANDB_MODE=offline``).
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from rlgrad.errors import UserError
from rlgrad.metrics import key


def _clean(v: Any) -> Any:
    v = float(v)
    return v if math.isfinite(v) else str(v)  # JSON has no NaN/inf; keep them visible as strings


class JsonlSink:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        line = json.dumps({"step": step, "data": {k: _clean(v) for k, v in metrics.items()}})
        with open(self.path, "a") as f:  # one append + fsync per step: a crash loses at most a torn line
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        pass


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("trainer.logger=tensorboard needs the tensorboard package "
                            "(pip install 'rlgrad[tensorboard]')") from None
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, float(v), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, project: str, name: str, run_dir: Path, config: dict, resume_id: str | None = None):
        try:
            import wandb
        except ImportError:
            raise UserError("trainer.logger=wandb needs the wandb package (pip install 'rlgrad[wandb]')") from None
        self.wandb = wandb
        id_file = run_dir / "wandb_run_id.txt"
        run_id = id_file.read_text().strip() if id_file.exists() else None
        # Without credentials (or network) log offline rather than fail; `wandb sync` uploads later.
        mode = os.environ.get("WANDB_MODE") or (None if os.environ.get("WANDB_API_KEY") or _wandb_logged_in()
                                                else "offline")
        self.run = wandb.init(project=project, name=name, dir=str(run_dir), config=config, id=run_id,
                              resume="allow", mode=mode)
        if run_id is None:
            from rlgrad.rundir import atomic_write_text
            atomic_write_text(id_file, self.run.id)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def log_table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        self.run.log({key: self.wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


def _wandb_logged_in() -> bool:
    netrc = Path.home() / ".netrc"
    return netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore")


# The phases of a step, in order, as the console names them (their timing_s/<phase> keys: rlgrad.metrics).
PHASES = ("gen", "filter", "old_log_prob", "ref", "values", "adv", "update_critic", "analysis/components",
          "analysis/buckets", "update_actor", "neuron/actor", "neuron/critic")


class ConsoleSink:
    """A tqdm progress bar (step, reward, ETA), a line for each validation, and, at a step where an instrument
    ran, a line saying where the step's time went."""

    def __init__(self, total: int, initial: int = 0):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=initial, desc="rlgrad", unit="step", dynamic_ncols=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if "critic/score/mean" in metrics:
            self.bar.set_postfix(reward=f"{metrics['critic/score/mean']:.3f}",
                                 acc=f"{metrics.get('rollout/accuracy', float('nan')):.2f}", refresh=False)
        if step > 0:
            self.bar.update(step - self.bar.n)
        if "val/accuracy" in metrics:
            self.bar.write(f"step {step}: val/accuracy = {metrics['val/accuracy']:.3f}")
        if any(k.startswith(("timing_s/analysis/", "timing_s/neuron/")) for k in metrics):
            parts = [f"{p} {metrics['timing_s/' + p]:.2f}" for p in PHASES if "timing_s/" + p in metrics]
            self.bar.write(f"step {step}: {metrics.get('timing_s/step', float('nan')):.2f} s "
                           f"({', '.join(parts)})")

    def close(self) -> None:
        self.bar.close()


class MetricLogger:
    def __init__(self, sinks: list):
        self.sinks = sinks

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for s in self.sinks:
            s.log(step, metrics)

    def log_table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        for s in self.sinks:
            if hasattr(s, "log_table"):
                s.log_table(key, columns, rows, step)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


@contextmanager
def timer(metrics: dict, key: str):
    """Seconds spent in the block, written to ``metrics[key]`` (a ``timing_s/...`` key)."""
    t0 = time.perf_counter()
    yield
    metrics[key] = time.perf_counter() - t0


def summarize(template: str, x: torch.Tensor) -> dict[str, float]:
    """Mean, max and min of ``x`` under a ``.../{stat}`` metric template."""
    x = x.float()
    if x.numel() == 0:
        return {}
    return {key(template, stat=s): float(getattr(x, s)()) for s in ("mean", "max", "min")}
