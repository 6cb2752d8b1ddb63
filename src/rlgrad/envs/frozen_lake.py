"""FrozenLake as RAGEN plays it: gymnasium's environment on a random map, shown as a text grid.

The dynamics are gymnasium's own (``gymnasium.envs.toy_text.FrozenLakeEnv``): on slippery ice a move goes the
intended way a third of the time and to either side otherwise; reaching the goal earns 1 and ends the episode,
falling into a hole ends it with nothing. The map is ``generate_random_map(size, p, seed)``, which guarantees a
path to the goal, and the slips come from the environment's generator seeded the same: one seed, one map and one
episode for the same moves (RAGEN seeds both with the episode's seed). ``max_steps`` ends an episode too.

An action is effective when the player's cell changed (RAGEN's definition; on ice the cell may change another
way than asked). The grid, RAGEN's symbols: ``P`` player, ``_`` frozen, ``O`` hole, ``G`` goal, ``X`` player in
a hole, ``√`` player on the goal.
"""

from __future__ import annotations

import copy
import random
from collections import deque

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

ACTIONS = ("Left", "Down", "Right", "Up")  # gymnasium's action ids 0..3
DELTAS = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
TILES = {b"S": "_", b"F": "_", b"H": "O", b"G": "G"}
INSTRUCTION = ("FrozenLake: you are P. Reach the goal G without falling into a hole O. The ice is slippery: a "
               "move may go sideways. Answer with moves, e.g. <answer>Left || Down</answer>.")


class FrozenLakeEnv:
    actions = ACTIONS
    instruction = INSTRUCTION

    def __init__(self, size: int = 4, p: float = 0.8, is_slippery: bool = True, max_steps: int = 100,
                 instruction: str | None = None):
        if size < 2 or not 0 < p <= 1 or max_steps < 1:
            raise ValueError(f"needs size >= 2, 0 < p <= 1 and max_steps >= 1, got size={size} p={p} "
                             f"max_steps={max_steps}")
        self.size, self.p, self.is_slippery, self.max_steps = size, p, is_slippery, max_steps
        self.instruction = INSTRUCTION if instruction is None else instruction
        self.gym: GymFrozenLake | None = None
        self.steps = 0

    def reset(self, seed: int) -> str:
        self._start(generate_random_map(size=self.size, p=self.p, seed=seed), seed)
        return self.render()

    def _start(self, desc: list[str], seed: int) -> None:
        self.gym = GymFrozenLake(desc=desc, is_slippery=self.is_slippery)
        self.gym.reset(seed=seed)
        self.steps = 0

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """One move. An unknown word is no step at all (RAGEN's agent never sends one: its manager drops them)."""
        if action not in ACTIONS:
            return self.render(), 0.0, False, {"success": self.tile() == b"G", "action_is_valid": False,
                                               "action_is_effective": False}
        before = int(self.gym.s)
        _, reward, terminated, truncated, _ = self.gym.step(ACTIONS.index(action))
        self.steps += 1
        done = bool(terminated or truncated) or self.steps >= self.max_steps
        return self.render(), float(reward), done, {"success": self.tile() == b"G", "action_is_valid": True,
                                                    "action_is_effective": int(self.gym.s) != before}

    def position(self) -> tuple[int, int]:
        return divmod(int(self.gym.s), int(self.gym.ncol))

    def tile(self) -> bytes:
        y, x = self.position()
        return bytes(self.gym.desc[y, x])

    def render(self) -> str:
        py, px = self.position()
        rows = []
        for y, row in enumerate(self.gym.desc):
            cells = [TILES[bytes(c)] for c in row]
            if y == py:
                cells[px] = {b"H": "X", b"G": "√"}.get(bytes(row[px]), "P")
            rows.append("".join(cells))
        return "\n".join(rows)

    def copy(self) -> FrozenLakeEnv:
        """An independent copy of the current state, its slip generator included (for a planner to look ahead)."""
        return copy.deepcopy(self)

    @classmethod
    def from_text(cls, grid: str, is_slippery: bool = False, seed: int = 0, max_steps: int = 100) -> FrozenLakeEnv:
        """An environment on a hand-made map in gymnasium's letters (``S`` start, ``F`` frozen, ``H`` hole, ``G``
        goal), one row per line."""
        desc = [line.strip() for line in grid.strip().splitlines()]
        env = cls(size=len(desc), is_slippery=is_slippery, max_steps=max_steps)
        env._start(desc, seed)
        return env


def shortest_path(env: FrozenLakeEnv) -> list[str]:
    """The fewest moves from the player's cell to the goal around the holes, as if the ice held (breadth-first);
    empty when there is none or the episode is over."""
    start, desc = env.position(), env.gym.desc
    if bytes(desc[start]) in (b"H", b"G"):
        return []
    parent: dict = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if bytes(desc[cell]) == b"G":
            moves = []
            while parent[cell] is not None:
                cell, move = parent[cell]
                moves.append(move)
            return moves[::-1]
        for move, (dy, dx) in DELTAS.items():
            nxt = (cell[0] + dy, cell[1] + dx)
            if 0 <= nxt[0] < desc.shape[0] and 0 <= nxt[1] < desc.shape[1] and nxt not in parent \
                    and bytes(desc[nxt]) != b"H":
                parent[nxt] = (cell, move)
                queue.append(nxt)
    return []


def sloppy_plan(env: FrozenLakeEnv, rng: random.Random, slip: float) -> list[str]:
    """A sloppy teacher for a supervised warm start: the shortest path to the goal, each move replaced, with
    probability ``slip``, by a random other one."""
    return [rng.choice([a for a in ACTIONS if a != m]) if rng.random() < slip else m for m in shortest_path(env)]
