"""The two false alarms the first held-out set found on healthy runs (docs/doctor.md, "Held-out evaluation"), each
rebuilt from the recorded run's own values and read as the live doctor reads a run: at every prefix."""

from __future__ import annotations

import dataclasses

from rlgrad import rundata as D
from rlgrad.doctor import diagnose
from tests.doctor.test_doctor import healthy_series, run_of


def firsts(run: D.RunData, finding: str) -> list[int]:
    """The prefixes (last steps) at which ``finding`` is a warning or critical."""
    out = []
    for s in sorted(run.rows):
        part = dataclasses.replace(run, rows={k: m for k, m in run.rows.items() if k <= s})
        out += [s for f in diagnose(part).findings if f.id == finding and f.severity in ("warn", "critical")]
    return out


# healthy_demo_s4's share of prompt groups with one reward (rollout/filter_zero_count of 16), steps 1-12
HEALTHY_S4_ZERO_VAR = [13 / 16, 8 / 16, 12 / 16, 7 / 16, 8 / 16, 7 / 16, 6 / 16, 6 / 16, 5 / 16, 6 / 16, 6 / 16,
                       10 / 16]


def test_one_step_with_most_groups_unanimous_is_not_a_finding():
    """Healthy seed 4's first batch had 13 of 16 groups at one reward (81%, above zero_var_frac 0.75), its next
    two 8 and 12: the one-step prefix was judged by that step alone and warned at step 1."""
    s = healthy_series(12) | {"critic/score/frac_zero_std": HEALTHY_S4_ZERO_VAR}
    assert firsts(run_of(s), "zero_variance_groups") == []


def test_most_groups_unanimous_on_the_first_three_steps_is_found_at_step_3():
    """The rule still fires from the first steps it may judge: three steps in a row of 13 of 16 groups."""
    s = healthy_series(12) | {"critic/score/frac_zero_std": [13 / 16] * 12}
    assert firsts(run_of(s), "zero_variance_groups")[0] == 3


# healthy_demo_s4's dormant ratio at its analysis steps 1, 3, ..., 29 (every step had a task gradient)
HEALTHY_S4_DORMANT = [0.1572, 0.1656, 0.1849, 0.1450, 0.1637, 0.1869, 0.1611, 0.1740, 0.1791, 0.1572, 0.2120, 0.1901,
                      0.1527, 0.1662, 0.1727]


def with_dormant(ratios: list[float]) -> D.RunData:
    run = run_of(healthy_series(30))
    for i, ratio in enumerate(ratios):
        run.rows[1 + 2 * i]["actor/neuron/dormant_ratio"] = ratio
    return run


def test_one_analysis_step_above_the_first_is_not_a_growing_dormant_ratio():
    """Healthy seed 4: 0.157 at step 1, 0.212 at step 21 (a rise of 0.055, past dormant_rise 0.05) and 0.190 at 23:
    the ratio's step-to-step noise on the healthy runs (0.14-0.23), warned at the prefix ending at 21."""
    assert firsts(with_dormant(HEALTHY_S4_DORMANT), "dormant_growing") == []


def test_a_rise_held_on_two_analysis_steps_is_found():
    assert firsts(with_dormant([0.16, 0.17, 0.16, 0.25, 0.27, 0.3]), "dormant_growing")[0] == 9


# healthy_trl_grpo_s5 (held-out set 2; examples/trl_grpo.py, seed 5, instruments every 2 steps), retrained at the
# same seed with the same values: TRL's frac_reward_zero_std at steps 1-30, and the KL and task gradient norms at
# the analysis steps 1, 3, ..., 29 (step 5: every group had one reward, no task gradient; the KL term's 0.00224)
HEALTHY_TRL_S5_ZERO_VAR = [0.875, 0.5, 0.5, 0.625, 1.0, 0.5, 0.5, 0.625, 0.75, 0.5, 0.5, 0.625, 0.5, 0.875, 0.625,
                           0.625, 0.25, 0.375, 0.25, 0.5, 0.5, 0.75, 0.75, 0.75, 0.5, 0.5, 0.75, 0.625, 0.5, 0.625]
HEALTHY_TRL_S5_TASK = [0.4873, 2.6371, 0.0, 4.0439, 0.7507, 2.1890, 2.2446, 2.0108, 5.0712, 1.6302, 1.2552, 4.1217,
                       1.6076, 0.9956, 4.3199]
HEALTHY_TRL_S5_KL = [5.594e-08, 0.01868, 0.002244, 0.06983, 0.03806, 0.07789, 0.03741, 0.1080, 0.2422, 0.04800,
                     0.05659, 0.1949, 0.09483, 0.2078, 0.2067]


def with_gradients(task: list[float], kl: list[float]) -> D.RunData:
    run = run_of(healthy_series(30) | {"critic/score/frac_zero_std": HEALTHY_TRL_S5_ZERO_VAR})
    for i, (task_norm, kl_norm) in enumerate(zip(task, kl)):
        run.rows[1 + 2 * i] |= {"grad_norm/all/task": task_norm, "grad_norm/all/kl": kl_norm}
    return run


def test_a_kl_gradient_against_no_task_gradient_is_not_the_kl_term_dominating():
    """Healthy TRL seed 5, at the prefix ending at step 5: of its 3 analysis steps the KL gradient outweighed the
    task's only on step 5, where the task gradient was exactly 0 (every group had one reward); read as "the KL
    term's gradient outweighs the task's" (1 of 3, the rule's "most" for 3 steps). Elsewhere it is 0.2 at most."""
    assert firsts(with_gradients(HEALTHY_TRL_S5_TASK, HEALTHY_TRL_S5_KL), "regularizer_dominates") == []


def test_the_kl_term_dominating_the_steps_with_a_task_gradient_is_found_and_says_what_was_left_out():
    """The same run with a KL gradient twice the task's on every analysis step: found at the first, and on the
    prefix ending at step 5 its evidence counts the step without a task gradient as left out, not as a hit."""
    run = with_gradients(HEALTHY_TRL_S5_TASK, [2 * x for x in HEALTHY_TRL_S5_TASK[:2]] + [0.002244]
                         + [2 * x for x in HEALTHY_TRL_S5_TASK[3:]])
    assert firsts(run, "regularizer_dominates")[0] == 1
    part = dataclasses.replace(run, rows={k: m for k, m in run.rows.items() if k <= 5})
    found = next(f for f in diagnose(part).findings if f.id == "regularizer_dominates")
    assert "on 2 of the 2 analysis steps with a task gradient; 1 step(s) without one left out" in found.evidence


def test_an_entropy_term_on_steps_without_a_task_gradient_is_not_a_collapse_cause():
    """progress.py's collapse cause counts the steps where the entropy term's gradient outweighs the task's: a
    step with no task gradient is not one of them (the same ratio, the same left-out steps)."""
    from rlgrad.doctor.findings import Thresholds, View
    from rlgrad.doctor.progress import entropy_term_dominates

    run = with_gradients(HEALTHY_TRL_S5_TASK, HEALTHY_TRL_S5_KL)
    run.rows[5]["grad_norm/all/entropy"] = 0.01
    run.rows[7]["grad_norm/all/entropy"] = 5.0  # above the task's 4.04: one hit of the 14 with a task gradient
    assert entropy_term_dominates(View(run), Thresholds(), until=29) == (1, 14)
