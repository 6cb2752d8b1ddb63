"""Sokoban (rlgrad.envs.sokoban): generated rooms are solvable and reproducible, the rules and rewards on hand-made
rooms, the solver and the sloppy planner."""

import random

import pytest

from rlgrad.envs import make_env, parse_answer
from rlgrad.envs.sokoban import SokobanEnv, sloppy_plan, solve


@pytest.mark.parametrize("dim, boxes, depth", [(6, 1, 30), (6, 1, 3), (7, 2, 12)])
def test_generated_rooms_are_solvable_in_their_drawn_length(dim, boxes, depth):
    env = SokobanEnv(dim_x=dim, dim_y=dim, num_boxes=boxes, search_depth=depth)
    lengths = set()
    for seed in range(60 if boxes == 1 else 15):
        obs = env.reset(seed)
        rows = obs.split("\n")
        assert len(rows) == dim and all(len(r) == dim for r in rows)
        assert set(obs) <= set("#_OX√PS\n") and sum(obs.count(c) for c in "PS") == 1
        assert obs.count("X") + obs.count("√") == boxes and obs.count("X") >= 1  # never starts solved
        assert rows[0] == "#" * dim and rows[-1] == "#" * dim
        plan = solve(env)
        assert plan is not None and 1 <= len(plan) <= depth
        lengths.add(len(plan))
        for move in plan:  # the plan plays out to a success
            _, _, done, info = env.step(move)
        assert done and info["success"]
    assert len(lengths) > 1


def test_the_same_seed_gives_the_same_room_whatever_the_global_rng():
    a, b = SokobanEnv(), SokobanEnv()
    random.seed(1)
    first = a.reset(7)
    state = random.getstate()
    random.seed(99)
    assert b.reset(7) == first
    random.setstate(state)
    assert a.reset(7) == first and random.getstate() == state  # reset neither reads nor moves it
    assert len({a.reset(s) for s in range(20)}) > 10


ROOM = """
#######
#_____#
#_PX_O#
#_____#
#######"""


def test_push_rewards_and_solving():
    env = SokobanEnv.from_text(ROOM)
    assert env.render() == ROOM.strip("\n")
    obs, r, done, info = env.step("Right")  # push the box one cell: a step, no target
    assert r == pytest.approx(-0.1) and not done and info == {"success": False, "action_is_valid": True,
                                                                 "action_is_effective": True}
    assert obs.splitlines()[2] == "#__PXO#"
    obs, r, done, info = env.step("Right")  # onto the target, the only one: +1 and +10
    assert r == pytest.approx(-0.1 + 1 + 10) and done and info["success"]
    assert obs.splitlines()[2] == "#___P√#"


def test_walls_boxes_and_off_target_pushes():
    env = SokobanEnv.from_text("""
######
#_√X_#
#_P__#
#_O__#
######""")
    obs, r, done, info = env.step("Down")  # the player walks onto a target: S
    assert obs.splitlines()[3] == "#_S__#" and r == pytest.approx(-0.1) and info["action_is_effective"]
    env.step("Up")
    _, r, _, info = env.step("Up")  # the box on target is pushed against the wall: nothing moves
    assert r == pytest.approx(-0.1) and not info["action_is_effective"] and info["action_is_valid"]
    env.step("Left")
    obs, r, _, info = env.step("Up")  # player at (2,1) -> (1,1) (empty): a plain step
    obs, r, _, info = env.step("Right")  # push √ right into X: two boxes in a row, nothing moves
    assert not info["action_is_effective"] and r == pytest.approx(-0.1)
    env2 = SokobanEnv.from_text("""
######
#P√__#
#____#
#_X_O#
######""")
    obs, r, _, _ = env2.step("Right")  # off the target: -1
    assert r == pytest.approx(-0.1 - 1.0) and obs.splitlines()[1] == "#_SX_#"
    _, r, done, info = env2.step("Jump")  # an unknown word is no step
    assert (r, done, info["action_is_valid"], env2.steps) == (0.0, False, False, 1)


def test_max_steps_ends_the_episode_without_success():
    env = SokobanEnv.from_text(ROOM, max_steps=2)
    env.step("Left")
    _, _, done, info = env.step("Left")
    assert done and not info["success"]


def test_solver_and_sloppy_planner():
    env = SokobanEnv.from_text(ROOM)
    assert solve(env) == ["Right", "Right"]
    assert solve(SokobanEnv.from_text("""
#####
#PX_#
#O__#
#####""")) is None  # the box is stuck against the wall above the target row: no way to push it down
    env = SokobanEnv()
    env.reset(4)
    rng = random.Random(0)
    assert sloppy_plan(env, rng, 0.0) == solve(env)
    best = solve(env)
    assert all(a != b for a, b in zip(sloppy_plan(env, rng, 1.0), best))
    copy = env.copy()
    copy.step(best[0])
    assert env.render() != copy.render() and env.steps == 0  # the copy moved, the original did not


def test_through_the_shared_interface():
    env = make_env("sokoban", {"dim_x": 7, "dim_y": 6, "num_boxes": 1})
    assert len(env.reset(0).splitlines()[0]) == 7
    a = parse_answer("<answer>Right || up</answer>", env.actions, enable_think=False, action_sep="||", max_actions=5)
    assert a.actions == ["Right", "Up"] and a.well_formed
    with pytest.raises(ValueError):
        SokobanEnv(dim_x=3)
