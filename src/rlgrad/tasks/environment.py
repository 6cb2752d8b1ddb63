"""A multi-turn environment as a task: which episodes a step plays, and how the embedded model is warm-started.

An example is an episode's start: ``meta["env_seed"]`` seeds the environment (every episode of a prompt group
shares it, as in RAGEN, so a group's reward spread means what it means for a prompt), ``prompt`` is the first
state (what validation rooms are told apart and kept out of training by). Episodes are played and scored by
``rlgrad.rl.episodes``; the reward components are ``env`` (the environment's rewards) and ``format`` (the
format penalties), both weighted 1 unless ``reward.weights`` says otherwise.

The embedded default model is warm-started on a *sloppy planner* (``warmstart_pairs``): episodes where each
turn plays the environment's shortest solution with every move, with probability ``PLANNER_SLIP``, swapped for
a random other one, and, as the arithmetic teacher drops minus signs, one systematic slip: one action word written
as another ``PLANNER_CONFUSION`` of the time, by default the first as the third (Sokoban's Up as Left); an
environment's module may name its own pair, ``CONFUSED_WORDS = (meant, written)`` (FrozenLake's Down as Right:
its maps run from the top-left corner to the bottom-right one, so Left, its first word, is seldom needed and a
slip on it would leave RL nothing to fix). The model learns the format and how to move, but its greedy move is
wrong wherever the solution needs that word while it samples the right one about a third of the time: RL has
mistakes to fix.
"""

from __future__ import annotations

import importlib
import random
from dataclasses import asdict, is_dataclass
from typing import Any

from rlgrad.config.agent import AgentConfig
from rlgrad.envs import Env, make_env
from rlgrad.envs.dialogue import (
    feedback_text,
    opening_tag,
    plain_continuation,
    plain_opening,
    transcript,
    turn_text,
)
from rlgrad.errors import UserError
from rlgrad.tasks.base import Example, Score, make_val_set, resolve_weights, sample_excluding

DEFAULT_WEIGHTS = {"env": 1.0, "format": 1.0}
PLANNER_SLIP = 0.1
PLANNER_CONFUSION = 0.65


class EnvTask:
    multi_turn = True

    def __init__(self, name: str, options: Any = None, agent: AgentConfig | None = None, *, seed: int = 0,
                 val_size: int = 128, weights: dict[str, float] | None = None):
        self.name = name
        self.options = asdict(options) if is_dataclass(options) else dict(options or {})
        self.agent = agent or AgentConfig()
        self.weights = resolve_weights(name, DEFAULT_WEIGHTS, weights)
        self.make_env()  # bad options fail now, in one line
        self._val = make_val_set(self._draw, seed, val_size, name)
        self._val_prompts = {ex.prompt for ex in self._val}

    def make_env(self) -> Env:
        try:
            return make_env(self.name, self.options)
        except TypeError as e:  # an option the environment does not take
            raise UserError(f"env.{self.name}: {e}") from None

    def _draw(self, rng: random.Random) -> Example:
        seed = rng.randrange(1 << 31)
        return Example(prompt=self.make_env().reset(seed), answer="", meta={"env_seed": seed})

    def train_examples(self, n: int, rng: random.Random) -> list[Example]:
        return sample_excluding(self._draw, rng, n, self._val_prompts, self.name)

    def val_examples(self) -> list[Example]:
        return list(self._val)

    def score(self, response: str, example: Example, num_tokens: int | None = None) -> Score:
        raise TypeError(f"task '{self.name}' is scored by its episodes (rlgrad.rl.episodes), not response by response")

    def sft_target(self, example: Example) -> str:
        raise TypeError(f"task '{self.name}' warm-starts on whole episodes (warmstart_pairs)")

    def warmstart_spec(self) -> dict:
        """What the warm start depends on beyond the task's name (part of its cache key)."""
        spec = {"env": self.options, "agent": asdict(self.agent), "weights": self.weights, "slip": PLANNER_SLIP,
                "confusion": PLANNER_CONFUSION}
        words = self._confused_words()
        if words is not None:  # only an environment that names its pair: the other warm starts keep their keys
            spec["confused_words"] = list(words)
        return spec

    def _confused_words(self) -> tuple[str, str] | None:
        return getattr(importlib.import_module(f"rlgrad.envs.{self.name}"), "CONFUSED_WORDS", None)

    def warmstart_pairs(self, n: int, rng: random.Random, eos: str) -> tuple[list[str], list[str]]:
        """``n`` (context, answer) pairs in the plain layout the embedded model plays in: each from a sloppy
        planner's episode, at one of its turns, with the turns before it as the model would have played them
        (``eos``: the text of the token that ends a model turn)."""
        planner = importlib.import_module(f"rlgrad.envs.{self.name}").sloppy_plan
        a, tag = self.agent, opening_tag(self.agent.enable_think)
        actions = self.make_env().actions
        meant, confused = self._confused_words() or (actions[0], actions[2])
        prompts, targets = [], []
        for ex in self.train_examples(n, rng):
            env, seen = self.make_env(), []  # per turn: (shown state, answer, turn reward)
            obs, used, done = env.reset(ex.meta["env_seed"]), 0, False
            while not done and len(seen) < a.max_turn and used < a.max_actions_per_traj:
                moves = planner(env, rng, PLANNER_SLIP)[:a.max_actions_per_turn] or [rng.choice(env.actions)]
                moves = [confused if m == meant and rng.random() < PLANNER_CONFUSION else m for m in moves]
                body = f" {a.action_sep} ".join(moves) + "</answer>"
                answer = ("</think><answer>" + body) if a.enable_think else body
                shown, reward = turn_text(len(seen) + 1, obs, a.max_actions_per_traj - used), 0.0
                for move in moves[:a.max_actions_per_traj - used]:
                    obs, r, done, _ = env.step(move)
                    reward, used = reward + r, used + 1
                    if done:
                        break
                seen.append((shown, answer, self.weights["env"] * reward))
            last = rng.randrange(len(seen))
            text = ""
            for kind, j in transcript(last, False, a.window):
                if kind == "open":
                    text += plain_opening(env.instruction, seen[j][0], tag)
                elif kind == "continue":
                    text += plain_continuation(feedback_text(seen[j - 1][2]), seen[j][0], tag)
                else:
                    text += seen[j][1] + eos
            prompts.append(text)
            targets.append(seen[last][1])
        return prompts, targets
