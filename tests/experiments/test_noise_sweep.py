"""scripts/experiments/noise_sweep_analysis.py (issue 45's critical-batch sweep) on synthetic extracts whose answer is
known by hand: steps S = S_min + E_min / N at every batch's best rate give back B_crit = E_min / S_min, and pooled
trace / signal give back B_simple."""

import json
import math

import pytest

from tests.conftest import REPO
from tests.helpers.scripts import load_script

S_MIN, E_MIN = 4.0, 256.0  # B_crit = 64
TRACE, SIGNAL = 640.0, 10.0  # every analysed step: B_simple = 64
SAMPLES = (16, 32, 64, 128)


def script():
    return load_script("scripts/experiments/noise_sweep_analysis.py")


def extract(samples: int, rollouts: int, lr: float, seed: int, steps: float) -> dict:
    """A run whose validation accuracy rises linearly from 0.4, gaining 0.1 every ``steps`` steps (so linear
    interpolation finds +0.1 at ``steps`` and +0.2 at 2·``steps`` exactly), every step analysed."""
    last = math.ceil(2 * steps) + 1
    return {"run": {"samples": samples, "rollouts": rollouts, "lr": lr, "seed": seed}, "max_steps": 60,
            "wall_s": 1.0, "end": "target", "val": [[s, 0.4 + 0.1 * s / steps] for s in range(last + 1)],
            "noise_fields": ["step", "trace", "signal", "trace_se", "signal_se", "cov", "groups"],
            "noise": [[s, TRACE, SIGNAL, 100.0, 1.0, 0.0, 4.0] for s in range(1, last + 1)]}


@pytest.fixture
def results(tmp_path):
    """At every N: a best rate (its lr differs with N) whose three seeds take S(N) steps to +0.1, a slower rate
    (1.5x, its median), and a rate that never gets there (its runs stop at step 2, 0.05 up)."""
    (tmp_path / "extracts").mkdir()
    for n in SAMPLES:
        best = S_MIN + E_MIN / n
        for seed in (1, 2, 3):
            runs = [extract(n, 8, 1e-4 * n / 16, seed, best), extract(n, 8, 5e-5, seed, 1.5 * best)]
            dead = extract(n, 8, 1e-2, seed, best)
            dead["val"] = [[0, 0.4], [1, 0.43], [2, 0.45]]
            for run in runs + [dead]:
                name = f"N{n}_lr{run['run']['lr']:g}_s{seed}.json"
                (tmp_path / "extracts" / name).write_text(json.dumps(run))
    return tmp_path


def test_steps_to_a_target_interpolate_between_the_validations_around_it():
    sweep = script()
    assert sweep.steps_to([[0, 0.40], [1, 0.45], [2, 0.55]], 0.10) == pytest.approx(1.5)
    assert sweep.steps_to([[0, 0.40], [1, 0.45], [2, 0.55]], 0.20) is None
    assert sweep.steps_to([[0, 0.40], [1, 0.38], [2, 0.50], [3, 0.62]], 0.20) == pytest.approx(2 + 0.1 / 0.12)


def test_the_fit_gives_back_s_min_e_min_and_b_crit_of_exact_data():
    sweep = script()
    points = [(n, S_MIN + E_MIN / n) for n in SAMPLES]
    assert sweep.fit(points) == pytest.approx((S_MIN, E_MIN))
    assert sweep.critical(points) == pytest.approx(64.0)
    assert sweep.critical([(16, 10.0), (128, 10.0)]) == 0.0  # steps that do not fall with N
    assert sweep.critical([(16, 8.0), (128, 1.0)]) == math.inf  # steps that fall as 1/N: S_min = 0


def test_the_analysis_of_exact_extracts_gives_b_crit_64_and_b_simple_64_at_both_targets(results, capsys):
    sweep = script()
    out = sweep.analyse(results, figure=None)
    for gain, scale in ((0.10, 1.0), (0.20, 2.0)):  # +0.2 takes twice the steps: S_min and E_min double
        f = out["fits"][gain]
        assert {n: p["lr"] for n, p in f["points"].items()} == {n: pytest.approx(1e-4 * n / 16) for n in SAMPLES}
        assert (f["s_min"], f["e_min"]) == (pytest.approx(scale * S_MIN), pytest.approx(scale * E_MIN))
        assert f["b_crit"] == pytest.approx(64.0)
        # identical seeds: every resample picks the same rates and gives the same fit
        assert (f["bootstrap"]["low"], f["bootstrap"]["high"]) == (pytest.approx(64.0), pytest.approx(64.0))
        assert f["leave_one_out"] == {n: pytest.approx(64.0) for n in SAMPLES}
        pooled = f["b_simple_pooled"]
        assert pooled["scale"] == pytest.approx(TRACE / SIGNAL)
        assert pooled["low"] < 64.0 < pooled["high"]
        # the steps pooled: those up to ceil(S) of each run at its N's best rate, 3 seeds
        assert pooled["steps"] == sum(3 * math.ceil(scale * (S_MIN + E_MIN / n)) for n in SAMPLES)
    assert json.loads((results / "analysis.json").read_text())["fits"]["0.2"]["b_crit"] == pytest.approx(64.0)
    assert "| 16 |" in capsys.readouterr().out


def test_the_bootstrap_re_picks_the_best_rate_so_its_choice_is_inside_the_interval(results):
    """One more rate at N = 128 whose seeds take 5, 7 and 9 steps (median 7 > the best rate's 6): a resample with
    two or three of its 5s (7 in 27) makes it the best and lowers S(128) to 5, which lowers S_min and raises E_min,
    so B_crit's interval reaches above 64; no resample lowers it."""
    sweep = script()
    for seed, steps in zip((1, 2, 3), (5.0, 7.0, 9.0)):
        (results / "extracts" / f"N128_lr3_s{seed}.json").write_text(json.dumps(extract(128, 8, 3e-3, seed, steps)))
    f = sweep.fit_table(sweep.load(results), 0.10, 8)
    assert f["b_crit"] == pytest.approx(64.0)  # the point fit keeps the rate with the lower median
    picks = f["bootstrap"]["picks"][128]
    assert sorted(picks) == [pytest.approx(8e-4), 3e-3] and sum(picks.values()) == sweep.DRAWS
    assert picks[3e-3] / sweep.DRAWS == pytest.approx(7 / 27, abs=0.03)
    lifted = sweep.critical([(n, S_MIN + E_MIN / n) for n in SAMPLES[:-1]] + [(128, 5.0)])
    assert lifted > 64.0 + 1
    assert f["bootstrap"]["low"] == pytest.approx(64.0) and f["bootstrap"]["high"] == pytest.approx(lifted)


def test_an_unresolved_b_simple_gets_fiellers_one_sided_bound_trace_over_the_signals_upper_end():
    """With no error in the trace and none shared, Fieller's set for trace / signal where the signal's interval
    reaches 0 is ρ >= trace / (signal + q·SE) (and ρ <= trace / (signal − q·SE) < 0): by hand, 100 / (1 + q)."""
    sweep = script()
    step = {"trace": 100.0, "signal": 1.0, "trace_se": 0.0, "signal_se": 1.0, "cov": 0.0, "groups": 31.0}
    q = 2.0423  # Student's t, 97.5%, 30 degrees of freedom (printed tables)
    assert sweep.pooled_scale([step])["low"] != sweep.pooled_scale([step])["low"]  # NaN: unresolved
    assert sweep.scale_floor([step]) == pytest.approx(100 / (1 + q), rel=1e-4)
    # two such steps pool: Σ trace / (Σ signal + q·sqrt(Σ SE²)), df 60
    assert sweep.scale_floor([step, step]) == pytest.approx(200 / (2 + 2.0003 * math.sqrt(2)), rel=1e-4)
    # a signal whose interval lies far below 0: the set holds small positive values too, so no bound
    assert math.isnan(sweep.scale_floor([dict(step, signal=-5.0)]))


def test_extra_seeds_add_steps_to_b_simple_but_stay_out_of_the_steps_and_the_fit(results):
    sweep = script()
    before = sweep.fit_table(sweep.load(results), 0.10, 8)
    fast = extract(128, 8, 8e-4, 11, 1.0)  # an extra seed at N = 128's best rate, far faster than its grid seeds
    fast["run"]["role"] = "noise"
    (results / "extracts" / "N128_lr0.0008_s11_noise.json").write_text(json.dumps(fast))
    after = sweep.fit_table(sweep.load(results), 0.10, 8)
    assert after["b_crit"] == pytest.approx(before["b_crit"]) and after["points"][128]["steps"] == 6.0
    assert after["points"][128]["extra_seeds"] == [1.0]
    assert after["b_simple"][128]["steps"] == before["b_simple"][128]["steps"] + 1  # step 1 (its ceil(S) = 1)


def test_the_pages_summaries_are_the_stored_analysis():
    """docs/noise_scale.md's fit summary and B_simple table are what bench/results/noise_sweep/analysis.json gives."""
    module = script()
    out = module.stored(REPO / "bench" / "results" / "noise_sweep")
    page = (REPO / "docs" / "noise_scale.md").read_text()
    assert module.fit_summary(out) in page
    assert module.b_simple_summary(out, module.TARGETS[-1]) in page


@pytest.mark.e2e  # re-analyses all 191 stored runs (~5 CPU-s): out of the suite's budget, in CI's e2e
def test_every_table_of_the_sweep_section_comes_out_of_the_stored_runs(tmp_path, capsys):
    import shutil

    module = script()
    results = tmp_path / "noise_sweep"
    shutil.copytree(REPO / "bench" / "results" / "noise_sweep", results)
    module.analyse(results, figure=None)
    printed = capsys.readouterr().out
    assert json.loads((results / "analysis.json").read_text()) == json.loads(
        (REPO / "bench" / "results" / "noise_sweep" / "analysis.json").read_text())
    page = (REPO / "docs" / "noise_scale.md").read_text()
    section = page[page.index("## The experiment: does B_simple predict"):]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows and all(line in printed for line in rows), [line for line in rows if line not in printed]
