"""A reward function in verl's form: the same file serves verl's trainer and rlgrad's.

    rlgrad train --config-name custom_reward_demo        # the embedded default on examples/data/tiny_arith.parquet
    rlgrad train data.task=math data.train_files=[my_data.parquet] \
        reward.custom_reward_function.path=examples/custom_reward.py

Each response is scored once, called by keyword with its row's ``data_source``, ``reward_model.ground_truth`` and
``extra_info`` columns. The dict's ``score`` is the reward; its other numbers are reward components in rlgrad
(``reward/<field>/mean``, and with ``analysis.components.every`` their gradient geometry), weighted by
``reward.weights``: the preset gives them the weights ``score`` is built with below, so the component ``rest``
(the score the weighted fields leave unexplained) is 0 and the update splits into acc, boxed and brevity.
``pred`` is not a number: verl logs it, rlgrad passes it over.
"""

import re

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
LENGTH = 100  # characters: brevity is 0 from here on


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    found = BOXED.findall(solution_str)
    pred = found[-1].strip() if found else None
    acc = float(pred is not None and pred == str(ground_truth).strip())
    boxed = float(pred is not None)
    brevity = max(0.0, 1.0 - len(solution_str) / LENGTH)
    return {"score": acc + 0.2 * boxed + 0.2 * brevity, "acc": acc, "boxed": boxed, "brevity": brevity,
            "pred": pred or ""}
