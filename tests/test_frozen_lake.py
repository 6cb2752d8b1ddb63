"""FrozenLake (rlgrad.envs.frozen_lake): gymnasium's dynamics on seeded maps, RAGEN's text grid, the planner."""

import random

import pytest

from rlgrad.envs import make_env, parse_answer
from rlgrad.envs.frozen_lake import FrozenLakeEnv, shortest_path, sloppy_plan

MAP = """
SFFH
FHFF
FFFG"""


def test_the_same_seed_gives_the_same_map_and_episode():
    def play(seed):
        env = FrozenLakeEnv(size=5, is_slippery=True)
        out = [env.reset(seed)]
        for move in ["Right", "Down", "Right", "Down", "Down", "Right"] * 2:
            obs, r, done, _ = env.step(move)
            out.append((obs, r))
            if done:
                break
        return out

    random.seed(3)
    state = random.getstate()
    assert play(11) == play(11) and random.getstate() == state
    assert len({play(s)[0] for s in range(20)}) > 10
    grid = play(11)[0].split("\n")
    assert len(grid) == 5 and all(len(r) == 5 for r in grid) and grid[0][0] == "P" and grid[-1][-1] == "G"
    assert set("".join(grid)) <= set("P_OG")


def test_rules_on_a_hand_made_map():
    env = FrozenLakeEnv.from_text(MAP)
    assert env.render() == "P__O\n_O__\n___G"
    obs, r, done, info = env.step("Up")  # into the border: the cell does not change
    assert (r, done, info["action_is_effective"], info["action_is_valid"]) == (0.0, False, False, True)
    for move in ("Right", "Right", "Down", "Down"):
        obs, r, done, info = env.step(move)
    assert obs == "___O\n_O__\n__PG" and not done
    obs, r, done, info = env.step("Right")
    assert (obs.splitlines()[2], r, done, info["success"]) == ("___√", 1.0, True, True)
    hole = FrozenLakeEnv.from_text(MAP)
    obs, r, done, info = hole.step("Down")
    obs, r, done, info = hole.step("Right")  # (1,1) is a hole
    assert obs.splitlines()[1] == "_X__" and (r, done, info["success"]) == (0.0, True, False)
    _, r, done, info = FrozenLakeEnv.from_text(MAP).step("Jump")
    assert (r, done, info["action_is_valid"]) == (0.0, False, False)


def test_max_steps_ends_the_episode():
    env = FrozenLakeEnv.from_text(MAP, max_steps=2)
    env.step("Up")
    _, _, done, info = env.step("Up")
    assert done and not info["success"]


def test_the_planner_reaches_the_goal_where_the_ice_holds():
    env = FrozenLakeEnv.from_text(MAP)
    path = shortest_path(env)
    assert len(path) == 5 and sloppy_plan(env, random.Random(0), 0.0) == path
    for move in path:
        _, _, done, info = env.step(move)
    assert done and info["success"]
    for seed in range(100):  # generated maps always have a path
        e = FrozenLakeEnv(size=4, is_slippery=False)
        e.reset(seed)
        assert shortest_path(e)
    assert all(a != b for a, b in zip(sloppy_plan(env.copy(), random.Random(1), 1.0), path))


def test_through_the_shared_interface():
    env = make_env("frozen_lake", {"size": 4, "is_slippery": False})
    assert env.reset(0).count("P") == 1
    a = parse_answer("<answer>left || Up</answer>", env.actions, enable_think=False, action_sep="||", max_actions=5)
    assert a.actions == ["Left", "Up"]
    with pytest.raises(ValueError):
        FrozenLakeEnv(p=0)
