"""Peak memory of an analysed step against a plain step, per rank: 2 CPU processes (gloo), FSDP2, a Qwen2 of
about 51M parameters (hidden 384, 6 layers, an untied vocabulary of 50k; random init, built here from a config:
no download), in rlgrad's trainer and in rlgrad's verl worker. Run in the verl environment (it has both):

    PYTHONPATH=src .venv-verl/bin/python bench/memory_cost.py [--engines trainer,verl] [--threads 1] [--repeats 1]
                                                               [--hidden 384] [--layers 6] [--vocab 50000]

Memory is each process's resident set: its high-water mark (``VmHWM``) reset before a step by writing ``5`` to
``/proc/self/clear_refs``, and read after it. glibc is told to serve allocations above 64 KiB with ``mmap``
(``MALLOC_MMAP_THRESHOLD_``) so freed tensors leave the resident set and one step's peak does not hide in the
free lists of the one before. Per rank and kind of step (the most of its repeats):

- ``peak_mb``: the step's peak resident set minus the resident set just before it (what the step adds);
- ``kept_mb``: what the step left resident (after minus before);
- ``overhead``: the analysed step's ``peak_mb`` minus the plain step's, and that as a fraction of one full fp32
  copy of the model (4 bytes x parameters).

Kinds: ``off`` (the instruments off: rlgrad's trainer's update alone / verl's ``TrainingWorker.train_mini_batch``),
``idle`` (verl: the instruments on, the step not analysed), ``analysed`` (the bucket x term analysis with 4
buckets and neuron health with a nullspace sample of 8, as ``analysis.every`` runs them; the trainer: on the plain
replica it keeps for rollouts, ``analysed_shards``: on the FSDP2 module, as verl's worker runs them); and two
phases alone: ``forward`` (one forward of the loss over the rank's rows on the FSDP2 module, its graph held: the
activations the analysis keeps) and ``analysis`` (the bucket analysis alone, on the FSDP2 module; its overhead
is against ``forward``: what the instruments hold beyond those activations). The update:
one mini-batch of 16 rows (8 per rank) of 4 prompt + 12 response tokens, micro-batches of 4, AdamW, fp32; verl's
engine with its default activation checkpointing (the analysis turns it off for its forward). Each step is also
timed (``step_s``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # read by glibc at process start: the ranks inherit it
os.environ.setdefault("VERL_USE_EXTERNAL_MODULES", "rlgrad.integrations.verl_cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402

B, P, R, N = 16, 4, 12, 4  # global rows, prompt and response tokens, samples per prompt
OVERRIDES = ["analysis.buckets.num_buckets=4", "analysis.neurons.actor.nullspace_samples=8"]


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB -> MB
    raise RuntimeError(f"no {field} in /proc/self/status")


def measured(fn) -> dict[str, float]:
    """Run ``fn`` once: its peak and kept resident memory (MB) and its time (s)."""
    gc.collect()
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    peak = _status("VmHWM")
    gc.collect()
    return {"peak_mb": peak - before, "kept_mb": _status("VmRSS") - before, "step_s": seconds}


def build_model_dir(root: Path, hidden: int, layers: int, vocab: int) -> tuple[Path, int]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlgrad.models import build_char_tokenizer

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=8,
                      num_key_value_heads=2, intermediate_size=4 * hidden, tie_word_embeddings=False,
                      max_position_embeddings=256)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(root / "model")
    build_char_tokenizer().save_pretrained(root / "model")
    return root / "model", sum(p.numel() for p in model.parameters())


def verl_batch(rank: int, seed: int):
    """This rank's half of verl's update batch (rows rank, rank + 2, ...: every prompt group on both ranks)."""
    import numpy as np
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.utils.model import compute_position_id_with_mask
    from verl.workers.utils.padding import left_right_2_no_padding

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 1000, (B, P + R), generator=g)
    attn = torch.ones(B, P + R, dtype=torch.long)
    scores = torch.zeros(B, R)
    scores[:, -1] = (torch.rand(B, generator=g) < 0.5).float()
    d = {"input_ids": ids, "prompts": ids[:, :P], "attention_mask": attn,
         "position_ids": compute_position_id_with_mask(attn), "responses": ids[:, P:],
         "response_mask": attn[:, P:].clone(), "advantages": torch.randn(B, R, generator=g),
         "old_log_probs": -torch.rand(B, R, generator=g) * 4 - 0.5, "ref_log_prob": -torch.rand(B, R, generator=g) * 4,
         "token_level_scores": scores, "uid": np.array([f"p{i // N}" for i in range(B)], dtype=object)}
    rows = list(range(rank, B, 2))
    d = {k: v[rows] for k, v in d.items()}
    td = left_right_2_no_padding(DataProto.from_single_dict(d, meta_info={"temperature": 1.0}).to_tensordict())
    tu.assign_non_tensor(td, global_batch_size=B, mini_batch_size=B, epochs=1, calculate_entropy=True,
                         temperature=1.0, dataloader_kwargs={"shuffle": False})
    return td


def actor_config():
    from verl.workers.config import ActorConfig

    return ActorConfig(strategy="fsdp2", rollout_n=N, ppo_micro_batch_size_per_gpu=4, ppo_mini_batch_size=B // N,
                       use_kl_loss=True, kl_loss_coef=0.01, entropy_coeff=0.001)


def trainer_steps(model_dir: Path, run_dir: Path, rank: int, kinds: list[str], repeats: int
                  ) -> dict[str, list[dict]]:
    """rlgrad's trainer's actor step under FSDP2 (``Trainer.update_actor`` and its hook points), with and
    without the instruments."""
    from transformers import AutoModelForCausalLM

    from rlgrad import distributed
    from rlgrad.algos.objective import ActorLoss
    from rlgrad.analysis import hooks_from_config, schedules
    from rlgrad.hooks import HookRunner, Schedule, StepContext
    from rlgrad.integrations import instrument_settings
    from rlgrad.integrations.verl import DEFAULTS, UNSUPPORTED
    from rlgrad.integrations.verl_loss import batch_from_verl, verl_loss_settings
    from rlgrad.rl.actor import update_actor

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    train, replica = distributed.wrap(model, "fsdp2")
    opt = torch.optim.AdamW(train.parameters(), lr=1e-6)
    settings = verl_loss_settings(actor_config())
    cfg = instrument_settings([*DEFAULTS, "analysis.every=1", *OVERRIDES], UNSUPPORTED, "the benchmark")
    at = schedules(cfg)
    at["components"], at["neurons/critic"] = Schedule(0), Schedule(0)  # no reward components, no critic
    hooks = HookRunner(hooks_from_config(cfg, at))
    out: dict[str, list[dict]] = {k: [] for k in kinds}
    step = 0

    def run(kind: str) -> None:
        nonlocal step
        step += 1
        batch = batch_from_verl(verl_batch(rank, step))
        ctx = StepContext(step=step, batch=batch, actor=replica if kind == "analysed" else train,
                          optimizer=opt, loss_settings=settings, config=cfg, run_dir=run_dir, is_main=rank == 0,
                          sync_actor=lambda: distributed.sync_policy(train, replica))
        if kind == "forward":  # the activations one forward over the rank's rows holds (the analysis keeps them)
            ActorLoss(settings)(train, batch)
            train.reshard()  # FSDP2 keeps the root's parameters unsharded after a forward: back to the shards
            return
        if kind == "analysis":  # the bucket analysis alone (the hooks' before_update), on the shards
            hooks.before_update(ctx)
            return
        on = kind != "off"
        if on:
            hooks.before_update(ctx)
        update_actor(train, opt, batch, settings, ppo_epochs=1, mini_batch_size=B, micro_batch_size=4,
                     max_grad_norm=1.0, shuffle=False, seed=step,
                     on_grads=(lambda m, mini: hooks.on_grads(ctx, m, mini, role="actor")) if on else None)
        distributed.sync_policy(train, replica)  # the rollout replica gets the new weights
        if on:
            hooks.after_update(ctx)

    run("off")  # warm-up: AdamW's state, FSDP2's buffers
    for kind in kinds * repeats:
        out[kind].append(measured(partial(run, kind)))
    return out


def verl_steps(model_dir: Path, run_dir: Path, rank: int, kinds: list[str], repeats: int) -> dict[str, list[dict]]:
    """rlgrad's verl worker (verl's FSDP2 ``TrainingWorker``): its update with the instruments off, on but not
    due, and analysing."""
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine_workers import TrainingWorker as VerlTrainingWorker
    from verl.workers.engine_workers import TrainingWorkerConfig
    from verl.workers.utils.losses import ppo_loss

    from rlgrad.algos.objective import ActorLoss
    from rlgrad.integrations.verl import TrainingWorker
    from rlgrad.integrations.verl_loss import batch_from_verl

    mc = HFModelConfig(path=str(model_dir), use_remove_padding=False, override_config={"attn_implementation": "eager"})
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    ec = FSDPEngineConfig(forward_only=False, strategy="fsdp2", micro_batch_size_per_gpu=4, mixed_precision=fp32,
                          param_offload=False, use_dynamic_bsz=False)
    w = TrainingWorker(TrainingWorkerConfig(model_type="language_model", model_config=mc, engine_config=ec,
                                            optimizer_config=FSDPOptimizerConfig(lr=1e-6), checkpoint_config=None))
    w.reset()
    ac = actor_config()
    w.set_loss_fn(partial(ppo_loss, config=ac))
    w.rlgrad_setup(ac, ["analysis.every=2", *OVERRIDES], run_dir)  # due at the worker's steps 1, 3, ...
    out: dict[str, list[dict]] = {k: [] for k in kinds}
    seed = 0

    def run(kind: str) -> None:
        nonlocal seed
        seed += 1
        td = verl_batch(rank, seed)
        rl = w.rlgrad
        if kind == "forward":  # the activations one forward over the rank's rows holds (the analysis keeps them)
            with rl.analysing() as model:
                ActorLoss(rl.settings)(model, batch_from_verl(td))
                model.reshard()  # FSDP2 keeps the root's parameters unsharded after a forward: back to the shards
        elif kind == "analysis":  # the bucket analysis alone (before_update at a due step), no update
            step, rl.step = rl.step, 1
            rl.before_update(td)
            rl.step, rl.ctx = step, None
        elif kind == "off":
            VerlTrainingWorker.train_mini_batch(w, td)  # verl's own update: rlgrad's override not called
        else:
            w.train_mini_batch(td)

    run("off")  # warm-up
    for kind in kinds * repeats:
        out[kind].append(measured(partial(run, kind)))
    return out


def rank_main(rank: int, port: int, engine: str, kinds: list[str], repeats: int, model_dir: str, out_dir: str,
              threads: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(threads)
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if engine == "verl":
        import rlgrad.integrations.verl_cpu  # noqa: F401  (verl's CPU platform and engine)
    dist.init_process_group("gloo")
    run_dir = Path(out_dir) / f"run_{engine}"
    steps = (trainer_steps if engine == "trainer" else verl_steps)(Path(model_dir), run_dir, rank, kinds, repeats)
    Path(out_dir, f"{engine}_{rank}.json").write_text(json.dumps(steps))
    dist.barrier()
    dist.destroy_process_group()


def summary(engine: str, rank: int, steps: dict[str, list[dict]], copy_mb: float) -> list[str]:
    """Table rows: steps against ``off``; ``analysis`` against ``forward`` (what the analysis holds beyond the
    activations of its forward: slice gradients in flight, output gradients, Grams)."""
    worst = {k: {f: max(s[f] for s in v) for f in ("peak_mb", "kept_mb")} for k, v in steps.items()}
    secs = {k: sum(s["step_s"] for s in v) / len(v) for k, v in steps.items()}
    lines = []
    for kind, m in worst.items():
        base = "forward" if kind == "analysis" and "forward" in worst else "off"
        over = m["peak_mb"] - worst[base]["peak_mb"] if kind != "forward" else float("nan")
        lines.append(f"| {engine} | {rank} | {kind} | {m['peak_mb']:.0f} | {m['kept_mb']:.0f} | "
                     f"{over:+.0f} vs {base} | {over / copy_mb:+.0%} | {secs[kind]:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="trainer,verl")
    ap.add_argument("--trainer-steps", default="off,analysed,analysed_shards,forward,analysis")
    ap.add_argument("--verl-steps", default="off,analysed,idle,forward,analysis")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=50000)
    a = ap.parse_args(argv)
    import socket

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        model_dir, params = build_model_dir(Path(tmp), a.hidden, a.layers, a.vocab)
        copy_mb = 4 * params / 2**20
        print(f"model: Qwen2 hidden {a.hidden}, {a.layers} layers, vocab {a.vocab}: {params / 1e6:.1f}M parameters, "
              f"one fp32 copy {copy_mb:.0f} MB")
        print("| engine | rank | step | peak_mb | kept_mb | overhead_mb | of one fp32 copy | s |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for engine in a.engines.split(","):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            kinds = (a.trainer_steps if engine == "trainer" else a.verl_steps).split(",")
            mp.spawn(rank_main, args=(port, engine, kinds, a.repeats, str(model_dir), tmp, a.threads), nprocs=2,
                     join=True)
            for rank in (0, 1):
                steps = json.loads(Path(tmp, f"{engine}_{rank}.json").read_text())
                print("\n".join(summary(engine, rank, steps, copy_mb)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
