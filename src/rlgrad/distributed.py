"""More than one process: torchrun's environment, the process group, model wrapping, rank-0 decisions.

``torchrun --nproc_per_node N -m rlgrad train ...`` starts N copies of the CLI with WORLD_SIZE, RANK,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. ``setup`` turns that into a process
group (gloo on CPU, NCCL on CUDA) whose collectives time out after ``trainer.dist_timeout_s``, and
writes ``trainer.nnodes`` / ``trainer.n_gpus_per_node`` from the environment (the environment wins
over the config: the keys exist for verl compatibility). A single process never creates a group,
and every helper here is then the identity.

The data-parallel contract (see ``rlgrad.rl.trainer`` and ``rlgrad.rl.actor``): every rank draws the
same prompts and takes a contiguous share of the prompt groups, ranks in order; losses are
normalised by GLOBAL token / sequence counts so the local losses sum to the one-process loss, and
the wrapped model SUMS gradients over ranks (DDP comm hook / FSDP2 divide factor 1) instead of
averaging them: the update equals the one-process update.
"""

from __future__ import annotations

import copy
import os
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist

from rlgrad.collectives import initialized, is_main, world_size
from rlgrad.errors import UserError

STRATEGIES = ("ddp", "fsdp2")
_SETUP = False


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def under_torchrun() -> bool:
    """Launched by torchrun (which sets TORCHELASTIC_RUN_ID), with any number of processes."""
    return "TORCHELASTIC_RUN_ID" in os.environ or env_world_size() > 1


def was_setup() -> bool:
    """Whether this process joined a process group (errors before that are the same on every rank)."""
    return _SETUP


def setup(cfg) -> None:
    """Join the process group torchrun describes (no-op in one process); call before building a Trainer."""
    global _SETUP
    trainer = cfg.trainer
    world_size = env_world_size()
    if world_size <= 1 or initialized():
        return
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    trainer.nnodes, trainer.n_gpus_per_node = max(world_size // local_world_size, 1), local_world_size
    cuda = trainer.device == "cuda" or (trainer.device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=trainer.dist_timeout_s))
    _SETUP = True


def teardown() -> None:
    if initialized():
        dist.destroy_process_group()


def _sum_hook(state, bucket):
    """DDP comm hook: SUM the bucket over ranks (DDP's default averages)."""
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])


def wrap(model: torch.nn.Module, strategy: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``(train_model, policy)``: the module the update runs on, and a plain module with the same weights.

    One process: both are ``model``. DDP: the DDP wrapper and ``model`` itself (shared parameters).
    FSDP2: ``fully_shard`` on every decoder layer (the HF ``_no_split_modules``) and the root, and a
    full replica for rollouts and the analysis engine, refreshed by ``sync_policy`` after each update.
    Both strategies sum gradients over ranks.
    """
    if world_size() == 1:
        return model, model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        dev = next(model.parameters()).device
        ddp = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
        ddp.register_comm_hook(None, _sum_hook)
        return ddp, model
    from torch.distributed.fsdp import fully_shard

    policy = copy.deepcopy(model)
    blocks = set(getattr(model, "_no_split_modules", None) or [])
    for m in model.modules():
        if type(m).__name__ in blocks:
            fully_shard(m)
    fully_shard(model)
    for m in model.modules():  # every FSDP unit: the setters act on one unit each
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(1.0)  # sum, not mean
            m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return model, policy


@torch.no_grad()
def sync_policy(train_model: torch.nn.Module, policy: torch.nn.Module) -> None:
    """FSDP2: all-gather the full weights into the plain replica (every rank joins); else nothing to do."""
    if train_model is policy:
        return
    if hasattr(train_model, "module") and train_model.module is policy:  # DDP shares the parameters
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(train_model, options=StateDictOptions(full_state_dict=True))
    for name, p in policy.named_parameters():
        p.copy_(full[name])


def optimizer_state(train_model, optimizer) -> dict:
    """The full optimizer state keyed by parameter name (every rank must call; rank 0 gets it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(train_model, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(train_model, optimizer, state: dict) -> None:
    """Inverse of ``optimizer_state`` (every rank passes the full state read from the checkpoint)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(train_model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def grad_sync(model, on: bool):
    """Context for one micro-batch's forward/backward: reduce gradients over ranks only when ``on``
    (the last micro-batch of a mini-batch), accumulate locally otherwise."""
    if hasattr(model, "no_sync"):  # DDP
        return nullcontext() if on else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(on)
    return nullcontext()


def _quiet(msg: str) -> UserError:
    e = UserError(msg)
    e.silent = not is_main()  # the CLI prints it once, on rank 0
    return e


def decide(fn):
    """Run ``fn`` on rank 0 only (e.g. looking at the run directory before rank 0 writes to it) and hand
    its result -- or its UserError -- to every rank, so all ranks go on, or all exit 2, together."""
    if world_size() == 1:
        return fn()
    box = [None]
    if is_main():
        try:
            box[0] = ("ok", fn())
        except UserError as e:
            box[0] = ("error", str(e))
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise _quiet(value)
    return value


def agree(fn):
    """Run ``fn`` on every rank; if it raised a UserError anywhere, every rank raises the lowest rank's."""
    if world_size() == 1:
        return fn()
    out, err = None, None
    try:
        out = fn()
    except UserError as e:
        err = str(e)
    errs = [None] * world_size()
    dist.all_gather_object(errs, err)
    first = next((e for e in errs if e is not None), None)
    if first is not None:
        raise _quiet(first)
    return out


def check_config(cfg) -> None:
    """What a multi-process run needs beyond a valid config."""
    ws = world_size()
    if ws == 1:
        return
    for key, groups in (("data.train_batch_size", cfg.data.train_batch_size),
                        ("analysis.buckets.env_groups", cfg.analysis.buckets.env_groups)):
        if groups is not None and groups < ws:
            raise UserError(f"'{key}' ({groups}) must be at least the number of processes ({ws}): "
                            "each rank samples whole prompt groups")
    if cfg.analysis.buckets.save_batch:
        raise UserError("'analysis.buckets.save_batch=true' is not supported with more than one process yet")
    if cfg.actor.lora.rank > 0 and cfg.trainer.strategy == "fsdp2":
        raise UserError("'actor.lora.rank' > 0 with trainer.strategy=fsdp2 is not supported yet: use "
                        "trainer.strategy=ddp (an adapter is small; the base weights are frozen on every rank)")


def failure_message(exc: BaseException) -> str:
    """One line for a collective that failed (a rank died, or hung past trainer.dist_timeout_s)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (f"rank {dist.get_rank() if initialized() else env_rank()} of {env_world_size()}: a collective failed -- "
            f"another rank died or did not answer within trainer.dist_timeout_s ({first[:200]})")
