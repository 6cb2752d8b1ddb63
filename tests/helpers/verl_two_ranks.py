"""One rank of the verl integration's data-parallel test (``torchrun --nproc_per_node 2``): verl's FSDP2 actor
worker sharded over two CPU processes, each holding half of the batch's rows (every prompt group split over
both ranks, as verl's length balancing may split them), with rlgrad's instruments every step.

    python tests/helpers/verl_two_ranks.py MODEL_DIR RUN_DIR
"""

import os
import sys
from functools import partial
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers.verl_cpu import B, actor_config, verl_batch, worker  # noqa: E402  (first: it sets up verl's platform)


def main(model_dir: str, run_dir: str) -> None:
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ac = actor_config()
    w = worker(model_dir)
    w.set_loss_fn(partial(ppo_loss, config=ac))
    w.rlgrad_setup(ac, ["analysis.every=1", "analysis.buckets.num_buckets=2"], run_dir)
    for s in (0, 1):
        td, _ = verl_batch(seed=s, rows=list(range(rank, B, 2)))
        tu.assign_non_tensor(td, global_batch_size=B, mini_batch_size=B)
        w.train_mini_batch(td)
    dist.destroy_process_group()
    print(f"rank {rank} done, pid {os.getpid()}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
