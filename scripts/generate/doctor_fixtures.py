"""Regenerate the runs with known faults that tests/doctor/test_doctor.py diagnoses (tests/data/doctor/<name>/).

    .venv/bin/python scripts/generate/doctor_fixtures.py [NAME ...]     # all of them by default, a minute or two each
    .venv/bin/python scripts/generate/doctor_fixtures.py --threads 1 NAME  # on a shared machine: one torch thread
    .venv/bin/python scripts/generate/doctor_fixtures.py --sweep runs/noise_sweep batch_small  # from a trained sweep

Each is a short rlgrad run of the demo (GRPO on the embedded default model) with one thing wrong; only its
small files are kept (metrics.jsonl, config.yaml, the analysis JSON/CSV files), not checkpoints or rollouts (but
the last 3 rollout files of the runs whose finding reads them).
The runs of issue 37 use its cadence (validation every 2 steps, the instruments every 4: ``ISSUE37``) and stop
once their fault has shown. The runs train with this interpreter's rlgrad (``python -m rlgrad``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "doctor"
BASE = ["--config-name", "demo", "trainer.total_training_steps=30", "trainer.test_freq=10", "trainer.save_freq=-1",
        "analysis.every=10", "trainer.logger=[jsonl]", "trainer.num_threads=2"]
NOISY = [f"reward.custom_reward_function.path={ROOT / 'bench' / 'lead_time_rewards.py'}",
         "reward.custom_reward_function.name=noisy", "reward.weights={correctness: 0.9, format: 0.1}"]
# name -> (the fault's overrides, the finding tests/doctor/test_doctor.py expects)
RUNS = {
    "healthy": ([], None),
    "lr_too_low": (["actor.optim.lr=1e-8"], "lr_too_small"),
    "tiny_grad_clip": (["actor.max_grad_norm=0.001"], "clip_every_step"),
    "std_norm_binary": (["algorithm.norm_adv_by_std_in_grpo=true", "reward.weights={correctness: 1.0, format: 0.0}"],
                        "std_normalisation_amplifies"),
    # the instruments every 2 steps: component_dominates judges from a share of the analysis steps, not one
    "format_heavy": (["reward.weights={correctness: 0.1, format: 0.9}", "analysis.every=2"], "component_dominates"),
    # ... and its advice followed: format's weight lowered to the task's default (0.9 / 0.1), at the same cadence
    "format_heavy_followed": (["analysis.every=2"], None),
    "kl_explodes": (["actor.use_kl_loss=true", "actor.kl_loss_coef=1.0", "actor.kl_loss_type=mse",
                     "actor.optim.lr=3e-3"], "kl_blowup"),
    # a policy pushed to determinism: an entropy *penalty* (a negative bonus) on a weakly warm-started model
    "entropy_collapse": (["model.warmstart_steps=200", "actor.entropy_coeff=-1.0", "actor.optim.lr=5e-4"],
                         "entropy_collapse"),
    "lr_too_high": (["actor.optim.lr=3e-3", "actor.optim.lr_warmup_steps=0"], "reward_collapse"),
    "zero_variance": (["model.warmstart_steps=0"], "zero_variance_groups"),
}
ISSUE37 = ["trainer.test_freq=2", "trainer.val_before_train=true", "analysis.every=4"]
RUNS |= {
    # the demo as it is (healthy) and on a weakly warm-started model (a low, noisy start): no finding at any step
    "healthy_issue37": ([*ISSUE37, "trainer.total_training_steps=30"], None),
    "weak_start": ([*ISSUE37, "trainer.total_training_steps=30", "model.warmstart_steps=200"], None),
    # the demo under two more seeds (issue 33: no critical finding at any step of 3 healthy seeds)
    "healthy_seed2": ([*ISSUE37, "trainer.total_training_steps=30", "trainer.seed=2"], None),
    "healthy_seed3": ([*ISSUE37, "trainer.total_training_steps=30", "trainer.seed=3"], None),
    # destroyed in 2 steps: the learning rate 30x the preset's, no warm-up
    "lr_fast_collapse": ([*ISSUE37, "trainer.total_training_steps=12", "actor.optim.lr=3e-3",
                          "actor.optim.lr_warmup_steps=0"], "reward_collapse"),
    # ... and with update_too_large's advice followed: the learning rate ~20x lower (still no warm-up)
    "lr_fast_collapse_followed": ([*ISSUE37, "trainer.total_training_steps=12", "actor.optim.lr=1.4e-4",
                                   "actor.optim.lr_warmup_steps=0"], None),
    # 10x below the preset: learns nothing in 20 steps (the preset gains ~0.3 validation accuracy by step 20)
    "lr_slow": ([*ISSUE37, "trainer.total_training_steps=20", "actor.optim.lr=1e-5"], "lr_too_small"),
    # every response cut at 2 tokens
    "truncated": ([*ISSUE37, "trainer.total_training_steps=12", "rollout.response_length=2"], "length_truncated"),
    # an entropy penalty drives the collapse (with a learning rate 5x the preset's)
    "entropy_penalty": ([*ISSUE37, "trainer.total_training_steps=20", "model.warmstart_steps=200",
                         "actor.entropy_coeff=-0.5", "actor.optim.lr=5e-4"], "regularizer_dominates"),
    # ... and the same run with its advice followed (entropy_coeff 0)
    "entropy_penalty_removed": ([*ISSUE37, "trainer.total_training_steps=20", "model.warmstart_steps=200",
                                 "actor.entropy_coeff=0", "actor.optim.lr=5e-4"], None),
    # correctness paid negatively
    "reward_inverted": ([*ISSUE37, "trainer.total_training_steps=16",
                         "reward.weights={correctness: -0.9, format: 0.1}"], "inverted_reward"),
}
# Issue 33: each finding's advice followed. A fault, 20 steps with validation every 5 (the instruments every 10),
# and the same run with the finding's advice applied (``*_followed``); tests/doctor/test_advice_followed.py.
ADVICE = ["trainer.total_training_steps=20", "trainer.test_freq=5", "trainer.val_before_train=true"]
KL_MSE = ["actor.use_kl_loss=true", "actor.kl_loss_coef=1.0", "actor.kl_loss_type=mse"]
FAULTY_REWARDS = Path(__file__).resolve().parent / "doctor_fixture_rewards.py"  # the faults' reward functions
SENTINEL = [f"reward.custom_reward_function.path={FAULTY_REWARDS}",
            "reward.custom_reward_function.name=worst_sentinel", "reward.weights={correctness: 1.0}"]
JACKPOT = [f"reward.custom_reward_function.path={FAULTY_REWARDS}",
           "reward.custom_reward_function.name=jackpot", "reward.weights={correctness: 0.9, format: 0.1}"]
LENGTH_RUN = ["trainer.total_training_steps=40", "trainer.test_freq=10", "model.warmstart_steps=0",
              "actor.optim.lr=1e-3", "reward.overlong_buffer.enable=true"]
CLIP_NARROW = ["actor.clip_ratio_low=0.01", "actor.clip_ratio_high=0.01"]
MANY_STEPS = ["actor.ppo_epochs=8", "actor.ppo_mini_batch_size=4"]
CLIP_RUN = ["model.warmstart_steps=200", "actor.optim.lr=3e-4",
            f"reward.custom_reward_function.path={ROOT / 'bench' / 'lead_time_rewards.py'}",
            "reward.custom_reward_function.name=noisy", "reward.weights={correctness: 0.9, format: 0.1}"]
BREVITY = ["trainer.total_training_steps=30", "trainer.test_freq=5", "trainer.val_before_train=true",
           "analysis.every=4",
           f"reward.custom_reward_function.path={ROOT / 'bench' / 'lead_time_rewards.py'}",
           "reward.custom_reward_function.name=brevity", "reward.weights={correctness: 1.0, brevity: 1.0}"]
RUNS |= {
    # a KL loss at the learning rate 30x the preset's: the KL runs away (kl_blowup) ...
    "kl_lr_high": ([*ADVICE, *KL_MSE, "actor.optim.lr=3e-3"], "kl_blowup"),
    # ... and with its advice followed, the learning rate lowered (to the preset's)
    "kl_lr_high_followed": ([*ADVICE, *KL_MSE, "actor.optim.lr=1e-4"], None),
    # a KL coefficient 50 000x the preset's: the KL term's gradient outweighs the task's (regularizer_dominates) ...
    "kl_coef_huge": ([*ADVICE, "actor.use_kl_loss=true", "actor.kl_loss_coef=50"], "regularizer_dominates"),
    # ... and with kl_loss_coef lowered (to the preset's)
    "kl_coef_huge_followed": ([*ADVICE, "actor.use_kl_loss=true", "actor.kl_loss_coef=0.001"], None),
    # std_norm_binary with its advice followed (norm_adv_by_std_in_grpo=false, Dr. GRPO; rlgrad's default)
    "std_norm_binary_followed": (["algorithm.norm_adv_by_std_in_grpo=false",
                                  "reward.weights={correctness: 1.0, format: 0.0}"], None),
    # entropy_collapse with its advice followed (the entropy penalty removed: entropy_coeff 0)
    "entropy_collapse_followed": (["model.warmstart_steps=200", "actor.entropy_coeff=0", "actor.optim.lr=5e-4"],
                                  None),
    # a clip range 20x narrower than the usual (±0.01) under 32 optimizer steps a batch (8 epochs of 4 mini-batches)
    # at lr 3e-4, on the weakly warm-started model with a noisy verifier (every group has a signal): ~0.38 of the
    # tokens clipped. That is near the demo's ceiling (the preset's ±0.2 with 16 steps a batch stayed at or below
    # 0.25 even at lr 1e-3), under Thresholds.clipfrac_high (0.4): tests read it with that threshold at 0.3 ...
    "clip_narrow": ([*ADVICE, *CLIP_RUN, *CLIP_NARROW, *MANY_STEPS], "clipfrac_saturated"),
    # ... with its advice followed: the clip range widened to the usual ±0.2
    "clip_narrow_followed": ([*ADVICE, *CLIP_RUN, *MANY_STEPS], None),
    # ... and with the other advice, one optimizer step a batch (the narrow clip kept)
    "clip_narrow_one_step": ([*ADVICE, *CLIP_RUN, *CLIP_NARROW], None),
    # ... and with update_too_large's advice, which the doctor says to act on first: the learning rate ~17x lower
    "clip_narrow_lr_lowered": ([*ADVICE, *CLIP_RUN, *CLIP_NARROW, *MANY_STEPS, "actor.optim.lr=1.8e-5"], None),
    # a reward for short bare integers that outpays correctness (bench/lead_time_rewards.py's brevity at its weight
    # 4): its component takes the update over against correctness, and validation does not rise in 30 steps ...
    "brevity_takeover": ([*BREVITY], "component_takes_over"),
    # ... and with that weight lowered 10x where the reward function computes it (a custom reward function's score
    # is its own: reward.weights only splits it into components)
    "brevity_takeover_followed": ([*BREVITY, "reward.custom_reward_function.reward_kwargs={weight: 0.4}"], None),
    # a reward function scoring an answer that is not a bare integer -sys.float_info.max (a "worst" sentinel):
    # finite, but the batch's sums overflow, and the steps holding such an answer have a non-finite loss ...
    "reward_overflow": ([*ADVICE, *SENTINEL], "nonfinite_steps"),
    # ... and with that sentinel replaced by 0 (the reward function fixed, as the finding says)
    "reward_overflow_followed": ([*ADVICE, *SENTINEL, "reward.custom_reward_function.reward_kwargs={worst: 0.0}"],
                                 None),
    # a verifier that now and then (0.3% of samples) returns a raw score of 1000, with gradient clipping off
    # (max_grad_norm 1e6): gradient-norm spikes of 30-400x whose unclipped steps inflate AdamW's second moment ...
    "jackpot_unclipped": ([*ADVICE, *JACKPOT, "actor.max_grad_norm=1e6"], "grad_norm_spike"),
    "jackpot_unclipped_seed3": ([*ADVICE, *JACKPOT, "actor.max_grad_norm=1e6", "trainer.seed=3"], "grad_norm_spike"),
    # ... and with grad_norm_spike's advice followed: max_grad_norm on (the preset's 1.0)
    "jackpot_unclipped_followed": ([*ADVICE, *JACKPOT], None),
    "jackpot_unclipped_seed3_followed": ([*ADVICE, *JACKPOT, "trainer.seed=3"], None),
    # an overlong penalty whose buffer (7 tokens) covers all but the first token of the 8-token budget, on the model
    # without its warm start (it writes ~7.7 tokens of noise), at lr 1e-3: responses shrink to ~1 token ...
    "length_squeezed": ([*LENGTH_RUN, "reward.overlong_buffer.len=7"], "length_collapse"),
    # (not kept: the same at rlgrad's default buffer, 4 of 8, collapsed alike, 1.16 tokens at step 40; with the
    # penalty off it shrank slower, 2.7 at step 40, the format reward paying for short bare integers)
    # lr_too_high's responses run into the length limit (length_runaway) ... with an overlong penalty
    "length_runaway_followed": (["actor.optim.lr=3e-3", "actor.optim.lr_warmup_steps=0",
                                 "reward.overlong_buffer.enable=true"], None),
    # ... whose neurons go dormant (dormant_growing, under update_too_large): the same with the learning rate lowered
    "dormant_followed": (["actor.optim.lr=1e-4", "actor.optim.lr_warmup_steps=0",
                          "reward.overlong_buffer.enable=true"], None),
    # 512 prompts x 8 samples a step (4,096 samples, ~14x B_simple) for 12 steps, the per-sample analysis every 5:
    # batch_above_noise_scale; its advice followed is issue 32's sweep run at 32 x 8 (batch_large_followed)
    "batch_large": (["data.train_batch_size=512", "trainer.total_training_steps=12", "trainer.test_freq=2",
                     "analysis.every=null", "analysis.per_sample.every=5", "analysis.per_sample.proxy_corr=false"],
                    "batch_above_noise_scale"),
    # a verifier that flips the correctness verdict on 40% of the samples (bench/lead_time_rewards.py's ``noisy``) ...
    "noisy_verifier": ([*NOISY, "reward.custom_reward_function.reward_kwargs={flip: 0.4}"], "noisy_verifier"),
    # ... and the same verifier made deterministic, as noisy_verifier advises
    "noisy_verifier_followed": ([*NOISY, "reward.custom_reward_function.reward_kwargs={flip: 0.0}"], None),
}
KEEP = ("layers.json", "neurons.json", "components.json", "group_rv_table.csv")
KEEP_ROLLOUTS = 3  # the last rollout files of the runs whose finding reads them (noisy_verifier)


def make(name: str) -> None:
    overrides, _ = RUNS[name]
    with tempfile.TemporaryDirectory(prefix=f"rlgrad-doctor-{name}-") as tmp:
        run = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "rlgrad", "train", *BASE, *overrides, f"trainer.default_local_dir={run}",
               *([f"trainer.num_threads={THREADS}"] if THREADS else [])]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"{name}: rlgrad train failed:\n{res.stderr[-2000:]}")
        dest = OUT / name
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for f in ("metrics.jsonl", "config.yaml"):
            shutil.copy(run / f, dest / f)
        for step_dir in sorted((run / "analysis").glob("step_*")):
            for f in KEEP:
                if (step_dir / f).exists():
                    (dest / "analysis" / step_dir.name).mkdir(parents=True, exist_ok=True)
                    shutil.copy(step_dir / f, dest / "analysis" / step_dir.name / f)
        if name.startswith("noisy_verifier"):
            for f in sorted((run / "rollouts").glob("step_*.jsonl"), key=lambda f: int(f.stem[5:]))[-KEEP_ROLLOUTS:]:
                (dest / "rollouts").mkdir(exist_ok=True)
                shutil.copy(f, dest / "rollouts" / f.name)
        print(f"{name}: {dest}")


def shorter(prompts, completions, **kw):
    return [-len(c) / 8 for c in completions]


def always_right(prompts, completions, **kw):  # every group agrees: TRL's frac_reward_zero_std is 1
    return [1.0 for _ in completions]


# name -> (its reward function, learning rate)
TRL_RUNS = {"trl_lr_too_low": (shorter, 1e-8), "trl_too_easy": (always_right, 1e-6)}


def make_trl(name: str = "trl_lr_too_low") -> None:
    """A plain TRL GRPOTrainer run (no rlgrad): its trainer_state.json. ``trl_lr_too_low``: a learning rate far too
    low; ``trl_too_easy``: a reward of 1 for every completion (no group has a signal)."""
    reward, lr = TRL_RUNS[name]
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    from rlgrad.config.model import ModelConfig, TinyModelConfig
    from rlgrad.models import build_char_tokenizer, build_tiny_model
    from rlgrad.tasks import build_task

    with tempfile.TemporaryDirectory(prefix="rlgrad-doctor-trl-") as tmp:
        tok = build_char_tokenizer()
        cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                               num_key_value_heads=1, intermediate_size=64))
        build_tiny_model(cfg, tok, 1).save_pretrained(Path(tmp) / "model")
        tok.save_pretrained(Path(tmp) / "model")
        import random

        rows = build_task("arithmetic", seed=1, val_size=8).train_examples(64, random.Random(1))
        data = datasets.Dataset.from_dict({"prompt": [r.prompt for r in rows]})

        args = GRPOConfig(output_dir=str(Path(tmp) / "out"), use_cpu=True, per_device_train_batch_size=16,
                          num_generations=4, max_completion_length=8, max_steps=24, logging_steps=1, report_to=[],
                          save_strategy="no", learning_rate=lr, disable_tqdm=True, seed=1, bf16=False)
        trainer = GRPOTrainer(model=str(Path(tmp) / "model"), reward_funcs=[reward], args=args, train_dataset=data,
                              processing_class=tok)
        trainer.train()
        dest = OUT / name
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        trainer.state.save_to_json(str(dest / "trainer_state.json"))
        print(f"{name}: {dest}")


def make_wandb(name: str = "wandb_kl_explodes.json", source: str = "kl_explodes") -> None:
    """A recorded run's metrics as W&B's ``scan_history`` returns them (``_step``, ``_runtime``, None where a key
    was not logged at a step), for ``rlgrad doctor --wandb-path`` without network."""
    import json

    rows: dict[int, dict] = {}
    for line in (OUT / source / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows.setdefault(r["step"], {}).update(r["data"])
    keys = sorted({k for d in rows.values() for k in d})
    history = [{"_step": s, "_runtime": 1.5 * s, **{k: rows[s].get(k) for k in keys}} for s in sorted(rows)]
    (OUT / name).write_text(json.dumps(history) + "\n")
    print(f"{name}: {OUT / name}")


# Issue 32's sweep (scripts/experiments/noise_sweep.py, docs/noise_scale.md) at lr 1e-3, K = 8: name -> (B prompts,
# seed). N = 64 (seed 1) fires batch_below_noise_scale; N = 256 is its advice followed (the batch grown toward
# B_simple, the learning rate kept). Validation every 1-2 steps on 128 prompts, the per-sample analysis at steps 1,
# 11, 21.
# The same 8 prompts at the preset's lr 1e-4 (the sweep's default runs, to step 30): val_falls's advice followed.
SWEEP_RUNS = {"batch_small": (8, 1), "batch_small_seed2": (8, 2),
              "batch_small_followed": (32, 1), "batch_small_followed_seed2": (32, 2),
              "batch_small_lr_lowered": (8, 1, None), "batch_small_lr_lowered_seed2": (8, 2, None),
              "batch_large_followed": (32, 1, None)}


def make_sweep(name: str, source: Path | None = None) -> None:
    """Train one run of scripts/experiments/noise_sweep.py (``run --lr 1e-3``, or its default lr: it stops at
    validation 0.85 or once collapsed) and keep its metrics.jsonl and config.yaml; ``--sweep DIR``: copy that run
    from a sweep already trained in DIR (runs/noise_sweep of issue 32) instead of training it again."""
    prompts, seed, lr = (*SWEEP_RUNS[name], "1e-3")[:3]
    run_name = f"B{prompts}_K8_s{seed}" + (f"_lr{float(lr)}" if lr else "")
    with tempfile.TemporaryDirectory(prefix=f"rlgrad-doctor-{name}-") as tmp:
        if source is None:
            source = Path(tmp)
            cmd = [sys.executable, str(ROOT / "scripts" / "experiments" / "noise_sweep.py"), "run", "--out", tmp,
                   *(["--lr", lr] if lr else []), "--seeds", str(seed), "--only", f"B{prompts}_K8_",
                   "--samples", str(prompts * 8)]
            subprocess.run(cmd, check=True)
        dest = OUT / name
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for f in ("metrics.jsonl", "config.yaml"):
            shutil.copy(source / run_name / f, dest / f)
    print(f"{name}: {dest}")


THREADS = None  # --threads N: torch threads of each run (BASE's 2 otherwise)

if __name__ == "__main__":
    names = sys.argv[1:]
    if names[:1] == ["--threads"]:
        THREADS, names = int(names[1]), names[2:]
    sweep = None
    if names[:1] == ["--sweep"]:
        sweep, names = Path(names[1]), names[2:]
    for n in names or [*RUNS, *TRL_RUNS, *SWEEP_RUNS, "wandb"]:
        if n in SWEEP_RUNS:
            make_sweep(n, sweep)
        else:
            make_trl(n) if n.startswith("trl") else make_wandb() if n == "wandb" else make(n)
