"""How rlgrad words a metric's movement, one rule for the report's "What changed", the console and the doctor.

A change is called a rise or a fall only beyond its noise: the means of the first and the last window of a series
(``WINDOW`` values each, half the series when it is short) differ by more than ``Z`` standard errors of their
difference, each window's standard error its values' standard deviation over the square root of their number
(Welch's comparison of two means). A window of one value has no standard deviation: its change is stated, never
called a rise or a fall. A share measured on ``n`` samples (validation accuracy) has the binomial standard error
``sqrt(p (1 - p) / n)`` (``share_error``). A cosine between two gradients is called a conflict only below
``-CONFLICT`` (docs/runs.md, "Rises and falls").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

Z = 2.0  # standard errors a difference must exceed to be called a rise or a fall
WINDOW = 5  # values averaged at each end of a series
CONFLICT = 0.1  # a cosine below -CONFLICT is a conflict, above CONFLICT an alignment; between, nearly orthogonal


@dataclass(frozen=True)
class Change:
    """A metric's value at the start and at the end (a window's mean, or one value) and the standard error of the
    difference (NaN when it cannot be estimated)."""

    before: float
    after: float
    noise: float
    window: int = 1

    @property
    def direction(self) -> int:
        """+1 a rise, -1 a fall, 0 neither: within ``Z`` standard errors, or no noise estimate."""
        delta = self.after - self.before
        if not math.isfinite(self.noise) or abs(delta) <= Z * self.noise:
            return 0
        return 1 if delta > 0 else -1

    @property
    def verb(self) -> str:
        """"rose", "fell", "stayed within its noise", or "went" (no noise estimate: no claim)."""
        if self.direction:
            return "rose" if self.direction > 0 else "fell"
        return "went" if not math.isfinite(self.noise) else "stayed within its noise"


def compare(before: float, before_error: float, after: float, after_error: float) -> Change:
    """Two estimates with their standard errors (NaN: unknown)."""
    return Change(before, after, math.sqrt(before_error ** 2 + after_error ** 2))


def windows(values: Sequence[float], window: int = WINDOW, errors: Sequence[float] | None = None) -> Change | None:
    """The first and the last ``window`` values of a series compared (half the series each when it is shorter than
    two windows); None under two values. A window of one value has no spread: its standard error is ``errors``'s
    (each value's own, e.g. a step's mean over its samples) when given, else unknown."""
    if len(values) < 2:
        return None
    k = max(1, min(window, len(values) // 2))

    def error(xs: Sequence[float], own: float) -> float:
        return statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) >= 2 else own

    first_own, last_own = (errors[0], errors[-1]) if errors is not None else (math.nan, math.nan)
    first, last = values[:k], values[-k:]
    change = compare(statistics.fmean(first), error(first, first_own), statistics.fmean(last), error(last, last_own))
    return Change(change.before, change.after, change.noise, k)


def share_error(share: float, samples: int | None) -> float:
    """The binomial standard error of a share measured on ``samples`` draws (NaN when their number is unknown)."""
    if not samples or samples < 1:
        return math.nan
    return math.sqrt(max(share * (1 - share), 0.0) / samples)


def cosine_word(cosine: float) -> str:
    """Two gradients' cosine in words: aligned, weakly aligned, nearly orthogonal, in conflict."""
    if cosine < -CONFLICT:
        return "in conflict"
    if abs(cosine) <= CONFLICT:
        return "nearly orthogonal"
    return "aligned" if cosine > 0.5 else "weakly aligned"
