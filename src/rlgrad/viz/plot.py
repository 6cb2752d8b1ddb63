"""``rlgrad plot`` and ``rlgrad plot-steps``: a run's analysis steps as files, and the multi-step grid."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

from matplotlib.figure import Figure

from rlgrad import rundata as D
from rlgrad.errors import UserError
from rlgrad.runfiles import atomic_write_bytes, atomic_write_text
from rlgrad.viz import bucket_figures as B
from rlgrad.viz import run_figures as R
from rlgrad.viz.figbase import png_bytes

# The files of RAGEN's plotting script (gradient_analysis/plot_gradient_analysis.py), in its recommended
# reading order; then ours (written when the run has the data).
RAGEN_FIGURES = {"summary": B.fig_summary, "plots": B.fig_grad_norms, "loss_plots": B.fig_losses,
                 "reward_std": B.fig_reward_std, "normed_grads": B.fig_normed}


def sanitize(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "run"


def step_metrics_export(run: D.RunData, step: int) -> dict:
    """gradient_analysis_metrics_step_N.json: the step's whole metric row (as RAGEN's plotting script dumps
    its W&B row)."""
    return {"_step": step, **run.metrics(step)}


def rv_table_csv(run: D.RunData, step: int) -> str:
    """gradient_analysis_bucket_rv_table_step_N.csv: one row per prompt group, RAGEN's columns first."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["bucket", "reward_std", "group_id"])
    for bucket, gid, sd in sorted(D.rv_table(run, step), key=lambda r: (D.bucket_order(r[0]), r[1])):
        writer.writerow([bucket, f"{sd:.8g}", gid])
    return buf.getvalue()


def plottable_steps(run: D.RunData) -> list[int]:
    """Steps with anything to draw: a bucket analysis, a reward-component geometry or a neuron-health measurement."""
    return sorted(set(D.analysis_steps(run)) | set(D.component_steps(run)) | set(D.neuron_steps(run)))


def step_figures(run: D.RunData, step: int) -> dict[str, Figure]:
    """name -> figure for one step: RAGEN's five on a bucket-analysis step, then whatever else the step holds."""
    sv = B.StepView(run, step)
    buckets = step in D.analysis_steps(run)
    figs = {name: make(sv) for name, make in RAGEN_FIGURES.items()} if buckets else {}
    extra = {"layers": B.fig_layers(sv) if buckets else None}
    geom = D.component_geometry(run, step)
    if geom is not None:
        extra["components"] = R.fig_components(geom, sv.title("Reward-component gradient geometry"))
    health = D.neuron_health(run, step)
    if health is not None:
        extra["neurons"] = R.fig_neurons(health, sv.title("Neuron health"))
    figs.update({k: v for k, v in extra.items() if v is not None})
    return figs


def write_step_outputs(run: D.RunData, step: int, out_dir: Path, dpi: int = 150) -> list[Path]:
    written = []
    for name, fig in step_figures(run, step).items():
        path = out_dir / f"gradient_analysis_{name}_step_{step}.png"
        atomic_write_bytes(path, png_bytes(fig, dpi))
        written.append(path)
    path = out_dir / f"gradient_analysis_metrics_step_{step}.json"
    atomic_write_text(path, json.dumps(step_metrics_export(run, step), indent=2, sort_keys=True) + "\n")
    written.append(path)
    if step in D.analysis_steps(run):
        path = out_dir / f"gradient_analysis_bucket_rv_table_step_{step}.csv"
        atomic_write_text(path, rv_table_csv(run, step))
        written.append(path)
    return written


def _print_steps(run: D.RunData, available: list[int]) -> None:
    """``rlgrad plot --list-steps``."""
    if not available:
        print(f"no analysis steps in {run.source}")
        return
    print(f"analysis steps in {run.source} (bucket analysis, reward components, neuron health):")
    for s in available:
        print(s)


def _chosen_steps(run: D.RunData, steps: list[int] | None, available: list[int]) -> list[int]:
    """The asked-for steps that have an analysis (all of them when none is asked for); a miss is named."""
    chosen = sorted(set(steps or available) & set(available))
    missing = sorted(set(steps or []) - set(available))
    if missing and not chosen:
        raise UserError(f"step {', '.join(map(str, missing))} has no analysis in '{run.source}' "
                        f"(available: {', '.join(map(str, available))})")
    if missing:
        print(f"no analysis at step {', '.join(map(str, missing))} (available: {', '.join(map(str, available))}); "
              "drawing the others")
    return chosen


def _output_dir(run: D.RunData, output_dir: str | None) -> Path:
    out = Path(output_dir) if output_dir else Path("gradient_analysis_outputs") / sanitize(run.name)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output-dir '{out}' exists and is not a directory")
    return out


def plot_command(run_dir: str | None, wandb_path: str | None, steps: list[int] | None, output_dir: str | None,
                 list_steps: bool, dpi: int = 150) -> int:
    if (run_dir is None) == (wandb_path is None):
        raise UserError("give a RUN_DIR or --wandb-path ENTITY/PROJECT/RUN_ID (one of them)")
    run = D.load_run(run_dir) if run_dir is not None else D.load_wandb_run(wandb_path)
    available = plottable_steps(run)
    if list_steps:
        _print_steps(run, available)
        return 0
    if not available:
        raise UserError(f"'{run.source}' holds no analysis steps (no bucket analysis, reward-component geometry or "
                        "neuron-health measurement)")
    chosen = _chosen_steps(run, steps, available)
    out = _output_dir(run, output_dir)
    for s in chosen:
        files = write_step_outputs(run, s, out, dpi)
        print(f"step {s}: {len(files)} files")
    trend = R.fig_component_trend(run)
    if trend is not None:  # the run-level view of the component steps
        atomic_write_bytes(out / "gradient_analysis_components_over_steps.png", png_bytes(trend, dpi))
        print("reward components over the steps: gradient_analysis_components_over_steps.png")
    print(f"all outputs written to {out.resolve()}")
    return 0


def parse_step_dir(spec: str) -> tuple[str, Path]:
    m = re.fullmatch(r"([^=]+)=(.+)", spec)
    if not m:
        raise UserError(f"--step-dir '{spec}' is not STEP=DIR")
    return m.group(1), Path(m.group(2))


def load_step_dir(step: str, path: Path) -> dict[str, float]:
    """DIR holds ``gradient_analysis_metrics_step_<STEP>.json`` (``rlgrad plot``) or ``metrics.json``
    (RAGEN's layout)."""
    if path.is_file():
        return D.read_step_metrics(path)
    if not path.is_dir():
        raise UserError(f"--step-dir {step}={path}: directory does not exist")
    for name in (f"gradient_analysis_metrics_step_{step}.json", "metrics.json"):
        if (path / name).is_file():
            return D.read_step_metrics(path / name)
    found = sorted(p.name for p in path.glob("gradient_analysis_metrics_step_*.json"))
    hint = f" (it has {', '.join(found)})" if found else ""
    raise UserError(f"--step-dir {step}={path}: no gradient_analysis_metrics_step_{step}.json or "
                    f"metrics.json{hint}")


def plot_steps_command(mode: str, step_dirs: list[str], out: str, dpi: int = 200) -> int:
    steps = []
    for spec in step_dirs:
        step, path = parse_step_dir(spec)
        metrics = load_step_dir(step, path)
        if not D.bucket_names(metrics):
            raise UserError(f"--step-dir {spec}: the metrics hold no grad_norm/bucket_* values")
        steps.append((f"Step {step}", metrics))
    fig = R.fig_steps_grid(steps, mode)
    atomic_write_bytes(out, png_bytes(fig, dpi))
    print(f"saved figure to {Path(out).resolve()}")
    return 0
