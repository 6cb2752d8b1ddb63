"""Rewards a run cannot learn from: the live warning and the doctor's findings (rlgrad.logging.reward_signal)."""

from pathlib import Path

import pytest

from rlgrad.doctor import diagnose
from rlgrad.logging.reward_signal import RewardSignalWatch, reward_problems
from rlgrad.rundata import RunData, load_any
from tests.conftest import REPO, run_cli

FIXTURES = REPO / "tests" / "data" / "doctor"


def rows(correct_mean, correct_frac, format_mean=0.5, format_std=0.3, steps=3, base=None, flexible=None):
    out = {s: {"reward/correctness/mean": correct_mean, "reward/correctness/std": 0.0 if correct_frac == 1 else 0.4,
               "reward/correctness/frac_zero_std": correct_frac, "reward/format/mean": format_mean,
               "reward/format/std": format_std} for s in range(1, steps + 1)}
    if flexible is not None:
        for m in out.values():
            m["reward/extraction/flexible_share"] = flexible
    if base is not None:
        out[0] = {"val/accuracy": base}
    return out


def ids(problems):
    return [(p.id, p.component) for p in problems]


def test_all_wrong_with_a_saturated_format_blames_extraction_or_format():
    (p,) = reward_problems(rows(0.0, 1.0, format_mean=0.96, base=0.0))
    assert (p.id, p.component, p.step) == ("unlearnable_reward", "correctness", 3)
    assert "'format' pays almost every response" in p.cause and "extraction" in p.cause
    assert any("base rate): 0%" in e for e in p.evidence)


def test_the_cause_follows_the_evidence():
    assert "too easy" in reward_problems(rows(1.0, 1.0))[0].cause
    assert "always right or always wrong" in reward_problems(rows(0.5, 1.0))[0].cause
    assert "lack the asked answer form" in reward_problems(rows(0.0, 1.0, format_mean=0.1, flexible=0.9))[0].cause
    strict = rows(0.0, 1.0, format_mean=0.0, format_std=0.0, flexible=0.0)
    assert "strict extraction reads nothing" in reward_problems(strict)[0].cause
    assert "too hard" in reward_problems(rows(0.0, 1.0, format_mean=0.4))[0].cause


def test_a_signal_in_any_early_step_or_too_few_steps_is_no_problem():
    some = rows(0.0, 1.0)
    some[2]["reward/correctness/frac_zero_std"] = 0.75
    assert reward_problems(some) == []
    assert reward_problems(rows(0.0, 1.0, steps=2)) == []
    late = rows(0.3, 0.5, steps=6)  # constant later: learned, not broken
    for s in (4, 5, 6):
        late[s].update({"reward/correctness/frac_zero_std": 1.0, "reward/format/std": 0.0})
    assert reward_problems(late) == []


def test_constant_component_needs_a_weight():
    const = rows(0.3, 0.5, format_mean=1.0, format_std=0.0)
    assert ids(reward_problems(const)) == [("constant_component", "format")]
    assert "pays every response" in reward_problems(const)[0].cause and "cancels" in reward_problems(const)[0].cause
    assert reward_problems(const, weights={"correctness": 1.0, "format": 0.0}) == []
    weighted = reward_problems(const, weights={"correctness": 0.9, "format": 0.1})
    assert ids(weighted) == [("constant_component", "format")]


def test_watch_prints_each_problem_once_at_the_third_step():
    said = []
    watch = RewardSignalWatch(said.append)
    data = rows(0.0, 1.0, format_mean=0.95, base=0.0, steps=5)
    for step in sorted(data):
        watch.log(step, data[step])
        assert len(said) == (1 if step >= 3 else 0)
    assert said[0].startswith("WARNING [unlearnable_reward] step 3:")


def test_the_live_line_and_the_doctors_finding_say_the_same_words():
    """The trainer's line (``RewardSignalWatch``) and rlgrad doctor's finding (post hoc, and live with doctor.live)
    word a problem once, in ``RewardProblem``: same severity, title, cause, advice and evidence."""
    data = dict(sorted(rows(0.0, 1.0, format_mean=1.0, format_std=0.0, base=0.0).items()))
    said = []
    watch = RewardSignalWatch(said.append)
    for step in sorted(data):
        watch.log(step, data[step])
    found = {f.id: f for f in diagnose(RunData(name="t", source="t", rows=data)).findings}
    assert [line.split(" [")[0] for line in said] == ["WARNING", "note"]  # as before: critical warns, info notes
    for line, fid in zip(said, ("unlearnable_reward", "constant_component")):
        f = found[fid]
        assert line == (f"{'WARNING' if fid == 'unlearnable_reward' else 'note'} [{fid}] step 3: {f.title}. "
                        f"{f.explanation} {f.action} ({'; '.join(f.evidence)})")
    assert (found["unlearnable_reward"].severity, found["constant_component"].severity) == ("critical", "info")
    assert found["unlearnable_reward"].title == "The reward cannot teach: 'correctness' gives no group a signal"


def test_doctor_finds_the_recorded_zero_variance_run_and_not_the_healthy_one():
    found = {f.id: f for f in diagnose(load_any(FIXTURES / "zero_variance")).findings}
    assert found["unlearnable_reward"].severity == "critical"
    assert "too hard" in found["unlearnable_reward"].explanation
    healthy = {f.id for f in diagnose(load_any(FIXTURES / "healthy")).findings}
    assert not healthy & {"unlearnable_reward", "constant_component"}


def live(tmp_path: Path, overrides: list[str]):
    run = tmp_path / "run"
    res = run_cli(["train", "--config-name", "demo", "trainer.total_training_steps=3", "trainer.test_freq=-1",
                   "trainer.save_freq=-1", "analysis.buckets.enable=false", "trainer.logger=[console,jsonl]",
                   f"trainer.default_local_dir={run}", f"model.cache_dir={tmp_path / 'cache'}", *overrides])
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout + res.stderr, run


@pytest.mark.e2e  # whole `rlgrad train --config-name demo` runs (2.5 minutes of the suite on 2 shared cores)
@pytest.mark.parametrize("overrides,fires", [
    ([], False),  # the demo as shipped: its warm start has a signal in most groups
    (["model.warmstart_steps=0", "rollout.n=4", "data.train_batch_size=8"], True),  # an untrained model: all wrong
])
def test_live_warning_and_doctor_on_demo_runs(tmp_path, overrides, fires):
    out, run = live(tmp_path, overrides)
    assert ("WARNING [unlearnable_reward]" in out) == fires, out[-3000:]
    assert "WARNING [constant_component]" not in out  # a note at most: GRPO cancels a constant
    found = {f.id for f in diagnose(load_any(run)).findings}
    assert ("unlearnable_reward" in found) == fires
