"""The report explains itself: each section defines its terms (linked to the metric catalogue), draws each figure
once, and says in one sentence what an all-zero analysis would only show as empty panels. Synthetic run
directories (no training): the report reads files, so files are all it needs."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest

from rlgrad import metrics as M
from rlgrad import rundata as D
from rlgrad.viz import run_figures as RF
from rlgrad.viz.reading import narrative
from rlgrad.viz.report import build_report
from rlgrad.viz.terms import SECTION_TERMS, TERMS
from tests.helpers.chromium import chromium_or_skip, open_page


def _bucket_row(task: list[float], rv: list[float], kl: float | None = None) -> dict[str, float]:
    row: dict[str, float] = {"critic/score/mean": 0.5, "actor/grad_norm": 1.0}
    for i, (t, r) in enumerate(zip(task, rv), start=1):
        b = f"grad_norm/bucket_{i}"
        row.update({f"{b}/task": t, f"{b}/reward_std_mean": r, f"{b}/reward_std_min": r, f"{b}/reward_std_max": r,
                    f"{b}/sample_count": 8.0, f"{b}/sample_pct": 100 / len(task), f"{b}/group_rv_count": 2.0})
        if kl is not None:
            row[f"{b}/kl"] = kl
    row["grad_norm/all/task"] = float(np.sqrt(sum(t * t for t in task)))
    return row


def _neurons(step: int) -> dict:
    return {"step": step, "actor": {
        "tau": 0.1, "global": {"dormant_ratio": 0.05, "act_dormant_ratio": 0.04, "zero_grad_ratio": 0.01,
                               "nullspace_ratio": 0.2, "reset_count": 0},
        "layers": {f"model.layers.0.{k}": {"kind": k, "neurons": 64, "dormant_ratio": 0.05, "act_dormant": 2,
                                           "zero_grad": 1} for k in ("mlp", "attn")}}}


def _write_run(run_dir, rows: dict[int, dict], neurons: bool = True):
    run_dir.mkdir(parents=True)
    for step, row in rows.items():
        if neurons:
            row.update({"actor/neuron/dormant_ratio": 0.05, "actor/neuron/nullspace_ratio": 0.2})
            d = run_dir / "analysis" / f"step_{step}"
            d.mkdir(parents=True)
            (d / "neurons.json").write_text(json.dumps(_neurons(step)))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": r}) + "\n"
                                                   for s, r in rows.items()))
    return D.load_run(run_dir)


@pytest.fixture(scope="module")
def healthy_page(tmp_path_factory):
    rows = {1: _bucket_row([0.0, 0.4, 0.9], [0.0, 0.3, 0.5], kl=0.01),
            11: _bucket_row([0.0, 0.2, 0.5], [0.0, 0.2, 0.4], kl=0.01)}
    run = _write_run(tmp_path_factory.mktemp("report") / "run", rows)
    return build_report(run, dpi=40, max_steps=1)  # step 11's figures, the ones checked (both steps' took 10 s)


def test_every_term_of_a_section_is_defined_next_to_it_and_in_the_terms_section(healthy_page):
    page = html.unescape(healthy_page)
    for section in ("analysis", "neurons"):
        body = page[page.index(f'<section id="{section}">'):]
        body = body[:body.index("</section>")]
        for slug in SECTION_TERMS[section]:
            term = TERMS[slug]
            assert f'<a href="#term-{slug}"><b>{term.name}</b></a>: {term.definition}' in body
    terms = page[page.index('<section id="terms">'):]
    for slug in (*SECTION_TERMS["analysis"], *SECTION_TERMS["neurons"]):
        assert f'<dt id="term-{slug}">' in terms
    # the catalogue's own meaning of the key behind a term, and where the whole catalogue is
    dormant = M.match("actor/neuron/dormant_ratio")
    assert f"<code>{dormant.template}</code>: {dormant.meaning}" in terms
    assert "docs/metrics.md" in terms and "python -m rlgrad.metrics" in terms
    assert 'href="#terms"' in page  # in the navigation
    # the figures' own words are the ones defined
    for name in ("dormant (τ-score)", "activation-dormant", "gradient null space"):
        assert any(t.name == name for t in TERMS.values())


def test_terms_name_keys_the_catalogue_declares():
    for term in TERMS.values():
        assert term.metric is None or M.match(term.metric) is not None, term


def test_the_neuron_figure_of_a_step_is_drawn_once(healthy_page):
    alts = re.findall(r'<img alt="([^"]*)"', healthy_page)
    per_layer = [a for a in alts if a.startswith("step 11") and ("neurons" in a or "per layer" in a)]
    assert per_layer == ["step 11: neurons"]
    assert "Per layer at step 11: under" in healthy_page


def test_a_run_whose_every_bucket_gradient_is_zero_gets_a_sentence_not_panels(tmp_path):
    rows = {1: _bucket_row([0.0] * 3, [0.0] * 3), 11: _bucket_row([0.0] * 3, [0.0] * 3)}
    run = _write_run(tmp_path / "run", rows, neurons=False)
    page = build_report(run, dpi=40)
    assert "Every bucket's gradient is zero at every analysis step" in html.unescape(page)
    alts = re.findall(r'<img alt="([^"]*)"', page)
    assert not [a for a in alts if re.match(r"step \d+: (summary|plots|loss plots|reward std|normed grads|layers)", a)]
    assert not [a for a in alts if "paper-style grid" in a or "over the analysis steps" in a]
    assert "<table>" in page  # the bucket tables stay
    reading = narrative(run)
    assert not [s for s in reading if "largest" in s], reading
    assert "Between steps 1 and 11 the task gradient stayed zero in every bucket." in reading


def test_what_changed_says_nothing_of_the_largest_when_buckets_are_equal(tmp_path):
    run = _write_run(tmp_path / "run", {1: _bucket_row([0.3] * 3, [0.2] * 3),
                                        11: _bucket_row([0.0, 0.4, 0.9], [0.0, 0.3, 0.5])}, neurons=False)
    reading = narrative(run)
    assert "At step 1 every bucket's task gradient has the same norm, 0.3." in reading
    assert [s for s in reading if s.startswith("Between steps 1 and 11")] == [
        "Between steps 1 and 11 the whole-batch task gradient norm went from 0.52 to 0.985 (+90%)."]
    assert any("At step 11 the task gradient is largest in bucket 3" in s for s in reading)


def test_grid_panel_c_joins_zero_std_buckets_into_one_point():
    row = _bucket_row([0.0, 0.0, 0.0, 0.5], [0.0, 0.0, 0.0, 0.4])
    for i, kl in enumerate((0.01, 0.03, 0.02, 0.05), start=1):
        row[f"grad_norm/bucket_{i}/kl"] = kl
    fig = RF.fig_steps_grid([("Step 1", row)], "grpo")
    panel_c = fig.axes[2]
    line = next(ln for ln in panel_c.lines if ln.get_marker() == "o")
    assert list(line.get_xdata()) == [0.0, 0.4] and line.get_ydata() == pytest.approx([0.02, 0.05])
    assert line.get_linestyle() == "-"  # joined, not loose dots
    rng = [c for c in panel_c.collections if c.get_gid() == "shared_x_range"]
    assert len(rng) == 1 and np.allclose(rng[0].get_segments()[0], [[0.0, 0.01], [0.0, 0.03]])
    assert [t.get_text() for t in panel_c.texts] == ["×3"]


def test_a_bounded_reward_band_stays_in_its_range(tmp_path):
    _write_run(tmp_path / "run", {s: {"critic/score/mean": 0.1} for s in (1, 2, 3)}, neurons=False)
    with open(tmp_path / "run" / "reward_components.jsonl", "w") as f:
        for step, mean in ((1, 0.1), (2, 0.05), (3, 0.9)):  # a 0/1 reward: std 0.3 would reach -0.2 and 1.2
            f.write(json.dumps({"step": step, "components": ["correctness"], "weights": {"correctness": 1.0},
                                "stats": {"correctness": {"mean": mean, "std": 0.3, "min": 0.0, "max": 1.0}},
                                "num_samples": 16}) + "\n")
    ax = RF.fig_reward_components(D.load_run(tmp_path / "run")).axes[0]
    band = ax.collections[0].get_paths()[0].vertices
    assert band[:, 1].min() == pytest.approx(0.0) and band[:, 1].max() == pytest.approx(1.0)
    # metrics only (no samples' range): no band rather than one past the range
    only = D.RunData("r", "r", {s: {"reward/correctness/mean": 0.1, "reward/correctness/std": 0.3} for s in (1, 2)})
    ax = RF.fig_reward_components(only).axes[0]
    assert not ax.collections and "no band" in ax.get_title()


def test_the_page_with_its_terms_renders_in_chromium(healthy_page, tmp_path):
    chromium = chromium_or_skip()
    page = tmp_path / "report.html"
    page.write_text(healthy_page)
    assert open_page(chromium, page.as_uri(), tmp_path / "shot.png") == []


def test_a_zero_gradient_row_of_the_layer_shares_is_grey_n_a_never_0_percent(tmp_path):
    from rlgrad.viz import bucket_figures as B

    _write_run(tmp_path / "run", {1: _bucket_row([0.0, 0.5], [0.0, 0.4])}, neurons=False)
    d = tmp_path / "run" / "analysis" / "step_1"
    d.mkdir(parents=True)
    (d / "layers.json").write_text(json.dumps({"grad_norm": {
        "bucket_1": {"task": {"embed": 0.0, "layer_0": 0.0}},
        "bucket_2": {"task": {"embed": 0.3, "layer_0": 0.4}},
        "all": {"task": {"embed": 0.3, "layer_0": 0.4}}}}))
    fig = B.fig_layers(B.StepView(D.load_run(tmp_path / "run"), 1))
    share_ax = fig.axes[1]
    share = share_ax.images[0].get_array()
    assert np.ma.is_masked(share[0, 0]) and np.ma.is_masked(share[0, 1])  # bucket 1: no shares
    assert share[1].tolist() == pytest.approx([0.36, 0.64])
    bad = share_ax.images[0].cmap.get_bad()
    assert bad[3] == 1.0 and tuple(bad[:3]) != tuple(share_ax.images[0].cmap(0.0)[:3])  # grey, not the 0 colour
    texts = [t.get_text() for t in share_ax.texts]
    assert texts.count("n/a\n(zero gradient)") == 2 and "0%" not in texts
    assert "n/a (grey): bucket 1, zero gradient" in share_ax.get_title()


def test_a_missing_bar_value_is_labelled_n_a_not_0():
    """A bucket whose policy loss was not logged (NaN) is a bar labelled n/a; a logged 0 stays 0."""
    from rlgrad.viz import bucket_figures as B

    row = _bucket_row([0.0, 0.5], [0.0, 0.4])
    row.update({"grad_norm/bucket_1/loss/policy": 0.0, "grad_norm/bucket_2/per_sample/task": 0.1,
                "grad_norm/bucket_1/per_token/task": 0.01, "grad_norm/bucket_2/per_token/task": 0.02})
    sv = B.StepView(D.RunData("t", "t", {1: row}), 1)
    losses = B.fig_losses(sv).axes[0]
    assert [t.get_text() for t in losses.texts][:2] == ["0", "n/a"]  # bucket_2's loss/policy is missing
    normed = B.fig_normed(sv).axes[0]
    # missing: bucket_1 per sample, and both of the whole batch (row has only its task norm)
    assert [t.get_text() for t in normed.texts if t.get_text()] == ["n/a"] * 3
