"""A reward function in verl's form: the same file serves verl's trainer and rlgrad's.

    rlgrad train --config-name custom_reward_demo        # the embedded default on the demo's arithmetic
    rlgrad train data.task=math data.train_files=[my_data.parquet] \
        reward.custom_reward_function.path=examples/custom_reward.py

Each response is scored once, called by keyword with its row's ``data_source``, ``reward_model.ground_truth`` and
``extra_info`` columns. The dict's ``score`` is the reward; its other numbers are reward components in rlgrad
(``reward/<field>/mean``, and with ``analysis.components.every`` their gradient geometry), weighted by
``reward.weights``: the preset gives them the weights ``score`` is built with below, so the component ``rest``
(the score the weighted fields leave unexplained) is 0 and the update splits into acc, format and brevity.
``pred`` is not a number: verl logs it, rlgrad passes it over.

The answer is the last non-empty ``\\boxed{...}`` (a math solution's), else the whole response when it is a bare
integer (the arithmetic task's ``-42``). An empty ``\\boxed{}`` is no answer: it scored as one, it would be the
cheapest way to earn ``format`` and ``brevity`` without computing anything.
"""

import re

BOXED = re.compile(r"\\boxed\{([^{}]+)\}")
INTEGER = re.compile(r"-?[0-9]+")
LENGTH = 100  # characters: brevity is 0 from here on


def read_answer(solution_str):
    boxed = [b.strip() for b in BOXED.findall(solution_str) if b.strip()]
    if boxed:
        return boxed[-1]
    text = solution_str.strip()
    return text if INTEGER.fullmatch(text) else None


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    pred = read_answer(solution_str)  # the last non-empty \boxed{...}, else a bare integer response
    acc = float(pred is not None and pred == str(ground_truth).strip())
    format_ = float(pred is not None)
    brevity = max(0.0, 1.0 - len(solution_str) / LENGTH)
    return {"score": acc + 0.2 * format_ + 0.2 * brevity, "acc": acc, "format": format_, "brevity": brevity,
            "pred": pred or ""}
