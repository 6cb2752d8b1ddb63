"""Reward functions of scripts/generate/doctor_fixtures.py's faults, in verl's form (``reward.custom_reward_function``).

- ``worst_sentinel``: the arithmetic task's correctness, and a "worst possible" score for an answer that is not a
  bare integer, ``-sys.float_info.max`` by default: finite (rlgrad refuses NaN and inf rewards), but a batch's sum
  of such scores overflows, and the loss and gradient of that step are not finite (nonfinite_steps);
- ``jackpot``: the task's score, and now and then a raw score of 1000 (grad_norm_spike).
"""

from __future__ import annotations

import random
import sys

from rlgrad.tasks.arithmetic import _BARE_INT, _INT


def worst_sentinel(data_source, solution_str, ground_truth, extra_info=None,
                   worst: float = -sys.float_info.max) -> dict:
    text = solution_str.strip()
    if _BARE_INT.fullmatch(text) is None:
        return {"score": worst, "correctness": 0.0}
    correct = float(_INT.fullmatch(text) is not None and int(text) == int(ground_truth))
    return {"score": correct, "correctness": correct}


_JACKPOTS = random.Random(0)  # one stream per training process: which samples the faulty verifier overpays


def jackpot(data_source, solution_str, ground_truth, extra_info=None, prob: float = 0.003,
            pay: float = 1000.0) -> dict:
    """The task's correctness and format (0.9 / 0.1), and on a random ``prob`` of the samples a raw, unnormalised
    score of ``pay`` (a verifier that now and then returns its internal score): a rare advantage ~1000x the usual,
    the gradient-norm spike of grad_norm_spike."""
    text = solution_str.strip()
    fmt = float(_BARE_INT.fullmatch(text) is not None)
    correct = float(_INT.fullmatch(text) is not None and int(text) == int(ground_truth))
    if _JACKPOTS.random() < prob:
        return {"score": pay, "correctness": correct, "format": fmt}
    return {"score": 0.9 * correct + 0.1 * fmt, "correctness": correct, "format": fmt}
