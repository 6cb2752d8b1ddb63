"""scripts/experiments/findings.py: its statistics on data with a known answer, its extraction on a hand-made run,
and docs/findings.md's tables against the stored records (bench/results/findings/)."""

import json
import math

import pytest

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
