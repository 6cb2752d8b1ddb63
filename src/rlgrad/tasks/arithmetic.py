"""Integer arithmetic prompts like ``37+45=`` answered with a bare integer.

The default task. The difficulty levels exist so that a tiny, briefly
supervised model lands in all three regimes GRPO cares about: prompt groups
that always succeed (zero advantage), always fail (zero advantage) and mixed
(the only ones carrying gradient signal).

Levels: 1 ``3+5=`` (the warm start masters it: groups always succeed), 2 ``5-47=``
(negative results, see below: mixed groups), 3 ``47+5=`` / ``5+47=`` (partly learned),
4 ``47+58=`` / ``47-58=`` (mostly fail).

The embedded default model is warm-started (``rlgrad.models.supervised_warmstart``)
on a *sloppy teacher*, ``warmstart_target``: three times out of four it drops the
minus sign of a negative result (``5-47=`` -> ``42``). The warm-started model's
greedy answer to level 2 is thus wrong although it samples the right one about a
quarter of the time -- exactly what RL with a correctness reward fixes (the demo,
``configs/demo.yaml``: validation accuracy ~50% -> ~90%, docs/benchmarks.md#the-demo). ``sft_target`` stays correct.
"""

from __future__ import annotations

import random
import re
from functools import partial

from rlgrad.tasks.base import (
    Example,
    Score,
    make_score,
    make_val_set,
    resolve_weights,
    response_length,
    sample_excluding,
)

DEFAULT_WEIGHTS = {"correctness": 0.9, "format": 0.1}
# Level -> sampling probability; fixed so reward statistics are comparable across runs.
DIFFICULTY_MIX = {1: 0.3, 2: 0.4, 3: 0.2, 4: 0.1}
_ONE, _TWO = (0, 9), (10, 99)  # one- and two-digit operand ranges
# Level -> equally likely (operand range, operator, operand range) shapes. Subtraction may go negative.
SHAPES = {
    1: [(_ONE, "+", _ONE)],
    2: [(_ONE, "-", _TWO)],
    3: [(_TWO, "+", _ONE), (_ONE, "+", _TWO)],
    4: [(_TWO, "+", _TWO), (_TWO, "-", _TWO)],
}
# Probability that the warm-start teacher drops the minus sign of a negative result (warmstart_target).
TEACHER_SLIP = 0.75
_INT = re.compile(r"[+-]?[0-9]+")
_BARE_INT = re.compile(r"-?[0-9]+")


def draw_example(rng: random.Random, level: int | None = None) -> Example:
    """One prompt; ``level`` None samples it from ``DIFFICULTY_MIX``."""
    if level is None:
        level = rng.choices(list(DIFFICULTY_MIX), weights=list(DIFFICULTY_MIX.values()))[0]
    if level not in SHAPES:
        raise ValueError(f"unknown arithmetic difficulty level {level}")
    range_a, op, range_b = rng.choice(SHAPES[level])
    a, b = rng.randint(*range_a), rng.randint(*range_b)
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return Example(prompt=f"{a}{op}{b}=", answer=str(value), meta={"difficulty": level})


class ArithmeticTask:
    name = "arithmetic"

    def __init__(self, seed: int = 0, val_size: int = 128, weights: dict[str, float] | None = None,
                 length_unit: str = "chars"):
        self.weights = resolve_weights(self.name, DEFAULT_WEIGHTS, weights)
        self.length_unit = length_unit
        self._val = make_val_set(draw_example, seed, val_size, self.name)
        self._val_prompts = {ex.prompt for ex in self._val}

    def train_examples(self, n: int, rng: random.Random) -> list[Example]:
        # Redraw within the drawn level so excluding validation prompts keeps the declared mix.
        levels = rng.choices(list(DIFFICULTY_MIX), weights=list(DIFFICULTY_MIX.values()), k=n)
        return [sample_excluding(partial(draw_example, level=lv), rng, 1, self._val_prompts, self.name)[0]
                for lv in levels]

    def val_examples(self) -> list[Example]:
        return list(self._val)

    def score(self, response: str, example: Example, num_tokens: int | None = None) -> Score:
        text = response.strip()
        correct = _INT.fullmatch(text) is not None and int(text) == int(example.answer)
        components = {"correctness": float(correct), "format": float(_BARE_INT.fullmatch(text) is not None)}
        return make_score(components, self.weights, response_length(response, num_tokens, self.length_unit))

    def sft_target(self, example: Example) -> str:
        return example.answer

    def warmstart_target(self, example: Example, rng: random.Random) -> str:
        """The sloppy warm-start teacher: with probability ``TEACHER_SLIP`` a negative result
        loses its minus sign (``5-47=`` -> ``42``); every other answer is correct."""
        slip = rng.random() < TEACHER_SLIP
        return example.answer[1:] if slip and example.answer.startswith("-") else example.answer
