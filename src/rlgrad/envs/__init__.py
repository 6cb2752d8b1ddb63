"""Environments for multi-turn agents: the interface, the answer parser, and the shipped environments.

An environment is anything with this shape (``Env``); implement it for your own and hand it to
``rlgrad.agent`` (``make_env`` builds the shipped ones by name):

    env.instruction            the task, shown once before the first observation
    env.actions                the action words it accepts ("Up", "Down", ...)
    env.reset(seed) -> str     a fresh episode from ``seed`` (the same seed, the same episode); its observation
    env.step(action) -> (observation, reward, done, info)
                               one action word; ``info`` holds ``success`` (the episode is won),
                               ``action_is_valid`` (a word of ``env.actions``) and ``action_is_effective``
                               (it changed the state)

The model answers a turn as RAGEN's agents do, ``<think>...</think><answer>Right || Up</answer>`` (or only the
answer with ``agent.enable_think=false``): ``parse_answer`` reads the action words out of it, and the agent
loop steps the environment once per word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from rlgrad.errors import UserError


class Env(Protocol):
    instruction: str
    actions: tuple[str, ...]

    def reset(self, seed: int) -> str: ...
    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]: ...


@dataclass
class Answer:
    """One model turn, read: the known action words in order, how many words it wrote (at most ``max_actions``),
    and whether the turn followed the format (an ``<answer>`` block, after a ``<think>`` block when thinking is on,
    holding at least one word and only words the environment knows)."""

    actions: list[str]
    words: int
    well_formed: bool


def parse_answer(text: str, actions: tuple[str, ...], *, enable_think: bool, action_sep: str,
                 max_actions: int) -> Answer:
    """The action words of a model turn (RAGEN's ``_parse_response``, plus a check of the words).

    Words are matched to ``actions`` without regard to case or surrounding spaces and returned in the
    environment's spelling; an unknown word, like a missing ``<answer>`` block, makes the turn ill-formed (the
    format penalty) and is dropped, the known words before and after it are still played. Words past
    ``max_actions`` are dropped without penalty, as RAGEN keeps only the first ``max_actions_per_turn``.
    """
    pattern = r"<think>(.*?)</think>\s*<answer>(.*?)</answer>" if enable_think else r"<answer>(.*?)</answer>"
    match = re.search(pattern, text, re.DOTALL)
    if match is None:
        return Answer([], 0, False)
    known = {a.lower(): a for a in actions}
    words = [w.strip() for w in match.group(match.lastindex).split(action_sep) if w.strip()][:max_actions]
    played = [known[w.lower()] for w in words if w.lower() in known]
    return Answer(played, len(words), bool(words) and len(played) == len(words))


ENV_NAMES = ("sokoban", "frozen_lake")


def make_env(name: str, options: Any = None) -> Env:
    """A shipped environment by its ``data.task`` name; ``options``: its section of the config (``env.sokoban``,
    ``env.frozen_lake``) or a mapping of the same keys."""
    opts = dict(options or {}) if isinstance(options, dict) else dict(vars(options)) if options is not None else {}
    if name == "sokoban":
        from rlgrad.envs.sokoban import SokobanEnv
        return SokobanEnv(**opts)
    if name == "frozen_lake":
        from rlgrad.envs.frozen_lake import FrozenLakeEnv
        return FrozenLakeEnv(**opts)
    raise UserError(f"unknown environment '{name}' (known: {', '.join(ENV_NAMES)})")
