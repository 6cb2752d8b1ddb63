"""Per-step reward-component tracking: ``reward_components.jsonl`` and ``reward/<c>/mean|std``.

One line per training step (format in docs/architecture.md, "Reward components"):

    {"step": N, "timestamp": "...", "components": [...], "weights": {c: w},
     "stats": {c: {"mean", "std", "min", "max"}}, "total": {"mean", "std"},
     "num_correct": k, "num_valid_format": k, "mean_length": x, "num_samples": n,
     "samples": [{"group_id": g, "components": {c: x}, "total": x, "length": n}, ...]}

The samples are those of the batch the actor update sees (after the rollout filter). The file is
only ever appended to (one write + flush per line), never rewritten: after a resume the steps past the
checkpoint appear again, so readers keep the LAST line of each step (``read_reward_components``).
Standard deviations are population ones (divide by n).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from rlgrad.metrics import key
from rlgrad.runfiles import CONFIG_FILE, REWARD_COMPONENTS_FILE


def _std(x: torch.Tensor) -> float:
    return float(x.double().std(unbiased=False)) if x.numel() else 0.0


def reward_metrics(components: dict[str, torch.Tensor], group_ids: torch.Tensor | None = None,
                   fallback: torch.Tensor | None = None) -> dict[str, float]:
    """``reward/{component}/mean|std`` of each component over the batch; with ``group_ids``,
    ``reward/{component}/frac_zero_std`` (the share of prompt groups in which the component is the same for every
    sample); with ``fallback`` (1 where the answer was read the flexible way), ``reward/extraction/flexible_share``."""
    out = {}
    for name, v in components.items():
        if v.numel():
            out[key("reward/{component}/mean", component=name)] = float(v.double().mean())
            out[key("reward/{component}/std", component=name)] = _std(v)
            if group_ids is not None:
                out[key("reward/{component}/frac_zero_std", component=name)] = frac_constant_groups(v, group_ids)
    if fallback is not None and fallback.numel():
        out[key("reward/extraction/flexible_share")] = float(fallback.double().mean())
    return out


def frac_constant_groups(values: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Share of the groups of ``group_ids`` whose ``values`` are all equal (TRL's ``frac_reward_zero_std``, per
    component): such a group gives the component no advantage signal."""
    groups = torch.unique(group_ids)
    constant = [bool((values[group_ids == g] == values[group_ids == g][0]).all()) for g in groups.tolist()]
    return sum(constant) / len(constant) if constant else 0.0


def step_record(step: int, components: dict[str, torch.Tensor], weights: dict[str, float], total: torch.Tensor,
                group_ids: torch.Tensor, lengths: torch.Tensor, correct: torch.Tensor | None,
                valid_format: torch.Tensor | None = None) -> dict:
    """One line of ``reward_components.jsonl``; every per-sample tensor is ``[N]``.

    ``lengths`` are the actual response lengths the length reward sees (``reward.length_unit``);
    ``correct`` the task's correctness flags (None: the loop has no notion of correct, e.g. TRL's reward
    functions; ``num_correct`` is then left out, as ``num_valid_format`` is without a ``format`` component).
    A valid format is a format reward > 0 (rldynamic's count), unless the task says which answers were readable
    (``valid_format``: a multi-turn episode's format component is a penalty, 0 when every turn could be read).
    """
    names = list(components)
    stats = {c: {"mean": float(v.double().mean()), "std": _std(v), "min": float(v.min()), "max": float(v.max())}
             for c, v in components.items()}
    fmt = components.get("format")
    cols = {c: components[c].tolist() for c in names}
    tot, gids, lens = total.tolist(), group_ids.tolist(), lengths.tolist()
    samples = [{"group_id": int(gids[i]), "components": {c: cols[c][i] for c in names}, "total": tot[i],
                "length": int(lens[i])} for i in range(len(tot))]
    record = {
        "step": int(step), "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"), "components": names,
        "weights": {c: float(weights[c]) for c in names}, "stats": stats,
        "total": {"mean": float(total.double().mean()), "std": _std(total)},
        "num_correct": None if correct is None else int(correct.bool().sum()),
        "num_valid_format": (int(valid_format.bool().sum()) if valid_format is not None
                             else int((fmt > 0).sum()) if fmt is not None else None),
        "mean_length": float(lengths.double().mean()), "num_samples": len(tot), "samples": samples,
    }
    return {k: v for k, v in record.items() if v is not None}


class RewardComponentLog:
    """Appends one line per step to ``RUN/reward_components.jsonl``. Only the main process makes one."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / REWARD_COMPONENTS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_torn_tail()

    def _repair_torn_tail(self) -> None:
        """A crash mid-append leaves a line without its newline; end it so the next line stays whole."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
        if torn:
            with open(self.path, "a") as f:
                f.write("\n")

    def append(self, record: dict) -> None:
        line = json.dumps(record)
        with open(self.path, "a") as f:  # one write + flush per line: a crash loses at most a torn line
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def well_formed(row, full: bool = True) -> bool:
    """A line shaped as ``step_record`` writes it (a hand-edited or damaged one is skipped like a torn one):
    step, components and per-component stats; ``full``: also every component's stats, the samples and counts
    (what the rldynamic export needs)."""
    if not (isinstance(row, dict) and isinstance(row.get("step"), int) and isinstance(row.get("components"), list)
            and isinstance(row.get("stats"), dict) and all(isinstance(v, dict) for v in row["stats"].values())):
        return False
    return not full or (all(c in row["stats"] for c in row["components"]) and isinstance(row.get("samples"), list)
                        and isinstance(row.get("num_samples"), int)
                        and isinstance(row.get("mean_length"), int | float))


def read_reward_components(path: str | os.PathLike) -> list[dict]:
    """The lines of a ``reward_components.jsonl``, the LAST one of each step, by step; torn lines skipped."""
    p = Path(path)
    by_step: dict[int, dict] = {}
    for line in p.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            by_step[row["step"]] = row
    return [by_step[k] for k in sorted(by_step)]


def _seed_key(component: str) -> str:
    """rldynamic's per-sample key of a component (its length reward is ``length_reward``)."""
    return "length_reward" if component == "length" else component


def to_seed_layout(rows: list[dict], metadata: dict) -> dict:
    """rldynamic's ``all_rewards.json`` (custom_main_ppo_2.py): ``{"metadata": {...}, "steps": [{step, timestamp,
    num_samples, statistics: {avg_<c>, avg_actual_length, correct_count, format_valid_count, total_samples},
    samples: [{idx, <c>, actual_length}]}]}`` with ``length`` spelled ``length_reward`` as rldynamic does."""
    steps = []
    for r in rows:
        stats = {f"avg_{_seed_key(c)}": r["stats"][c]["mean"] for c in r["components"]}
        stats.update({"avg_actual_length": r["mean_length"], "correct_count": r.get("num_correct"),
                      "format_valid_count": r.get("num_valid_format"), "total_samples": r["num_samples"]})
        samples = [{"idx": i, **{_seed_key(c): s["components"][c] for c in r["components"]},
                    "actual_length": s["length"]} for i, s in enumerate(r["samples"])]
        steps.append({"step": r["step"], "timestamp": r.get("timestamp"), "num_samples": r["num_samples"],
                      "statistics": stats, "samples": samples})
    return {"metadata": metadata, "steps": steps}



def export_rewards(run_dir: str | os.PathLike, output: str | os.PathLike | None = None, fmt: str = "json") -> Path:
    """Write a run's reward tracking in rldynamic's ``all_rewards.json`` layout; returns the path written.

    Default output: ``RUN/all_rewards.json``. A directory that is not a run with reward tracking is a UserError.
    """
    from rlgrad.config.saved import read_saved_config
    from rlgrad.errors import UserError
    from rlgrad.runfiles import atomic_write_json, check_output

    if fmt != "json":
        raise UserError(f"export format '{fmt}' is not supported (json)")
    run = Path(run_dir)
    if not run.is_dir():
        raise UserError(f"run directory '{run}' does not exist")
    src = run / REWARD_COMPONENTS_FILE
    if not src.is_file():
        raise UserError(f"'{run}' has no {REWARD_COMPONENTS_FILE} (not an rlgrad run directory, or no training step "
                        "finished)")
    try:
        rows = [r for r in read_reward_components(src) if well_formed(r)]  # damaged lines are skipped
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {src}: {e}") from None
    if not rows:
        raise UserError(f"{src} holds no complete step")
    model, dataset = None, None
    saved = read_saved_config(run / CONFIG_FILE)
    if isinstance(saved.tree, dict):  # only for the metadata: a damaged config.yaml leaves it blank
        cfg = saved.settings
        model = cfg.model.path or "embedded default (tiny Qwen2)"
        dataset = cfg.data.task + (f" ({', '.join(cfg.data.train_files)})" if cfg.data.train_files else "")
    metadata = {"created_at": rows[0].get("timestamp"), "model": model, "dataset": dataset,
                "last_saved": time.strftime("%Y-%m-%d %H:%M:%S"), "run_dir": str(run)}
    out = check_output(output, run) if output is not None else run / "all_rewards.json"
    atomic_write_json(out, to_seed_layout(rows, metadata))
    return out
