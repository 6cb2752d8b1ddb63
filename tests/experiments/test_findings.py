"""scripts/experiments/findings.py: its statistics on data with a known answer, its extraction on a hand-made run,
and docs/findings.md's tables against the stored records (bench/results/findings/)."""

import json
import math

import pytest

from rlgrad.config import load_config
from tests.conftest import REPO
from tests.helpers.scripts import load_script


@pytest.fixture(scope="module")
def findings():
    return load_script("scripts/experiments/findings.py")


def test_spearman_by_hand(findings):
    assert findings.spearman([1, 2, 3], [10, 30, 20]) == pytest.approx(0.5)  # ranks (1,2,3) vs (1,3,2)
    assert findings.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share their mean rank: (1.5, 1.5, 3) vs (1, 2, 3) -> Pearson of the ranks = sqrt(3)/2
    assert findings.spearman([0, 0, 5], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)


def test_relation_against_its_null(findings):
    """Monotone steps give rho 1 beyond the null; steps of alternating sign give 0 inside it."""
    up = [([0.1, 0.2, 0.3, 0.4], [1.0, 2.0, 3.0, 4.0])] * 12
    rel = findings.relation(up)
    assert rel["rho"] == pytest.approx(1.0) and rel["low"] == pytest.approx(1.0)
    # the null of a mean of 12 independent 4-point Spearmans: sd sqrt(1/3/12) ~ 0.17, so its 95% band is ~ +-0.33
    assert -0.45 < rel["null_low"] < -0.2 and 0.2 < rel["null_high"] < 0.45 and rel["p"] < 0.01
    mixed = up[:6] + [([0.1, 0.2, 0.3, 0.4], [4.0, 3.0, 2.0, 1.0])] * 6
    rel = findings.relation(mixed)
    assert rel["rho"] == pytest.approx(0.0) and rel["low"] < 0 < rel["high"] and rel["p"] > 0.5


def test_signal_points_leave_out_zero_buckets_and_divide_by_the_rms_advantage(findings):
    buckets = [{"reward_std_mean": 0.0, "per_sample_task": 0.0, "adv_rms": 0.0},
               {"reward_std_mean": 0.2, "per_sample_task": 1.0, "adv_rms": 0.5},
               {"reward_std_mean": 0.3, "per_sample_task": 1.5, "adv_rms": 1.0},
               {"reward_std_mean": 0.4, "per_sample_task": 2.0, "adv_rms": 2.0}]
    record = {"steps": {"1": {"buckets": buckets}, "2": {"buckets": buckets[:3]}}}  # step 2: 2 signal buckets
    assert findings.signal_points(record, False) == [([0.2, 0.3, 0.4], [1.0, 1.5, 2.0])]
    assert findings.signal_points(record, True) == [([0.2, 0.3, 0.4], [2.0, 1.5, 1.0])]


def test_bucket_rows_read_the_rollouts_rms_advantage(findings, tmp_path):
    step = tmp_path / "analysis" / "step_1"
    step.mkdir(parents=True)
    (step / "group_rv_table.csv").write_text("bucket,group_id,reward_std\nbucket_1,0,0\nbucket_2,1,0.5\n")
    (tmp_path / "rollouts").mkdir()
    rows = [{"group_id": 0, "advantage": 0.0}, {"group_id": 0, "advantage": 0.0},
            {"group_id": 1, "advantage": 3.0}, {"group_id": 1, "advantage": -1.0},
            {"group_id": 1, "advantage": 9.0, "kept": False}]  # dropped by the filter: not in the batch
    (tmp_path / "rollouts" / "step_1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = {f"grad_norm/bucket_{b}/{k}": v for b in (1, 2) for k, v in
               (("sample_count", 2), ("reward_std_mean", 0.5 * (b - 1)), ("task", b), ("per_sample_task", b / 2))}
    got = findings.bucket_rows(tmp_path, 1, {k.replace("per_sample_task", "per_sample/task"): v
                                             for k, v in metrics.items()})
    assert [b["adv_rms"] for b in got] == [0.0, pytest.approx(math.sqrt(5.0))]  # sqrt((9 + 1) / 2)
    metrics["grad_norm/bucket_2/sample_count"] = 3  # a file of another batch is refused, not averaged
    with pytest.raises(SystemExit):
        findings.bucket_rows(tmp_path, 1, {k.replace("per_sample_task", "per_sample/task"): v
                                           for k, v in metrics.items()})


def test_the_pages_tables_are_the_stored_records(findings):
    """docs/findings.md shows exactly what `findings.py show` makes of bench/results/findings/."""
    page = (REPO / "docs" / "findings.md").read_text()
    records = findings.load(findings.STORE)
    for table in findings.tables(records):
        assert table in page, table


def _smol(val, fmt, time_s=600.0):
    return {"val": val, "format": fmt, "time_s": time_s}


def test_format_table_reads_both_arms_at_step_20(findings):
    """Seed 1 has both arms (a row, in the mean); seed 2 lacks the format arm (no row)."""
    records = {"smollm2-std-seed1": _smol([[0, 0.5], [20, 0.6]], [[1, 0.1], [2, 0.3], [21, 0.9]]),
               "smollm2-format0-seed1": _smol([[0, 0.5], [20, 0.7], [30, 0.8]], [[1, 0.0], [2, 0.1]]),
               "smollm2-format0-seed2": _smol([[0, 0.4], [20, 0.5]], [[1, 0.0]])}
    rows = findings.format_table(records).splitlines()[2:]
    assert rows == ["| 1 | 50.0% → 60.0% | 20% (30%) | 50.0% → 70.0% | 5% (10%) | +10.0 points |",
                    "| **mean of 1** | | | | | **+10.0 points** |"]


def test_walkthrough_table_gains_from_first_to_last_validation(findings):
    records = {"smollm2-format0-seed1": _smol([[0, 0.25], [5, 0.5], [10, 0.75]], [[1, 0.5], [2, 0.0]], 1200.0),
               "smollm2-format0-seed3": _smol([[0, 0.5], [10, 0.25]], [[1, 0.0]]),
               "smollm2-std-seed1": _smol([[0, 0.0], [10, 1.0]], [[1, 1.0]])}  # not the preset: not shown
    head, rule, *rows = findings.walkthrough_table(records).splitlines()
    assert head.startswith("| greedy val acc, step | 0 | 5 | 10 | gain (points) |") and rule == "|---|" + "---|" * 6
    assert rows == ["| seed 1 | 25.0% | 50.0% | 75.0% | **+50.0** | 25% (50%) | 20 min |",
                    "| seed 3 | 50.0% | — | 25.0% | **-25.0** | 0% (0%) | 10 min |"]


def test_the_walkthrough_pages_show_the_stored_runs(findings):
    """docs/real_model.md and docs/benchmarks.md show the walk-through's curves as the stored records give them."""
    table = findings.walkthrough_table(findings.load(findings.STORE))
    for page in ("real_model.md", "benchmarks.md"):
        assert table in (REPO / "docs" / page).read_text(), page


def test_smollm2_arms_differ_in_the_format_bonus_and_steps_only(findings, monkeypatch, tmp_path):
    """The format-0.1 arm is the walk-through's preset plus the bonus, 20 steps and no instruments, and the preset's
    lr is constant: so the preset's first 20 steps are the arm's counterpart (docs/findings.md, section 7)."""
    monkeypatch.setattr(findings, "smollm2_gguf", lambda: "SmolLM2.gguf")
    preset, arm = (findings.command("smollm2", name, 1, tmp_path, "cpu") for name in ("format0", "std"))
    assert [a for a in arm if a not in preset] == ["reward.weights={correctness: 0.9, format: 0.1}",
                                                   "trainer.total_training_steps=20", "analysis.buckets.enable=false"]
    config = load_config("smollm2_chain_sum")
    assert dict(config.reward.weights) == {"correctness": 0.9, "format": 0.0}
    assert config.actor.optim.lr_warmup_steps == 0 and config.trainer.total_training_steps == 30
