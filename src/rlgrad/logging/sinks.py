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
from rlgrad.metrics import INSTRUMENTS, key, match, write_run_catalogue
from rlgrad.metrics.judge import cosine_word
from rlgrad.runfiles import METRICS_FILE, WANDB_ID_FILE, step_dir


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


class JsonlTableSink:
    """Tables (``rlgrad.hooks.HookResult.tables``) as JSON lines, ``{"step", "key", "columns", "rows"}``: where a
    loop without a table sink of its own (the TRL and verl integrations) keeps them, in ``tables.jsonl``."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def log_table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        cells = [[_cell(v) for v in row] for row in rows]
        line = json.dumps({"step": step, "key": key, "columns": list(columns), "rows": cells})
        with open(self.path, "a") as f:
            f.write(line + "\n")

    def close(self) -> None:
        pass


def _cell(v: Any) -> Any:
    """A table cell as JSON holds it: numbers as numbers (NaN/inf as strings, as in metrics.jsonl), text as text."""
    if isinstance(v, torch.Tensor):
        v = v.item()
    return _clean(v) if isinstance(v, float) else v


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
        id_file = run_dir / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else None
        # Without credentials (or network) log offline rather than fail; `wandb sync` uploads later.
        mode = os.environ.get("WANDB_MODE") or (None if os.environ.get("WANDB_API_KEY") or _wandb_logged_in()
                                                else "offline")
        self.run = wandb.init(project=project, name=name, dir=str(run_dir), config=config, id=run_id,
                              resume="allow", mode=mode)
        if run_id is None:
            from rlgrad.runfiles import atomic_write_text
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


INSTRUMENT_TIMINGS = {instrument.timing for instrument in INSTRUMENTS}  # the templates of their timing keys
# The phases of a step, in order, as the console names them (their timing_s/<phase> keys: rlgrad.metrics).
PHASES = ("gen", "filter", "old_log_prob", "ref", "values", "adv", "update_critic", "analysis/components",
          "analysis/buckets", "update_actor", "neuron/actor", "neuron/critic")


def analysis_summary(step: int, m: dict[str, float]) -> str | None:
    """One line on what a step's instruments found (None when none ran): the zero-variance share and the bucket
    carrying the most task gradient, the largest reward-component share and the most opposed pair, the dormant
    share of the actor's neurons."""
    parts = []
    buckets = {k.split("/")[1] for k in m if k.startswith("grad_norm/bucket_") and k.endswith("/group_rv_count")}
    if buckets:
        # counted per group, as group_rv_table.csv lists them (a bucket may mix zero- and nonzero-std groups)
        groups, zero = m.get("grad_norm/all/group_rv_count"), m.get("grad_norm/all/group_rv_zero_count")
        if groups and zero is not None:
            parts.append(f"{zero:.0f} of {groups:.0f} groups ({100 * zero / groups:.0f}%) have zero reward variance")
        task = {b: m[f"grad_norm/{b}/task"] for b in buckets if f"grad_norm/{b}/task" in m}
        if task:
            top = max(task, key=task.get)
            std = m.get(f"grad_norm/{top}/reward_std_mean", 0.0)
            parts.append(f"largest task gradient: {top} (reward std {std:.2f})")
    def defined(v) -> bool:  # a zero gradient has no share or cosine (null / NaN): shown as n/a, never a number
        return isinstance(v, int | float) and math.isfinite(v)

    shares = {k.split("/")[1]: v for k, v in m.items() if k.startswith("grad_comp/") and k.endswith("/share")}
    if shares:
        known = {c: v for c, v in shares.items() if defined(v)}
        top = max(known, key=known.get) if known else None
        parts.append(f"largest reward component: {top} ({100 * known[top]:.0f}% of the gradient)" if top
                     else "reward-component shares n/a (zero gradient)")
        sims = {k.split("/", 1)[1].replace("__", " vs "): v for k, v in m.items()
                if k.startswith("grad_sim/") and defined(v)}
        worst = min(sims, key=sims.get) if sims else None
        if worst is not None and cosine_word(sims[worst]) == "in conflict":  # -0.003 is orthogonal, not a conflict
            parts.append(f"{worst} pull apart (cosine {sims[worst]:+.2f})")
    if "actor/neuron/dormant_ratio" in m:
        parts.append(f"{100 * m['actor/neuron/dormant_ratio']:.1f}% of actor neurons dormant")
    return f"step {step} analysis: " + "; ".join(parts) if parts else None


class ConsoleSink:
    """Progress on the console: a tqdm bar on a terminal, one plain line a step otherwise (a log file or a pipe,
    where a bar's carriage returns read badly); a line for each validation; at a step where an instrument ran,
    what it found (``analysis_summary``), where its files went, and where the step's time went."""

    def __init__(self, total: int, initial: int = 0, run_dir: Path | None = None, stream=None):
        import sys

        from tqdm.auto import tqdm

        self.stream = stream or sys.stderr
        self.total, self.run_dir = total, run_dir
        self.bar = (tqdm(total=total, initial=initial, desc="rlgrad", unit="step", dynamic_ncols=True,
                         file=self.stream) if self.stream.isatty() else None)

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        # accuracy and reward of the same samples: every sampled response, before the rollout filter
        shown = {k: metrics[key] for k, key in (("acc", "rollout/accuracy"), ("reward", "rollout/score/mean"))
                 if key in metrics}
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items()}, refresh=False)
            if step > 0:
                self.bar.update(step - self.bar.n)
        elif step > 0:
            stats = "  ".join(f"{k} {v:.3f}" for k, v in shown.items())
            self.write(f"step {step}/{self.total}  {stats}  ({metrics.get('timing_s/step', float('nan')):.1f} s)")
        if "val/accuracy" in metrics:
            self.write(f"step {step}: val/accuracy = {metrics['val/accuracy']:.3f}")
        if any((m := match(k)) is not None and m.template in INSTRUMENT_TIMINGS for k in metrics):  # one ran
            found = analysis_summary(step, metrics)
            if found:
                where = step_dir(self.run_dir, step) if self.run_dir else None
                self.write(found + (f" (files: {where})" if where is not None and where.is_dir() else ""))
            parts = [f"{p} {metrics['timing_s/' + p]:.2f}" for p in PHASES if "timing_s/" + p in metrics]
            self.write(f"step {step}: {metrics.get('timing_s/step', float('nan')):.2f} s ({', '.join(parts)})")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def metrics_sink(run_dir: Path) -> JsonlSink:
    """``RUN/metrics.jsonl``, with what its keys mean for other tools next to it: ``RUN/metrics_catalogue.json``
    (``rlgrad metrics``' JSON), rewritten at every start, so that a resume by a newer rlgrad describes its keys."""
    sink = JsonlSink(run_dir / METRICS_FILE)
    write_run_catalogue(run_dir)
    return sink


def open_sinks(trainer, run_dir: Path, step: int, config: dict) -> list:
    """The sinks ``trainer.logger`` names for a run directory (metrics.jsonl always), opened at ``step``;
    ``trainer``: the run's ``trainer`` settings, ``config``: the whole config as a dict (for W&B)."""
    sinks: list = [metrics_sink(run_dir)]
    if "console" in trainer.logger:
        sinks.append(ConsoleSink(trainer.total_training_steps, initial=step, run_dir=run_dir))
    if "tensorboard" in trainer.logger:
        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    if "wandb" in trainer.logger:
        sinks.append(WandbSink(trainer.project_name, trainer.experiment_name, run_dir, config))
    return sinks


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
