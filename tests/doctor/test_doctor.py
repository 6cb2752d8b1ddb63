"""``rlgrad doctor``: each signature on runs with a known fault, and the readers of every run source.

Two kinds of runs: hand-made metric series (each signature fires on its fault and stays quiet on a clean
series, the numbers in the evidence computed by hand), and the recorded rlgrad runs with known faults in
``tests/data/doctor/`` (regenerate: ``.venv/bin/python scripts/generate/doctor_fixtures.py``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlgrad import rundata as D
from rlgrad import runfiles
from rlgrad.cli import main
from rlgrad.doctor import SIGNATURES, Thresholds, diagnose
from rlgrad.doctor.findings import README_END, README_START, SEVERITY, View, findings_table
from rlgrad.doctor.progress import _restart_from, held_checkpoints
from rlgrad.doctor.selftest import FAULTS
from rlgrad.errors import UserError
from rlgrad.viz.report import _diagnosis_section, build_report
from tests.conftest import run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "doctor"


def run_of(series: dict[str, list[float]], config: dict | None = None, nonfinite=None) -> D.RunData:
    n = max(len(v) for v in series.values())
    rows = {s + 1: {k: v[s] for k, v in series.items() if s < len(v)} for s in range(n)}
    return D.RunData(name="t", source="t", rows=rows, config=config, nonfinite=nonfinite or {})


def ids(run: D.RunData, t: Thresholds | None = None) -> dict[str, str]:
    return {f.id: f.severity for f in diagnose(run, t).findings}


def healthy_series(n: int = 40) -> dict[str, list[float]]:
    return {"actor/grad_norm": [0.3 + 0.01 * (i % 3) for i in range(n)],
            "critic/score/mean": [0.2 + 0.5 * i / n for i in range(n)],
            "actor/entropy": [1.5 - 0.005 * i for i in range(n)], "actor/pg_clipfrac": [0.15] * n,
            "actor/kl_loss": [0.001 * (1 + i / n) for i in range(n)], "response_length/mean": [20.0] * n,
            "response_length/clip_ratio": [0.01] * n, "actor/pg_loss": [0.01] * n}


def test_clean_run_is_healthy_and_explains_the_scale():
    d = diagnose(run_of(healthy_series(), {"actor": {"optim": {"lr": 1e-5}, "max_grad_norm": 1.0}}))
    assert [f.id for f in d.findings] == ["healthy"] and not d.critical
    assert "0.31" in d.scale and "not comparable" in d.scale  # the median gradient norm: 0.31


def test_the_healthy_line_never_denies_an_info_finding_above_it():
    """Issue 48: "None of the checked signatures fired" stood right under an INFO finding that fired."""
    alone = next(f for f in diagnose(run_of(healthy_series())).findings if f.id == "healthy")
    assert alone.explanation.startswith("None of the checked signatures fired.")
    d = diagnose(D.load_any(fixture("healthy")))
    assert [f.id for f in d.findings] == ["clipfrac_zero", "healthy"]
    assert d.findings[-1].explanation.startswith(
        "No checked signature fired as a warning or worse (an info finding is a note, not a fault).")


@pytest.mark.parametrize("fault,key,values,expect", [
    ("spike", "actor/grad_norm", [0.3] * 15 + [9.0] + [0.3] * 10, ("grad_norm_spike", "warn")),
    ("kl", "actor/kl_loss", [0.001] * 20 + [2.0] * 20, ("kl_blowup", "critical")),
    ("kl_growth", "actor/kl_loss", [0.001] * 20 + [0.3] * 20, ("kl_blowup", "warn")),
    ("entropy", "actor/entropy", [1.5] * 10 + [0.05] * 30, ("entropy_collapse", "warn")),
    ("clip", "actor/pg_clipfrac", [0.6] * 40, ("clipfrac_saturated", "warn")),
    ("length", "response_length/clip_ratio", [0.0] * 20 + [0.6] * 20, ("length_runaway", "warn")),
    ("short", "response_length/mean", [40.0] * 20 + [5.0] * 20, ("length_collapse", "warn")),
    ("collapse", "critic/score/mean", [0.7] * 10 + [0.1] * 30, ("reward_collapse", "critical")),
])
def test_each_scalar_signature_fires_on_its_fault(fault, key, values, expect):
    s = healthy_series()
    s[key] = values
    got = ids(run_of(s))
    assert got.get(expect[0]) == expect[1], got
    assert "healthy" not in got


def test_spike_followed_by_collapse_is_critical():
    s = healthy_series()
    s["actor/grad_norm"] = [0.3] * 20 + [30.0] + [0.3] * 19
    s["critic/score/mean"] = [0.6] * 21 + [0.1] * 19
    d = diagnose(run_of(s))
    f = next(f for f in d.findings if f.id == "grad_norm_spike")
    assert (f.severity, f.step) == ("critical", 21) and d.findings[0] is f  # most serious first
    assert "grad_norm 30 against a median of 0.3" in f.evidence[0]


def test_clipping_every_step_gives_the_effective_learning_rate_under_sgd():
    s = healthy_series()
    s["actor/grad_norm"] = [0.05] * 40
    d = diagnose(run_of(s, {"actor": {"optim": {"lr": 1e-5, "optimizer": "SGD"}, "max_grad_norm": 0.01}}))
    f = next(f for f in d.findings if f.id == "clip_every_step")
    assert "factor of about 0.2" in f.explanation and "lr × 0.2 = 2e-06" in f.explanation  # 0.01/0.05
    # verl's spelling of the clip is read too
    assert "clip_every_step" in ids(run_of(s, {"actor_rollout_ref": {"actor": {"grad_clip": 0.01}}}))


def test_small_learning_rate_needs_a_flat_reward_unless_tiny():
    s = healthy_series()
    assert "lr_too_small" not in ids(run_of(s, {"actor": {"optim": {"lr": 1e-6}}}))  # the reward rises
    s["critic/score/mean"] = [0.3] * 40
    assert ids(run_of(s, {"actor": {"optim": {"lr": 1e-6}}}))["lr_too_small"] == "warn"
    assert "lr_too_small" in ids(run_of(healthy_series(), {"actor": {"optim": {"lr": 1e-8}}}))


def test_nonfinite_and_zero_advantages_are_critical():
    s = healthy_series()
    got = ids(run_of(s, nonfinite={12: ["actor/grad_norm"]}))
    assert got["nonfinite_steps"] == "critical"
    only_nan = run_of({"critic/score/mean": [0.1] * 5}, nonfinite={s: ["actor/grad_norm"] for s in range(1, 6)})
    assert ids(only_nan)["nonfinite_steps"] == "critical"  # a metric logged only as NaN is still seen
    s["critic/advantages/max"] = [0.0] * 40
    s["critic/advantages/min"] = [0.0] * 40
    assert ids(run_of(s))["zero_variance_groups"] == "critical"
    s = healthy_series()
    s["rollout/filter_zero_count"] = [13.0] * 40
    assert ids(run_of(s, {"data": {"train_batch_size": 16}}))["zero_variance_groups"] == "warn"  # 81% > 75%
    s["rollout/filter_zero_count"] = [9.0] * 40  # 56%: common in a run that learns (groups all right)
    assert "zero_variance_groups" not in ids(run_of(s, {"data": {"train_batch_size": 16}}))


def test_format_rising_while_correctness_does_not():
    s = healthy_series()
    s["reward/correctness/mean"] = [0.3] * 40
    s["reward/format/mean"] = [0.2 + 0.02 * i for i in range(40)]
    assert ids(run_of(s))["format_over_correct"] == "warn"
    s["reward/correctness/mean"] = [0.3 + 0.01 * i for i in range(40)]  # both rise: fine
    assert "format_over_correct" not in ids(run_of(s))


def test_validation_falling_while_training_reward_rises():
    s = healthy_series()
    s["val/accuracy"] = [0.5, 0.6, 0.7, 0.6, 0.55]
    assert ids(run_of(s))["val_falls_train_rises"] == "warn"


def test_std_normalisation_signature():
    """Advantages larger than the reward range can only come from dividing by a small group std."""
    cfg = {"algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True}}
    s = healthy_series()
    s.update({"critic/score/max": [1.0] * 40, "critic/score/min": [0.0] * 40, "critic/advantages/max": [2.47] * 40})
    run = run_of(s, cfg)
    for b, per, std in (("bucket_1", 0.3, 0.35), ("bucket_2", 0.1, 0.5)):
        run.rows[11].update({f"grad_norm/{b}/task": per, f"grad_norm/{b}/per_sample/task": per,
                             f"grad_norm/{b}/reward_std_mean": std})
    f = next(f for f in diagnose(run).findings if f.id == "std_normalisation_amplifies")
    assert "2.47 against a reward range of 1" in f.evidence[0] and "0.3 in bucket_1" in f.evidence[1]
    s["critic/advantages/max"] = [0.875] * 40  # 7 of 8 wrong, no division: (1 - 1/8)
    assert "std_normalisation_amplifies" not in ids(run_of(s, cfg))
    s["critic/advantages/max"] = [2.47] * 40
    cfg["algorithm"]["norm_adv_by_std_in_grpo"] = False
    assert "std_normalisation_amplifies" not in ids(run_of(s, cfg))


def test_gradient_level_signatures():
    run = run_of(healthy_series(), {"actor": {"kl_loss_coef": 0.5}})
    for s in (1, 11, 21):
        run.rows[s].update({"grad_norm/all/task": 0.1, "grad_norm/all/kl": 0.4, "grad_comp/correctness/share": 0.2,
                            "grad_comp/format/share": 0.8, "grad_sim/correctness__format": -0.3,
                            "actor/neuron/dormant_ratio": 0.02 + 0.1 * (s // 10)})
    got = ids(run)
    assert got["regularizer_dominates"] == "warn" and got["component_takes_over"] == "warn"
    assert got["component_dominates"] == "warn" and got["dormant_growing"] == "warn"


def test_missing_metrics_are_listed_not_guessed():
    d = diagnose(run_of({"critic/score/mean": [0.1] * 30}))
    assert "kl_blowup" in d.missing and "actor/kl_loss" in d.missing["kl_blowup"]
    assert not any(f.id == "kl_blowup" for f in d.findings)
    assert len(d.missing) < len(SIGNATURES)


def test_thresholds_file(tmp_path):
    s = healthy_series()
    s["actor/pg_clipfrac"] = [0.3] * 40
    f = tmp_path / "t.yaml"
    f.write_text("clipfrac_high: 0.25\nwindow: 5\n")
    t = Thresholds.from_file(f)
    assert (t.clipfrac_high, t.window) == (0.25, 5) and isinstance(t.window, int)
    assert "clipfrac_saturated" in ids(run_of(s), t) and "clipfrac_saturated" not in ids(run_of(s))
    for text, msg in [("nope: 1\n", "unknown threshold 'nope'"), ("window: -1\n", "non-negative"),
                      ("kl_high: abc\n", "must be a non-negative number"), ("- 1\n", "mapping")]:
        f.write_text(text)
        with pytest.raises(UserError, match=msg):
            Thresholds.from_file(f)


# ---------------------------------------------------------------- sources


def test_trl_output_directory(tmp_path):
    state = {"log_history": [{"step": i, "reward": 0.1, "grad_norm": 0.2, "learning_rate": 1e-8, "entropy": 2.0,
                              "rewards/shorter/mean": -0.5, "clip_ratio/region_mean": 0.0, "loss": 0.0}
                             for i in range(1, 31)] + [{"step": 30, "train_runtime": 10.0}]}
    (tmp_path / "checkpoint-30").mkdir()
    (tmp_path / "checkpoint-30" / "trainer_state.json").write_text(json.dumps(state))
    run = D.load_any(tmp_path)
    assert run.kind == "trl" and run.rows[3]["actor/lr"] == 1e-8 and run.rows[3]["reward/shorter/mean"] == -0.5
    assert run.rows[3]["critic/score/mean"] == 0.1 and "loss" not in run.rows[3]
    assert "lr_too_small" in ids(run)


def test_verl_file_logger_jsonl(tmp_path):
    """verl's FileLogger lines ({"step", "data"}, orjson: NaN written as null), its validation names, and the
    Hydra config saved next to the log."""
    lines = []
    for s in range(1, 31):
        data = {"actor/grad_norm": 0.3, "actor/kl_loss": 0.001 if s < 15 else 3.0, "critic/score/mean": 0.5,
                "actor/pg_clipfrac": 0.1, "val-core/openai/gsm8k/acc/mean@1": 0.4, "timing_s/gen": 1.0}
        if s == 20:
            data["actor/pg_loss"] = None
        lines.append(json.dumps({"step": s, "data": data}))
    log = tmp_path / "exp.jsonl"
    log.write_text("\n".join(lines) + "\n")
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("actor_rollout_ref:\n  actor:\n    grad_clip: 0.1\n"
                                                     "    optim:\n      lr: 1.0e-6\n")
    run = D.load_any(log)
    assert run.kind == "verl" and run.rows[2]["val/accuracy"] == 0.4 and run.nonfinite == {20: ["actor/pg_loss"]}
    got = ids(run)
    assert got["kl_blowup"] == "critical" and got["nonfinite_steps"] == "critical"
    assert got["clip_every_step"] == "info"  # verl's default optimizer: AdamW


def test_wandb_history_rows():
    rows = [{"_step": s, "_runtime": 1.0, "actor/entropy": 2.0 if s < 10 else 0.01, "critic/score/mean": 0.2,
             "actor/grad_norm": float("nan") if s == 3 else 0.2} for s in range(1, 41)]
    run = D.RunData(name="w", source="e/p/r", rows=D.records_from_wandb_rows(rows), kind="wandb")
    assert ids(run)["entropy_collapse"] == "warn"


def test_recorded_wandb_history():
    rows = json.loads(fixture("wandb_kl_explodes.json").read_text())
    assert any(v is None for r in rows for v in r.values())  # W&B's shape: None where a key was not logged
    run = D.RunData(name="w", source="e/p/r", rows=D.records_from_wandb_rows(rows), kind="wandb")
    assert ids(run)["kl_blowup"] == "critical"


def test_bad_inputs_one_line_exit_2(tmp_path, capsys):
    # in process (cli.main, what `python -m rlgrad` calls: any exception but the one-line error fails the test);
    # test_recorded_healthy_demo_and_the_cli launches `rlgrad doctor` as a process of its own
    for args, msg in [([str(tmp_path / "nope")], "does not exist"), ([str(tmp_path)], "is not a run"),
                      ([], "name a run")]:
        capsys.readouterr()
        assert main(["doctor", *args]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.startswith("rlgrad: error:") and err.count("\n") == 1, err
    bad = tmp_path / "x.jsonl"
    bad.write_text("not json\n")
    assert main(["doctor", str(bad)]) == 2
    assert "holds no metric lines" in capsys.readouterr().err


# ---------------------------------------------------------------- the recorded runs with known faults


def fixture(name: str) -> Path:
    p = FIXTURES / name
    if not p.exists():
        pytest.fail(f"missing fixture {p}: .venv/bin/python scripts/generate/doctor_fixtures.py {name}")
    return p


@pytest.mark.parametrize("name", sorted(n for n in FAULTS if not n.endswith(".json")))
def test_recorded_fault_is_diagnosed(name):
    """The selftest's matrix (rlgrad.doctor.selftest.FAULTS): each recorded fault gives its finding, at least as
    serious as the matrix says."""
    fid, least = FAULTS[name]
    d = diagnose(D.load_any(fixture(name)))
    assert any(f.id == fid and SEVERITY[f.severity] <= SEVERITY[least] for f in d.findings), \
        [(f.id, f.severity) for f in d.findings]


def test_recorded_healthy_demo_and_the_cli(tmp_path, capsys):
    run = fixture("healthy")
    d = diagnose(D.load_any(run))
    assert not [f for f in d.findings if f.severity in ("warn", "critical")], [(f.id, f.evidence) for f in d.findings]
    assert any(f.id == "healthy" for f in d.findings)
    res = run_cli(["doctor", str(run), "--json"])
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["critical"] is False and out["findings"][0]["id"] in {f.id for f in d.findings}
    capsys.readouterr()  # the second run in process: the real entry point is checked just above
    assert main(["doctor", str(fixture("zero_variance")), "--explain"]) == 1
    assert "[CRITICAL] zero_variance_groups" in capsys.readouterr().out
    page = build_report(D.load_run(fixture("zero_variance")), dpi=30, max_steps=1)
    assert page.index('id="diagnosis"') < page.index('id="reading"') and "finding critical" in page
    # a critical finding shown whole; an info finding folded to its line (the first screen goes to what matters)
    d = diagnose(D.load_any(fixture("zero_variance")))
    crit = next(f for f in d.findings if f.severity == "critical")
    assert f'<div class="finding critical"><b>CRITICAL</b> · {crit.title}' in page
    assert "<i>What to do:</i>" in page.split('<div class="finding critical">')[1].split("</div>")[0]
    # the healthy run's diagnosis section alone: where it sits on the page is checked on zero_variance's above,
    # and a whole page of the healthy run's figures took 9 s
    healthy = _diagnosis_section(D.load_run(run))
    assert '<details class="finding info"><summary><b>INFO</b> · No sign of trouble' in healthy
    assert '<div class="finding info">' not in healthy


def test_a_trl_run_quotes_trls_names_and_its_reward_names():
    """A run of rlgrad's TRL integration (kind trl): the evidence names TRL's metrics, and a reward component by the
    name TRL gave it, not its escaped key."""
    s = healthy_series()
    s["actor/entropy"] = [2.0] * 5 + [0.01] * 35
    s["reward/correct_answer/mean"] = [0.3] * 40
    s["reward/fmt_v2/mean"] = [0.2 + 0.02 * i for i in range(40)]
    for kind, labels in (("rlgrad", {}), ("trl", {"correct_answer": "correct-answer", "fmt_v2": "fmt.v2"})):
        run = run_of(s)
        run.kind, run.labels = kind, labels
        found = {f.id: f for f in diagnose(run).findings}
        entropy, fmt_ = found["entropy_collapse"].evidence[0], found["format_over_correct"]
        if kind == "trl":
            assert entropy.startswith("entropy ") and "actor/entropy" not in entropy
            assert fmt_.evidence[0].startswith("rewards/fmt.v2/mean ") and "'fmt.v2' reward rises" in fmt_.title
            assert fmt_.evidence[1].startswith("rewards/correct-answer/mean ")
        else:
            assert entropy.startswith("actor/entropy ") and fmt_.evidence[0].startswith("reward/fmt_v2/mean ")


def test_finding_ids_are_the_registered_signature_ids_and_the_readme_table_is_generated_from_them():
    registered = [sid for sid, _, _ in SIGNATURES]
    assert len(registered) == len(set(registered))
    seen = set()
    for run in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
        seen |= {f.id for f in diagnose(D.load_any(str(run))).findings}
    assert seen and seen <= set(registered) | {"healthy"}, seen - set(registered)
    readme = (Path(__file__).resolve().parents[2] / "docs" / "doctor.md").read_text()
    table = readme.split(README_START)[1].split(README_END)[0]
    assert table == "\n" + findings_table() + "\n", "docs/doctor.md's findings table is stale: " \
                                                     "python scripts/generate/doctor_table.py"
    named = re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.M)
    assert named == registered  # one row per registered id, in registration order
    assert "{" not in table  # every threshold placeholder filled in


# ---------------------------------------------------------------- issue 37: hand-made series


def test_a_fast_collapse_is_measured_against_the_first_step_not_a_smoothed_peak():
    """The issue's run: 0.74 at step 1, then 0.22, 0.23, 0.10, ... A smoothed peak (0.39) against the range (0.65)
    missed it; against the first step (the policy before any update) it is a 75% fall at 3.4× the noise."""
    s = healthy_series(10)
    s["critic/score/mean"] = [0.725, 0.22, 0.231, 0.098, 0.2, 0.128, 0.163, 0.098, 0.099, 0.094]
    for n, expect in ((3, None), (4, 2), (10, 2)):  # 3 steps of the fall needed; then stable
        run = run_of({k: v[:n] for k, v in s.items()})
        f = next((f for f in diagnose(run).findings if f.id == "reward_collapse"), None)
        assert (f.step if f else None) == expect, (n, f)
    f = next(f for f in diagnose(run_of(s)).findings if f.id == "reward_collapse")
    assert f.severity == "critical" and "0.725 at step 1 (the policy before any update) → 0.183 over steps 2-4" in \
        f.evidence[0]
    # validation before training and after the fall: held, it is a warning; fallen, critical
    for acc, severity in ((0.45, "warn"), (0.1, "critical")):
        run = run_of(s)
        run.rows = {0: {"val/accuracy": 0.5}, **run.rows}
        for step in (2, 4, 6):
            run.rows[step]["val/accuracy"] = acc
        assert ids(run)["reward_collapse"] == severity


@pytest.mark.parametrize("rewards", [
    [0.2, 0.1, 0.25, 0.05, 0.08, 0.06, 0.3, 0.15, 0.1, 0.2, 0.12, 0.25],  # a weak model's noisy start
    [0.73, 0.73, 0.72, 0.63, 0.73, 0.79, 0.59, 0.64, 0.58, 0.56, 0.65, 0.61, 0.49, 0.35, 0.81, 0.49],  # lr 1e-8
    [-0.5, -0.6, -0.4, -0.55, -0.5, -0.45, -0.6],  # a penalty-shaped reward that does not move
])
def test_no_collapse_in_noise(rewards):
    s = {"critic/score/mean": rewards}
    for n in range(1, len(rewards) + 1):
        assert "reward_collapse" not in ids(run_of({"critic/score/mean": rewards[:n]})), n
    assert "reward_collapse" not in ids(run_of(s))


def test_learning_rate_findings_read_the_measured_update_size_first():
    s = healthy_series(30)
    s["actor/update_ratio"] = [5e-4] * 30
    # a tiny configured learning rate with normal measured updates and a rising reward: no finding (the absolute
    # learning rate is the last resort, for runs that log no update size)
    assert "lr_too_small" not in ids(run_of(s, {"actor": {"optim": {"lr": 1e-8}}}))
    s["actor/update_ratio"] = [7e-5] * 30
    assert "lr_too_small" not in ids(run_of(s))  # small updates, but the reward rises: it learns
    s["critic/score/mean"] = [0.6, 0.62] * 15
    f = next(f for f in diagnose(run_of(s, {"actor": {"optim": {"lr": 1e-5}}})).findings if f.id == "lr_too_small")
    assert "actor/update_ratio 7e-05" in f.evidence[0] and "lr 1e-05" in f.evidence and "about 10-fold" in f.action
    s["actor/update_ratio"] = [0.03] * 30
    got = ids(run_of(s))
    assert got["update_too_large"] == "warn" and "lr_too_small" not in got


def test_chronic_truncation_is_one_stable_finding():
    """75-100% of responses cut at every step: length_truncated from the 3rd step on, always from step 1; the
    rising-share finding (length_runaway) never fires on it."""
    s = healthy_series(30)
    s["response_length/clip_ratio"] = [0.81, 1.0, 0.75, 0.94, 0.75, 1.0, 0.88, 0.75, 0.81, 1.0] * 3
    for n in range(1, 31):
        got = {f.id: f for f in diagnose(run_of({k: v[:n] for k, v in s.items()})).findings}
        assert "length_runaway" not in got
        assert (got["length_truncated"].step if "length_truncated" in got else None) == (1 if n >= 3 else None), n
    s["response_length/clip_ratio"] = [0.0] * 15 + [0.6] * 15  # rising into the limit: both, the rise first
    d = diagnose(run_of(s))
    assert [f.id for f in d.findings[:2]] == ["length_runaway", "length_truncated"]
    assert d.findings[1].cause == "length_runaway"


def test_an_entropy_penalty_is_named_as_the_cause_and_never_called_a_push_toward_randomness():
    s = healthy_series(20)
    s["critic/score/mean"] = [0.21, 0.18, 0.19, 0.18, 0.13, 0.1, 0.08, 0.07, 0.07, 0.06] + [0.06] * 10
    s["actor/entropy"] = [1.4, 1.3, 1.2, 1.0, 0.7, 0.4, 0.2, 0.1] + [0.05] * 12
    s["actor/update_ratio"] = [0.012] * 20  # the learning rate is high too
    run = run_of(s, {"actor": {"entropy_coeff": -0.5, "optim": {"lr": 5e-4}}})
    for step in (1, 5, 9, 13, 17):
        run.rows[step].update({"grad_norm/all/task": 0.1, "grad_norm/all/entropy": 0.5})
    d = diagnose(run)
    first = d.findings[0]
    assert first.id == "regularizer_dominates" and first.severity == "critical", [f.id for f in d.findings]
    assert "penalty" in first.title and "toward determinism" in first.explanation
    assert "randomness" not in first.explanation + first.action and "Lower" not in first.action
    assert "entropy_coeff to 0" in first.action
    causes = {f.id: f.cause for f in d.findings}
    assert causes["reward_collapse"] == causes["entropy_collapse"] == "regularizer_dominates"
    assert causes["update_too_large"] == "regularizer_dominates"
    collapse = next(f for f in d.findings if f.id == "reward_collapse")
    assert collapse.action.startswith("Act on regularizer_dominates first")
    # a positive coefficient is a bonus: toward randomness, lower it
    run.config = {"actor": {"entropy_coeff": 0.5}}
    f = next(f for f in diagnose(run).findings if f.id == "regularizer_dominates")
    assert "randomness" in f.explanation and f.action.startswith("Lower entropy_coeff")


def test_a_negative_weight_on_correctness_is_the_first_finding():
    s = healthy_series(20)
    s["reward/correctness/mean"] = [0.7 - 0.03 * i for i in range(20)]
    s["reward/format/mean"] = [0.5 + 0.02 * i for i in range(20)]
    s["val/accuracy"] = [0.5, 0.6, 0.4, 0.2, 0.1]
    d = diagnose(run_of(s, {"reward": {"weights": {"correctness": -0.9, "format": 0.1}}}))
    assert d.findings[0].id == "inverted_reward" and d.findings[0].severity == "critical"
    assert "reward.weights.correctness = -0.9" in d.findings[0].evidence
    assert {f.id: f.cause for f in d.findings}["format_over_correct"] == "inverted_reward"
    assert "inverted_reward" not in ids(run_of(s, {"reward": {"weights": {"correctness": 0.9, "format": 0.1}}}))


def test_no_checkpoint_of_step_0():
    """Step 0 is the validation before training: the initial weights, no checkpoint; a trained step is named as
    kept only where the run saved it."""
    s = healthy_series(10)
    run = run_of(s, {"trainer": {"save_freq": -1}})
    run.rows = {0: {"val/accuracy": 0.6}, **run.rows}
    for step, acc in ((2, 0.5), (4, 0.45), (6, 0.4)):
        run.rows[step]["val/accuracy"] = acc
    f = next(f for f in diagnose(run).findings if f.id == "val_falls_train_rises")
    assert "checkpoint of step 0" not in f.action and "keep the initial model" in f.action
    assert "before training (step 0: the initial weights)" in f.evidence[0]
    run.rows[4]["val/accuracy"] = 0.8
    f = next(f for f in diagnose(run).findings if f.id == "val_falls_train_rises")
    assert f.action.startswith("No checkpoint holds step 4 (trainer.save_freq=-1)")
    run.config = {"trainer": {"save_freq": 2}}
    assert next(f for f in diagnose(run).findings if f.id == "val_falls_train_rises").action.startswith(
        "Keep the checkpoint of step 4 (global_step_4)")



def test_checkpoint_advice_names_only_checkpoints_on_disk(tmp_path):
    """trainer.max_ckpt_to_keep deletes the oldest checkpoints: the doctor never offers one that is gone. The run
    saved global_step_2, 4, ..., 10 (save_freq 2) and kept the newest two; its best validation step is 2."""
    s = healthy_series(10)
    run = run_of(s, {"trainer": {"save_freq": 2, "max_ckpt_to_keep": 2}})
    for step, acc in ((2, 0.8), (4, 0.6), (6, 0.5), (8, 0.4), (10, 0.3)):
        run.rows[step]["val/accuracy"] = acc
    run.run_dir = tmp_path
    for step in (8, 10):
        (runfiles.checkpoint_dir(tmp_path, step)).mkdir()
        (runfiles.checkpoint_dir(tmp_path, step) / runfiles.CHECKPOINT_COMPLETE).write_text(f"{step}\n")
    assert held_checkpoints(View(run)) == [8, 10]
    f = next(f for f in diagnose(run).findings if f.id == "val_falls_train_rises")
    assert f.action.startswith("No checkpoint holds step 2 any more (trainer.max_ckpt_to_keep=2 keeps the newest): "
                               "rerun to step 2 to keep it, with a larger trainer.max_ckpt_to_keep")
    assert "global_step_" not in f.action
    run.run_dir = None  # no directory to look in (a W&B run): the schedule and the retention say the same
    assert held_checkpoints(View(run)) == [8, 10]
    assert next(f for f in diagnose(run).findings if f.id == "val_falls_train_rises").action == f.action
    run.run_dir = tmp_path  # the checkpoint on disk is offered, whatever the settings say
    (runfiles.checkpoint_dir(tmp_path, 2)).mkdir()
    (runfiles.checkpoint_dir(tmp_path, 2) / runfiles.CHECKPOINT_COMPLETE).write_text("2\n")
    assert next(f for f in diagnose(run).findings if f.id == "val_falls_train_rises").action.startswith(
        "Keep the checkpoint of step 2 (global_step_2)")
    # where to restart from before step 9: the newest checkpoint on disk before it, never the deleted global_step_6
    assert _restart_from(View(run), 9) == "resume from the last checkpoint before step 9 (global_step_8)"
    assert _restart_from(View(run), 8) == "resume from the last checkpoint before step 8 (global_step_2)"
    run.run_dir = tmp_path / "empty"
    assert _restart_from(View(run), 8) == "restart from the initial weights (the run holds no checkpoint before step 8)"


def test_shares_outside_0_1_are_signed_contributions():
    assert D.share_words(0.45) == "45% of the update" and D.share_label(0.45) == "45%"
    assert D.share_label(1.09) == "signed +1.09" and D.share_label(-0.088) == "signed -0.088"
    run = run_of(healthy_series())
    for s in (1, 11, 21):
        run.rows[s].update({"grad_comp/format/share": 1.09, "grad_comp/correctness/share": -0.088})
    f = next(f for f in diagnose(run).findings if f.id == "component_dominates")
    text = " ".join(f.evidence)
    assert "109%" not in text and "-8.8%" not in text and "-9%" not in text
    assert "a signed contribution of +1.09" in text and "a signed contribution of -0.088" in text


@pytest.mark.parametrize("level,words", [(1.0, "too easy"), (0.0, "too hard"), (0.5, "always right or always wrong")])
def test_trl_zero_variance_from_its_own_fraction(tmp_path, level, words):
    """A TRL run whose groups all agree (frac_reward_zero_std 1): zero_variance_groups, critical, says too easy or
    too hard from the reward's level; the KL term's gradient against a task gradient that does not exist is no
    finding (issue 46's held-out set 2: it was one, filed under zero_variance_groups)."""
    state = {"log_history": [{"step": i, "reward": level, "frac_reward_zero_std": 1.0, "grad_norm": 0.01,
                              "learning_rate": 1e-6, "kl": 0.001} for i in range(1, 21)]}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    run = D.load_any(tmp_path)
    assert "zero_variance_groups" not in diagnose(run).missing
    f = next(f for f in diagnose(run).findings if f.id == "zero_variance_groups")
    assert f.severity == "critical" and words in f.explanation and f.evidence[0].startswith("100% of the prompt")
    assert "frac_reward_zero_std" in f.evidence[0]
    for s in (1, 11):  # rlgrad's TRL integration adds the bucket analysis: a KL gradient, no task gradient
        run.rows[s].update({"grad_norm/all/task": 0.0, "grad_norm/all/kl": 0.01})
    d = diagnose(run)
    assert d.findings[0].id == "zero_variance_groups"
    assert "regularizer_dominates" not in {f.id for f in d.findings}
    state["log_history"] = [{"step": i, "reward": level, "grad_norm": 0.01} for i in range(1, 21)]
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    assert "zero_variance_groups" in diagnose(D.load_any(tmp_path)).missing  # listed as not checked


def test_a_default_kept_against_advice_says_so_and_explain_says_why_and_what_logs_a_missing_metric(capsys):
    """algorithm.norm_adv_by_std_in_grpo=true is verl's and TRL's default, kept by rlgrad: the finding still warns
    and names it as the kept default; --explain gives the reason (doctor/settings.py) and, for each unchecked
    signature, the setting that would log its metrics."""
    from rlgrad.doctor import render_text
    from rlgrad.doctor.settings import KEPT_DEFAULTS, producing_settings

    s = healthy_series()
    s.update({"critic/score/max": [1.0] * 40, "critic/score/min": [0.0] * 40, "critic/advantages/max": [2.47] * 40})
    cfg = {"algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True}}
    # issue 48: a run that only uses the default (its reward rises, no bucket analysis) gets a note, not a warning
    note = next(f for f in diagnose(run_of(s, cfg)).findings if f.id == "std_normalisation_amplifies")
    assert note.severity == "info" and note.evidence[-2].startswith(
        "algorithm.norm_adv_by_std_in_grpo=true is rlgrad's default, kept against this advice")
    assert note.evidence[-1] == (
        "this run measured no harm from it (the lowest-variance bucket's per-sample task gradient above the highest's "
        "while the reward stalls: not seen), so this is a note, not a warning")
    # the harm measured: the reward stalls and the lowest-variance bucket's per-sample gradient outweighs the others'
    s["critic/score/mean"] = [0.5] * 40
    run = run_of(s, cfg)
    for b, per, std in (("bucket_1", 0.3, 0.35), ("bucket_2", 0.1, 0.5)):
        run.rows[11].update({f"grad_norm/{b}/task": per, f"grad_norm/{b}/per_sample/task": per,
                             f"grad_norm/{b}/reward_std_mean": std})
    d = diagnose(run)
    f = next(f for f in d.findings if f.id == "std_normalisation_amplifies")
    assert f.evidence[-2] == ("this run measured the harm: the lowest-variance bucket's per-sample task gradient "
                              "outweighs the highest's, and the reward stalls (critic/score/mean 0.5 (first steps) → "
                              "0.5 (last steps))")
    assert f.severity == "warn" and f.evidence[-1].startswith(
        "algorithm.norm_adv_by_std_in_grpo=true is rlgrad's default, kept against this advice: rlgrad keeps GRPO's "
        "std normalisation on by default, as verl") and f.evidence[-1].endswith("(--explain says why)")
    text = render_text(d, explain=True)
    assert f"algorithm.norm_adv_by_std_in_grpo=true (std_normalisation_amplifies): {KEPT_DEFAULTS[0].reason}" in text
    assert "    dormant_growing: needs actor/neuron/dormant_ratio; logged with analysis.neurons.actor.metric_every=N " \
           "or analysis.every=N" in text
    assert "Defaults kept" not in render_text(d)  # without --explain: only the evidence line
    assert producing_settings(["grad_comp/{component}/share", "grad_sim/{pair}", "no/such"]) == [
        "analysis.components.every=N or analysis.every=N (outcome advantages: adv_estimator=grpo or rloo)"]
    assert producing_settings(["grad_norm/all/task"])[0].startswith("analysis.buckets.enable=true")
    # derived from the catalogue's groups: the per-sample instrument's keys name its setting too
    assert producing_settings(["noise_trace/all/task", "actor/entropy"]) == [
        "analysis.per_sample.every=N or analysis.every=N"]
