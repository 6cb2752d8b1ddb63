"""Everything the figures and the report read, in one place.

A run reaches the plotting code as a :class:`RunData`: metric rows by step plus a handle on the run
directory (or, for a W&B run, the tables fetched through the public API). Every file format of the run
directory (``metrics.jsonl``, ``config.yaml``, ``analysis/step_N/{group_rv_table.csv, layers.json,
components.json, neurons.json}``, ``reward_components.jsonl``, ``rollouts/step_N.jsonl``) is parsed here
and nowhere else, so a format change is a one-place fix. See docs/runs.md, "The run directory".
"""

from __future__ import annotations

import csv
import json
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlgrad.config.aliases import ALIASES, resolve_alias
from rlgrad.errors import UserError
from rlgrad.metrics import FOREIGN_NAMES, component_keys, foreign_key, key, match, own_key, parse, trl_reward_name
from rlgrad.runfiles import read_jsonl

PREFIX = "grad_norm"  # bucket metrics: grad_norm/{bucket}/... (rlgrad.metrics); layers.json's section
GRAD_COMPONENTS = ("task", "entropy", "kl")
LOSS_TERMS = ("policy", "entropy", "kl", "total")
ROLES = ("actor", "critic")
NEURON_KEYS = {  # neurons.json's "global" names -> the metric templates they are logged under
    "dormant_ratio": "{role}/neuron/dormant_ratio", "act_dormant_ratio": "{role}/neuron/act_dormant_ratio",
    "zero_grad_ratio": "{role}/neuron/zero_grad_ratio", "param_zero_grad_ratio": "{role}/param/zero_grad_ratio",
    "nullspace_ratio": "{role}/neuron/nullspace_ratio", "reset_count": "{role}/neuron/reset_count"}


@dataclass
class RunData:
    name: str  # run directory name or W&B run name
    source: str  # where it came from (a path or entity/project/run_id), for titles
    rows: dict[int, dict[str, float]]  # step -> {metric: value}, finite numbers only
    config: dict | None = None
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
        return None if self.run_dir is None else self.run_dir / "analysis" / f"step_{step}"


# ---------------------------------------------------------------- loading


def _finite(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float) and math.isfinite(float(v)):
        return float(v)
    return None


_NONFINITE = {"nan", "inf", "-inf", "NaN", "Infinity", "-Infinity"}


def _metric_row(row: dict, null_is_nonfinite: bool = False) -> tuple[int, dict[str, float], list[str]] | None:
    """One metrics.jsonl line: ``{"step": N, "data": {...}}`` (rlgrad's and verl's file logger) or flat
    ``{"step": N, key: v}``; its finite values and the keys logged as NaN / inf (rlgrad writes them as strings,
    verl's orjson as null: ``null_is_nonfinite``)."""
    step = row.get("step")
    if not isinstance(step, int):
        return None
    data = row["data"] if isinstance(row.get("data"), dict) else {k: v for k, v in row.items() if k != "step"}
    bad = [k for k, v in data.items() if (isinstance(v, str) and v in _NONFINITE)
           or (isinstance(v, float) and not math.isfinite(v)) or (v is None and null_is_nonfinite)]
    return step, {k: f for k, v in data.items() if (f := _finite(v)) is not None}, bad


def _read_metric_lines(path: Path, rename=None, null_is_nonfinite: bool = False
                       ) -> tuple[dict[int, dict[str, float]], dict[int, list[str]]]:
    rows: dict[int, dict[str, float]] = {}
    bad: dict[int, list[str]] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            parsed = _metric_row(json.loads(line), null_is_nonfinite)
        except (json.JSONDecodeError, AttributeError):
            continue  # a torn last line (crash mid-append)
        if parsed is None:
            continue
        step, vals, nonfinite = parsed
        if rename is not None:
            vals = {n: v for k, v in vals.items() if (n := rename(k)) is not None}
            nonfinite = [n for k in nonfinite if (n := rename(k)) is not None]
        rows.setdefault(step, {}).update(vals)  # a step written twice: the later value wins
        if nonfinite:
            bad.setdefault(step, []).extend(nonfinite)
    return dict(sorted(rows.items())), bad


def _read_config(path: Path) -> tuple[dict | None, str | None]:
    if not path.is_file():
        return None, None
    from omegaconf import OmegaConf

    text = path.read_text(errors="replace")
    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False), text
    except Exception:  # a hand-edited, broken config.yaml should not stop the figures
        return None, text


def run_dir_of(path: str | Path) -> Path:
    """The run directory ``path`` names: itself, or the directory holding it when it is a run's metrics.jsonl (the
    file named rather than its folder, as a shell's tab completion gives it)."""
    p = Path(path)
    return p.parent if p.name == "metrics.jsonl" and p.is_file() else p


def load_run(run_dir: str | Path) -> RunData:
    """A local run directory (or its metrics.jsonl: ``run_dir_of``); one-line error if it is not one."""
    p = run_dir_of(run_dir)
    if not p.is_dir():
        raise UserError(f"run directory '{p}' does not exist")
    mfile = p / "metrics.jsonl"
    if not mfile.is_file():
        raise UserError(f"'{p}' is not a run directory (no metrics.jsonl)")
    rows, bad = _read_metric_lines(mfile)
    config, text = _read_config(p / "config.yaml")
    # Written by rlgrad's TRL integration: the trainer whose metric names the run's users know, and the reward
    # names behind the escaped component keys (rlgrad.metrics.component_keys).
    src = _read_json(p / "run_source.json") or {}
    names = src.get("reward_names") if isinstance(src.get("reward_names"), dict) else {}
    kind = src.get("trainer") if src.get("trainer") in ("trl", "verl") else "rlgrad"
    settings = src.get("settings") if isinstance(src.get("settings"), dict) else {}
    return RunData(name=p.resolve().name, source=str(p), rows=rows, config=config, config_text=text, run_dir=p,
                   nonfinite=bad, kind=kind, labels={str(k): str(v) for k, v in names.items()}, settings=settings)


def load_trl_output(out_dir: str | Path) -> RunData:
    """A TRL output directory without rlgrad's files: ``trainer_state.json``'s log history (the directory's, or
    its newest ``checkpoint-N``'s), TRL's names mapped to rlgrad's (``rlgrad.metrics.TRL_NAMES``)."""
    p = Path(out_dir)
    states = [p / "trainer_state.json"] + sorted(p.glob("checkpoint-*/trainer_state.json"),
                                                 key=lambda f: int(f.parent.name.split("-")[-1]) if
                                                 f.parent.name.split("-")[-1].isdigit() else -1, reverse=True)
    state = next((f for f in states if f.is_file()), None)
    if state is None:
        raise UserError(f"'{p}' holds no trainer_state.json (a TRL output directory saves it with its checkpoints)")
    try:
        history = json.loads(state.read_text()).get("log_history", [])
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise UserError(f"cannot read TRL state '{state}': {str(e).splitlines()[0]}") from None
    rows: dict[int, dict[str, float]] = {}
    bad: dict[int, list[str]] = {}
    entries = [e for e in history if isinstance(e, dict)] if isinstance(history, list) else []
    # the reward names in order of appearance, escaped together so that two never share a key
    names = list(dict.fromkeys(f for e in entries for k in e if (f := trl_reward_name(k)) is not None))
    keys = dict(zip(names, component_keys(names)))
    for entry in entries:
        step = entry.get("step")
        if not isinstance(step, int):
            continue
        for k, v in entry.items():
            name = foreign_key(k, "trl", keys)
            if name is None:
                continue
            if (f := _finite(v)) is not None:
                rows.setdefault(step, {})[name] = f
            elif isinstance(v, float):
                bad.setdefault(step, []).append(name)
    return RunData(name=p.resolve().name, source=str(p), rows=dict(sorted(rows.items())), run_dir=None,
                   nonfinite=bad, kind="trl", labels={k: n for n, k in keys.items()})


def load_verl_log(path: str | Path) -> RunData:
    """verl's file-logger JSONL (``{"step", "data"}`` lines, verl's metric names; ``foreign_key``), with the
    Hydra config found next to it (``.hydra/config.yaml`` or ``config.yaml``) when there is one."""
    p = Path(path)
    rows, bad = _read_metric_lines(p, rename=lambda k: foreign_key(k, "verl"), null_is_nonfinite=True)
    if not rows and not bad:
        raise UserError(f"'{p}' holds no metric lines of verl's file logger ('{{\"step\": N, \"data\": ...}}')")
    config, text = None, None
    for c in (p.parent / ".hydra" / "config.yaml", p.parent / "config.yaml"):
        config, text = _read_config(c)
        if config is not None:
            break
    return RunData(name=p.stem, source=str(p), rows=rows, config=config, config_text=text, run_dir=None,
                   nonfinite=bad, kind="verl")


def guess_source(names) -> str:
    """Whose names a log without a config uses: ``trl``, ``openrlhf`` or ``rldoctor`` when it holds names only
    that source logs (``metrics.FOREIGN_NAMES``; a ``train/`` prefix dropped), else ``rlgrad`` (rlgrad's names
    are verl's)."""
    bare = {n.removeprefix("train/") for n in names}
    # names rlgrad itself never logs, and of those the log holds; the source with the most wins (ties: the first),
    # as sources share some names (TRL's reward_std and entropy are rldoctor's too)
    hits = {source: len(bare & {k for k in FOREIGN_NAMES[source] if match(k) is None})
            for source in ("trl", "openrlhf", "rldoctor")}
    best = max(hits, key=hits.__getitem__)
    return best if hits[best] else "rlgrad"


def rows_by_name(rows: dict[int, dict[str, float]], source: str) -> dict[int, dict[str, float]]:
    """Another trainer's rows under rlgrad's names (``foreign_key``); a name that is already rlgrad's (rlgrad's
    instruments inside that trainer) kept, any other dropped."""
    out: dict[int, dict[str, float]] = {}
    for step, m in rows.items():
        for k, v in m.items():
            bare = k.removeprefix("train/")
            name = foreign_key(k, "verl" if source == "rlgrad" else source) or (bare if match(bare) else None)
            if name is not None:
                out.setdefault(step, {})[name] = v
    return dict(sorted(out.items()))


def load_csv(path: str | Path) -> RunData:
    """A CSV log: a ``step`` column and one column per metric (a blank cell: not logged at that step), under
    rlgrad's, TRL's, OpenRLHF's or rldoctor's names (``guess_source``)."""
    p = Path(path)
    try:
        with open(p, newline="") as f:
            table = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise UserError(f"cannot read CSV log '{p}': {str(e).splitlines()[0]}") from None
    if not table or "step" not in table[0]:
        raise UserError(f"CSV log '{p}' has no 'step' column (one row per step, a column per metric)")
    rows: dict[int, dict[str, float]] = {}
    bad: dict[int, list[str]] = {}
    for r in table:
        try:
            step = int(float(r.pop("step")))
        except (TypeError, ValueError):
            continue
        for k, v in r.items():
            try:
                _put(rows, bad, step, k, float(v))
            except (TypeError, ValueError):  # a blank cell: not logged at this step
                continue
    return _foreign_run(p, rows, bad)


def _put(rows: dict[int, dict[str, float]], bad: dict[int, list[str]], step: int, name: str, x: float) -> None:
    """A logged value into the rows, or its name into ``bad`` when it is NaN / inf."""
    if math.isfinite(x):
        rows.setdefault(step, {})[name] = x
    else:
        bad.setdefault(step, []).append(name)


def load_tensorboard(path: str | Path) -> RunData:
    """TensorBoard event files (a file, or every one under a directory), read through tensorboard's own
    ``EventAccumulator``: the scalars by step, under rlgrad's, TRL's, OpenRLHF's or rldoctor's names."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise UserError("reading TensorBoard logs needs the tensorboard package (pip install "
                        "'rlgrad[tensorboard]')") from None
    p = Path(path)
    files = [p] if p.is_file() else sorted(p.rglob("events.out.tfevents.*"))
    rows: dict[int, dict[str, float]] = {}
    bad: dict[int, list[str]] = {}
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for ev in acc.Scalars(tag):
                _put(rows, bad, int(ev.step), tag, float(ev.value))
    if not rows and not bad:
        raise UserError(f"'{p}' holds no TensorBoard scalars")
    return _foreign_run(p, rows, bad)


def _foreign_run(p: Path, rows: dict[int, dict[str, float]], bad: dict[int, list[str]]) -> RunData:
    source = guess_source({k for m in rows.values() for k in m})
    keep = rows_by_name({s: dict.fromkeys(k, 0.0) for s, k in bad.items()}, source)
    return RunData(name=p.stem if p.is_file() else p.resolve().name, source=str(p),
                   rows=rows_by_name(rows, source), run_dir=None, nonfinite={s: list(m) for s, m in keep.items()},
                   kind=source)


def load_any(path: str | Path | None, wandb_path: str | None = None) -> RunData:
    """Whatever run ``path`` names: an rlgrad run directory (also what rlgrad's TRL / verl integrations write),
    a TRL output directory, or verl's file-logger JSONL; or a W&B run."""
    if wandb_path:
        run = load_wandb_run(wandb_path)
        run.kind = "wandb"
        return run
    if path is None:
        raise UserError("name a run: a run directory, a TRL output directory, a verl JSONL log, or --wandb-path")
    p = Path(path)
    if p.is_file() and p.name == "metrics.jsonl":  # rlgrad's, as the directory holding it would be read
        return load_run(p.parent)
    if p.is_file():
        if p.suffix.lower() == ".csv":
            return load_csv(p)
        return load_tensorboard(p) if p.name.startswith("events.out.tfevents.") else load_verl_log(p)
    if not p.is_dir():
        raise UserError(f"run '{p}' does not exist")
    if (p / "metrics.jsonl").is_file():
        return load_run(p)
    if (p / "trainer_state.json").is_file() or any(p.glob("checkpoint-*/trainer_state.json")):
        return load_trl_output(p)
    if any(p.rglob("events.out.tfevents.*")):
        return load_tensorboard(p)
    raise UserError(f"'{p}' is not a run: no metrics.jsonl (rlgrad), trainer_state.json (TRL) or TensorBoard "
                    "event files")


def records_from_wandb_rows(rows: list[dict]) -> dict[int, dict[str, float]]:
    """W&B history rows -> our metric rows by step (pure; tested on recorded rows).

    W&B rows carry ``_step``, ``_runtime``, ``_timestamp`` and the logged keys; a key not logged at that
    step is None (``scan_history``) or NaN (``history()``'s DataFrame). Media (tables) are dicts and are
    fetched separately. Rows sharing a ``_step`` (several ``log`` calls) are merged.
    """
    out: dict[int, dict[str, float]] = {}
    for row in rows:
        step = row.get("_step")
        if _finite(step) is None:
            continue
        rec = out.setdefault(int(step), {})
        for k, v in row.items():
            if k.startswith("_"):
                continue
            f = _finite(v)
            if f is not None:
                rec[k] = f
    return {s: r for s, r in sorted(out.items()) if r}


def wandb_table_rows(table: dict) -> list[tuple[str, int, float]]:
    """A downloaded ``group_rv_table`` (``{"columns": [...], "data": [[...]]}``) -> (bucket, group_id, reward_std)."""
    cols = table.get("columns", [])
    try:
        ib, ig, ir = cols.index("bucket"), cols.index("group_id"), cols.index("reward_std")
    except ValueError:
        return []
    return [(str(r[ib]), int(r[ig]), float(r[ir])) for r in table.get("data", [])]


def load_wandb_run(path: str) -> RunData:
    """A W&B run through the public API (needs network and credentials)."""
    if path.count("/") != 2:
        raise UserError(f"--wandb-path '{path}' is not ENTITY/PROJECT/RUN_ID")
    try:
        import wandb
    except ImportError:
        raise UserError("--wandb-path needs the wandb package (pip install 'rlgrad[wandb]')") from None
    try:
        run = wandb.Api().run(path)
        history = list(run.scan_history())
    except Exception as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot read W&B run '{path}': {why}") from None
    tables: dict[int, list[tuple[str, int, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="rlgrad-wandb-") as tmp:
        for row in history:
            meta = row.get("grad_norm/group_rv_table")
            if isinstance(meta, dict) and "path" in meta and row.get("_step") is not None:
                try:
                    local = run.file(meta["path"]).download(replace=True, root=tmp).name
                    tables[int(row["_step"])] = wandb_table_rows(json.loads(Path(local).read_text()))
                except Exception:
                    continue  # the figures fall back to the logged min/mean/max
    config = dict(run.config) if run.config else None
    return RunData(name=run.name or run.id, source=path, rows=records_from_wandb_rows(history), config=config,
                   rv_tables=tables)


# ---------------------------------------------------------------- buckets


def _bucket_key(name: str) -> tuple:
    m = re.fullmatch(r"bucket_(\d+)", name)
    return (0, int(m.group(1)), name) if m else (1, 0, name)


def sort_buckets(names) -> list[str]:
    """Bucket names, lowest reward variance first (``bucket_1``, ``bucket_2``, ..., then any other name)."""
    return sorted(set(names), key=_bucket_key)


def bucket_names(metrics: dict[str, float]) -> list[str]:
    """Real buckets present in a metric row, lowest reward variance first (``all`` excluded)."""
    names = {f["bucket"] for k in metrics if (f := parse("grad_norm/{bucket}/sample_count", k))}
    names |= {f["bucket"] for k in metrics if (f := parse("grad_norm/{bucket}/{term}", k))}
    return sorted(names - {"all"}, key=_bucket_key)


def analysis_steps(run: RunData) -> list[int]:
    """Steps whose row holds bucket metrics (as RAGEN's plotting script decides: a ``grad_norm/bucket_*`` value)."""
    return [s for s, m in run.rows.items() if bucket_names(m)]


def bucket_value(metrics: dict[str, float], bucket: str, name: str, default: float = math.nan) -> float:
    """``grad_norm/{bucket}/<name>``, ``name`` being the rest of a bucket template (``task``, ``loss/kl`` ...)."""
    return metrics.get(f"grad_norm/{bucket}/{name}", default)


def has_component(metrics: dict[str, float], comp: str) -> bool:
    """Was this gradient term computed (entropy needs entropy_coeff > 0, kl needs the KL loss)?"""
    return any((f := parse("grad_norm/{bucket}/{term}", k)) and f["term"] == comp for k in metrics)


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


# ---------------------------------------------------------------- per-layer, components, neurons


def layer_sort_key(name: str) -> tuple:
    """embed, layer_0, layer_1, ..., final_norm, lm_head, anything else."""
    m = re.fullmatch(r"layer_(\d+)", name)
    if name == "embed":
        return (0, 0, name)
    if m:
        return (1, int(m.group(1)), name)
    return ({"final_norm": 2, "lm_head": 3}.get(name, 4), 0, name)


def _read_json(path: Path | None) -> dict | None:
    if path is None or not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(errors="replace"))
    except (OSError, json.JSONDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def layer_norms(run: RunData, step: int, component: str = "task") -> dict[str, dict[str, float]] | None:
    """bucket -> layer group -> norm of ``component``'s gradient, from analysis/step_N/layers.json."""
    d = run.analysis_dir(step)
    obj = _read_json(d / "layers.json" if d else None)
    if not obj or not isinstance(obj.get(PREFIX), dict):
        return None
    out = {b: comps[component] for b, comps in obj[PREFIX].items()
           if isinstance(comps, dict) and isinstance(comps.get(component), dict)}
    return out or None


def label(run: RunData, component: str) -> str:
    """A reward component as its trainer names it (a TRL reward model: its repo name, not the metric key)."""
    return run.labels.get(component, component)


def pair_label(run: RunData, pair: str) -> str:
    """``a__b`` of ``grad_sim/{pair}`` as "a · b" with the components' own names (a key never holds ``__``)."""
    a, _, b = pair.partition("__")
    return f"{label(run, a)} · {label(run, b)}"


def metric_name(run: RunData, k: str) -> str:
    """The name the run's own trainer logs rlgrad's metric ``k`` under (TRL: ``grad_norm``, ``rewards/<f>/mean``);
    rlgrad's name for a run of rlgrad's trainer or verl (whose names rlgrad's are)."""
    return own_key(k, run.kind, run.labels)


def component_geometry(run: RunData, step: int) -> dict | None:
    """Reward-component gradient geometry (components.json layout); from the file, else from metrics.

    Metric fallback (a W&B run): ``grad_sim/{pair}``, ``grad_comp/{component}/norm|share``,
    ``grad_comp/total/norm``. A cosine or share the file holds as null (a zero gradient has no direction) is NaN.
    """
    d = run.analysis_dir(step)
    obj = _read_json(d / "components.json" if d else None)
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


def share_is_fraction(x: float) -> bool:
    """``grad_comp/{component}/share`` is ⟨g_c, g⟩ / |g|²: a share of the update only while it lies in [0, 1]; a
    component whose gradient outgrows the update along it (> 1) or pulls against it (< 0) has a signed
    contribution, no share of 100%."""
    return 0.0 <= x <= 1.0


def share_words(x: float) -> str:
    """A component's ``grad_comp/{component}/share`` in words: a percentage while it is a fraction, else the signed
    contribution it is, with what that means."""
    if not math.isfinite(x):
        return "no share (a zero update gradient)"
    if share_is_fraction(x):
        return f"{100 * x:.0f}% of the update"
    if x > 1:
        return (f"a signed contribution of {x:+.3g}: its gradient, projected on the update, is {x:.3g}× the update "
                "(more than all of it: other components pull back by the rest)")
    return f"a signed contribution of {x:+.3g}: its gradient pulls against the update"


def share_label(x: float) -> str:
    """``share_words`` for a figure: ``45%`` for a fraction, ``signed +1.09`` / ``signed -0.088`` otherwise."""
    return f"{x:.0%}" if share_is_fraction(x) else f"signed {x:+.3g}"


def component_steps(run: RunData) -> list[int]:
    steps = {s for s, m in run.rows.items() if any(parse("grad_sim/{pair}", k) for k in m)}
    steps |= _steps_with_file(run, "components.json")
    return sorted(steps)


def neuron_health(run: RunData, step: int) -> dict | None:
    """role -> {"global": {...}, "layers": {...}} (neurons.json layout); from the file, else from metrics."""
    d = run.analysis_dir(step)
    obj = _read_json(d / "neurons.json" if d else None)
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


def _steps_with_file(run: RunData, name: str) -> set[int]:
    if run.run_dir is None:
        return set()
    out = set()
    for p in (run.run_dir / "analysis").glob(f"step_*/{name}"):
        suffix = p.parent.name[len("step_"):]
        if suffix.isdigit():
            out.add(int(suffix))
    return out


def reward_components(run: RunData) -> dict[int, dict]:
    """reward_components.jsonl by step, keeping the LAST line of each step (a resumed run repeats steps)."""
    if run.run_dir is None:
        return {}
    f = run.run_dir / "reward_components.jsonl"
    if not f.is_file():
        return {}
    from rlgrad.logging.rewards import read_reward_components, well_formed

    return {row["step"]: row for row in read_reward_components(f) if well_formed(row, full=False)}


# ---------------------------------------------------------------- rollouts (what the model wrote)


def rollout_dir(run: RunData) -> Path | None:
    """Where the run wrote its per-step rollout files: ``trainer.rollout_data_dir``, else ``RUN/rollouts``."""
    if run.run_dir is None:
        return None
    from rlgrad.logging.rollouts import rollout_dir as where

    configured = config_get(run, "trainer.rollout_data_dir")
    return where(run.run_dir, configured if isinstance(configured, str) and configured else None)


def rollout_steps(run: RunData) -> list[int]:
    """Steps with a ``step_<N>.jsonl`` rollout file, ascending."""
    d = rollout_dir(run)
    if d is None:
        return []
    from rlgrad.logging.rollouts import rollout_steps as steps

    return steps(d)


def group_buckets(run: RunData, step: int) -> dict[int, str]:
    """group id -> bucket at a bucket-analysis step of the TRAINING batch (``group_rv_table.csv``); empty when
    the step was not analysed, or the analysis ran on a separate batch (``analysis.buckets.env_groups`` /
    ``group_size``: its group ids are not the training batch's)."""
    if any(config_get(run, f"analysis.buckets.{k}") for k in ("env_groups", "group_size")):
        return {}
    return {gid: bucket for bucket, gid, _ in rv_table(run, step)}


def rollout_samples(run: RunData, step: int) -> list[dict]:
    """One step's rollout lines (logging/rollouts.py's format) with ``bucket`` added: the group's bucket at a
    bucket-analysis step (``group_buckets``), else None (also for groups the filter dropped)."""
    d = rollout_dir(run)
    if d is None:
        return []
    from rlgrad.logging.rollouts import read_rollouts, step_file

    f = step_file(d, step)
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
    obj = _read_json(d / "sample_layers.json" if d else None)
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
        std = _finite(rows[0].get("reward_std"))
        out.append(PromptGroup(group_id=gid, prompt=str(rows[0].get("prompt", "")), bucket=rows[0].get("bucket"),
                               reward_std=math.nan if std is None else std,
                               kept=any(bool(r.get("kept")) for r in rows), samples=rows))
    return out


# ---------------------------------------------------------------- series


def series(run: RunData, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric over the run, where it was logged."""
    steps = [s for s, m in run.rows.items() if key in m]
    return steps, [run.rows[s][key] for s in steps]


def metric_keys(run: RunData) -> set[str]:
    return {k for m in run.rows.values() for k in m}


def config_get(run: RunData, dotted: str, default: Any = None) -> Any:
    """A setting of the run's config.yaml by its key; a run saved before a key moved holds it under an alias
    (``trainer.gradient_analysis_every`` for ``analysis.buckets.every``), which is read then."""
    for spelling in (dotted, *[a for a in ALIASES if not a.endswith(".") and resolve_alias(a) == dotted]):
        node: Any = run.config or {}
        for part in spelling.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            return node
    return default


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


def read_step_metrics(path: str | Path) -> dict[str, float]:
    """An exported ``gradient_analysis_metrics_step_<N>.json`` (or ``metrics.json``, as RAGEN's
    plot_icml_steps.py reads)."""
    p = Path(path)
    try:
        obj = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read metrics file '{p}': {e}") from None
    if not isinstance(obj, dict):
        raise UserError(f"metrics file '{p}' does not hold a JSON object")
    return {k: f for k, v in obj.items() if (f := _finite(v)) is not None}
