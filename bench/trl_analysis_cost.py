"""Cost of rlgrad's instruments inside TRL: a GRPOTrainer step with the bucket analysis every step against a
plain TRL GRPOTrainer step, both in this one process, interleaved step by step.

    .venv/bin/python bench/trl_analysis_cost.py [--threads 2] [--warmup 2] [--steps 6] [--model tiny|PATH]
                                                [--prompts 8] [--samples 8] [--tokens 32] [--instruments buckets|all]
                                                [--beta 0.04] [--checkpointing] [--rlgrad KEY=VALUE ...]

Both trainers train the same model (``tiny``: rlgrad's embedded Qwen2 at its default size, untrained; or a
local HF directory / .gguf) on the same prompts with the same GRPOConfig (fp32, no activation checkpointing unless
``--checkpointing``, loss_type dapo, beta 0.04 unless ``--beta``, two reward functions whose values vary within
groups).
``--instruments buckets``: ``analysis.buckets.every=1`` (the bucket x term analysis, 6 buckets, fast engine);
``all``: also the reward functions' geometry and neuron health every step. The rlgrad trainer runs in a second
thread, and the two alternate step by step (each waits for the other's step to end), so both see the same
machine load; a step is timed from ``on_step_begin`` to ``on_step_end``. The last line is

    plain_step_s=... rlgrad_step_s=... ratio=...      (ratio = with instruments / plain)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402


def model_dir(root: Path, spec: str, seed: int) -> Path:
    if spec != "tiny":
        from rlgrad.models import resolve_model_path

        return resolve_model_path(spec)
    from rlgrad.config.model import ModelConfig
    from rlgrad.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    build_tiny_model(ModelConfig(), tok, seed).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    return root / "model"


class Turns:
    """Two trainers taking turns: a step of one, then a step of the other."""

    def __init__(self):
        self.go = {"plain": threading.Semaphore(1), "rlgrad": threading.Semaphore(0)}
        self.other = {"plain": "rlgrad", "rlgrad": "plain"}
        self.finished: set[str] = set()

    def begin(self, side: str) -> None:
        self.go[side].acquire()

    def end(self, side: str) -> None:
        nxt = self.other[side]
        (self.go[nxt] if nxt not in self.finished else self.go[side]).release()

    def finish(self, side: str) -> None:
        self.finished.add(side)
        self.go[self.other[side]].release()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--model", default="tiny")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--instruments", choices=("buckets", "all"), default="buckets")
    p.add_argument("--rlgrad", nargs="*", default=[], metavar="KEY=VALUE",
                   help="more rlgrad settings after --instruments' (e.g. analysis.neurons.actor.nullspace_samples=0)")
    p.add_argument("--checkpointing", action="store_true",
                   help="TRL's default activation checkpointing (gradient_checkpointing=True) in both trainers")
    p.add_argument("--beta", type=float, default=0.04,
                   help="TRL's KL coefficient; 0 (TRL's default): the loss is the policy term alone and the "
                        "instruments ride on TRL's own update (rlgrad.integrations.trl.one_pass_update)")
    return p


def _reward_functions(tokens: int) -> list:
    """Two rewards whose values vary within groups: shortness and "has more than one digit"."""

    def shorter(prompts, completions, **kw):
        return [-len(c) / tokens for c in completions]

    def digits(prompts, completions, **kw):
        return [float(sum(ch.isdigit() for ch in c) > 1) for c in completions]

    return [shorter, digits]


def _timer(side: str, turns: Turns, times: dict[str, list[float]]):
    """A callback that waits for ``side``'s turn, then times its step from on_step_begin to on_step_end."""
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def __init__(self):
            self.t0 = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            turns.begin(side)
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times[side].append(time.perf_counter() - self.t0)
            turns.end(side)

    return Timer()


def _build(side: str, root: Path, mdir: Path, tok, data, args, callback):
    """The plain TRL trainer (``side="plain"``) or rlgrad's, with the same GRPOConfig."""
    from transformers import PrinterCallback
    from trl import GRPOConfig
    from trl import GRPOTrainer as PlainGRPOTrainer

    from rlgrad.integrations.trl import GRPOTrainer

    cfg = GRPOConfig(output_dir=str(root / side), use_cpu=True, bf16=False, gradient_checkpointing=args.checkpointing,
                     per_device_train_batch_size=args.prompts * args.samples, num_generations=args.samples,
                     max_completion_length=args.tokens, generation_kwargs={"min_new_tokens": args.tokens},
                     beta=args.beta, loss_type="dapo", learning_rate=1e-5, max_steps=args.warmup + args.steps,
                     seed=args.seed, shuffle_dataset=False, report_to=[], logging_steps=1, save_strategy="no",
                     disable_tqdm=True, reward_weights=[0.7, 0.3])
    kw = dict(model=str(mdir), reward_funcs=_reward_functions(args.tokens), args=cfg, train_dataset=data,
              processing_class=tok, callbacks=[callback])
    if side == "plain":
        trainer = PlainGRPOTrainer(**kw)
    else:
        what = (["analysis.every=null", "analysis.buckets.every=1"] if args.instruments == "buckets"
                else ["analysis.every=1"])
        trainer = GRPOTrainer(**kw, rlgrad=what + list(args.rlgrad))
    trainer.remove_callback(PrinterCallback)
    return trainer


def _train_in_turns(plain, ours, turns: Turns) -> None:
    """Train rlgrad's trainer in a second thread while the plain one trains here, step by step in turns."""
    errors = []

    def run(side, trainer):
        try:
            trainer.train()
        except BaseException as e:  # noqa: BLE001 - reported below, the other side must not wait forever
            errors.append((side, e))
        finally:
            turns.finish(side)

    th = threading.Thread(target=run, args=("rlgrad", ours))
    th.start()
    run("plain", plain)
    th.join()
    if errors:
        raise errors[0][1]


def _report(args, times: dict[str, list[float]], ours) -> None:
    a, b = times["plain"][args.warmup:], times["rlgrad"][args.warmup:]
    pa, pb = statistics.median(a), statistics.median(b)
    bucket_s = [h["timing_s/analysis/buckets"] for h in ours.state.log_history
                if "timing_s/analysis/buckets" in h]
    print(f"torch {torch.__version__}, threads={args.threads}, model {args.model}, {args.prompts} prompts x "
          f"{args.samples} samples x {args.tokens} tokens, instruments: {args.instruments}")
    print(f"plain TRL steps {[round(x, 3) for x in a]} s; with rlgrad {[round(x, 3) for x in b]} s; "
          f"median timing_s/analysis/buckets {statistics.median(bucket_s[args.warmup:] or [float('nan')]):.3f} s; "
          f"median of per-pair ratios {statistics.median(y / x for x, y in zip(a, b)):.3f}")
    # a part run every N-th step (analysis.neurons.*.nullspace_every): the medians hide it, the totals do not
    print(f"total with / total without = {sum(b) / sum(a):.3f} over {len(a)} steps each")
    print(f"plain_step_s={pa:.4f} rlgrad_step_s={pb:.4f} ratio={pb / pa:.3f}")


def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    warnings.filterwarnings("ignore")
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from rlgrad.tasks import build_task

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="rlgrad-trl-bench-"))
    try:
        mdir = model_dir(root, args.model, args.seed)
        tok = AutoTokenizer.from_pretrained(mdir)
        task = build_task("arithmetic", seed=args.seed, val_size=8)
        rows = task.train_examples(args.prompts * (args.warmup + args.steps + 2), random.Random(args.seed))
        data = Dataset.from_dict({"prompt": [r.prompt for r in rows]})
        turns = Turns()
        times: dict[str, list[float]] = {"plain": [], "rlgrad": []}
        plain = _build("plain", root, mdir, tok, data, args, _timer("plain", turns, times))
        ours = _build("rlgrad", root, mdir, tok, data, args, _timer("rlgrad", turns, times))
        _train_in_turns(plain, ours, turns)
        _report(args, times, ours)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
