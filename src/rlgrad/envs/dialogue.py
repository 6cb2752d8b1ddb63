"""The words around the model's turns: how a turn's state and the last turn's reward are shown (RAGEN's layout).

A turn is shown as

    Turn 2:
    State:
    #####
    #_P_#
    ...
    You have 8 actions left.

after the reward of the turn before (``Reward:\\n-0.1\\n``), and the model's answer starts after an opening
tag, ``<think>`` or ``<answer>``, that the prompt ends with (RAGEN forces it the same way). Without a chat
template these pieces are plain text; with one, ``rlgrad.rl.episodes`` puts them into user turns.
"""

from __future__ import annotations


def opening_tag(enable_think: bool) -> str:
    """What every turn's prompt ends with, so the model writes from inside the format."""
    return "<think>" if enable_think else "<answer>"


def turn_text(turn: int, observation: str, actions_left: int) -> str:
    return f"Turn {turn}:\nState:\n{observation}\nYou have {actions_left} actions left.\n"


def feedback_text(reward: float) -> str:
    """The reward of the turn just played (its actions' rewards and its format penalty), shown before the next."""
    return f"Reward:\n{round(reward, 4):g}\n"


def plain_opening(instruction: str, turn: str, tag: str) -> str:
    """The start of a sequence without a chat template: the instruction, the first shown turn, the tag."""
    return f"{instruction}\n{turn}{tag}"


def plain_continuation(feedback: str, turn: str, tag: str) -> str:
    """Between two model turns without a chat template (after the model's end-of-sequence token)."""
    return f"\n{feedback}{turn}{tag}"


def transcript(last: int, with_response: bool, window: int | None) -> list[tuple[str, int]]:
    """Which pieces a context through turn ``last`` (0-based) shows, in order: ``("open", j)`` (the sequence starts
    at turn j: instruction and its state), ``("continue", j)`` (turn j - 1's reward, then turn j's state),
    ``("model", j)`` (the model's turn j; turn ``last``'s only when ``with_response``). ``window``: the last
    turns shown (None: all), RAGEN's ``max_context_window``."""
    first = 0 if window is None else max(0, last - window + 1)
    out: list[tuple[str, int]] = []
    for j in range(first, last + 1):
        out.append(("open" if j == first else "continue", j))
        if j < last or with_response:
            out.append(("model", j))
    return out
