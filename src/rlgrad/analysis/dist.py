"""The few collectives the instruments need; identities in a single process.

Every analysis statistic is built from additive partial sums (per-slice gradients, per-neuron
sums of |g|, zero counts, Gram matrices of parameter shards) so that ONE ``all_reduce_sum`` makes
it global and exact. Call these in the same order on every rank, also when a rank holds no
sample of the thing being measured (pass zeros): a skipped collective is a hang.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if initialized() else 1


def is_main() -> bool:
    return rank() == 0


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over all ranks (a new tensor; ``t`` is left alone)."""
    if not initialized() or world_size() == 1:
        return t
    out = t.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out
