"""The few collectives rlgrad needs (trainer and instruments alike); identities in a single process.

A leaf module: it imports only torch. Every analysis statistic is built from additive partial sums
(per-slice gradients, per-neuron sums of |g|, zero counts, Gram matrices of parameter shards) so that
ONE ``all_reduce_sum`` makes it global and exact. Call these in the same order on every rank, also
when a rank holds no sample of the thing being measured (pass zeros): a skipped collective is a hang.
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


def _device() -> torch.device:
    # NCCL only moves CUDA tensors; gloo only CPU ones.
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _all_reduce(t: torch.Tensor, op) -> torch.Tensor:
    if not initialized() or world_size() == 1:
        return t
    out = t.detach().to(_device(), copy=True)
    dist.all_reduce(out, op=op)
    return out.to(t.device)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over all ranks (a new tensor; ``t`` is left alone)."""
    return _all_reduce(t, dist.ReduceOp.SUM)


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """Element-wise max of ``t`` over all ranks (a new tensor)."""
    return _all_reduce(t, dist.ReduceOp.MAX)


def all_reduce_sum_dict(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``all_reduce_sum`` of every tensor of a dict in ONE collective (one flat buffer, dict order)."""
    if not initialized() or world_size() == 1 or not tensors:
        return tensors
    dtype = tensors[next(iter(tensors))].dtype
    for t in tensors.values():
        dtype = torch.promote_types(dtype, t.dtype)
    parts = [t.detach().reshape(-1).to(dtype) for t in tensors.values()]
    # one tensor (the gradient engine sums one parameter's slice gradients at a time): no concatenated copy
    flat = all_reduce_sum(parts[0] if len(parts) == 1 else torch.cat(parts))
    out, k = {}, 0
    for name, t in tensors.items():
        out[name] = flat[k:k + t.numel()].view(t.shape).to(t.dtype)
        k += t.numel()
    return out


def all_gather_cat(t: torch.Tensor) -> torch.Tensor:
    """Concatenation along dim 0 of every rank's ``t`` in rank order (first dims may differ)."""
    if not initialized() or world_size() == 1:
        return t
    sizes = all_gather_sizes(t.shape[0])
    dev = _device()
    buf = torch.zeros((max(sizes), *t.shape[1:]), dtype=t.dtype, device=dev)
    buf[:t.shape[0]] = t.to(dev)
    parts = [torch.empty_like(buf) for _ in sizes]
    dist.all_gather(parts, buf)
    return torch.cat([p[:n] for p, n in zip(parts, sizes)]).to(t.device)


def all_gather_sizes(n: int) -> list[int]:
    """Every rank's ``n``, in rank order."""
    if not initialized() or world_size() == 1:
        return [n]
    one_hot = torch.zeros(world_size(), dtype=torch.long)
    one_hot[rank()] = n
    return [int(x) for x in all_reduce_sum(one_hot)]
