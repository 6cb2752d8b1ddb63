"""The one rule of rises and falls (``rlgrad.metrics.judge``) against hand-computed standard errors."""

from __future__ import annotations

import math

from rlgrad.metrics.judge import Change, compare, cosine_word, share_error, windows


def test_windows_compare_the_ends_by_welch_standard_errors():
    # first 5: mean 0.3, sample std sqrt(0.025) -> se 0.0707; last 5: mean 0.49, same se; se of the difference 0.1
    change = windows([0.1, 0.2, 0.3, 0.4, 0.5] + [9.0] * 3 + [0.29, 0.39, 0.49, 0.59, 0.69])
    assert change.window == 5 and math.isclose(change.before, 0.3) and math.isclose(change.after, 0.49)
    assert math.isclose(change.noise, 0.1)
    assert change.direction == 0 and change.verb == "stayed within its noise"  # 0.19 is not beyond 2 x 0.1
    rise = windows([0.1, 0.2, 0.3, 0.4, 0.5, 0.31, 0.41, 0.51, 0.61, 0.71])  # 0.21 > 0.2
    assert rise.direction == 1 and rise.verb == "rose"
    fall = windows([0.7, 0.7, 0.1, 0.1])  # halves of 2: zero spread, a difference is beyond it
    assert fall.window == 2 and fall.noise == 0 and fall.direction == -1 and fall.verb == "fell"


def test_a_window_of_one_value_is_not_called_a_rise_without_its_own_error():
    change = windows([0.2, 0.9])
    assert change.window == 1 and math.isnan(change.noise) and change.direction == 0 and change.verb == "went"
    judged = windows([0.2, 0.9], errors=[0.1, 0.2])  # se of the difference sqrt(0.05) = 0.224; 0.7 > 0.447
    assert math.isclose(judged.noise, math.sqrt(0.05)) and judged.verb == "rose"
    assert windows([0.5]) is None and windows([]) is None


def test_share_error_and_compare():
    assert math.isclose(share_error(0.5, 100), 0.05) and math.isnan(share_error(0.5, None))
    assert compare(0.5, 0.03, 0.6, 0.04) == Change(0.5, 0.6, 0.05)
    assert compare(0.5, 0.03, 0.6, 0.04).direction == 0 and compare(0.5, 0.03, 0.61, 0.04).direction == 1


def test_cosine_words():
    assert cosine_word(-0.0025) == "nearly orthogonal" and cosine_word(-0.25) == "in conflict"
    assert cosine_word(0.3) == "weakly aligned" and cosine_word(0.9) == "aligned"
