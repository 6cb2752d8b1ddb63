"""Reward functions of scripts/doctor_fixtures.py's faults, in verl's form (``reward.custom_reward_function``).

- ``worst_sentinel``: the arithmetic task's correctness, and a "worst possible" score for an answer that is not a
  bare integer, ``-sys.float_info.max`` by default: finite (rlgrad refuses NaN and inf rewards), but a batch's sum
  of such scores overflows, and the loss and gradient of that step are not finite (nonfinite_steps).
"""

from __future__ import annotations

import sys

from rlgrad.tasks.arithmetic import _BARE_INT, _INT


def worst_sentinel(data_source, solution_str, ground_truth, extra_info=None,
                   worst: float = -sys.float_info.max) -> dict:
    text = solution_str.strip()
    if _BARE_INT.fullmatch(text) is None:
        return {"score": worst, "correctness": 0.0}
    correct = float(_INT.fullmatch(text) is not None and int(text) == int(ground_truth))
    return {"score": correct, "correctness": correct}
