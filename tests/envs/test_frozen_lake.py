"""FrozenLake (rlgrad.envs.frozen_lake): seeded maps and slips, gymnasium's dynamics behind RAGEN's text grid, the
rules on hand-made maps, the shortest path and the sloppy planner, the shared interface."""

import random
from collections import Counter

import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from rlgrad.config.agent import FrozenLakeConfig
from rlgrad.envs import make_env, parse_answer
from rlgrad.envs.frozen_lake import ACTIONS, FrozenLakeEnv, shortest_path, sloppy_plan

MAP = """
SFFH
FHFF
FFFG"""
DETOUR = """
SFF
HHF
GFF"""
OPEN = """
FFF
FSF
FFG"""


def play(env, seed, moves):
    out = [env.reset(seed)]
    for move in moves:
        out.append(env.step(move))
        if out[-1][2]:
            break
    return out


def test_one_seed_one_map_and_one_episode_whatever_the_global_rngs():
    moves = ["Right", "Down", "Right", "Down", "Down", "Right"] * 3
    random.seed(1)
    np.random.seed(1)
    first = play(FrozenLakeEnv(size=5), 11, moves)
    py_state, np_state = random.getstate(), np.random.get_state()
    random.seed(2)
    np.random.seed(2)
    assert play(FrozenLakeEnv(size=5), 11, moves) == first
    random.setstate(py_state)
    np.random.set_state(np_state)
    play(FrozenLakeEnv(size=5), 11, moves)
    assert random.getstate() == py_state and np.random.get_state()[1].tolist() == np_state[1].tolist()
    env = FrozenLakeEnv(size=5)
    assert len({env.reset(s) for s in range(20)}) > 10


def test_the_map_is_gymnasiums_in_ragens_symbols():
    env = FrozenLakeEnv(size=5, p=0.7)
    for seed in range(10):
        letters = generate_random_map(size=5, p=0.7, seed=seed)
        expected = "\n".join(r.replace("S", "P").replace("F", "_").replace("H", "O") for r in letters)
        assert env.reset(seed) == expected
    assert FrozenLakeEnv(size=4, p=1.0).reset(3) == "P___\n____\n____\n___G"  # p: the chance a cell is frozen


def test_each_word_moves_its_way_on_firm_ice():
    expected = {"Left": "___\nP__\n__G", "Down": "___\n___\n_PG", "Right": "___\n__P\n__G", "Up": "_P_\n___\n__G"}
    for move, obs in expected.items():
        assert FrozenLakeEnv.from_text(OPEN).step(move)[0] == obs


def test_slippery_ice_goes_the_intended_way_a_third_of_the_time_and_never_back():
    where = Counter(FrozenLakeEnv.from_text(OPEN, is_slippery=True, seed=s).step("Up")[0] for s in range(300))
    up, left, right = "_P_\n___\n__G", "___\nP__\n__G", "___\n__P\n__G"
    assert set(where) == {up, left, right}
    assert all(60 <= where[obs] <= 140 for obs in (up, left, right))
    # effective means the cell changed: from the corner only the slide to the right moves the player
    corner = [FrozenLakeEnv.from_text("SFF\nFFF\nFFG", is_slippery=True, seed=s).step("Up") for s in range(300)]
    moved = [obs for obs, _, _, info in corner if info["action_is_effective"]]
    assert set(moved) == {"_P_\n___\n__G"} and 60 <= len(moved) <= 140
    assert {obs for obs, _, _, info in corner if not info["action_is_effective"]} == {"P__\n___\n__G"}


def test_goal_border_and_the_step_after_the_end():
    env = FrozenLakeEnv.from_text(MAP)
    assert env.render() == "P__O\n_O__\n___G"
    for move in ("Up", "Left"):  # into the border: the cell does not change
        assert env.step(move) == ("P__O\n_O__\n___G", 0.0, False,
                                  {"success": False, "action_is_valid": True, "action_is_effective": False})
    assert env.step("Right") == ("_P_O\n_O__\n___G", 0.0, False,
                                 {"success": False, "action_is_valid": True, "action_is_effective": True})
    for move in ("Right", "Down", "Down"):
        obs, r, done, _ = env.step(move)
    assert (obs, r, done) == ("___O\n_O__\n__PG", 0.0, False)
    assert env.step("Right") == ("___O\n_O__\n___√", 1.0, True,
                                 {"success": True, "action_is_valid": True, "action_is_effective": True})
    assert env.step("Left") == ("___O\n_O__\n___√", 0.0, True,
                                {"success": True, "action_is_valid": True, "action_is_effective": False})


def test_a_hole_ends_the_episode_without_reward():
    env = FrozenLakeEnv.from_text(MAP)
    env.step("Down")
    assert env.step("Right") == ("___O\n_X__\n___G", 0.0, True,
                                 {"success": False, "action_is_valid": True, "action_is_effective": True})


def test_unknown_words_are_no_step_and_max_steps_ends_the_episode():
    env = FrozenLakeEnv.from_text(MAP, max_steps=2)
    for word in ("Jump", "up", ""):  # words are exact, as parse_answer hands them over
        assert env.step(word) == ("P__O\n_O__\n___G", 0.0, False,
                                  {"success": False, "action_is_valid": False, "action_is_effective": False})
    assert env.steps == 0
    assert env.step("Right")[2] is False
    obs, r, done, info = env.step("Right")
    assert (obs, r, done, info["success"]) == ("__PO\n_O__\n___G", 0.0, True, False)
    fresh = FrozenLakeEnv(size=4, p=1.0, is_slippery=False, max_steps=2)
    assert [t[2] for t in play(fresh, 0, ["Up", "Up"])[1:]] == [False, True]
    assert [t[2] for t in play(fresh, 0, ["Up"])[1:]] == [False]  # reset restarts the count


def test_hand_made_maps_in_either_alphabet():
    assert FrozenLakeEnv.from_text("P__O\n_O__\n___G").render() == "P__O\n_O__\n___G"
    for bad in ("FFH\nFFG", "SF\nFFG", "SS\nFG", "SF\nFF", "SX\nFG"):  # no start, ragged, two starts, no goal, ?
        with pytest.raises(ValueError):
            FrozenLakeEnv.from_text(bad)


def test_shortest_path_goes_around_the_holes():
    env = FrozenLakeEnv.from_text(DETOUR)
    assert shortest_path(env) == ["Right", "Right", "Down", "Down", "Left", "Left"]
    env.step("Right")
    path = shortest_path(env)
    assert path == ["Right", "Down", "Down", "Left", "Left"] and env.render() == "_P_\nOO_\nG__"  # env untouched
    for move in path:
        _, r, done, info = env.step(move)
    assert (r, done, info["success"]) == (1.0, True, True)
    assert shortest_path(env) == []  # the episode is over
    assert len(shortest_path(FrozenLakeEnv.from_text(MAP))) == 5
    assert shortest_path(FrozenLakeEnv.from_text("SH\nHG")) == []


@pytest.mark.parametrize("size", [4, 8])
def test_generated_maps_always_have_a_path_that_plays_out(size):
    env = FrozenLakeEnv(size=size, is_slippery=False)
    for seed in range(100):
        env.reset(seed)
        path = shortest_path(env)
        assert len(path) >= 2 * (size - 1)  # from corner to corner
        for move in path:
            _, _, done, info = env.step(move)
        assert done and info["success"]


def test_the_sloppy_planner():
    env = FrozenLakeEnv.from_text(DETOUR)
    path = shortest_path(env)
    assert sloppy_plan(env, random.Random(0), 0.0) == path
    assert sloppy_plan(env, random.Random(5), 0.5) == sloppy_plan(env, random.Random(5), 0.5)
    wild = sloppy_plan(env, random.Random(1), 1.0)
    assert len(wild) == len(path) and all(a != b and a in ACTIONS for a, b in zip(wild, path))
    rng = random.Random(2)
    changed = sum(a != b for _ in range(200) for a, b in zip(sloppy_plan(env, rng, 0.5), path))
    assert 0.4 < changed / (200 * len(path)) < 0.6
    assert env.render() == "P__\nOO_\nG__" and env.steps == 0


def test_a_copy_looks_ahead_with_the_same_slips():
    env = FrozenLakeEnv(size=6, is_slippery=True)
    start = env.reset(4)
    moves = ["Right", "Down"] * 5
    twin = env.copy()
    ahead = [twin.step(m) for m in moves]
    assert env.render() == start and env.steps == 0
    assert [env.step(m) for m in moves] == ahead


def test_through_the_shared_interface():
    env = make_env("frozen_lake", {"size": 4, "p": 0.8, "is_slippery": False, "map_seed": 42})
    assert isinstance(env, FrozenLakeEnv) and not env.is_slippery
    rows = env.reset(0).split("\n")
    assert len(rows) == 4 and all(len(r) == 4 for r in rows) and "".join(rows).count("P") == 1
    assert env.reset(5) == FrozenLakeEnv().reset(5)  # map_seed: RAGEN's key, replaced by each episode's seed
    default = make_env("frozen_lake", FrozenLakeConfig())
    assert (default.size, default.p, default.is_slippery) == (4, 0.8, True)
    a = parse_answer("<answer>left || Up</answer>", env.actions, enable_think=False, action_sep="||", max_actions=5)
    assert a.actions == ["Left", "Up"] and a.well_formed


def test_instruction_and_arguments():
    slippery, firm = FrozenLakeEnv().instruction, FrozenLakeEnv(is_slippery=False).instruction
    assert len(slippery) < 200 and "<answer>Left || Up</answer>" in slippery and "slippery" in slippery
    assert "slippery" not in firm
    assert FrozenLakeEnv(instruction="Go.").instruction == "Go."
    for bad in ({"p": 0}, {"p": 1.5}, {"size": 1}, {"max_steps": 0}):
        with pytest.raises(ValueError):
            FrozenLakeEnv(**bad)
    with pytest.raises(RuntimeError):
        FrozenLakeEnv().step("Up")


def test_the_warm_start_planner_slips_on_down_where_sokoban_slips_on_up(monkeypatch):
    """The systematic slip of the warm start's planner (rlgrad.tasks.environment): FrozenLake names its own pair,
    Down written as Right (its paths all need Down), and only its warm-start key records it; Sokoban keeps the
    default, its first word Up written as its third, Left. With the slip always taken and no random swaps, neither
    warm start ever sees the word."""
    import rlgrad.tasks.environment as environment
    from rlgrad.tasks import build_task

    monkeypatch.setattr(environment, "PLANNER_SLIP", 0.0)
    monkeypatch.setattr(environment, "PLANNER_CONFUSION", 1.0)
    lake = build_task("frozen_lake", seed=3, val_size=4, env={"size": 4, "is_slippery": False})
    soko = build_task("sokoban", seed=3, val_size=4)
    assert lake.warmstart_spec()["confused_words"] == ["Down", "Right"]
    assert "confused_words" not in soko.warmstart_spec()
    for task, never, instead in ((lake, "Down", "Right"), (soko, "Up", "Left")):
        _, answers = task.warmstart_pairs(64, random.Random(1), "")
        words = " ".join(answers)
        assert never not in words and instead in words, task.name
