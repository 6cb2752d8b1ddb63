"""noisy_verifier (rlgrad.doctor.verifier): identical responses to one prompt given different rewards, on rollout
files written with a known flip rate, against the same rollouts under a deterministic verifier."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rlgrad import rundata as D
from rlgrad.doctor import diagnose
from rlgrad.doctor.findings import Thresholds
from rlgrad.doctor.verifier import flip_rate, identical_pairs


def _noisy_run(tmp: Path, flip: float, steps: int = 3, groups: int = 16, n: int = 16, seed: int = 0) -> D.RunData:
    """A run whose policy answers each prompt with one of two responses (the right one 70% of the time) and whose
    verifier flips each sample's correctness with probability ``flip``; its metrics as rlgrad logs them."""
    rng = random.Random(seed)
    (tmp / "rollouts").mkdir()
    rows = {}
    for step in range(1, steps + 1):
        lines, right, paid = [], 0, 0.0
        for g in range(groups):
            for i in range(n):
                ok = rng.random() < 0.7
                correct = float(ok) if rng.random() >= flip else 1.0 - float(ok)
                right, paid = right + ok, paid + correct
                lines.append({"step": step, "index": g * n + i, "group_id": g, "prompt": f"{g}+{g}=",
                              "response": str(2 * g) if ok else str(2 * g + 1), "components": {"correctness": correct},
                              "total": correct, "kept": True})
        (tmp / "rollouts" / f"step_{step}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        rows[step] = {"critic/score/mean": paid / len(lines), "reward/correctness/mean": paid / len(lines),
                      "rollout/accuracy": right / len(lines)}
    return D.RunData(name="t", source=str(tmp), rows=rows, run_dir=tmp)


def test_the_flip_rate_is_read_back_from_pairs_of_identical_responses():
    # two identical samples disagree with probability 2p(1 - p): p = 0.4 gives 0.48, p = 0 gives 0
    assert flip_rate(0.48) == pytest.approx(0.4)
    assert flip_rate(0.0) == 0.0 and flip_rate(0.5) == 0.5
    # a group of 4 identical responses, verdicts 1, 1, 0, 0: 6 pairs, 2 × 2 = 4 of them disagree
    same = [{"group_id": 0, "response": "7", "components": {"correctness": x}} for x in (1.0, 1.0, 0.0, 0.0)]
    assert identical_pairs(same + [{"group_id": 1, "response": "7", "components": {"correctness": 1.0}}],
                           "correctness") == (6, 4)


@pytest.mark.parametrize("flip", [0.1, 0.4])
def test_a_noisy_verifier_is_named_with_its_flip_rate(tmp_path, flip):
    f = next(f for f in diagnose(_noisy_run(tmp_path, flip)).findings if f.id == "noisy_verifier")
    assert f.severity == "warn" and f.step == 1
    estimated = float(f.evidence[0].split("flip rate of about ")[1].split(" ")[0])
    assert estimated == pytest.approx(flip, abs=0.05), f.evidence
    # the scalar cross-check: the reward's correctness sits at p + (1 - 2p) × the task's own accuracy
    assert "rollout/accuracy" in f.evidence[1]


def test_a_deterministic_verifier_and_a_small_flip_rate_stay_quiet(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    assert "noisy_verifier" not in {f.id for f in diagnose(_noisy_run(tmp_path / "a", 0.0)).findings}
    # 2% of verdicts flipped: some pairs disagree, but below verifier_flip (5%) it is not worth a warning
    slight = _noisy_run(tmp_path / "b", 0.02, steps=10)
    assert "noisy_verifier" not in {f.id for f in diagnose(slight).findings}
    assert "noisy_verifier" in {f.id for f in diagnose(slight, Thresholds(verifier_flip=0.005)).findings}


def test_a_prefix_reads_only_the_rollouts_of_its_own_steps(tmp_path):
    """Live, the doctor after step 3 must not read the rollouts of later steps: here the verifier turns noisy at 4."""
    (tmp_path / "clean").mkdir(), (tmp_path / "noisy").mkdir()
    run = _noisy_run(tmp_path / "clean", 0.0, steps=6)
    _noisy_run(tmp_path / "noisy", 0.4, steps=6)
    for s in (4, 5, 6):
        name = f"rollouts/step_{s}.jsonl"
        (tmp_path / "clean" / name).write_bytes((tmp_path / "noisy" / name).read_bytes())
    early = D.RunData(name="t", source="t", rows={s: m for s, m in run.rows.items() if s <= 3}, run_dir=run.run_dir)
    assert "noisy_verifier" not in {f.id for f in diagnose(early).findings}
    assert next(f for f in diagnose(run).findings if f.id == "noisy_verifier").step == 4


BENCH = Path(__file__).resolve().parents[1] / "data" / "lead_time"  # bench/doctor_lead_time.py --excerpt


def test_the_lead_time_bench_noisy_run_is_named_from_step_1_and_its_healthy_seed_is_not():
    """The first 3 steps of bench/doctor_lead_time.py's noisy_reward (correctness flipped on 40% of samples) and of
    its healthy seed 1, trained the same way: the flip rate read back is 0.4 within the pairs' noise."""
    noisy = D.load_run(BENCH / "noisy_reward")
    f = next(f for f in diagnose(noisy).findings if f.id == "noisy_verifier")
    assert f.step == 1 and f.severity == "warn"
    differ, pairs = (int(x) for x in f.evidence[0].split(" pairs")[0].split(" of "))
    assert pairs > 500 and flip_rate(differ / pairs) == pytest.approx(0.4, abs=0.06), f.evidence
    healthy = D.load_run(BENCH / "healthy_seed1")
    assert "noisy_verifier" not in {f.id for f in diagnose(healthy).findings}
    counts = [identical_pairs(D.rollout_samples(healthy, s), "correctness") for s in (1, 2, 3)]
    assert sum(n for n, _ in counts) > 500 and sum(d for _, d in counts) == 0, counts
