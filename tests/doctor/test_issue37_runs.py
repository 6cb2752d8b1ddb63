"""The faults of issue 37 as recorded demo runs (``tests/data/doctor/``, made by scripts/generate/doctor_fixtures.py
with the issue's cadence: validation every 2 steps, the instruments every 4), diagnosed at every prefix, as a live
doctor would see them; and each finding's advice checked against the run that follows it."""

from __future__ import annotations

import copy

import pytest

from rlgrad import rundata as D
from rlgrad.doctor import diagnose
from tests.doctor.test_doctor import fixture

SERIOUS = ("warn", "critical")


def prefix(run: D.RunData, n: int) -> D.RunData:
    """The run as it stood after step ``n``."""
    out = copy.copy(run)
    out.rows = {s: m for s, m in run.rows.items() if s <= n}
    out.nonfinite = {s: k for s, k in run.nonfinite.items() if s <= n}
    return out


def prefixes(name: str):
    run = D.load_any(fixture(name))
    for n in sorted(s for s in run.rows if s >= 1):
        yield n, diagnose(prefix(run, n))


def found(d, fid: str):
    return next((f for f in d.findings if f.id == fid), None)


def val(name: str) -> dict[int, float]:
    return dict(zip(*D.series(D.load_any(fixture(name)), "val/accuracy")))


@pytest.mark.parametrize("name", ["healthy", "healthy_issue37", "healthy_seed2", "healthy_seed3", "weak_start"])
def test_healthy_runs_and_a_weak_models_noisy_start_raise_no_collapse_or_lr_finding_at_any_step(name):
    quiet = ("reward_collapse", "update_too_large", "lr_too_small", "length_truncated", "inverted_reward")
    for n, d in prefixes(name):
        loud = [(f.id, f.step) for f in d.findings if f.id in quiet]
        assert not loud, (name, n, loud)
        if name.startswith("healthy"):
            assert not [f.id for f in d.findings if f.severity in SERIOUS], (n, [f.id for f in d.findings])


def test_a_run_destroyed_in_two_steps_is_critical_by_step_4():
    """lr 3e-3 without warm-up: the update moves the weights by ~5% a step from step 1 (update_too_large), the
    reward falls from step 2 (reward_collapse, from step 4 on: three steps of it); the update size ranks first."""
    seen = {}
    for n, d in prefixes("lr_fast_collapse"):
        assert d.findings[0].id == "update_too_large" and d.findings[0].step == 1, (n, d.findings[0].id)
        collapse = found(d, "reward_collapse")
        seen[n] = collapse and (collapse.severity, collapse.step, collapse.cause)
    assert seen[3] is None and all(seen[n] == ("critical", 2, "update_too_large") for n in seen if n >= 4), seen
    d = diagnose(D.load_any(fixture("lr_fast_collapse")))
    assert d.critical and "Lower the learning rate (now 0.003)" in d.findings[0].action


def test_the_update_size_names_a_learning_rate_ten_times_too_small():
    """lr 1e-5 (the preset's / 10) with its default warm-up: updates ~7e-5 of the weights' norm, no gain."""
    for n, d in prefixes("lr_slow"):
        f = found(d, "lr_too_small")
        assert (f is not None) == (n >= 10), n  # a window of 10 steps first
    f = found(diagnose(D.load_any(fixture("lr_slow"))), "lr_too_small")
    assert f.evidence[0].startswith("actor/update_ratio 7") and "Raise the learning rate (now 1e-05)" in f.action


def test_chronic_truncation_is_found_from_the_third_step_and_stays():
    steps = {n: (f.step if (f := found(d, "length_truncated")) else None) for n, d in prefixes("truncated")}
    assert all(steps[n] == (1 if n >= 3 else None) for n in steps), steps
    d = diagnose(D.load_any(fixture("truncated")))
    assert "length_runaway" not in {f.id for f in d.findings}
    assert "rollout.response_length, now 2" in found(d, "length_truncated").action


def test_an_entropy_penalty_is_ranked_above_the_collapse_it_drives():
    d = diagnose(D.load_any(fixture("entropy_penalty")))
    first = d.findings[0]
    assert first.id == "regularizer_dominates" and first.severity == "critical", [f.id for f in d.findings]
    assert "entropy_coeff to 0" in first.action and "randomness" not in first.explanation + first.action
    collapse = found(d, "reward_collapse")
    assert collapse.cause == "regularizer_dominates" and "learning rate" not in collapse.action.split(". ")[0]


def test_a_negative_correctness_weight_is_the_first_finding():
    d = diagnose(D.load_any(fixture("reward_inverted")))
    assert d.findings[0].id == "inverted_reward" and d.critical
    assert all(f.cause == "inverted_reward" or f.severity == "info" for f in d.findings[1:]), \
        [(f.id, f.cause) for f in d.findings]


# ---------------------------------------------------------------- the advice, followed


def test_following_the_advice_helps():
    """Each fault's run against the same run with the advice followed, both recorded: validation accuracy by the
    same step. lr_too_small's "raise the learning rate" (1e-5 -> the preset's 1e-4), reward_collapse /
    update_too_large's "lower the learning rate about 20-fold and warm it up" (3e-3 -> 1.4e-4 without warm-up; the
    preset's 1e-4 with it), length_truncated's
    "raise the limit" (2 -> the preset's), inverted_reward's "make the weight positive", regularizer_dominates'
    "set entropy_coeff to 0" (its training reward and entropy hold)."""
    healthy = val("healthy_issue37")
    assert val("lr_slow")[20] + 0.2 < healthy[20]
    assert val("lr_fast_collapse")[12] + 0.3 < healthy[12]
    followed = diagnose(D.load_any(fixture("lr_fast_collapse_followed")))  # lr / 20, as advised: no finding
    assert val("lr_fast_collapse")[12] + 0.3 < val("lr_fast_collapse_followed")[12]
    assert not [f.id for f in followed.findings if f.severity in SERIOUS]
    assert val("truncated")[12] + 0.1 < healthy[12]
    assert val("reward_inverted")[16] + 0.3 < healthy[16]
    # the weak model's validation is near 0 either way: the training reward and the entropy tell
    penalty, removed = (D.load_any(fixture(n)) for n in ("entropy_penalty", "entropy_penalty_removed"))
    reward = {n: D.series(r, "critic/score/mean")[1] for n, r in (("penalty", penalty), ("removed", removed))}
    entropy = {n: D.series(r, "actor/entropy")[1] for n, r in (("penalty", penalty), ("removed", removed))}
    assert sum(reward["penalty"][-5:]) * 1.5 < sum(reward["removed"][-5:])
    assert entropy["penalty"][-1] < 0.5 * entropy["penalty"][0] and entropy["removed"][-1] > 0.8 * entropy["removed"][0]
    assert not found(diagnose(removed), "reward_collapse") and not found(diagnose(removed), "regularizer_dominates")


def test_a_trl_run_whose_groups_all_agree_is_too_easy_first():
    """A plain TRL run paying 1 for every completion (scripts/generate/doctor_fixtures.py trl_too_easy): TRL's
    frac_reward_zero_std is 1, so zero_variance_groups (too easy) comes first, and the flat reward is not blamed on
    the learning rate."""
    d = diagnose(D.load_any(fixture("trl_too_easy")))
    first = d.findings[0]
    assert (first.id, first.severity) == ("zero_variance_groups", "critical") and "too easy" in first.explanation
    assert "frac_reward_zero_std" in first.evidence[0] and first.action.startswith("Make the task harder")
    assert found(d, "lr_too_small").cause == "zero_variance_groups"
    assert not found(d, "length_truncated").explains  # cut, yet paid in full: not the cause
