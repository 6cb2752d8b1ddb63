"""Where a run comes from: the loaders of every format a run is read from. An rlgrad run directory (also what
rlgrad's TRL and verl integrations write), a TRL output directory (``trainer_state.json``), verl's file-logger JSONL,
a CSV or TensorBoard log under rlgrad's, TRL's, OpenRLHF's or rldoctor's names, a W&B run, an exported step's
metrics. Each returns a :class:`RunData` under rlgrad's metric names (``rlgrad.metrics.foreign_key``)."""

from __future__ import annotations

import csv
import json
import math
import tempfile
from pathlib import Path

from rlgrad.config.saved import read_saved_config
from rlgrad.errors import UserError
from rlgrad.metrics import FOREIGN_NAMES, component_keys, foreign_key, match, trl_reward_name
from rlgrad.rundata.run import RunData, finite
from rlgrad.runfiles import CONFIG_FILE, METRICS_FILE, RUN_SOURCE_FILE, read_json

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
    return step, {k: f for k, v in data.items() if (f := finite(v)) is not None}, bad


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


def run_dir_of(path: str | Path) -> Path:
    """The run directory ``path`` names: itself, or the directory holding it when it is a run's metrics.jsonl (the
    file named rather than its folder, as a shell's tab completion gives it)."""
    p = Path(path)
    return p.parent if p.name == METRICS_FILE and p.is_file() else p


def _garbled(path: Path) -> bool:
    """Whether a metrics file that gave no row is more than a torn first row (a crash mid-append): bytes that are
    not UTF-8 text, or more than one line."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return True
    return "\x00" in text or len([line for line in text.splitlines() if line.strip()]) > 1


def load_run(run_dir: str | Path) -> RunData:
    """A local run directory (or its metrics.jsonl: ``run_dir_of``); one-line error if it is not one."""
    p = run_dir_of(run_dir)
    if not p.is_dir():
        raise UserError(f"run directory '{p}' does not exist")
    mfile = p / METRICS_FILE
    if not mfile.is_file():
        raise UserError(f"'{p}' is not a run directory (no {METRICS_FILE})")
    rows, bad = _read_metric_lines(mfile)
    if not rows and _garbled(mfile):
        raise UserError(f"'{mfile}' cannot be read: no line of it is a metric row (damaged, or not a metrics file)")
    saved = read_saved_config(p / CONFIG_FILE)
    # Written by rlgrad's TRL integration: the trainer whose metric names the run's users know, and the reward
    # names behind the escaped component keys (rlgrad.metrics.component_keys).
    src = read_json(p / RUN_SOURCE_FILE) or {}
    names = src.get("reward_names") if isinstance(src.get("reward_names"), dict) else {}
    kind = src.get("trainer") if src.get("trainer") in ("trl", "verl") else "rlgrad"
    settings = src.get("settings") if isinstance(src.get("settings"), dict) else {}
    return RunData(name=p.resolve().name, source=str(p), rows=rows, config=saved.tree, config_text=saved.text,
                   run_dir=p, nonfinite=bad, kind=kind, labels={str(k): str(v) for k, v in names.items()},
                   settings=settings)


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
            if (f := finite(v)) is not None:
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
    for c in (p.parent / ".hydra" / CONFIG_FILE, p.parent / CONFIG_FILE):
        saved = read_saved_config(c)
        if saved.tree is not None:
            break
    return RunData(name=p.stem, source=str(p), rows=rows, config=saved.tree, config_text=saved.text, run_dir=None,
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
    if p.is_file() and p.name == METRICS_FILE:  # rlgrad's, as the directory holding it would be read
        return load_run(p.parent)
    if p.is_file():
        if p.suffix.lower() == ".csv":
            return load_csv(p)
        return load_tensorboard(p) if p.name.startswith("events.out.tfevents.") else load_verl_log(p)
    if not p.is_dir():
        raise UserError(f"run '{p}' does not exist")
    if (p / METRICS_FILE).is_file():
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
        if finite(step) is None:
            continue
        rec = out.setdefault(int(step), {})
        for k, v in row.items():
            if k.startswith("_"):
                continue
            f = finite(v)
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
    return {k: f for k, v in obj.items() if (f := finite(v)) is not None}
