"""What every task is made of: an ``Example`` (a prompt and what scores it), a ``Score`` (the reward and its named
components), the ``Task`` protocol, and the helpers tasks share (reward weights, response length, validation
sets drawn apart from training).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlgrad.errors import UserError

# Validation sets come from their own stream so that changing how training
# prompts are drawn never changes what we evaluate on.
VAL_SEED_OFFSET = 10_000


LENGTH_UNITS = ("chars", "tokens")


@dataclass
class Example:
    prompt: str  # the question as plain text (its last user turn when ``messages`` is set)
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)
    # The prompt as chat messages ([{"role": ..., "content": ...}], verl's parquet `prompt` column), when the
    # data has them; a plain-text prompt becomes one user message. Rendered by the tokenizer's chat template.
    messages: list[dict[str, str]] | None = None


@dataclass
class Score:
    total: float
    components: dict[str, float]
    correct: bool
    actual_length: int
    # The response lacked the asked answer form and was read the flexible way (rlgrad.tasks.extraction);
    # None for a task without answer extraction.
    fallback: bool | None = None


class Task(Protocol):
    name: str
    weights: dict[str, float]

    def train_examples(self, n: int, rng: random.Random) -> list[Example]: ...
    def val_examples(self) -> list[Example]: ...
    def score(self, response: str, example: Example, num_tokens: int | None = None) -> Score: ...
    def sft_target(self, example: Example) -> str: ...


def data_rows(task: Task) -> list[Example]:
    """Every row of the data files a task reads (training and validation), for checks before a run writes anything;
    empty for a task that generates its prompts (``data_examples``: a task with data files)."""
    return task.data_examples() if hasattr(task, "data_examples") else []


def resolve_weights(task: str, defaults: dict[str, float], user: dict[str, float] | None) -> dict[str, float]:
    """Defaults overridden key by key; a key the task does not produce is a typo worth failing on."""
    weights = dict(defaults)
    for key, value in (user or {}).items():
        if key not in defaults:
            raise UserError(f"task '{task}' has no reward component '{key}' (components: {', '.join(defaults)})")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(f"reward weight '{key}' for task '{task}' must be a number, got {value!r}")
        weights[key] = float(value)
    return weights


def response_length(response: str, num_tokens: int | None, unit: str) -> int:
    if unit == "chars":
        return len(response)
    if num_tokens is None:
        raise ValueError("length_unit='tokens' needs num_tokens to be passed to score()")
    return int(num_tokens)


def make_score(components: dict[str, float], weights: dict[str, float], actual_length: int,
               fallback: bool | None = None) -> Score:
    total = sum(weights[k] * v for k, v in components.items())
    return Score(total=total, components=components, correct=components["correctness"] == 1.0,
                 actual_length=actual_length, fallback=fallback)


def make_val_set(draw: Callable[[random.Random], Example], seed: int, size: int, task: str) -> list[Example]:
    """``size`` distinct prompts from the validation stream of ``seed``."""
    rng = random.Random(seed + VAL_SEED_OFFSET)
    out: list[Example] = []
    seen: set[str] = set()
    for _ in range(50 * size + 100):
        if len(out) == size:
            return out
        ex = draw(rng)
        if ex.prompt not in seen:
            seen.add(ex.prompt)
            out.append(ex)
    if len(out) == size:
        return out
    raise UserError(f"task '{task}': cannot draw {size} distinct validation prompts; lower val_size")


def sample_excluding(draw: Callable[[random.Random], Example], rng: random.Random, n: int,
                     exclude: set[str], task: str) -> list[Example]:
    """``n`` draws whose prompts are not in ``exclude`` (the validation prompts)."""
    out: list[Example] = []
    for _ in range(n):
        for _ in range(1000):
            ex = draw(rng)
            if ex.prompt not in exclude:
                out.append(ex)
                break
        else:
            raise UserError(f"task '{task}': validation set covers almost every prompt; lower val_size")
    return out
