"""`rlgrad plot`, `rlgrad plot-steps`, `rlgrad report`: files, contents, W&B rows, the report in Chromium."""

import base64
import csv
import io
import json
import math
import re
import shutil
import sys
import types

import matplotlib.image as mpimg
import numpy as np
import pytest

from rlgrad import rundata as D
from rlgrad.cli import main
from rlgrad.config.load import load_config
from rlgrad.recipes import make_trainer
from rlgrad.viz import bucket_figures as F
from rlgrad.viz import reading as R
from rlgrad.viz import run_figures as RF
from rlgrad.viz.figbase import png_bytes
from rlgrad.viz.plot import step_figures
from rlgrad.viz.reading import narrative
from tests.conftest import REPO, tiny_overrides
from tests.helpers.chromium import chromium_or_skip, open_page

DATA = REPO / "tests" / "data"
RAGEN_FILES = ["summary", "plots", "loss_plots", "reward_std", "normed_grads"]
DPI = "40"


def _png_ok(data: bytes) -> np.ndarray:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(io.BytesIO(data), format="png")
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50
    assert float(img[..., :3].std()) > 0.01  # not blank
    return img


def _rows(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["data"] for r in map(json.loads, lines)}


@pytest.fixture(scope="session")
def recorded_run(tmp_path_factory, model_cache):
    """A real tiny run: 2 steps, bucket analysis, component geometry and neuron health every step, KL and
    entropy on, some reward variance."""
    run = tmp_path_factory.mktemp("viz") / "tiny-run"
    ov = [o for o in tiny_overrides(model_cache, run) if not o.startswith("model.warmstart_steps")]
    ov += ["model.warmstart_steps=40", "trainer.total_training_steps=2", "trainer.gradient_analysis_every=1",
           "actor.use_kl_loss=true", "actor.entropy_coeff=0.01", "trainer.test_freq=1",
           "analysis.components_every=1", "actor.redo_metric_freq=1"]
    make_trainer(load_config(overrides=ov), log=lambda *a: None).fit()
    return run


def _add_synthetic_analyses(run_dir):
    """The issue-4/5 files (formats agreed in the briefs) and their metrics, on a copy of a real run."""
    rows = _rows(run_dir)
    comps = ["correctness", "format"]
    for step in (1, 2):
        d = run_dir / "analysis" / f"step_{step}"
        layers = ["embed", "layer_0", "layer_1", "final_norm"]
        (d / "components.json").write_text(json.dumps({
            "step": step, "mode": "shared_std", "components": comps,
            "global": {"norm": {"correctness": 0.8, "format": 0.3, "total": 0.9},
                       "share": {"correctness": 0.75, "format": 0.25},
                       "cosine": {"correctness__format": {1: -0.4, 2: 0.3}[step]}},
            "layers": {g: {"norm": {"correctness": 0.1 * i, "format": 0.05, "total": 0.12},
                           "cosine": {"correctness__format": 0.2 - 0.15 * i}}
                       for i, g in enumerate(layers)}}))
        (d / "neurons.json").write_text(json.dumps({"step": step, "actor": {
            "tau": 0.1, "mode": "activation",
            "global": {"dormant_ratio": 0.05 * step, "act_dormant_ratio": 0.04, "zero_grad_ratio": 0.01,
                       "param_zero_grad_ratio": 0.0, "nullspace_ratio": 0.2, "reset_count": 0},
            "layers": {f"model.layers.{i}.{k}": {"kind": k, "neurons": 64, "dormant": 3 * step,
                                                 "dormant_ratio": 3 * step / 64,
                                                 "act_dormant": 2, "zero_grad": 1, "reset": 0}
                       for i in range(2) for k in ("mlp", "attn")}}}))
        rows[step].update({"actor/neuron/dormant_ratio": 0.05 * step, "actor/neuron/zero_grad_ratio": 0.01,
                           "grad_sim/correctness__format": {1: -0.4, 2: 0.3}[step],
                           "critic/vf_explained_var": 0.1 * step, "critic/vf_loss": 1.0 / step})
    with open(run_dir / "reward_components.jsonl", "w") as f:
        for step, mean in ((1, 0.1), (2, 9.9), (2, 0.2)):  # a resumed run repeats a step: the last line wins
            f.write(json.dumps({"step": step, "components": comps + ["length"],
                                "weights": {"correctness": 0.5, "format": 0.3, "length": 0.2},
                                "stats": {c: {"mean": mean, "std": 0.05, "min": 0.0, "max": 1.0}
                                          for c in comps + ["length"]},
                                "total": {"mean": 0.2, "std": 0.1}, "num_correct": step,
                                "num_valid_format": 8, "mean_length": 3.0, "num_samples": 16,
                                "samples": []}) + "\n")
    _write_rows(run_dir, rows)


def _write_rows(run_dir, rows):
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": d}) + "\n"
                                                   for s, d in rows.items()))


def test_plot_draws_the_real_producers_files(recorded_run):
    """components.json / neurons.json as the trainer writes them (not the synthetic copies) are drawn: the step's
    figures as `rlgrad plot` makes them (step_figures), the two drawn to PNG (the command writing every figure
    is test_plot_writes_every_file_with_the_run_contents; all eight of this step through it took 4 s)."""
    for step in (1, 2):
        assert (recorded_run / "analysis" / f"step_{step}" / "components.json").exists()
        assert (recorded_run / "analysis" / f"step_{step}" / "neurons.json").exists()
    figs = step_figures(D.load_run(recorded_run), 2)
    for name in ("components", "neurons"):
        _png_ok(png_bytes(figs[name], int(DPI)))


@pytest.fixture(scope="session")
def rich_run(recorded_run, tmp_path_factory):
    run = tmp_path_factory.mktemp("viz-rich") / "rich-run"
    shutil.copytree(recorded_run, run, ignore=shutil.ignore_patterns("global_step_*"))
    _add_synthetic_analyses(run)
    return run


@pytest.fixture(scope="session")
def plotted(rich_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("viz-out") / "plots"
    assert main(["plot", str(rich_run), "--output-dir", str(out), "--dpi", DPI]) == 0
    return out


def test_plot_writes_every_file_with_the_run_contents(rich_run, plotted):
    rows = _rows(rich_run)
    for step in (1, 2):
        for name in RAGEN_FILES + ["layers", "components", "neurons"]:
            _png_ok((plotted / f"gradient_analysis_{name}_step_{step}.png").read_bytes())
        exported = json.loads((plotted / f"gradient_analysis_metrics_step_{step}.json").read_text())
        assert exported == {"_step": step, **rows[step]}  # the whole row, as RAGEN's script dumps its W&B row
        with open(plotted / f"gradient_analysis_bucket_rv_table_step_{step}.csv") as f:
            table = list(csv.DictReader(f))
        assert list(table[0]) == ["bucket", "reward_std", "group_id"]
        with open(rich_run / "analysis" / f"step_{step}" / "group_rv_table.csv") as f:
            source = {(r["bucket"], int(r["group_id"]), float(r["reward_std"])) for r in csv.DictReader(f)}
        assert {(r["bucket"], int(r["group_id"]), float(r["reward_std"])) for r in table} == source
        buckets = sorted({k.split("/")[1] for k in rows[step] if k.startswith("grad_norm/bucket_")})
        for b in buckets:  # one row per prompt group of each bucket
            assert sum(r["bucket"] == b for r in table) == rows[step][f"grad_norm/{b}/group_rv_count"]
    assert not list(plotted.glob(".*"))  # atomic writes leave no temp files


def test_a_run_gets_only_the_figures_it_has_data_for(recorded_run, tmp_path):
    run = D.load_run(recorded_run)
    assert run.name == "tiny-run"  # the default output directory: gradient_analysis_outputs/tiny-run/
    assert list(step_figures(run, 2)) == RAGEN_FILES + ["layers", "components", "neurons"]
    plain = tmp_path / "plain-run"  # the same run without its component / neuron files
    shutil.copytree(recorded_run, plain, ignore=shutil.ignore_patterns("global_step_*", "components.json",
                                                                       "neurons.json"))
    rows = _rows(plain)
    rows = {s: {k: v for k, v in d.items() if "/neuron/" not in k
                and not k.startswith(("grad_comp/", "grad_sim/")) and "zero_grad" not in k}
            for s, d in rows.items()}
    _write_rows(plain, rows)
    assert list(step_figures(D.load_run(plain), 2)) == RAGEN_FILES + ["layers"]


def test_plot_draws_a_run_without_bucket_analysis(recorded_run, tmp_path, capsys):
    """A run with the bucket analysis off (components_demo) still gets its component and neuron figures."""
    run = tmp_path / "no-buckets"
    shutil.copytree(recorded_run, run, ignore=shutil.ignore_patterns("global_step_*"))
    _write_rows(run, {s: {k: v for k, v in d.items() if not k.startswith(("grad_norm/", "grad_norm_prefilter/"))}
                      for s, d in _rows(run).items()})
    out = tmp_path / "out"
    assert main(["plot", str(run), "--output-dir", str(out), "--dpi", DPI]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert "gradient_analysis_components_step_1.png" in names and "gradient_analysis_neurons_step_2.png" in names
    assert not any("summary" in n or "rv_table" in n for n in names)
    # a step list with one missing step draws the others and says which is missing
    assert main(["plot", str(run), "--step", "1", "51", "--output-dir", str(tmp_path / "o2"), "--dpi", DPI]) == 0
    assert "no analysis at step 51" in capsys.readouterr().out
    assert (tmp_path / "o2" / "gradient_analysis_components_step_1.png").is_file()


def test_list_steps(recorded_run, capsys):
    assert main(["plot", str(recorded_run), "--list-steps"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1:] == ["1", "2"]


@pytest.mark.parametrize("argv,culprit", [
    (["plot", "{tmp}/nope"], "nope"),
    (["plot", "{tmp}"], "metrics.jsonl"),
    (["plot", "{run}", "--step", "7"], "step 7"),
    (["plot", "{run}", "--wandb-path", "a/b/c"], "one of them"),
    (["plot", "--wandb-path", "not-a-path"], "ENTITY/PROJECT/RUN_ID"),
    (["report", "{tmp}/nope"], "nope"),
    (["plot", "{run}", "--dpi", "0"], "--dpi 0"),
    (["report", "{run}", "--output", "{tmp}"], "is a directory"),
    (["plot", "{run}", "--output-dir", "{run}/metrics.jsonl"], "not a directory"),
    (["plot-steps", "--step-dir", "1", "--out", "{tmp}/x.png"], "STEP=DIR"),
    (["plot-steps", "--step-dir", "1={tmp}/none", "--out", "{tmp}/x.png"], "none"),
    (["plot-steps", "--step-dir", "5={tmp}", "--out", "{tmp}/x.png"],
     "gradient_analysis_metrics_step_5.json"),
])
def test_bad_input_exits_2_with_one_line(recorded_run, tmp_path, capsys, argv, culprit):
    argv = [a.format(tmp=tmp_path, run=recorded_run) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlgrad: error:") and culprit in err[0], err
    assert not (tmp_path / "x.png").exists()


def test_run_reader_takes_both_row_layouts_torn_lines_and_repeated_steps(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"step": 0, "data": {"val/accuracy": 0.5}}\n'
        '{"step": 1, "actor/grad_norm": 2.0, "grad_norm/bucket_1/task": 1.0, "x": "text"}\n'  # flat layout
        '{"step": 1, "data": {"actor/grad_norm": 3.0, "actor/entropy": NaN}}\n'  # repeated step: later wins
        '{"step": 2, "data": {"actor/gr')  # torn last line (a crash mid-append)
    r = D.load_run(run)
    assert r.rows == {0: {"val/accuracy": 0.5}, 1: {"actor/grad_norm": 3.0, "grad_norm/bucket_1/task": 1.0}}
    assert D.analysis_steps(r) == [1] and r.config is None


def test_wandb_rows_convert_to_our_records():
    rows = json.loads((DATA / "wandb_history_rows.json").read_text())  # recorded W&B shapes: None and NaN
    rec = D.records_from_wandb_rows(rows)
    assert list(rec) == [0, 1, 2]
    assert rec[0] == {"val/accuracy": 0.25, "val/score/mean": 0.3}
    # two log calls at step 1 merged; None dropped
    assert "trainer/note" in rec[1] and "val/accuracy" not in rec[1]
    assert not any(k.startswith("_") for r in rec.values() for k in r)
    assert "grad_norm/group_rv_table" not in rec[1]  # media are fetched apart
    assert all(math.isfinite(v) for r in rec.values() for v in r.values())  # NaN (history() frames) dropped
    assert not any(k.startswith("grad_norm/") for k in rec[2])
    src = {k: v for k, v in rows[1].items() if not k.startswith("_") and isinstance(v, float | int)}
    assert {k: v for k, v in rec[1].items() if k != "trainer/note"} == src
    run = D.RunData(name="w", source="e/p/r", rows=rec)
    assert D.analysis_steps(run) == [1]
    table = D.wandb_table_rows(json.loads((DATA / "wandb_group_rv_table.json").read_text()))
    assert table[0] == ("bucket_1", 0, 0.0) and len(table) == 4


def test_plot_from_wandb_through_the_public_api(tmp_path, monkeypatch, capsys):
    """The online path with a stand-in for wandb.Api (no network): rows, table download, output name."""
    rows = json.loads((DATA / "wandb_history_rows.json").read_text())
    table_json = DATA / "wandb_group_rv_table.json"

    class FakeFile:
        def __init__(self, path):
            self.path = path

        def download(self, replace, root):
            assert self.path.endswith(".table.json")
            return types.SimpleNamespace(name=str(table_json))

    class FakeRun:
        name, id, config = "my run/1", "abc123", {"actor": {"loss_agg_mode": "token-mean"}}

        def scan_history(self):
            return iter(rows)

        def file(self, path):
            return FakeFile(path)

    class FakeApi:
        def run(self, path):
            assert path == "ent/proj/abc123"
            return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(Api=FakeApi))
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "--wandb-path", "ent/proj/abc123", "--list-steps"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[1:] == ["1"]
    assert main(["plot", "--wandb-path", "ent/proj/abc123", "--dpi", "20"]) == 0
    out = tmp_path / "gradient_analysis_outputs" / "my_run_1"
    with open(out / "gradient_analysis_bucket_rv_table_step_1.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    for name in RAGEN_FILES:
        _png_ok((out / f"gradient_analysis_{name}_step_1.png").read_bytes())


def test_plot_steps_grid(plotted, tmp_path):
    one, two = tmp_path / "one.png", tmp_path / "two.png"
    assert main(["plot-steps", "--mode", "ppo", "--step-dir", f"1={plotted}", "--out", str(one),
                 "--dpi", DPI]) == 0
    ragen_dir = tmp_path / "step2"  # RAGEN's layout: DIR/metrics.json
    ragen_dir.mkdir()
    shutil.copy(plotted / "gradient_analysis_metrics_step_2.json", ragen_dir / "metrics.json")
    assert main(["plot-steps", "--mode", "grpo", "--step-dir", f"1={plotted}", f"2={ragen_dir}",
                 "--out", str(two), "--dpi", DPI]) == 0
    h1, h2 = _png_ok(one.read_bytes()).shape[0], _png_ok(two.read_bytes()).shape[0]
    assert h2 > 1.5 * h1  # a row per step


def _step_view(metrics):
    return F.StepView(D.RunData(name="t", source="t", rows={1: metrics}), 1)


def _bucket_metrics(rv, task, kl=None, ent=None, all_=None):
    m = {}
    for i, (r, t) in enumerate(zip(rv, task), start=1):
        b = f"grad_norm/bucket_{i}"
        m.update({f"{b}/reward_std_mean": r, f"{b}/reward_std_min": r, f"{b}/reward_std_max": r,
                  f"{b}/task": t, f"{b}/sample_pct": 100 / len(rv), f"{b}/group_rv_count": 1.0})
        if kl is not None:
            m[f"{b}/kl"] = kl[i - 1]
        if ent is not None:
            m[f"{b}/entropy"] = ent[i - 1]
    if all_ is not None:
        m.update({f"grad_norm/all/{k}": v for k, v in all_.items()})
    return m


def test_regulariser_axis_follows_the_data_and_reward_std_goes_log():
    m = _bucket_metrics(rv=[0.001, 0.01, 0.1, 1.0], task=[0.0, 0.5, 1.0, 2.0],
                        kl=[0.001, 0.002, 0.002, 0.003], ent=[0.001, 0.001, 0.001, 0.001],
                        all_={"task": 0.9, "reward_std_mean": 0.3})
    sv = _step_view(m)
    ax_a, ax_b, ax_c = F.fig_summary(sv).axes[:3]
    assert ax_c.get_ylim() == pytest.approx((0.0, 1.2 * 0.004))  # RAGEN's plot fixes [0, 1]
    assert ax_c.get_xscale() == "log" and ax_b.get_xscale() == "log"  # RV spans three decades
    assert F.fig_reward_std(sv).axes[0].get_yscale() == "log"
    # the `all` bucket is drawn: as a point in (b) and as a bar in the norm plot
    assert any(line.get_label() == "all (whole batch)" for line in ax_b.get_lines())
    task_ax = F.fig_grad_norms(sv).axes[2]
    assert [t.get_text() for t in task_ax.get_xticklabels()][-1] == "all"
    lin = _step_view(_bucket_metrics(rv=[0.2, 0.3, 0.4], task=[1, 2, 3]))
    assert F.fig_reward_std(lin).axes[0].get_yscale() == "linear"


def test_narrative_rules_on_hand_made_numbers():
    m1 = _bucket_metrics(rv=[0.0, 0.2, 0.4], task=[0.0, 0.6, 0.3], kl=[0.02, 0.01, 0.01],
                         ent=[0.01, 0.0, 0.0], all_={"task": 0.25})
    m1["grad_norm/bucket_1/reward_std_max"] = 0.0
    m2 = _bucket_metrics(rv=[0.1, 0.2, 0.4], task=[0.1, 0.2, 0.5], kl=[0.01] * 3, ent=[0.0] * 3,
                         all_={"task": 0.5})
    rows = {0: {"val/accuracy": 0.25}, 1: {**m1, "actor/neuron/dormant_ratio": 0.1},
            5: {**m2, "val/accuracy": 0.5, "actor/neuron/dormant_ratio": 0.2}}
    text = " ".join(narrative(D.RunData(name="t", source="t", rows=rows)))
    assert "Validation accuracy went from 25.0% (step 0) to 50.0% (step 5), +25.0 points." in text
    assert "At step 1 the task gradient is largest in bucket 2 (bucket 2 of 3, mean in-group reward std " \
           "0.2): norm 0.6, against 0.25 for the whole batch." in text
    assert "At step 5 the task gradient is largest in bucket 3 (the highest-variance bucket" in text
    assert "moved to another bucket" in text and "from 0.25 to 0.5 (+100%)" in text
    assert "it grows with reward variance" in text
    assert "dormant-neuron ratio went from 10.0% (step 1) to 20.0% (step 5)" in text
    # regularisers alone where the task gradient vanishes (step 1, bucket 1): checked on step 1 alone. Issue 48:
    # "the KL exceeds the task gradient" where that gradient is 0 is said as what it is
    text1 = " ".join(narrative(D.RunData(name="t", source="t", rows={1: m1})))
    assert "At step 1 only the regulariser gradient (KL + entropy) moves bucket 1 — the low-variance half: the task " \
           "gradient there is zero" in text1
    assert "exceeds the task gradient" not in text1
    assert "1 of 3 buckets (33% of samples) hold only groups with zero reward std" in text1
    assert "peaks at bucket 2" in text1


# ---------------------------------------------------------------- each narrative rule alone


def _run(rows, **kw):
    return D.RunData(name="t", source="t", rows=rows, **kw)


def test_narrative_is_the_rules_in_order():
    assert [r.__name__ for r in R.RULES] == [
        "rule_val_accuracy", "rule_training_reward", "rule_response_length", "rule_actor_grad_norm",
        "rule_top_bucket", "rule_top_bucket_moved", "rule_zero_variance_buckets", "rule_monotonicity",
        "rule_regulariser_vs_task", "rule_no_analysis", "rule_reward_components", "rule_component_cosines",
        "rule_dormant_neurons", "rule_neuron_resets", "rule_critic_explained_variance"]
    m = _bucket_metrics(rv=[0.0, 0.2, 0.4], task=[0.0, 0.6, 0.3], kl=[0.02, 0.01, 0.01], all_={"task": 0.25})
    run = _run({0: {"val/accuracy": 0.25}, 1: {**m, "critic/vf_explained_var": 0.5},
                2: {"val/accuracy": 0.5, "grad_sim/a__b": 0.9}})
    text = narrative(run)
    assert text == [s for rule in R.RULES for s in rule(run)]
    assert text[0].startswith("Validation accuracy went from 25.0%")
    assert text[-1].startswith("The critic explains")
    assert len(text) == 7  # val, top bucket, zero variance, not monotone, regulariser, cosines, critic


def test_rule_val_accuracy():
    run = _run({0: {"val/accuracy": 0.25}, 2: {"critic/score/mean": 1.0}, 4: {"val/accuracy": 0.625}})
    assert R.rule_val_accuracy(run) == [
        "Validation accuracy went from 25.0% (step 0) to 62.5% (step 4), +37.5 points."]
    assert R.rule_val_accuracy(_run({3: {"val/accuracy": 0.4}})) == [
        "Validation accuracy was 40.0% at step 3 (one validation only)."]
    assert R.rule_val_accuracy(_run({1: {"critic/score/mean": 1.0}})) == []


def test_rule_training_reward():
    def run(values):
        return _run({s: {"critic/score/mean": v} for s, v in enumerate(values, start=1)})

    assert R.rule_training_reward(run([0.2, 0.5])) == [  # 2 steps: one step at each end
        "Mean training reward went from 0.2 at step 1 to 0.5 at step 2 (+150%)."]
    assert R.rule_training_reward(run([0.1, 0.3, 5.0, 5.0, 0.6, 1.0])) == [  # 6 steps: 2 at each end
        "Mean training reward averaged 0.2 over the first 2 steps and 0.8 over the last 2 (+300%)."]
    assert R.rule_training_reward(run([1.0] * 5 + [100.0] * 8 + [2.0] * 5)) == [  # 18 steps: 5 at most
        "Mean training reward averaged 1 over the first 5 steps and 2 over the last 5 (+100%)."]
    assert R.rule_training_reward(run([0.0, 0.5])) == [
        "Mean training reward went from 0 at step 1 to 0.5 at step 2 (from zero)."]
    assert R.rule_training_reward(run([0.0, 0.0])) == [
        "Mean training reward went from 0 at step 1 to 0 at step 2 (unchanged)."]
    assert R.rule_training_reward(run([0.5])) == []
    assert R.rule_training_reward(_run({1: {"val/accuracy": 0.5}})) == []


def test_rule_response_length():
    def run(values):
        return _run({s: {"response_length/mean": v} for s, v in enumerate(values, start=1)})

    assert R.rule_response_length(run([100.0, 90.0, 80.0])) == [
        "Mean response length moved from 100 to 80 tokens."]
    assert R.rule_response_length(run([100.0, 80.0, 100.0])) == []  # same at both ends
    assert R.rule_response_length(run([100.0])) == []
    assert R.rule_response_length(_run({1: {"val/accuracy": 0.5}})) == []


def test_rule_actor_grad_norm():
    run = _run({s: {"actor/grad_norm": v} for s, v in zip((1, 2, 3, 4), (4.0, 1.0, 3.0, 2.0))})
    assert R.rule_actor_grad_norm(run) == [
        "The actor's gradient norm (before clipping) went from 4 at step 1 to 2 at step 4; median 3."]
    assert R.rule_actor_grad_norm(_run({1: {"actor/grad_norm": 4.0}})) == []
    assert R.rule_actor_grad_norm(_run({1: {"val/accuracy": 0.5}, 2: {"val/accuracy": 0.6}})) == []


def test_rule_top_bucket_at_first_and_last_analysis_step():
    first = _bucket_metrics(rv=[0.1, 0.2, 0.4], task=[0.3, 0.9, 0.6], all_={"task": 0.5})
    middle = _bucket_metrics(rv=[0.1, 0.2, 0.4], task=[5.0, 0.0, 0.0])  # neither first nor last: not read
    last = _bucket_metrics(rv=[0.1, 0.25, 0.4], task=[0.1, 0.2, 1.5])  # no `all` bucket
    run = _run({2: first, 4: middle, 7: last, 9: {"val/accuracy": 0.5}})
    assert R.rule_top_bucket(run) == [
        "At step 2 the task gradient is largest in bucket 2 (bucket 2 of 3, mean in-group reward std 0.2): "
        "norm 0.9, against 0.5 for the whole batch.",
        "At step 7 the task gradient is largest in bucket 3 (the highest-variance bucket, mean in-group "
        "reward std 0.4): norm 1.5."]
    one = _run({1: _bucket_metrics(rv=[0.05, 0.3], task=[2.0, 1.0])})
    assert R.rule_top_bucket(one) == [
        "At step 1 the task gradient is largest in bucket 1 (the lowest-variance bucket, mean in-group "
        "reward std 0.05): norm 2."]
    zero = _run({3: _bucket_metrics(rv=[0.0, 0.0], task=[0.0, 0.0])})
    assert R.rule_top_bucket(zero) == [
        "At step 3 every bucket's task gradient is zero: no group had reward variance, so every advantage "
        "was zero."]
    assert R.rule_top_bucket(_run({1: {"val/accuracy": 0.5}})) == []


def test_rule_top_bucket_moved():
    first = _bucket_metrics(rv=[0.1, 0.2], task=[0.3, 0.9], all_={"task": 0.5})
    same = _bucket_metrics(rv=[0.1, 0.2], task=[0.1, 0.4], all_={"task": 0.2})
    other = _bucket_metrics(rv=[0.1, 0.2], task=[0.9, 0.1], all_={"task": 0.75})
    assert R.rule_top_bucket_moved(_run({1: first, 3: same})) == [
        "Between steps 1 and 3 the largest task gradient stayed in the same bucket, and the whole-batch task "
        "gradient norm went from 0.5 to 0.2 (-60%)."]
    assert R.rule_top_bucket_moved(_run({1: first, 2: same, 6: other})) == [
        "Between steps 1 and 6 the largest task gradient moved to another bucket, and the whole-batch task "
        "gradient norm went from 0.5 to 0.75 (+50%)."]
    no_all = _bucket_metrics(rv=[0.1, 0.2], task=[0.1, 0.4])
    assert R.rule_top_bucket_moved(_run({1: first, 3: no_all})) == []  # no whole-batch norm at one end
    assert R.rule_top_bucket_moved(_run({1: first})) == []  # one analysis step
    assert R.rule_top_bucket_moved(_run({1: {"val/accuracy": 0.5}})) == []


def test_rule_zero_variance_buckets_at_the_last_step():
    m = _bucket_metrics(rv=[0.0, 0.0, 0.2, 0.4], task=[0.0, 0.0, 0.5, 1.0], kl=[0.1, 0.1, 0.1, 0.1])
    m["grad_norm/bucket_1/sample_pct"], m["grad_norm/bucket_2/sample_pct"] = 10.0, 30.0
    assert R.rule_zero_variance_buckets(_run({3: m})) == [
        "At step 3, 2 of 4 buckets (40% of samples) hold only groups with zero reward std: every sample of a "
        "prompt got the same reward, so their task gradient is zero and only the regularisers move them."]
    no_reg = {k: v for k, v in m.items() if not k.endswith("/kl")}
    assert R.rule_zero_variance_buckets(_run({3: no_reg}))[0].endswith("task gradient is zero and nothing moves them.")
    varied = _bucket_metrics(rv=[0.1, 0.2], task=[0.5, 1.0])
    assert R.rule_zero_variance_buckets(_run({3: m, 5: varied})) == []  # only the last step counts
    assert R.rule_zero_variance_buckets(_run({3: _bucket_metrics(rv=[0.0, 0.0], task=[0.0, 0.0])})) == []
    assert R.rule_zero_variance_buckets(_run({1: {"val/accuracy": 0.5}})) == []
    # counted group by group, as the console and group_rv_table.csv count them: 3 of the 4 groups of a bucket
    # that also holds one group with variance are still zero-variance groups
    mixed = _bucket_metrics(rv=[0.3, 0.4], task=[0.5, 1.0])
    mixed.update({"grad_norm/all/group_rv_count": 8.0, "grad_norm/all/group_rv_zero_count": 3.0})
    assert R.rule_zero_variance_buckets(_run({2: mixed})) == [
        "At step 2, 3 of 8 prompt groups (38%) have zero reward std: every sample of such a prompt got the same "
        "reward, so its task gradient is zero and nothing moves them."]
    counted = {**m, "grad_norm/all/group_rv_count": 5.0, "grad_norm/all/group_rv_zero_count": 2.0}
    assert R.rule_zero_variance_buckets(_run({3: counted}))[0].endswith(
        "only the regularisers move them. 2 of 4 buckets (40% of samples) hold only groups with zero reward std.")


def test_rule_monotonicity_at_the_last_step():
    grows = _bucket_metrics(rv=[0.1, 0.2, 0.3, 0.4], task=[0.1, 0.2, 0.2, 0.5])
    peaked = _bucket_metrics(rv=[0.1, 0.2, 0.4], task=[0.1, 0.7, 0.3])
    assert R.rule_monotonicity(_run({1: peaked, 2: grows})) == [
        "At step 2 the task gradient norm never decreases from a lower- to a higher-variance bucket: it "
        "grows with reward variance."]
    assert R.rule_monotonicity(_run({1: grows, 2: peaked})) == [
        "At step 2 the task gradient norm is not monotone in reward variance; it peaks at bucket 2."]
    two = _bucket_metrics(rv=[0.1, 0.2], task=[0.5, 0.1])
    assert R.rule_monotonicity(_run({1: two})) == []  # fewer than 3 buckets
    assert R.rule_monotonicity(_run({1: _bucket_metrics(rv=[0.1, 0.2, 0.3], task=[0.0] * 3)})) == []
    assert R.rule_monotonicity(_run({1: {"val/accuracy": 0.5}})) == []


def test_rule_regulariser_vs_task_at_the_last_step():
    low = _bucket_metrics(rv=[0.0, 0.1, 0.2, 0.4], task=[0.0, 0.5, 1.0, 2.0], kl=[0.02, 0.01, 0.01, 0.01],
                          ent=[0.01, 0.0, 0.0, 0.0])
    # issue 48: a task gradient of 0 is not "exceeded": those groups are moved by the regularisers alone
    assert R.rule_regulariser_vs_task(_run({1: low})) == [
        "At step 1 only the regulariser gradient (KL + entropy) moves bucket 1 — the low-variance half: the task "
        "gradient there is zero (every sample of a group got the same reward)."]
    small = _bucket_metrics(rv=[0.05, 0.1, 0.2, 0.4], task=[0.01, 0.5, 1.0, 2.0], kl=[0.02, 0.01, 0.01, 0.01],
                            ent=[0.01, 0.0, 0.0, 0.0])
    assert R.rule_regulariser_vs_task(_run({1: small})) == [
        "At step 1 the regulariser gradient (KL + entropy) exceeds the task gradient in bucket 1 — the "
        "low-variance half: those groups are pushed mainly by the regularisers."]
    high = _bucket_metrics(rv=[0.1, 0.2, 0.3, 0.4], task=[0.0, 0.0, 0.0, 1.0], kl=[0.1] * 4)
    assert R.rule_regulariser_vs_task(_run({1: high})) == [  # bucket 3 is not in the low half (1, 2)
        "At step 1 only the regulariser gradient (KL) moves bucket 1, bucket 2, bucket 3: the task gradient there "
        "is zero (every sample of a group got the same reward)."]
    task_wins = _bucket_metrics(rv=[0.1, 0.2, 0.4], task=[0.5, 1.0, 2.0], ent=[0.1, 0.1, 0.4])
    assert R.rule_regulariser_vs_task(_run({1: low, 4: task_wins})) == [  # ratios 5, 10, 5
        "At step 4 the task gradient exceeds the regulariser gradient (entropy) in every bucket (by at "
        "least 5×)."]
    zero_reg = _bucket_metrics(rv=[0.1, 0.2], task=[1.0, 2.0], kl=[0.0, 0.0])
    assert R.rule_regulariser_vs_task(_run({1: zero_reg})) == [
        "At step 1 the task gradient exceeds the regulariser gradient (KL) in every bucket."]
    assert R.rule_regulariser_vs_task(_run({1: _bucket_metrics(rv=[0.1, 0.2], task=[1.0, 2.0])})) == [
        "No regulariser gradient was computed (entropy coefficient 0 and no KL loss), so the task gradient "
        "is the whole update."]
    assert R.rule_regulariser_vs_task(_run({1: {"val/accuracy": 0.5}})) == []


def test_rule_no_analysis():
    sentence = ("This run has no gradient-analysis step (analysis.buckets.enable off, or no step "
                "matched analysis.buckets.every).")
    assert R.rule_no_analysis(_run({1: {"actor/grad_norm": 1.0}})) == [sentence]
    assert R.rule_no_analysis(_run({})) == [sentence]
    assert R.rule_no_analysis(_run({1: _bucket_metrics(rv=[0.1], task=[1.0])})) == []


def test_rule_reward_components(tmp_path):
    lines = [{"step": 1, "components": ["correctness", "format"],
              "stats": {"correctness": {"mean": 0.25}, "format": {"mean": 0.5}}},
             {"step": 3, "components": ["correctness", "format", "length"],
              "stats": {"correctness": {"mean": 0.75}, "length": {"mean": 0.125}}}]
    (tmp_path / "reward_components.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    run = _run({1: {"val/accuracy": 0.5}}, run_dir=tmp_path)
    # format has no mean at step 3 and length none at step 1: only correctness is compared
    assert R.rule_reward_components(run) == [
        "Reward components (mean per sample, step 1 → 3): correctness 0.25 → 0.75."]
    (tmp_path / "reward_components.jsonl").write_text(json.dumps(lines[1]) + "\n")  # one step: no change
    assert R.rule_reward_components(run) == [
        "Reward components (mean per sample, step 3 → 3): correctness 0.75 → 0.75, length 0.125 → 0.125."]
    (tmp_path / "reward_components.jsonl").unlink()
    assert R.rule_reward_components(run) == []
    assert R.rule_reward_components(_run({1: {"val/accuracy": 0.5}})) == []  # no run directory (W&B)


def test_rule_component_cosines_at_the_last_step():
    run = _run({2: {"grad_sim/correctness__format": 0.3},
                5: {"grad_sim/format__length": 0.05, "grad_sim/correctness__length": -0.5,
                    "grad_sim/correctness__format": 0.8}})
    assert R.rule_component_cosines(run) == [
        "At step 5 the reward components' gradients: correctness and format are aligned (cosine +0.80); "
        "correctness and length are in conflict (cosine -0.50); format and length are nearly orthogonal "
        "(cosine +0.05)."]
    assert R.rule_component_cosines(_run({2: {"grad_sim/correctness__format": 0.3}})) == [
        "At step 2 the reward components' gradients: correctness and format are weakly aligned "
        "(cosine +0.30)."]
    assert R.rule_component_cosines(_run({1: {"val/accuracy": 0.5}})) == []


def test_rule_component_cosines_of_a_zero_gradient(tmp_path):
    """components.json writes null for a pair whose gradient is zero (no direction): said, not a crash."""
    run = D.RunData("r", "r", {3: {"grad_comp/total/norm": 0.5}}, run_dir=tmp_path)
    (tmp_path / "analysis" / "step_3").mkdir(parents=True)
    (tmp_path / "analysis" / "step_3" / "components.json").write_text(json.dumps(
        {"step": 3, "components": ["correctness", "format"], "layers": {},
         "global": {"norm": {"correctness": 0.5, "format": 0.0, "total": 0.5}, "share": {},
                    "cosine": {"correctness__format": None}}}))
    assert R.rule_component_cosines(run) == [
        "At step 3 the reward components' gradients: correctness and format: cosine n/a (zero gradient)."]
    geom = D.component_geometry(run, 3)
    assert math.isnan(geom["global"]["cosine"]["correctness__format"])
    fig = RF.fig_components(geom, "zero gradients")
    assert _png_ok(png_bytes(fig)).shape[2] >= 3  # drawn, no crash
    # the undefined cells say so and are grey, not the scale's white ("orthogonal")
    ax = fig.axes[0]
    assert sum("n/a" in t.get_text() for t in ax.texts) == 3  # both pair cells and format's own: no direction
    assert [t.get_text() for t in ax.texts].count("+1.00") == 1  # correctness with itself
    bad = ax.images[0].cmap.get_bad()
    assert tuple(bad[:3]) != (1.0, 1.0, 1.0) and bad[3] == 1.0
    # per layer: a pair without a cosine anywhere is named in a note, not an empty legend entry
    geom["layers"] = {"embed": {"cosine": {"correctness__format": None}},
                      "layer_0": {"cosine": {"correctness__format": None}}}
    per_layer = next(a for a in RF.fig_components(geom, "zero gradients").axes
                     if a.get_title() == "cosine per layer group")
    assert per_layer.get_legend() is None and not [ln for ln in per_layer.lines if ln.get_marker() == "o"]
    assert [t.get_text() for t in per_layer.texts] == ["n/a (zero gradient): correctness · format"]
    # a zero share of a non-zero update is a number (0%), not n/a; a null share is n/a
    geom["global"]["share"] = {"correctness": 1.0, "format": 0.0}
    bars = next(a for a in RF.fig_components(geom, "t").axes if a.get_title() == "component gradient norm and share")
    assert [t.get_text() for t in bars.texts][:2] == ["0.5\n100%", "0\n0%"]
    geom["global"]["share"] = {"correctness": None, "format": None}
    bars = next(a for a in RF.fig_components(geom, "t").axes if a.get_title() == "component gradient norm and share")
    assert [t.get_text() for t in bars.texts][:2] == ["0.5\nshare n/a", "0\nshare n/a"]


def test_console_says_n_a_for_an_undefined_share_or_cosine():
    from rlgrad.logging.sinks import analysis_summary

    line = analysis_summary(3, {"grad_comp/correctness/share": math.nan, "grad_comp/format/share": math.nan,
                                "grad_sim/correctness__format": math.nan})
    assert "reward-component shares n/a (zero gradient)" in line and "nan" not in line
    line = analysis_summary(3, {"grad_comp/correctness/share": 0.8, "grad_comp/format/share": math.nan,
                                "grad_sim/correctness__format": math.nan})
    assert "largest reward component: correctness (80%" in line and "nan" not in line


def test_console_calls_a_conflict_only_beyond_the_reports_threshold():
    """Issue 48: a cosine of -0.0025 was "pull apart"; the console and the report word a cosine by one rule."""
    from rlgrad.logging.sinks import analysis_summary

    shares = {"grad_comp/correctness/share": 0.8, "grad_comp/format/share": 0.2}
    line = analysis_summary(3, {**shares, "grad_sim/correctness__format": -0.0025})
    assert "pull apart" not in line and "largest reward component: correctness (80%" in line
    line = analysis_summary(3, {**shares, "grad_sim/correctness__format": -0.25})
    assert "correctness vs format pull apart (cosine -0.25)" in line
    rows = {2: {"grad_sim/correctness__format": -0.0025}}
    assert "are nearly orthogonal (cosine -0.00)" in " ".join(R.rule_component_cosines(D.RunData("r", "r", rows)))


def test_component_trend_draws_cosines_and_shares_over_steps_with_gaps(tmp_path):
    rows = {s: {"grad_sim/correctness__format": c, "grad_comp/correctness/norm": 1.0, "grad_comp/format/norm": n,
                "grad_comp/correctness/share": sc, "grad_comp/format/share": sf, "grad_comp/total/norm": 1.0}
            for s, c, n, sc, sf in ((1, -0.4, 0.5, 0.9, 0.1), (11, math.nan, 0.0, 1.0, math.nan),
                                    (21, 0.2, 0.3, 0.7, 0.3))}
    run = D.RunData("r", "r", rows, run_dir=tmp_path)
    fig = RF.fig_component_trend(run)
    cos_ax, share_ax = fig.axes[:2]
    y = cos_ax.lines[0].get_ydata()
    assert list(cos_ax.lines[0].get_xdata()) == [1, 11, 21] and y[0] == -0.4 and math.isnan(y[1])
    assert "n/a (zero gradient)" in fig._suptitle.get_text()
    assert [ln.get_label() for ln in share_ax.lines if not ln.get_label().startswith("_")] == [
        "correctness", "format (n/a at step 11)"]
    # the missing values are a grey hatched band at step 11 marked n/a, never a point on the 0 line
    for ax in (cos_ax, share_ax):
        assert not [ln for ln in ax.lines if ln.get_marker() == "x"]
        assert not [ln for ln in ax.lines if 11 in list(ln.get_xdata()) and 0.0 in list(ln.get_ydata())]
        bands = [p for p in ax.patches if p.get_gid() == "undefined"]
        assert len(bands) == 1 and bands[0].get_hatch() == "//"
        assert bands[0].get_x() < 11 < bands[0].get_x() + bands[0].get_width()
        assert [t.get_text() for t in ax.texts] == ["n/a"]
    assert RF.fig_component_trend(D.RunData("r", "r", {1: rows[1]}, run_dir=tmp_path)) is None  # one step: no trend


def test_config_get_reads_a_setting_under_its_earlier_name():
    old = D.RunData("r", "r", {}, config={"trainer": {"gradient_analysis_every": 7}})
    new = D.RunData("r", "r", {}, config={"analysis": {"buckets": {"every": 9}}})
    assert D.config_get(old, "analysis.buckets.every") == 7 and D.config_get(new, "analysis.buckets.every") == 9
    assert D.config_get(new, "analysis.buckets.num_buckets", "-") == "-"


def test_a_component_is_said_to_fall_only_beyond_its_noise(tmp_path):
    """Issue 48: the README's every10 run: correctness 0.695 at step 1 and 0.617 at step 20, while its 5-step means
    rose from 0.651 to 0.716; the report said it "fell over the run" from the two single steps."""
    values = [0.695, 0.62, 0.66, 0.64, 0.64] + [0.68] * 10 + [0.76, 0.72, 0.74, 0.745, 0.617]
    lines = [{"step": s, "components": ["correctness"], "num_samples": 128,
              "stats": {"correctness": {"mean": x, "std": 0.45}}} for s, x in enumerate(values, start=1)]
    (tmp_path / "reward_components.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert R.rule_reward_components(_run({1: {"val/accuracy": 0.5}}, run_dir=tmp_path)) == [
        "Reward components (mean per sample, step 1 → 20): correctness 0.651 → 0.716 (means of the first and last "
        "5 steps)."]


def test_rule_dormant_neurons_per_role():
    run = _run({1: {"actor/neuron/dormant_ratio": 0.1},
                4: {"actor/neuron/dormant_ratio": 0.05, "critic/neuron/dormant_ratio": 0.2}})
    # two measurements: one at each end, no spread to judge a change by: stated, not called a rise or a fall
    assert R.rule_dormant_neurons(run) == [
        "The actor's dormant-neuron ratio went from 10.0% (step 1) to 5.0% (step 4).",
        "The critic's dormant-neuron ratio was 20.0% at step 4."]
    run = _run({1: {"critic/neuron/dormant_ratio": 0.125}, 2: {"critic/neuron/dormant_ratio": 0.25}})
    assert R.rule_dormant_neurons(run) == [
        "The critic's dormant-neuron ratio went from 12.5% (step 1) to 25.0% (step 2)."]
    # four: halves of two (standard errors 0.005 each, the rise 0.1 beyond 2 x 0.0071)
    run = _run({s: {"critic/neuron/dormant_ratio": x} for s, x in zip((1, 2, 3, 4), (0.1, 0.11, 0.2, 0.21))})
    assert R.rule_dormant_neurons(run) == [
        "The critic's dormant-neuron ratio rose from 10.0% (step 1) to 21.0% (step 4), 10.5% to 20.5% over the "
        "first and last 2 measurements."]
    run = _run({s: {"actor/neuron/dormant_ratio": x} for s, x in zip((1, 2, 3, 4), (0.1, 0.3, 0.1, 0.3))})
    assert R.rule_dormant_neurons(run) == [
        "The actor's dormant-neuron ratio stayed within its noise from 10.0% (step 1) to 30.0% (step 4), 20.0% to "
        "20.0% over the first and last 2 measurements."]
    assert R.rule_dormant_neurons(_run({1: {"actor/neuron/zero_grad_ratio": 0.5}})) == []


def test_rule_critic_explained_variance():
    run = _run({1: {"critic/vf_explained_var": 0.1}, 2: {"val/accuracy": 0.5},
                3: {"critic/vf_explained_var": 0.55}})
    assert R.rule_critic_explained_variance(run) == [
        "The critic explains 55.0% of the return variance at step 3 (from 10.0% at step 1)."]
    assert R.rule_critic_explained_variance(_run({3: {"critic/vf_explained_var": -0.25}})) == [
        "The critic explains -25.0% of the return variance at step 3."]
    assert R.rule_critic_explained_variance(_run({1: {"critic/vf_loss": 1.0}})) == []


def test_report_without_analysis_has_fewer_sections(tmp_path, capsys):
    run = tmp_path / "plain"
    run.mkdir()
    _write_rows(run, {s: {"critic/score/mean": 0.1 * s, "actor/grad_norm": 1.0 / s, "actor/entropy": 2.0}
                      for s in (1, 2, 3)})
    assert main(["plot", str(run)]) == 2
    assert "holds no analysis steps" in capsys.readouterr().err
    assert main(["report", str(run), "--dpi", DPI]) == 0  # default: RUN_DIR/report.html, written atomically
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "report.html"]
    page = (run / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert 'id="curves"' in page and 'id="analysis"' not in page and 'id="neurons"' not in page
    assert "has no gradient-analysis step" in page


@pytest.fixture(scope="session")
def rich_report(rich_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("viz-report") / "report.html"
    assert main(["report", str(rich_run), "--output", str(out), "--dpi", DPI, "--max-steps", "1"]) == 0
    return out


def test_report_is_self_contained(rich_run, rich_report):
    page = rich_report.read_text()
    for sid in ("reading", "config", "curves", "analysis", "rewards", "neurons", "critic"):
        assert f'id="{sid}"' in page, sid
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched from anywhere
    assert "<script" not in page and "<link" not in page
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) >= 10
    # --max-steps 1: the last step only
    assert "<summary>Step 2</summary>" in page and "<summary>Step 1</summary>" not in page
    for b64 in images:
        _png_ok(base64.b64decode(b64))
    rows = _rows(rich_run)
    acc = [rows[s]["val/accuracy"] for s in sorted(rows) if "val/accuracy" in rows[s]]
    assert f"Validation accuracy went from {100 * acc[0]:.1f}%" in page
    assert "correctness and format are weakly aligned (cosine +0.30)" in page  # step 2's components.json
    # the stale step-2 line is ignored
    assert "correctness 0.1 → 0.2, format 0.1 → 0.2, length 0.1 → 0.2" in page
    assert "dormant-neuron ratio went from 5.0% (step 1) to 10.0% (step 2)" in page
    assert "the actor update trained on: after the rollout filter" in page  # which samples the rewards are of
    assert "reward std mean" in page and "RV mean" not in page
    assert "in progress" not in page  # a finished run (2 of 2) with its analysis is not marked


def test_report_renders_in_chromium_without_errors(rich_report, tmp_path):
    chromium = chromium_or_skip()
    shot = tmp_path / "shot.png"
    errors = open_page(chromium, rich_report.as_uri(), shot)
    assert errors == []
    img = _png_ok(shot.read_bytes())  # decodes, and not blank
    assert img.shape[1] == 1280
    # the control: the same harness does see a broken page (a missing image, an uncaught exception)
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body><p>x</p><img src="missing.png"><script>nope();</script></body></html>')
    assert len(open_page(chromium, bad.as_uri(), tmp_path / "bad.png")) == 2


def test_layer_heatmap_holds_the_layers_json_numbers(recorded_run):
    layers = json.loads((recorded_run / "analysis" / "step_1" / "layers.json").read_text())["grad_norm"]
    fig = F.fig_layers(F.StepView(D.load_run(recorded_run), 1))
    norm_ax, share_ax = fig.axes[:2]
    rows = [t.get_text().replace(" ", "_") for t in norm_ax.get_yticklabels()]
    cols = [t.get_text() for t in norm_ax.get_xticklabels()]
    assert rows[-1] == "all" and set(rows) == set(layers)
    # input -> output
    assert cols == sorted(layers["all"]["task"], key=lambda g: (g != "embed", g == "final_norm", g))
    norms, share = norm_ax.images[0].get_array(), share_ax.images[0].get_array()
    for i, b in enumerate(rows):
        v = np.array([layers[b]["task"][g] for g in cols])
        sq = (v ** 2).sum()
        for j in range(len(cols)):
            if v[j] > 0:
                assert norms[i, j] == pytest.approx(v[j])
            else:
                assert np.ma.is_masked(norms[i, j])
            if sq > 0:
                assert share[i, j] == pytest.approx(v[j] ** 2 / sq)
            else:  # a zero-gradient row has no shares: grey n/a (test_report_explains.py), never 0%
                assert np.ma.is_masked(share[i, j])


def test_report_config_table_says_when_each_instrument_ran():
    from rlgrad.viz.report import _instrument_rows

    off = D.RunData("r", "r", {}, config={"analysis": {"every": None, "buckets": {"enable": False, "every": 50},
                                                       "components": {"every": 5},
                                                       "neurons": {"actor": {"metric_every": 5, "reset_every": 10,
                                                                             "tau": 0.1, "mode": "threshold"}}}})
    rows = {r[0]: r[1] for r in _instrument_rows(off)}
    assert rows["bucket analysis"] == "off" and "bucket mode" not in rows  # not "every 50" for an analysis that was off
    assert rows["reward-component geometry"] == "every 5 (steps 1, 6, …)"
    assert rows["neuron health"] == "every 5 (steps 5, 10, …)"  # ReDo's step rule
    assert rows["ReDo resets"] == "every 10 (τ 0.1, threshold)"
    # trainer-era names (actor.redo_*) and analysis.every, which puts every instrument on steps 1, 1+every, ...
    old = D.RunData("r", "r", {}, config={"actor": {"redo_metric_freq": 3}, "trainer": {"gradient_analysis_every": 7}})
    rows = {r[0]: r[1] for r in _instrument_rows(old)}
    assert rows["bucket analysis"] == "every 7 (steps 1, 8, …)" and rows["neuron health"] == "every 3 (steps 3, 6, …)"
    every = D.RunData("r", "r", {}, config={"analysis": {"every": 10, "components": {"every": 0}}})
    assert {r[0]: r[1] for r in _instrument_rows(every)}["reward-component geometry"] == "every 10 (steps 1, 11, …)"


def test_report_config_table_has_a_row_for_every_instrument_of_the_catalogue():
    """The table's rows come from the catalogue's instruments (rlgrad.metrics.INSTRUMENTS): one added there shows
    here; the per-sample instrument, once missing, among them."""
    from rlgrad.metrics import INSTRUMENTS
    from rlgrad.viz.report import _instrument_rows

    for config in ({}, {"analysis": {"every": 4}}):
        rows = {r[0]: (r[1], r[2]) for r in _instrument_rows(D.RunData("r", "r", {}, config=config))}
        assert {i.name for i in INSTRUMENTS} <= set(rows) and len(INSTRUMENTS) == 4
        assert rows["per-sample gradients and noise scale"] == (
            "off" if not config else "every 4 (steps 1, 5, …)", "analysis.per_sample.every")


def test_report_says_the_component_geometry_never_ran_under_gae():
    """The report reads the instruments' own step rule (``config.analysis.schedules``): analysis.every puts the
    reward-component geometry on steps 1, 1+every, ... only when the run has one advantage per response, which a
    gae run has not, so that instrument never ran there."""
    from rlgrad.viz.report import _instrument_rows

    gae = D.RunData("r", "r", {}, config={"algorithm": {"adv_estimator": "gae"}, "analysis": {"every": 10}})
    rows = {r[0]: r[1] for r in _instrument_rows(gae)}
    assert rows["reward-component geometry"] == "off"
    assert rows["bucket analysis"] == rows["neuron health"] == "every 10 (steps 1, 11, …)"


def test_figures_leave_out_the_panels_of_terms_the_run_never_computed():
    m = _bucket_metrics(rv=[0.0, 0.2, 0.4], task=[0.0, 0.6, 0.3], all_={"task": 0.4, "reward_std_mean": 0.2})
    for i in (1, 2, 3):
        m[f"grad_norm/bucket_{i}/loss/policy"] = 0.1 * i
        m[f"grad_norm/bucket_{i}/loss/total"] = 0.1 * i
    sv = _step_view(m)
    for fig in (F.fig_grad_norms(sv), F.fig_normed(sv)):
        assert len(fig.axes) == 1 and "Task" in fig.axes[0].get_title()
        assert "not drawn, not computed in this run: entropy (actor.entropy_coeff = 0), KL" in fig._suptitle.get_text()
    losses = F.fig_losses(sv)
    assert [ax.get_title() for ax in losses.axes] == ["Policy (task) loss", "Total loss"]
    assert len(F.fig_summary(sv).axes) == 2
    grid = RF.fig_steps_grid([("Step 1", m), ("Step 2", m)], "grpo")
    tied = _bucket_metrics(rv=[0.2, 0.2, 0.4], task=[0.1, 0.5, 0.3])
    line = next(ln for ln in RF.fig_steps_grid([("Step 1", tied)], "grpo").axes[1].lines if ln.get_linestyle() == "-")
    assert list(line.get_xdata()) == [0.2, 0.4] and list(line.get_ydata()) == pytest.approx([0.3, 0.3])
    assert len(grid.axes) == 4 and "not computed" in grid._suptitle.get_text()
    # with a KL term: its panels come back, in RAGEN's order
    m_kl = {**m, **{f"grad_norm/bucket_{i}/kl": 0.01 for i in (1, 2, 3)}}
    assert [ax.get_title() for ax in F.fig_grad_norms(_step_view(m_kl)).axes] == [
        "KL gradient norm", "Task (policy) gradient norm"]
    assert len(F.fig_summary(_step_view(m_kl)).axes) >= 3


def test_training_curves_leave_out_what_one_update_per_batch_makes_zero_and_bands_stay_in_range(tmp_path):
    rows = {s: {"critic/score/mean": 0.1 * s, "actor/ppo_kl": 1e-7 * (-1) ** s, "actor/pg_clipfrac": 0.0,
                "actor/entropy": 1.0} for s in (1, 2, 3)}
    on_policy = D.RunData("r", "r", rows, config={"actor": {"ppo_epochs": 1, "ppo_mini_batch_size": None},
                                                  "data": {"train_batch_size": 16}})
    fig = RF.fig_training_curves(on_policy)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert "KL" not in titles and "Clip fraction" not in titles and "Entropy" in titles
    assert "0 by construction, not drawn" in fig._suptitle.get_text()
    epochs = D.RunData("r", "r", rows, config={"actor": {"ppo_epochs": 2}, "data": {"train_batch_size": 16}})
    assert {"KL", "Clip fraction"} <= {ax.get_title() for ax in RF.fig_training_curves(epochs).axes}
    # a 0/1 reward with mean 0.5 and std 0.6: the band is [0, 1], not [-0.1, 1.1]
    (tmp_path / "reward_components.jsonl").write_text("".join(json.dumps(
        {"step": s, "components": ["correctness"], "weights": {"correctness": 1.0},
         "stats": {"correctness": {"mean": 0.5, "std": 0.6, "min": 0.0, "max": 1.0}}}) + "\n" for s in (1, 2)))
    band = RF.fig_reward_components(D.RunData("r", "r", {}, run_dir=tmp_path)).axes[0].collections[0]
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(0.0) and ys.max() == pytest.approx(1.0)


def test_bucket_trend_tracks_reward_std_levels_not_bucket_labels():
    s1 = _bucket_metrics(rv=[0.0, 0.2, 0.4], task=[0.0, 0.6, 0.3], all_={"task": 0.4})
    s2 = _bucket_metrics(rv=[0.1, 0.5, 0.9], task=[0.2, 0.5, 0.8], all_={"task": 0.6})
    fig = RF.fig_bucket_trend(D.RunData("r", "r", {1: s1, 11: s2}), [1, 11])
    left, right = fig.axes[:2]  # then the colourbar
    pts = left.collections[0]
    assert sorted(pts.get_array().tolist()) == [0.0, 0.1, 0.2, 0.4, 0.5, 0.9]  # colour = the bucket's reward std
    assert [ln.get_label() for ln in left.lines] == ["all (whole batch)"]  # no line joins bucket k over steps
    curves = {ln.get_label(): ln for ln in right.lines if not ln.get_label().startswith("_")}
    assert list(curves) == ["step 1", "step 11"] and list(curves["step 11"].get_xdata()) == [0.1, 0.5, 0.9]
    # two buckets of one reward std: one point at their mean on the line, a bar over their range, "×2" (no vertical
    # zigzag, no stack of unconnected dots)
    s3 = _bucket_metrics(rv=[0.0, 0.5, 0.5, 0.9], task=[0.0, 0.2, 0.6, 0.8], all_={"task": 0.5})
    fig = RF.fig_bucket_trend(D.RunData("r", "r", {1: s1, 11: s3}), [1, 11])
    line = next(ln for ln in fig.axes[1].lines if ln.get_label() == "step 11")
    assert list(line.get_xdata()) == [0.0, 0.5, 0.9] and line.get_ydata()[1] == pytest.approx(0.4)
    assert sum(len(ln.get_xdata()) for ln in fig.axes[1].lines if ln.get_marker() == "o") == 3 + 3
    bars = [c for c in fig.axes[1].collections if c.get_gid() == "shared_x_range"]
    assert len(bars) == 1 and np.allclose(bars[0].get_segments()[0], [[0.5, 0.2], [0.5, 0.6]])
    assert [t.get_text() for t in fig.axes[1].texts] == ["×2"]


def test_neuron_figures_read_plainly():
    health = {"actor": {"tau": 0.1, "global": {"dormant_ratio": 0.042, "zero_grad_ratio": 0.01, "reset_count": 152},
                        "layers": {"model.layers.0.mlp": {"kind": "mlp", "neurons": 64, "dormant_ratio": 0.1,
                                                          "act_dormant": 2, "zero_grad": 1},
                                   "model.layers.0.self_attn": {"kind": "attn", "neurons": 8, "dormant_ratio": 0.0,
                                                                "act_dormant": 0, "zero_grad": 0},
                                   "model.layers.1.self_attn": {"kind": "attn"}}}}
    ax = RF.fig_neurons(health, "t").axes[0]
    assert "dormant 4.2%" in ax.get_title() and "reset this step 152" in ax.get_title()
    assert RF._lines(["dormant 8.3%", "zero gradient 0.0%", "gradient null space 0.0%", "reset this step 0"], 60) == (
        "dormant 8.3%, zero gradient 0.0%, gradient null space 0.0%,\nreset this step 0")  # a fact is never split
    assert "dormant_ratio" not in ax.get_title()
    notes = [t.get_text() for t in ax.texts]
    assert notes == ["0 (none)", "not measured"]  # a zero row and an unmeasured row are told apart
    rows = {s: {"actor/neuron/reset_count": 152.0, "actor/neuron/dormant_ratio": 0.04} for s in (5, 10, 15)}
    resets = next(a for a in RF.fig_neuron_trend(D.RunData("r", "r", rows)).axes if a.get_title() == "ReDo resets")
    assert resets.get_ylim()[0] == 0  # a constant count is a flat line from 0, not noise on a 144-160 axis


def test_narrative_names_resets_and_a_falling_component(tmp_path):
    # two steps: each end's noise is its samples' (std 0.3 over 64: standard error 0.0375; the fall 0.5 is beyond)
    lines = [{"step": 1, "components": ["correctness", "format"], "num_samples": 64,
              "stats": {"correctness": {"mean": 0.25, "std": 0.4}, "format": {"mean": 0.9, "std": 0.3}}},
             {"step": 9, "components": ["correctness", "format"], "num_samples": 64,
              "stats": {"correctness": {"mean": 0.75, "std": 0.4}, "format": {"mean": 0.4, "std": 0.3}}}]
    (tmp_path / "reward_components.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    run = _run({1: {"val/accuracy": 0.5}}, run_dir=tmp_path)
    assert R.rule_reward_components(run)[-1] == "Fell over the run: format."
    for line in lines:  # without the samples' spread a lone step's mean has no noise: the fall is not called
        line.pop("num_samples")
    (tmp_path / "reward_components.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert R.rule_reward_components(run) == [
        "Reward components (mean per sample, step 1 → 9): correctness 0.25 → 0.75, format 0.9 → 0.4."]
    resets = _run({5: {"actor/neuron/reset_count": 100.0}, 10: {"actor/neuron/reset_count": 0.0},
                   15: {"actor/neuron/reset_count": 52.0}})
    assert R.rule_neuron_resets(resets) == ["ReDo reset 152 actor neurons over 2 reset steps (steps 5–15)."]
    assert R.rule_neuron_resets(_run({5: {"actor/neuron/reset_count": 0.0}})) == []


def test_buckets_of_one_reward_std_are_one_labelled_place_not_a_vertical_zigzag():
    """RAGEN's quantiles over mostly zero-variance groups: buckets 1-3 all at std 0, with different KL norms."""
    m = _bucket_metrics(rv=[0.0, 0.0, 0.0, 0.3, 0.5], task=[0.0, 0.0, 0.0, 0.4, 0.6],
                        kl=[0.03, 0.01, 0.02, 0.02, 0.02])
    _, ax_b, ax_c = F.fig_summary(_step_view(m)).axes[:3]
    for ax in (ax_b, ax_c):
        line = next(ln for ln in ax.get_lines() if ln.get_linestyle() == "-")
        xs = list(line.get_xdata())
        assert xs == sorted(set(xs)) == [0.0, 0.3, 0.5]  # the line never goes back along one x
    assert list(next(ln for ln in ax_c.get_lines() if ln.get_linestyle() == "-").get_ydata())[0] == pytest.approx(0.02)
    assert sorted(t.get_text() for t in ax_b.texts if t.get_text().startswith("Q")) == ["Q1–Q3", "Q4", "Q5"]
    assert sorted(t.get_text() for t in ax_c.texts if t.get_text().startswith("Q")) == [
        "Q1", "Q2", "Q3", "Q4", "Q5"]  # at std 0 but with their own KL norms
    assert "std 0" in F.StepView(D.RunData("t", "t", {1: m}), 1).tick_labels()[0]


def test_a_reset_only_step_draws_its_neurons_with_nothing_measured_said_so():
    """neurons.json of a step that only reset neurons: activation and null-space numbers are null (it crashed)."""
    health = {"actor": {"tau": 0.1, "global": {"dormant_ratio": 0.08, "act_dormant_ratio": None,
                                               "nullspace_ratio": None, "zero_grad_ratio": 0.0, "reset_count": 11},
                        "layers": {"model.layers.0.mlp": {"kind": "mlp", "neurons": 64, "dormant_ratio": 0.03,
                                                          "act_dormant": None, "zero_grad": 0, "reset": 2},
                                   "model.layers.0.self_attn": {"kind": "attn", "neurons": 2, "dormant_ratio": 0.0,
                                                                "act_dormant": None, "zero_grad": 0, "reset": 0}}}}
    ax = RF.fig_neurons(health, "t").axes[0]
    assert "dormant 8.0%" in ax.get_title() and "null space" not in ax.get_title()
    assert [t.get_text() for t in ax.texts] == ["0 (none)"]  # the attention row: measured, all zero
    assert math.isnan(RF._layer_ratio(health["actor"]["layers"]["model.layers.0.mlp"], "act_dormant_ratio"))


def test_commands_take_a_runs_metrics_jsonl_and_the_report_marks_an_unfinished_run(recorded_run, tmp_path, capsys):
    """report, plot, samples and doctor read RUN/metrics.jsonl as RUN; a run short of
    trainer.total_training_steps (here: its last row gone, as at step 1 of 2 while training) is marked at the top
    of its report, and a finished run is not."""
    run = tmp_path / "run"
    shutil.copytree(recorded_run, run, ignore=shutil.ignore_patterns("global_step_*"))
    rows = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("".join(r + "\n" for r in rows if json.loads(r)["step"] < 2))
    mfile = str(run / "metrics.jsonl")
    capsys.readouterr()
    assert main(["plot", mfile, "--list-steps"]) == 0 and f"analysis steps in {run} " in capsys.readouterr().out
    assert main(["samples", mfile, "--max", "1"]) == 0 and capsys.readouterr().out.startswith(f"{run} · step ")
    assert main(["doctor", mfile]) in (0, 1) and f"rlgrad doctor: run ({run})" in capsys.readouterr().out
    # The reports of this run and of the finished one without their analysis: the mark depends on the rows'
    # steps and the config alone, and the analysis figures (checked in test_report_is_self_contained) took 10 s.
    done = tmp_path / "done"
    shutil.copytree(recorded_run, done, ignore=shutil.ignore_patterns("global_step_*"))
    for r in (run, done):
        shutil.rmtree(r / "analysis")
        (r / "reward_components.jsonl").unlink()
        _write_rows(r, {s: {k: v for k, v in d.items() if not k.startswith(("grad_norm", "grad_comp/", "grad_sim/"))
                            and "/neuron/" not in k} for s, d in _rows(r).items()})
    assert main(["report", mfile, "--dpi", DPI, "--max-steps", "1"]) == 0
    assert capsys.readouterr().out.strip() == f"report written to {(run / 'report.html').resolve()} " \
                                              "(in progress: step 1 of 2)"
    page = (run / "report.html").read_text()
    assert page.index("in progress: step 1 of 2") < page.index("<nav>")
    assert main(["report", str(done / "metrics.jsonl"), "--output", str(tmp_path / "done.html"),
                 "--dpi", DPI, "--max-steps", "1"]) == 0
    assert "in progress" not in capsys.readouterr().out + (tmp_path / "done.html").read_text()
    assert D.unfinished(D.load_run(run)) == (1, 2) and D.unfinished(D.load_run(recorded_run)) is None
    exited = {1: {"trainer/exited_after_gradient_analysis": 1.0}}  # it ended where it was told to
    assert D.unfinished(_run(exited, config={"trainer": {"total_training_steps": 5}})) is None
    assert D.unfinished(_run({1: {}}, config={"trainer": {"total_training_steps": 5}}, kind="trl")) is None
