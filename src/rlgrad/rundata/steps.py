"""What a run wrote at its steps, by concept: the instruments' files of ``analysis/step_N`` (the bucket table, per-layer
norms, reward-component geometry, neuron health, per-sample rows), with the metrics logged at that step as the
fallback for a run without the files (a W&B run); ``reward_components.jsonl``; the rollout files of
``trainer.rollout_data_dir`` joined with the buckets. See docs/runs.md, "The run directory"."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from rlgrad import runfiles
from rlgrad.errors import UserError
from rlgrad.metrics import key, parse
from rlgrad.rundata.run import PREFIX, ROLES, RunData, finite
from rlgrad.runfiles import REWARD_COMPONENTS_FILE, read_json, read_jsonl

NEURON_KEYS = {  # neurons.json's "global" names -> the metric templates they are logged under
    "dormant_ratio": "{role}/neuron/dormant_ratio", "act_dormant_ratio": "{role}/neuron/act_dormant_ratio",
    "zero_grad_ratio": "{role}/neuron/zero_grad_ratio", "param_zero_grad_ratio": "{role}/param/zero_grad_ratio",
    "nullspace_ratio": "{role}/neuron/nullspace_ratio", "reset_count": "{role}/neuron/reset_count"}


def rv_table(run: RunData, step: int) -> list[tuple[str, int, float]]:
    """Per prompt group: (bucket, group_id, reward_std), from analysis/step_N/group_rv_table.csv or W&B."""
    if step in run.rv_tables:
        return run.rv_tables[step]
    d = run.analysis_dir(step)
    f = d / "group_rv_table.csv" if d is not None else None
    if f is None or not f.is_file():
        return []
    out = []
    with open(f, newline="", errors="replace") as fh:
        for r in csv.DictReader(fh):
            try:
                out.append((r["bucket"], int(r["group_id"]), float(r["reward_std"])))
            except (KeyError, ValueError):
                continue
    return out


def layer_norms(run: RunData, step: int, component: str = "task") -> dict[str, dict[str, float]] | None:
    """bucket -> layer group -> norm of ``component``'s gradient, from analysis/step_N/layers.json."""
    d = run.analysis_dir(step)
    obj = read_json(d / "layers.json" if d else None)
    if not obj or not isinstance(obj.get(PREFIX), dict):
        return None
    out = {b: comps[component] for b, comps in obj[PREFIX].items()
           if isinstance(comps, dict) and isinstance(comps.get(component), dict)}
    return out or None


def component_geometry(run: RunData, step: int) -> dict | None:
    """Reward-component gradient geometry (components.json layout); from the file, else from metrics.

    Metric fallback (a W&B run): ``grad_sim/{pair}``, ``grad_comp/{component}/norm|share``,
    ``grad_comp/total/norm``. A cosine or share the file holds as null (a zero gradient has no direction) is NaN.
    """
    d = run.analysis_dir(step)
    obj = read_json(d / "components.json" if d else None)
    if obj and isinstance(obj.get("global"), dict):
        for part in [obj["global"], *(v for v in (obj.get("layers") or {}).values() if isinstance(v, dict))]:
            for name in ("norm", "cosine", "share"):
                if isinstance(part.get(name), dict):
                    part[name] = {k: math.nan if v is None else v for k, v in part[name].items()}
        return {**obj, "labels": dict(run.labels)}
    m = run.metrics(step)
    cos = {f["pair"]: v for k, v in m.items() if (f := parse("grad_sim/{pair}", k))}
    norm = {f["component"]: v for k, v in m.items() if (f := parse("grad_comp/{component}/norm", k))}
    if "grad_comp/total/norm" in m:
        norm["total"] = m["grad_comp/total/norm"]
    share = {f["component"]: v for k, v in m.items() if (f := parse("grad_comp/{component}/share", k))}
    if not cos and not norm:
        return None
    comps = [c for c in norm if c != "total"]
    for pair in cos:
        for c in pair.split("__"):
            if c not in comps:
                comps.append(c)
    return {"step": step, "components": comps, "global": {"norm": norm, "share": share, "cosine": cos},
            "layers": {}, "labels": dict(run.labels)}


def component_steps(run: RunData) -> list[int]:
    steps = {s for s, m in run.rows.items() if any(parse("grad_sim/{pair}", k) for k in m)}
    steps |= _steps_with_file(run, "components.json")
    return sorted(steps)


def neuron_health(run: RunData, step: int) -> dict | None:
    """role -> {"global": {...}, "layers": {...}} (neurons.json layout); from the file, else from metrics."""
    d = run.analysis_dir(step)
    obj = read_json(d / "neurons.json" if d else None)
    if obj and any(isinstance(obj.get(r), dict) for r in ROLES):
        return {r: obj[r] for r in ROLES if isinstance(obj.get(r), dict)}
    m = run.metrics(step)
    out = {}
    for role in ROLES:
        g = {}
        for name, template in NEURON_KEYS.items():
            if key(template, role=role) in m:
                g[name] = m[key(template, role=role)]
        if g:
            out[role] = {"global": g, "layers": {}}
    return out or None


def neuron_steps(run: RunData) -> list[int]:
    steps = {s for s, m in run.rows.items() if any(key("{role}/neuron/dormant_ratio", role=r) in m for r in ROLES)}
    steps |= _steps_with_file(run, "neurons.json")
    return sorted(steps)


def reward_components(run: RunData) -> dict[int, dict]:
    """reward_components.jsonl by step, keeping the LAST line of each step (a resumed run repeats steps)."""
    if run.run_dir is None:
        return {}
    f = run.run_dir / REWARD_COMPONENTS_FILE
    if not f.is_file():
        return {}
    from rlgrad.logging.rewards import read_reward_components, well_formed

    return {row["step"]: row for row in read_reward_components(f) if well_formed(row, full=False)}


def rollout_dir(run: RunData) -> Path | None:
    """Where the run wrote its per-step rollout files: ``trainer.rollout_data_dir``, else ``RUN/rollouts``."""
    if run.run_dir is None:
        return None
    configured = run.saved.get("trainer.rollout_data_dir")
    return runfiles.rollout_dir(run.run_dir, configured if isinstance(configured, str) and configured else None)


def rollout_steps(run: RunData) -> list[int]:
    """Steps with a ``step_<N>.jsonl`` rollout file, ascending."""
    d = rollout_dir(run)
    if d is None:
        return []
    return runfiles.rollout_steps(d)


def group_buckets(run: RunData, step: int) -> dict[int, str]:
    """group id -> bucket at a bucket-analysis step of the TRAINING batch (``group_rv_table.csv``); empty when
    the step was not analysed, or the analysis ran on a separate batch (``analysis.buckets.env_groups`` /
    ``group_size``: its group ids are not the training batch's)."""
    if any(run.saved.get(f"analysis.buckets.{k}") for k in ("env_groups", "group_size")):
        return {}
    return {gid: bucket for bucket, gid, _ in rv_table(run, step)}


def rollout_samples(run: RunData, step: int) -> list[dict]:
    """One step's rollout lines (logging/rollouts.py's format) with ``bucket`` added: the group's bucket at a
    bucket-analysis step (``group_buckets``), else None (also for groups the filter dropped)."""
    d = rollout_dir(run)
    if d is None:
        return []
    from rlgrad.logging.rollouts import read_rollouts  # torch: only when a reader asks for rollouts

    f = runfiles.rollout_file(d, step)
    if not f.is_file():
        return []
    try:
        rows = read_rollouts(f)
    except OSError as e:
        raise UserError(f"cannot read {f}: {e}") from None
    buckets = group_buckets(run, step)
    for r in rows:
        r["bucket"] = buckets.get(r.get("group_id"))
    return rows


def per_sample_steps(run: RunData) -> list[int]:
    """Steps with an ``analysis/step_N/samples.jsonl`` (``analysis.per_sample``), ascending."""
    return sorted(_steps_with_file(run, "samples.jsonl"))


def per_sample_rows(run: RunData, step: int) -> list[dict]:
    """``analysis/step_N/samples.jsonl`` (``analysis/per_sample.py``): one line per sample of the analysed batch,
    each with the rollout line it joins (``rollout``: the line of ``rollouts/step_N.jsonl`` whose ``index`` is its
    ``sample``; None when the run has no such line)."""
    d = run.analysis_dir(step)
    if d is None or not (d / "samples.jsonl").is_file():
        return []
    rollouts = {r.get("index"): r for r in rollout_samples(run, step)}
    rows = [r for r in read_jsonl(d / "samples.jsonl") if isinstance(r, dict)]
    for r in rows:
        r["rollout"] = rollouts.get(r.get("sample"))
    return rows


def per_sample_layers(run: RunData, step: int, term: str = "task") -> dict[str, dict[str, float]] | None:
    """layer group -> {grad_norm: ||Σ_i g_i|| on its parameters, grad_norm_sample: mean ||g_i|| on them} of
    ``term`` at an ``analysis.per_sample`` step, from ``analysis/step_N/sample_layers.json``; None without it."""
    d = run.analysis_dir(step)
    obj = read_json(d / "sample_layers.json" if d else None)
    got = obj.get(term) if obj else None
    if not isinstance(got, dict):
        return None
    return {g: v for g, v in got.items() if isinstance(v, dict) and isinstance(v.get("grad_norm"), int | float)}


@dataclass
class PromptGroup:
    """The samples of one prompt at one step, as ``rollout_groups`` returns them."""

    group_id: int
    prompt: str
    bucket: str | None
    reward_std: float  # unbiased std of the group's totals (Batch.reward_std)
    kept: bool  # the rollout filter kept the group
    samples: list[dict]  # rollout lines, in order


def rollout_groups(run: RunData, step: int) -> list[PromptGroup]:
    """One step's samples grouped by prompt group, by group id."""
    by_group: dict[int, list[dict]] = {}
    for r in rollout_samples(run, step):
        if isinstance(r.get("group_id"), int):
            by_group.setdefault(r["group_id"], []).append(r)
    out = []
    for gid in sorted(by_group):
        rows = by_group[gid]
        std = finite(rows[0].get("reward_std"))
        out.append(PromptGroup(group_id=gid, prompt=str(rows[0].get("prompt", "")), bucket=rows[0].get("bucket"),
                               reward_std=math.nan if std is None else std,
                               kept=any(bool(r.get("kept")) for r in rows), samples=rows))
    return out


def _steps_with_file(run: RunData, name: str) -> set[int]:
    return set() if run.run_dir is None else set(runfiles.step_dirs(run.run_dir, name))
