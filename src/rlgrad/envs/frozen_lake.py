"""FrozenLake as RAGEN plays it: gymnasium's environment on a seeded random map, shown as RAGEN's text grid.

The dynamics are gymnasium's own (``gymnasium.envs.toy_text.FrozenLakeEnv``): on slippery ice a move goes the
intended way a third of the time and to either side of it otherwise (never backwards); a move into the border
leaves the player where it is. Reaching the goal earns 1 and ends the episode, falling into a hole ends it with 0,
every other move earns 0. ``max_steps`` also ends an episode (RAGEN has no such limit in the environment: its
episodes end after ``max_actions_per_traj`` actions, 10 by default, so the default 100 does not bind there).

One seed decides everything: the map is ``generate_random_map(size, p, seed)`` (which only returns maps with a
path from the start to the goal) and the slips come from gymnasium's generator reset with the same seed, as RAGEN
seeds both with the episode's seed. Neither reads nor moves Python's or numpy's global generators. Gymnasium's maps
put the start in the top-left corner and the goal in the bottom-right one; RAGEN's own copy of the generator draws
both cells at random, so its maps vary more.

An action is effective when the player's cell changed, RAGEN's definition: on ice a move that slid sideways is
effective, a move (intended or slid) into the border is not. The grid, RAGEN's symbols: ``P`` player, ``_``
frozen (the start too), ``O`` hole, ``G`` goal, ``X`` player in a hole, ``√`` player on the goal.
"""

from __future__ import annotations

import copy
import random
from collections import deque
from typing import Any

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

ACTIONS = ("Left", "Down", "Right", "Up")  # in the order of gymnasium's action ids 0..3
DELTAS = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
TILES = {"S": "_", "F": "_", "H": "O", "G": "G"}
PLAYER_ON = {"H": "X", "G": "√"}
RAGEN_LETTERS = str.maketrans("P_O", "SFH")  # from_text reads RAGEN's grid as well as gymnasium's letters
# the warm start's systematic slip (rlgrad.tasks.environment): Down written as Right, a word nearly every path needs
CONFUSED_WORDS = ("Down", "Right")


def default_instruction(is_slippery: bool) -> str:
    """The built-in task text, short because the embedded test model has a short context; RAGEN's prompt says the
    same (goal, holes, slipping, the answer format) plus the symbols and the action words."""
    ice = " The ice is slippery: a move may slide sideways." if is_slippery else ""
    return ("FrozenLake: you are P. Reach the goal G and avoid the holes O (_ is ice)." + ice
            + " Moves: Left, Down, Right, Up. Answer like <answer>Left || Up</answer>.")


class FrozenLakeEnv:
    """RAGEN's FrozenLake (``custom_envs.FrozenLake``): ``size`` 4, ``p`` 0.8 (the chance a cell is frozen rather
    than a hole), ``is_slippery`` true by default, RAGEN's defaults. ``map_seed`` is accepted so that RAGEN's
    ``env_config`` carries over; as in RAGEN, each episode's seed replaces it, so it changes nothing."""

    actions = ACTIONS

    def __init__(self, size: int = 4, p: float = 0.8, is_slippery: bool = True, max_steps: int = 100,
                 map_seed: int | None = None, instruction: str | None = None):
        if size < 2 or not 0 < p <= 1 or max_steps < 1:
            raise ValueError(f"needs size >= 2, 0 < p <= 1 and max_steps >= 1, got size={size} p={p} "
                             f"max_steps={max_steps}")
        self.size, self.p, self.is_slippery, self.max_steps = size, p, is_slippery, max_steps
        self.map_seed = map_seed
        self.instruction = default_instruction(is_slippery) if instruction is None else instruction
        self.gym: GymFrozenLake | None = None
        self.steps = 0

    def reset(self, seed: int) -> str:
        """A fresh episode: the map and the slips both from ``seed``; its observation."""
        self._start(generate_random_map(size=self.size, p=self.p, seed=seed), seed)
        return self.render()

    def _start(self, desc: list[str], seed: int) -> None:
        self.gym = GymFrozenLake(desc=desc, is_slippery=self.is_slippery)
        self.gym.reset(seed=seed)
        self.steps = 0

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """One move. An unknown word is no step at all (not counted towards ``max_steps``): RAGEN's manager drops
        such words before its environment sees them."""
        gym = self._live()
        if action not in ACTIONS:
            return self.render(), 0.0, self._over(), self._info(valid=False, effective=False)
        before = int(gym.s)
        _, reward, _, _, _ = gym.step(ACTIONS.index(action))
        self.steps += 1
        return self.render(), float(reward), self._over(), self._info(valid=True, effective=int(gym.s) != before)

    def _over(self) -> bool:
        # gymnasium terminates exactly on a hole or the goal; the step limit is ours
        return self.tile() in "HG" or self.steps >= self.max_steps

    def _info(self, valid: bool, effective: bool) -> dict[str, Any]:
        return {"success": self.tile() == "G", "action_is_valid": valid, "action_is_effective": effective}

    def _live(self) -> GymFrozenLake:
        if self.gym is None:
            raise RuntimeError("FrozenLakeEnv: call reset(seed) before step")
        return self.gym

    def position(self) -> tuple[int, int]:
        """The player's (row, column)."""
        gym = self._live()
        return divmod(int(gym.s), int(gym.ncol))

    def tile(self) -> str:
        """The map's letter under the player (gymnasium's: ``S``, ``F``, ``H`` or ``G``)."""
        y, x = self.position()
        return self._live().desc[y, x].decode()

    def render(self) -> str:
        py, px = self.position()
        rows = []
        for y, row in enumerate(self._live().desc):
            cells = [TILES[c.decode()] for c in row]
            if y == py:
                cells[px] = PLAYER_ON.get(row[px].decode(), "P")
            rows.append("".join(cells))
        return "\n".join(rows)

    def copy(self) -> FrozenLakeEnv:
        """An independent copy of the current state, the slip generator's state included, so a planner can look
        ahead: the copy slips exactly as the original would for the same moves."""
        return copy.deepcopy(self)

    @classmethod
    def from_text(cls, grid: str, is_slippery: bool = False, seed: int = 0, max_steps: int = 100) -> FrozenLakeEnv:
        """An environment on a hand-made map, one row per line, in gymnasium's letters (``S`` start, ``F`` frozen,
        ``H`` hole, ``G`` goal) or RAGEN's symbols (``P``, ``_``, ``O``, ``G``); ``seed`` drives the slips."""
        desc = [line.strip().translate(RAGEN_LETTERS) for line in grid.strip().splitlines()]
        cells = "".join(desc)
        if len({len(r) for r in desc}) != 1 or cells.count("S") != 1 or "G" not in cells or set(cells) - set(TILES):
            raise ValueError(f"a map needs equal rows of S/F/H/G (or P/_/O/G), one start and a goal, got {grid!r}")
        env = cls(size=len(desc), is_slippery=is_slippery, max_steps=max_steps)
        env._start(desc, seed)
        return env


def shortest_path(env: FrozenLakeEnv) -> list[str]:
    """The fewest moves from the player's cell to the goal around the holes as if the ice held (breadth-first);
    empty when there is no such path or the episode is over. It does not change ``env``."""
    start, desc = env.position(), env._live().desc
    if desc[start].decode() in "HG":
        return []
    parent: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if desc[cell].decode() == "G":
            moves = []
            while (link := parent[cell]) is not None:
                cell, move = link
                moves.append(move)
            return moves[::-1]
        for move, (dy, dx) in DELTAS.items():
            nxt = (cell[0] + dy, cell[1] + dx)
            if 0 <= nxt[0] < desc.shape[0] and 0 <= nxt[1] < desc.shape[1] and nxt not in parent \
                    and desc[nxt].decode() != "H":
                parent[nxt] = (cell, move)
                queue.append(nxt)
    return []


def sloppy_plan(env: FrozenLakeEnv, rng: random.Random, slip: float) -> list[str]:
    """A sloppy teacher for a supervised warm start: ``shortest_path`` from the current cell, each move replaced
    with probability ``slip`` by one of the three other action words (drawn from ``rng``). It plans as if the ice
    held; on slippery ice the episode may still slide off the path, and the next turn plans again from there."""
    return [rng.choice([a for a in ACTIONS if a != m]) if rng.random() < slip else m for m in shortest_path(env)]
