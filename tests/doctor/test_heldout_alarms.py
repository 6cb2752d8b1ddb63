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
