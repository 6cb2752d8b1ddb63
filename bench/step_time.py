"""Wall time of one GRPO step: rlgrad's ``Trainer.train_step`` against TRL's ``GRPOTrainer``.

    .venv/bin/python bench/step_time.py [--threads 2] [--warmup 2] [--steps 5] [--seed 1]
                                        [--engine auto|hf|native] [--recompute-log-probs]
                                        [--profile OUT.prof]

Both sides run in this one process, on the CPU, in fp32, with the same number of torch
threads, on the same tiny Qwen2 (``build_char_tokenizer`` + ``build_tiny_model``, saved to a
temporary directory that both load), and on the same step shape:

    8 prompts x 8 samples = 64 completions, exactly 32 new tokens each
    (``min_new_tokens=32`` in the saved generation_config.json; TRL also gets it in
    ``generation_kwargs``, because it builds its own GenerationConfig), sampling at T=1,
    top_p=1, no top_k; arithmetic-task reward; GRPO advantages (group std scaling);
    clipped PPO loss (eps 0.2) aggregated per token over the batch (ours token-mean,
    TRL loss_type="dapo"); k3 KL to a frozen reference with coefficient 0.04;
    one AdamW step per generation batch (lr 1e-4, no weight decay, constant schedule),
    gradient clipping at norm 1.0, no gradient checkpointing, no logging / saving.

A step is timed whole: prompts -> generation -> reward -> log-probs (old/ref) -> loss ->
backward -> clip -> optimizer step. Ours: ``Trainer.train_step`` itself. TRL: the interval
between consecutive ``on_step_end`` callbacks (dataloader fetch, generation, scoring, ref
log-probs, forward/backward, clipping, optimizer and scheduler step). The two sides are
interleaved step by step (one of ours runs inside TRL's ``on_step_end`` and is subtracted
from TRL's interval), so both see the same background load on a shared machine. After
``--warmup`` steps per side, the median of ``--steps`` steps is reported; the last line is

    rlgrad_step_s=... trl_step_s=... ratio=...      (ratio = rlgrad / trl; < 1 means we are faster)

The line before it gives the same medians in process CPU time (``time.process_time``), which a
shared machine disturbs less than wall time; it is meaningful with ``--threads 1`` (with more
threads it also counts the threads' spin-waiting).

TRL (``pip install rlgrad[bench]``) is optional: without it only our time is printed and the
last line says ``trl_step_s=nan ratio=nan``. Everything written goes to a temporary directory
that is removed at exit.

Differences left in place (part of what is compared): TRL generates with transformers'
``generate``; rlgrad with ``rollout.engine`` (``--engine``, default auto = rlgrad's own decode loop
for this Qwen2, ``rlgrad.rl.decode``: same sampling, same RNG draws). Neither side runs a separate
"old" log-prob forward: with one optimizer step per generation batch TRL uses the detached current
log-probs; rlgrad takes the old log-probs from the rollout's own logits (``--recompute-log-probs``
restores the separate forward, verl's default).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU on both sides, whatever the machine has

import torch  # noqa: E402

KL_COEF = 0.04
LR = 1e-4
MAX_GRAD_NORM = 1.0


def build_model_dir(root: Path, args) -> Path:
    """The model both sides load, with ``min_new_tokens = --tokens`` in its generation config.

    Forcing every completion to ``--tokens`` tokens (EOS is masked until then; ours reads this from the
    saved generation config, generate() stops at max_new_tokens) makes both sides do the same work.
    ``--model tiny``: the tiny Qwen2 built here. Otherwise a local HF directory or ``.gguf`` file
    (dequantised through rlgrad's cache), linked file by file into ``root / "model"``, its
    generation_config.json rewritten.
    """
    from transformers import GenerationConfig

    path = root / "model"
    if args.model == "tiny":
        from rlgrad.config.model import ModelConfig
        from rlgrad.models import build_char_tokenizer, build_tiny_model

        tok = build_char_tokenizer()
        model = build_tiny_model(ModelConfig(), tok, args.seed)
        model.generation_config.min_new_tokens = args.tokens
        model.save_pretrained(path)
        tok.save_pretrained(path)
        return path
    from rlgrad.models import resolve_model_path

    source = resolve_model_path(args.model)
    path.mkdir()
    for f in source.iterdir():
        if f.name != "generation_config.json":
            (path / f.name).symlink_to(f.resolve())
    try:
        gen = GenerationConfig.from_pretrained(source, local_files_only=True)
    except OSError:
        gen = GenerationConfig()
    gen.min_new_tokens = args.tokens
    gen.save_pretrained(path)
    return path


# ---------------------------------------------------------------------------------------- rlgrad
class RLGradSide:
    """Our trainer on the shared model; ``step()`` runs and times one ``Trainer.train_step``."""

    def __init__(self, model_dir: Path, root: Path, args):
        from rlgrad.config.load import load_config
        from rlgrad.rl.trainer import Trainer

        overrides = [
            f"model.path={model_dir}", "model.dtype=float32",
            "data.task=arithmetic", f"data.train_batch_size={args.prompts}",
            f"rollout.n={args.samples}", f"rollout.response_length={args.tokens}",
            "rollout.temperature=1.0", "rollout.top_p=1.0", "rollout.top_k=0",
            f"rollout.log_prob_micro_batch_size={args.prompts * args.samples}",
            "rollout.rollout_filter_strategy=top_p", "rollout.rollout_filter_value=1.0",  # keep every group
            "actor.ppo_epochs=1", "actor.ppo_mini_batch_size=null",  # one optimizer step per generation batch
            f"actor.ppo_micro_batch_size={args.prompts * args.samples}",
            "actor.use_kl_loss=true", f"actor.kl_loss_coef={KL_COEF}", "actor.kl_loss_type=low_var_kl",
            "actor.loss_agg_mode=token-mean", "actor.policy_loss=ppo",
            "actor.clip_ratio_low=0.2", "actor.clip_ratio_high=0.2", "actor.entropy_coeff=0.0",
            f"actor.max_grad_norm={MAX_GRAD_NORM}", f"actor.optim.lr={LR}", "actor.optim.weight_decay=0.0",
            "actor.optim.lr_warmup_steps=0",
            "algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=true",
            "trainer.logger=[jsonl]", f"trainer.default_local_dir={root / 'rlgrad_run'}",
            "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false",
            f"trainer.total_training_steps={args.warmup + args.steps}", "trainer.device=cpu",
            f"trainer.num_threads={args.threads}", f"trainer.seed={args.seed}", "trainer.resume_mode=disable",
            f"rollout.engine={args.engine}", f"rollout.recompute_log_probs={str(args.recompute_log_probs).lower()}",
        ]
        self.args = args
        self.trainer = Trainer(load_config(None, None, overrides), log=lambda *a, **k: None)
        torch.set_num_threads(args.threads)
        self.logger = self.trainer._open_run_dir()  # jsonl in the temp run dir, written outside the timed region
        self.times: list[float] = []
        self.cpu_times: list[float] = []
        self.phases: list[dict[str, float]] = []  # timing_s/* of each timed step
        self.metrics: dict = {}
        self.done = 0
        self.profiler = None
        self.prompts: list[list[str]] = []  # per step, to check both sides train on the same prompts
        draw = self.trainer.task.train_examples

        def recording_draw(n, rng):
            examples = draw(n, rng)
            self.prompts.append([e.prompt for e in examples])
            return examples

        self.trainer.task.train_examples = recording_draw

    def step(self) -> None:
        self.done += 1
        timed = self.done > self.args.warmup
        if timed and self.args.profile and self.profiler is None:
            import cProfile
            self.profiler = cProfile.Profile()
        if self.profiler is not None:
            self.profiler.enable()
        t0, c0 = time.perf_counter(), time.process_time()
        metrics, _ = self.trainer.train_step(self.done, self.logger)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if self.profiler is not None:
            self.profiler.disable()
        if timed:
            self.times.append(dt)
            self.cpu_times.append(dc)
            self.phases.append({k.split("/")[-1]: v for k, v in metrics.items() if k.startswith("timing_s/")})
        self.trainer.step = self.done
        self.logger.log(self.done, metrics)
        self.metrics = metrics

    def close(self) -> None:
        if self.profiler is not None:
            self.profiler.dump_stats(self.args.profile)
        self.logger.close()


# ------------------------------------------------------------------------------------------- TRL
def _trl_dataset(task, tokenizer, args):
    """The same prompts, in the same order, as our trainer draws them (same task seed and val_size, same data
    RNG, args.prompts at a time); TRL's sampler is told not to shuffle."""
    import datasets

    rng = random.Random(args.seed)
    rows = [ex for _ in range(args.warmup + args.steps + 4) for ex in task.train_examples(args.prompts, rng)]
    # A tokenizer with a chat template: conversational prompts, which TRL renders with
    # apply_chat_template(add_generation_prompt=True), as ours does (data.apply_chat_template=auto).
    chat = bool(getattr(tokenizer, "chat_template", None))
    prompts = [[{"role": "user", "content": r.prompt}] if chat else r.prompt for r in rows]
    return datasets.Dataset.from_dict({"prompt": prompts, "answer": [r.answer for r in rows]})


def _text(x):
    """A conversational prompt or completion -> its last message's text."""
    return x[-1]["content"] if isinstance(x, list) else x


def _arithmetic_reward(task, args, trl_prompts: list[list[str]]):
    """TRL's reward function: the arithmetic task's total; each step's prompts are kept in ``trl_prompts``."""
    from rlgrad.tasks import Example

    def arithmetic_reward(prompts, completions, answer, **kwargs):
        trl_prompts.append([_text(p) for p in prompts[::args.samples]])
        return [task.score(_text(c), Example(_text(p), a)).total for p, c, a in zip(prompts, completions, answer)]

    return arithmetic_reward


def _grpo_config(root: Path, args):
    """TRL's settings for the step shape of the module docstring."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(root / "trl_out"),
        use_cpu=True, bf16=False, fp16=False,
        model_init_kwargs={"dtype": "float32"},
        per_device_train_batch_size=args.prompts * args.samples, num_generations=args.samples,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        max_completion_length=args.tokens, generation_kwargs={"min_new_tokens": args.tokens},
        temperature=1.0, top_p=1.0, top_k=0,
        beta=KL_COEF, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, optim="adamw_torch",
        max_grad_norm=MAX_GRAD_NORM, gradient_checkpointing=False,
        max_steps=args.warmup + args.steps, seed=args.seed, data_seed=args.seed, shuffle_dataset=False,
        report_to=[], logging_strategy="no", save_strategy="no", eval_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, log_completions=False,
    )


def _interleave(ours: RLGradSide):
    """The callback that times TRL's steps and runs one of ours after each (its ``trainer`` set once built)."""
    from transformers import TrainerCallback

    class Interleave(TrainerCallback):
        def __init__(self):
            self.trainer = None
            self.mark = self.cpu_mark = 0.0
            self.times: list[float] = []
            self.cpu_times: list[float] = []
            self.lengths: list[tuple[float, float]] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.mark, self.cpu_mark = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self.mark)
            self.cpu_times.append(time.process_time() - self.cpu_mark)
            logged = self.trainer._metrics["train"]
            if logged.get("completions/min_length"):
                self.lengths.append((logged["completions/min_length"][-1], logged["completions/max_length"][-1]))
            ours.step()
            self.mark, self.cpu_mark = time.perf_counter(), time.process_time()

    return Interleave()


def _train_profiled(trainer, ours: RLGradSide, args) -> None:
    """``trainer.train()``, under cProfile with ``--profile`` (covering TRL's warm-up steps too; ours are
    excluded: they run inside the callback)."""
    profiler = None
    if args.profile:
        import cProfile
        profiler = cProfile.Profile()
    orig_step = ours.step

    def ours_step_unprofiled():
        if profiler is not None:
            profiler.disable()
        orig_step()
        if profiler is not None:
            profiler.enable()

    ours.step = ours_step_unprofiled
    if profiler is not None:
        profiler.enable()
    try:
        trainer.train()
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile + ".trl")
        ours.step = orig_step


def run_trl(model_dir: Path, root: Path, args, ours: RLGradSide) -> dict | None:
    """Train TRL for warmup+steps steps; after each of its steps, one of ours runs (interleaved).

    Interleaving makes both sides see the same background load (this machine may be shared).
    TRL's step = time between consecutive ``on_step_end`` callbacks minus the time our step
    spent inside the callback. Returns None (after a message) if TRL is not installed.
    """
    try:
        import datasets  # noqa: F401  (what _trl_dataset needs: missing, the TRL side is skipped)
        import trl
        from transformers import AutoTokenizer, PrinterCallback
        from trl import GRPOTrainer
    except ImportError as e:
        print(f"TRL not available ({e}); skipping the TRL side. Install it with: pip install 'rlgrad[bench]'",
              flush=True)
        return None
    from rlgrad.tasks import build_task

    task = build_task("arithmetic", seed=args.seed, val_size=ours.trainer.cfg.data.val_size)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    trl_prompts: list[list[str]] = []
    cb = _interleave(ours)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=_arithmetic_reward(task, args, trl_prompts),
                          args=_grpo_config(root, args), train_dataset=_trl_dataset(task, tokenizer, args),
                          processing_class=tokenizer, callbacks=[cb])
    cb.trainer = trainer
    trainer.remove_callback(PrinterCallback)  # no end-of-training metrics dump on stdout
    torch.set_num_threads(args.threads)
    _train_profiled(trainer, ours, args)
    return {"trl_version": trl.__version__, "times": cb.times[args.warmup:], "cpu_times": cb.cpu_times[args.warmup:],
            "same_prompts": trl_prompts == ours.prompts,
            "length_min": min((a for a, _ in cb.lengths), default=math.nan),
            "length_max": max((b for _, b in cb.lengths), default=math.nan)}


# ------------------------------------------------------------------------------------------ main
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="torch threads (both sides)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per side")
    p.add_argument("--steps", type=int, default=5, help="timed steps per side (median reported)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--model", default="tiny",
                   help="tiny (a 4-block Qwen2 built here) or a local HF directory / .gguf file (e.g. SmolLM2-135M)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per sample (forced: EOS masked until then)")
    p.add_argument("--skip-trl", action="store_true", help="time only rlgrad")
    p.add_argument("--engine", default="auto", choices=("auto", "hf", "native"), help="rlgrad's rollout.engine")
    p.add_argument("--recompute-log-probs", action="store_true",
                   help="rlgrad: old log-probs from a separate forward (rollout.recompute_log_probs=true)")
    p.add_argument("--profile", help="write a cProfile of our timed steps here (TRL's to PATH.trl)")
    return p


def main(argv=None) -> None:
    args = _parser().parse_args(argv)

    warnings.filterwarnings("ignore")
    try:  # no "Loading weights" / "Writing model shards" bars between the results
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    root = Path(tempfile.mkdtemp(prefix="rlgrad-bench-"))
    try:
        model_dir = build_model_dir(root, args)
        print(f"torch {torch.__version__}, threads={args.threads}, {args.prompts} prompts x {args.samples} "
              f"samples x {args.tokens} tokens, warmup={args.warmup}, timed steps={args.steps}", flush=True)

        ours = RLGradSide(model_dir, root, args)
        try:
            res = None if args.skip_trl else run_trl(model_dir, root, args, ours)
            while ours.done < args.warmup + args.steps:  # TRL skipped or missing: ours alone
                ours.step()
        finally:
            ours.close()
        if args.skip_trl:
            print("TRL skipped (--skip-trl)")
        from rlgrad.rl.rollout import resolve_engine

        m = ours.metrics
        ours_med = statistics.median(ours.times)
        engine = resolve_engine(ours.trainer.actor, ours.trainer.cfg.rollout.engine)
        print(f"rlgrad (engine {engine}, old log-probs "
              f"{'recomputed' if args.recompute_log_probs else 'from the rollout'}): steps "
              f"{[round(t, 3) for t in ours.times]} s, median {ours_med:.3f} s; "
              f"response_length min/max {m.get('response_length/min')}/{m.get('response_length/max')}; "
              "median phases: " + ", ".join(f"{k}={statistics.median(p[k] for p in ours.phases):.3f}"
                                            for k in ours.phases[-1]), flush=True)
        trl_med = math.nan
        if res is not None:
            trl_med = statistics.median(res["times"])
            pair = statistics.median(a / b for a, b in zip(ours.times, res["times"]))
            print(f"trl {res['trl_version']}: steps {[round(t, 3) for t in res['times']]} s, median {trl_med:.3f} s; "
                  f"completion_length min/max {res['length_min']}/{res['length_max']}; "
                  f"median of per-pair ratios {pair:.3f}; same prompts as ours each step: {res['same_prompts']}",
                  flush=True)
        spread = max(max(t) / min(t) for t in [ours.times] + ([res["times"]] if res else []))
        if spread > 1.5:
            print(f"warning: step times vary {spread:.1f}x within a side: the machine is busy (other processes); "
                  "the medians are unreliable, the per-pair ratio above less so. Rerun on an idle machine, "
                  "with more --steps, or with --threads 1 (less hurt by oversubscribed cores).", flush=True)
        if res is not None:
            ours_cpu, trl_cpu = statistics.median(ours.cpu_times), statistics.median(res["cpu_times"])
            print(f"cpu time: rlgrad_step_cpu_s={ours_cpu:.4f} trl_step_cpu_s={trl_cpu:.4f} "
                  f"ratio={ours_cpu / trl_cpu:.3f}", flush=True)
        ratio = ours_med / trl_med if trl_med == trl_med else math.nan
        print(f"rlgrad_step_s={ours_med:.4f} trl_step_s={trl_med:.4f} ratio={ratio:.3f}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
