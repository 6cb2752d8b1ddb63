"""Reward functions of bench/doctor_lead_time.py's faults, in verl's form (``reward.custom_reward_function``).

Each scores the embedded default's arithmetic answers as its task does (rlgrad.tasks.arithmetic: correctness 1 when
the stripped response is the integer answer, format 1 when it is a bare integer) and then breaks something:

- ``noisy``: correctness flipped on a fraction ``flip`` of the samples (a verifier that errs at random);
- ``always_right``: 1 for every response (a verifier that passes everything: every group agrees, "too easy");
- ``longer``: correctness and format plus a bonus for length that outpays being right (a length reward the policy
  games: at 0.5 a character, a response cut at the demo's 8-token limit earns about 4, a right 2-digit answer 2);
- ``brevity``: correctness plus a heavy bonus for short bare integers, which pays more than being right.

None returns an ``acc`` field, so rlgrad's ``rollout/accuracy`` and ``val/accuracy`` stay the task's own verdict
(the true correctness), whatever the training reward says.
"""

from __future__ import annotations

import random

from rlgrad.tasks.arithmetic import _BARE_INT, _INT, DEFAULT_WEIGHTS

_FLIPS = random.Random(0)  # one stream per training process: which samples the noisy verifier gets wrong


def _parts(solution_str: str, ground_truth: str) -> tuple[float, float]:
    """(correctness, format) as the arithmetic task scores them."""
    text = solution_str.strip()
    correct = _INT.fullmatch(text) is not None and int(text) == int(ground_truth)
    return float(correct), float(_BARE_INT.fullmatch(text) is not None)


def _task_score(correct: float, fmt: float) -> float:
    return DEFAULT_WEIGHTS["correctness"] * correct + DEFAULT_WEIGHTS["format"] * fmt


def noisy(data_source, solution_str, ground_truth, extra_info=None, flip: float = 0.4) -> dict:
    correct, fmt = _parts(solution_str, ground_truth)
    if _FLIPS.random() < flip:
        correct = 1.0 - correct
    return {"score": _task_score(correct, fmt), "correctness": correct, "format": fmt}


def always_right(data_source, solution_str, ground_truth, extra_info=None) -> float:
    return 1.0


def longer(data_source, solution_str, ground_truth, extra_info=None, per_char: float = 0.5) -> dict:
    # at 0.15 a character (the first version) a cut response (8 characters: 1.2) earned less than a right answer
    # (1 + 0.3): that reward pays correctness first, and the run learned like a healthy one
    correct, fmt = _parts(solution_str, ground_truth)
    length = per_char * len(solution_str)
    return {"score": _task_score(correct, fmt) + length, "correctness": correct, "format": fmt, "length": length}


def brevity(data_source, solution_str, ground_truth, extra_info=None, weight: float = 4.0) -> dict:
    # paid only for a bare integer, so an empty response earns nothing; at weight 4 a one-digit answer ("5" for -5,
    # "4" for 42) outscores the right one: shortness, not correctness, is what the update follows
    correct, fmt = _parts(solution_str, ground_truth)
    short = weight * fmt * max(0.0, 1.0 - len(solution_str.strip()) / 3)
    return {"score": correct + short, "correctness": correct, "brevity": short}
