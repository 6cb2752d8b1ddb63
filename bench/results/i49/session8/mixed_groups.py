"""How many of a step's live prompt groups the reward components' basis slice reads on the backward: 24 steps of
the bench's task-term setting (bench/always_on_cost.py --instruments task, the whole batch in one micro-batch), and
at each step where a basis slice rides (``groups.SideSplit`` with a basis), the live groups, those where the basis
weights vary within the group on its rows with a gradient (``Side.basis_by_group``'s rest: read on the backward), and
their rows. Output: mixed_groups.txt beside it.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/results/i49/session8/mixed_groups.py \
        > bench/results/i49/session8/mixed_groups.txt
"""

import sys
import tempfile
from pathlib import Path

import torch

from rlgrad.analysis import groups
from rlgrad.config.load import load_config
from rlgrad.logging.sinks import MetricLogger
from rlgrad.recipes import make_trainer

sys.path.insert(0, str(Path(__file__).parents[3]))  # bench/
from always_on_cost import INSTRUMENTS  # noqa: E402

split = groups.Side.split


def reported(self: groups.Side, inverse: torch.Tensor, count: int) -> groups.SideSplit | None:
    found = split(self, inverse, count)
    if found is not None and len(found.basis):
        _, rest = self.basis_by_group(found.basis, inverse, count)
        carrying = self.carrying.cpu()
        read = (rest != 0).any(0)
        print(f"live groups {len(torch.unique(inverse[carrying]))}, read on the backward "
              f"{len(torch.unique(inverse[read]))} of them, {int(read.sum())} of {int(carrying.sum())} live rows")
    return found


def main() -> None:
    torch.set_num_threads(1)
    groups.Side.split = reported
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(overrides=["trainer.logger=[]", f"trainer.default_local_dir={tmp}/run",
                                     "trainer.num_threads=1", "actor.ppo_micro_batch_size=128", *INSTRUMENTS["task"]])
        tr = make_trainer(cfg, log=lambda *a: None)
        for k in range(1, 25):
            tr.train_step(k, MetricLogger([]))


if __name__ == "__main__":
    main()
