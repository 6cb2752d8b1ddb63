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

from rlgrad.cli import main
from rlgrad.config import load_config
from rlgrad.rl.trainer import Trainer
from rlgrad.viz import data as D
from rlgrad.viz import figures as F
from rlgrad.viz.plot import step_figures
from rlgrad.viz.report import narrative

from .chromium import find_chromium, open_page
from .conftest import REPO, tiny_overrides

DATA = REPO / "tests" / "data"
SEED_FILES = ["summary", "plots", "loss_plots", "reward_std", "normed_grads"]
DPI = "40"


def _png_ok(data: bytes) -> np.ndarray:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(io.BytesIO(data), format="png")
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50
    assert float(img[..., :3].std()) > 0.01  # not blank
    return img


def _rows(run_dir):
    return {r["step"]: r["data"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="session")
def recorded_run(tmp_path_factory, model_cache):
    """A real tiny run: 2 steps, bucket analysis, component geometry and neuron health every step, KL and
    entropy on, some reward variance."""
    run = tmp_path_factory.mktemp("viz") / "tiny-run"
    ov = [o for o in tiny_overrides(model_cache, run) if not o.startswith("model.warmstart_steps")]
    ov += ["model.warmstart_steps=40", "trainer.total_training_steps=2", "trainer.gradient_analysis_every=1",
           "actor.use_kl_loss=true", "actor.entropy_coeff=0.01", "trainer.test_freq=1",
           "analysis.components_every=1", "actor.redo_metric_freq=1"]
    Trainer(load_config(overrides=ov), log=lambda *a: None).fit()
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
                       "share": {"correctness": 0.75, "format": 0.25}, "cosine": {"correctness__format": {1: -0.4, 2: 0.3}[step]}},
            "layers": {g: {"norm": {"correctness": 0.1 * i, "format": 0.05, "total": 0.12},
                           "cosine": {"correctness__format": 0.2 - 0.15 * i}} for i, g in enumerate(layers)}}))
        (d / "neurons.json").write_text(json.dumps({"step": step, "actor": {
            "tau": 0.1, "mode": "activation",
            "global": {"dormant_ratio": 0.05 * step, "act_dormant_ratio": 0.04, "zero_grad_ratio": 0.01,
                       "param_zero_grad_ratio": 0.0, "nullspace_ratio": 0.2, "reset_count": 0},
            "layers": {f"model.layers.{i}.{k}": {"kind": k, "neurons": 64, "dormant": 3 * step, "dormant_ratio": 3 * step / 64,
                                                 "act_dormant": 2, "zero_grad": 1, "reset": 0}
                       for i in range(2) for k in ("mlp", "attn")}}}))
        rows[step].update({"actor/neuron/dormant_ratio": 0.05 * step, "actor/neuron/zero_grad_ratio": 0.01,
                           "grad_sim/correctness__format": {1: -0.4, 2: 0.3}[step], "critic/vf_explained_var": 0.1 * step,
                           "critic/vf_loss": 1.0 / step})
    with open(run_dir / "reward_components.jsonl", "w") as f:
        for step, mean in ((1, 0.1), (2, 9.9), (2, 0.2)):  # a resumed run repeats a step: the last line wins
            f.write(json.dumps({"step": step, "components": comps + ["length"],
                                "weights": {"correctness": 0.5, "format": 0.3, "length": 0.2},
                                "stats": {c: {"mean": mean, "std": 0.05, "min": 0.0, "max": 1.0} for c in comps + ["length"]},
                                "total": {"mean": 0.2, "std": 0.1}, "num_correct": step, "num_valid_format": 8,
                                "mean_length": 3.0, "num_samples": 16, "samples": []}) + "\n")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in rows.items()))


def test_plot_draws_the_real_producers_files(recorded_run, tmp_path):
    """components.json / neurons.json as the trainer writes them (not the synthetic copies) are drawn."""
    for step in (1, 2):
        assert (recorded_run / "analysis" / f"step_{step}" / "components.json").exists()
        assert (recorded_run / "analysis" / f"step_{step}" / "neurons.json").exists()
    out = tmp_path / "plots"
    assert main(["plot", str(recorded_run), "--step", "2", "--output-dir", str(out), "--dpi", DPI]) == 0
    for name in ("components", "neurons"):
        png = out / f"gradient_analysis_{name}_step_2.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(png)
        assert img.std() > 0.01


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
        for name in SEED_FILES + ["layers", "components", "neurons"]:
            _png_ok((plotted / f"gradient_analysis_{name}_step_{step}.png").read_bytes())
        exported = json.loads((plotted / f"gradient_analysis_metrics_step_{step}.json").read_text())
        assert exported == {"_step": step, **rows[step]}  # the whole row, as the seed dumps its W&B row
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
    assert list(step_figures(run, 2)) == SEED_FILES + ["layers", "components", "neurons"]
    plain = tmp_path / "plain-run"  # the same run without its component / neuron files
    shutil.copytree(recorded_run, plain, ignore=shutil.ignore_patterns("global_step_*", "components.json",
                                                                       "neurons.json"))
    rows = _rows(plain)
    rows = {s: {k: v for k, v in d.items() if "/neuron/" not in k and not k.startswith(("grad_comp/", "grad_sim/"))
                and "zero_grad" not in k} for s, d in rows.items()}
    (plain / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in rows.items()))
    assert list(step_figures(D.load_run(plain), 2)) == SEED_FILES + ["layers"]


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
    (["plot-steps", "--step-dir", "5={tmp}", "--out", "{tmp}/x.png"], "gradient_analysis_metrics_step_5.json"),
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
    assert "trainer/note" in rec[1] and "val/accuracy" not in rec[1]  # two log calls at step 1 merged; None dropped
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
    for name in SEED_FILES:
        _png_ok((out / f"gradient_analysis_{name}_step_1.png").read_bytes())


def test_plot_steps_grid(plotted, tmp_path):
    one, two = tmp_path / "one.png", tmp_path / "two.png"
    assert main(["plot-steps", "--mode", "ppo", "--step-dir", f"1={plotted}", "--out", str(one), "--dpi", DPI]) == 0
    seed_dir = tmp_path / "step2"  # the seed's layout: DIR/metrics.json
    seed_dir.mkdir()
    shutil.copy(plotted / "gradient_analysis_metrics_step_2.json", seed_dir / "metrics.json")
    assert main(["plot-steps", "--mode", "grpo", "--step-dir", f"1={plotted}", f"2={seed_dir}",
                 "--out", str(two), "--dpi", DPI]) == 0
    h1, h2 = _png_ok(one.read_bytes()).shape[0], _png_ok(two.read_bytes()).shape[0]
    assert h2 > 1.5 * h1  # a row per step


def _step_view(metrics):
    return F.StepView(D.RunData(name="t", source="t", rows={1: metrics}), 1)


def _bucket_metrics(rv, task, kl=None, ent=None, all_=None):
    m = {}
    for i, (r, t) in enumerate(zip(rv, task), start=1):
        b = f"grad_norm/bucket_{i}"
        m.update({f"{b}/reward_std_mean": r, f"{b}/reward_std_min": r, f"{b}/reward_std_max": r, f"{b}/task": t,
                  f"{b}/sample_pct": 100 / len(rv), f"{b}/group_rv_count": 1.0})
        if kl is not None:
            m[f"{b}/kl"] = kl[i - 1]
        if ent is not None:
            m[f"{b}/entropy"] = ent[i - 1]
    if all_ is not None:
        m.update({f"grad_norm/all/{k}": v for k, v in all_.items()})
    return m


def test_regulariser_axis_follows_the_data_and_reward_std_goes_log():
    m = _bucket_metrics(rv=[0.001, 0.01, 0.1, 1.0], task=[0.0, 0.5, 1.0, 2.0], kl=[0.001, 0.002, 0.002, 0.003],
                        ent=[0.001, 0.001, 0.001, 0.001], all_={"task": 0.9, "reward_std_mean": 0.3})
    sv = _step_view(m)
    ax_a, ax_b, ax_c = F.fig_summary(sv).axes[:3]
    assert ax_c.get_ylim() == pytest.approx((0.0, 1.2 * 0.004))  # the seed fixed [0, 1]
    assert ax_c.get_xscale() == "log" and ax_b.get_xscale() == "log"  # RV spans three decades
    assert F.fig_reward_std(sv).axes[0].get_yscale() == "log"
    # the `all` bucket is drawn: as a point in (b) and as a bar in the norm plot
    assert any(line.get_label() == "all (whole batch)" for line in ax_b.get_lines())
    task_ax = F.fig_grad_norms(sv).axes[2]
    assert [t.get_text() for t in task_ax.get_xticklabels()][-1] == "all"
    lin = _step_view(_bucket_metrics(rv=[0.2, 0.3, 0.4], task=[1, 2, 3]))
    assert F.fig_reward_std(lin).axes[0].get_yscale() == "linear"


def test_narrative_rules_on_hand_made_numbers():
    m1 = _bucket_metrics(rv=[0.0, 0.2, 0.4], task=[0.0, 0.6, 0.3], kl=[0.02, 0.01, 0.01], ent=[0.01, 0.0, 0.0],
                         all_={"task": 0.25})
    m1["grad_norm/bucket_1/reward_std_max"] = 0.0
    m2 = _bucket_metrics(rv=[0.1, 0.2, 0.4], task=[0.1, 0.2, 0.5], kl=[0.01] * 3, ent=[0.0] * 3, all_={"task": 0.5})
    rows = {0: {"val/accuracy": 0.25}, 1: {**m1, "actor/neuron/dormant_ratio": 0.1},
            5: {**m2, "val/accuracy": 0.5, "actor/neuron/dormant_ratio": 0.2}}
    text = " ".join(narrative(D.RunData(name="t", source="t", rows=rows)))
    assert "Validation accuracy went from 25.0% (step 0) to 50.0% (step 5), +25.0 points." in text
    assert "At step 1 the task gradient is largest in bucket 2 (bucket 2 of 3, mean in-group reward std 0.2): " \
           "norm 0.6, against 0.25 for the whole batch." in text
    assert "At step 5 the task gradient is largest in bucket 3 (the highest-variance bucket" in text
    assert "moved to another bucket" in text and "from 0.25 to 0.5 (+100%)" in text
    assert "it grows with reward variance" in text
    assert "dormant-neuron ratio rose from 10.0% (step 1) to 20.0% (step 5)" in text
    # regularisers dominate only where the task gradient vanishes (step 1, bucket 1) -- checked on step 1 alone
    text1 = " ".join(narrative(D.RunData(name="t", source="t", rows={1: m1})))
    assert "exceeds the task gradient in bucket 1 — the low-variance half" in text1
    assert "1 of 3 buckets (33% of samples) hold only groups with zero reward std" in text1
    assert "peaks at bucket 2" in text1


def test_report_without_analysis_has_fewer_sections(tmp_path, capsys):
    run = tmp_path / "plain"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {
        "critic/score/mean": 0.1 * s, "actor/grad_norm": 1.0 / s, "actor/entropy": 2.0}}) + "\n" for s in (1, 2, 3)))
    assert main(["plot", str(run)]) == 2
    assert "no gradient-analysis steps" in capsys.readouterr().err
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
    assert "<summary>Step 2</summary>" in page and "<summary>Step 1</summary>" not in page  # --max-steps 1: the last
    for b64 in images:
        _png_ok(base64.b64decode(b64))
    rows = _rows(rich_run)
    acc = [rows[s]["val/accuracy"] for s in sorted(rows) if "val/accuracy" in rows[s]]
    assert f"Validation accuracy went from {100 * acc[0]:.1f}%" in page
    assert "correctness and format are weakly aligned (cosine +0.30)" in page  # step 2's components.json
    assert "correctness 0.1 → 0.2, format 0.1 → 0.2, length 0.1 → 0.2" in page  # the stale step-2 line is ignored
    assert "dormant-neuron ratio rose from 5.0% (step 1) to 10.0% (step 2)" in page


def test_report_renders_in_chromium_without_errors(rich_report, tmp_path):
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed and could not be installed here (scripts/setup.sh installs it "
                    "with apt-get when run as root)")
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
    assert cols == sorted(layers["all"]["task"], key=lambda g: (g != "embed", g == "final_norm", g))  # input -> output
    norms, share = norm_ax.images[0].get_array(), share_ax.images[0].get_array()
    for i, b in enumerate(rows):
        v = np.array([layers[b]["task"][g] for g in cols])
        sq = (v ** 2).sum()
        for j in range(len(cols)):
            if v[j] > 0:
                assert norms[i, j] == pytest.approx(v[j])
            else:
                assert np.ma.is_masked(norms[i, j])
            assert share[i, j] == pytest.approx(v[j] ** 2 / sq if sq > 0 else 0.0)
