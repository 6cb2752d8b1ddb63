"""Cost of the bucket gradient analysis against one plain actor update, in one process run.

Default bench batch: 16 prompt groups x 8 samples = 128 samples, 16 prompt + 48 response tokens,
6 quantile buckets + all, 3 components (task, entropy, KL), a ~4M-parameter Qwen2, CPU.

    python bench/analysis_cost.py [--repeats 5] [--threads N]

Prints the times (interleaved rounds) of one plain actor update (forward + backward of the full loss), of
analysis.method=fast and of analysis.method=reference, and ends with the median per-round ratios
``fast/update=... reference/fast=...``. Targets: fast <= 2.5x one update, reference/fast >= 3.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rlgrad.algos.advantages import group_reward_std, grpo_advantages
from rlgrad.algos.aggregation import Denominators
from rlgrad.algos.objective import LossSettings, actor_objective
from rlgrad.analysis.buckets import analyse_buckets
from rlgrad.batch import Batch
from rlgrad.config.model import ModelConfig, TinyModelConfig
from rlgrad.models import build_char_tokenizer, build_tiny_model


def bench_batch(vocab: int, groups: int = 16, n: int = 8, prompt: int = 16, response: int = 48) -> Batch:
    g = torch.Generator().manual_seed(0)
    N, L = groups * n, prompt + response
    ids = torch.randint(3, vocab, (N, L), generator=g)
    att = torch.ones(N, L, dtype=torch.long)
    resp = torch.zeros(N, L)
    resp[:, prompt:] = 1.0
    # Responses of varying length: some stop early (rest is padding after EOS).
    lengths = torch.randint(response // 2, response + 1, (N,), generator=g)
    for i, ln in enumerate(lengths.tolist()):
        resp[i, prompt + ln:] = 0
        att[i, prompt + ln:] = 0
    gids = torch.arange(groups).repeat_interleave(n)
    spread = torch.linspace(0, 1, groups).repeat_interleave(n)  # groups from zero to high variance
    scores = (torch.rand(N, generator=g) < 0.5).float() * spread
    b = Batch(
        input_ids=ids, attention_mask=att, response_mask=resp, group_ids=gids, scores=scores,
        reward_std=group_reward_std(scores, gids))
    noise = torch.randn(N, L, generator=g) * 0.01
    b.old_log_probs = (-2.0 + noise) * resp
    b.ref_log_probs = (-2.0 - noise) * resp
    b.advantages = grpo_advantages(scores, gids, norm_by_std=True)[:, None] * resp
    return b


def smollm2_shaped(layers: int) -> tuple[torch.nn.Module, Batch]:
    """A random Llama of SmolLM2-135M's shapes (width 576, MLP 1536, 9 / 3 heads, tied 49,152-word vocabulary) with
    ``layers`` layers (seed 0), and 4 prompt groups x 8 samples of 60 prompt + up to 32 response tokens: the model
    and batch of the memory studies under bench/results/i49/."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                         num_hidden_layers=layers, num_attention_heads=9, num_key_value_heads=3,
                                         tie_word_embeddings=True, max_position_embeddings=2048))
    return model, bench_batch(49152, groups=4, n=8, prompt=60, response=32)


def bench_model():
    """(model, tokenizer): the ~4M-parameter Qwen2 every analysis benchmark measures (5 blocks, width 256)."""
    tok = build_char_tokenizer()
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=256, num_hidden_layers=5, num_attention_heads=4,
                                           num_key_value_heads=2, intermediate_size=768))
    return build_tiny_model(cfg, tok, seed=0), tok


def interleaved_times(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Warm each function up once, then time them in interleaved rounds (all share whatever else the
    machine is doing, so per-round ratios move less than single times); prints each one's median."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    width = max(map(len, fns))
    for name, ts in times.items():
        print(f"{name:>{width}}: median {statistics.median(ts):.3f} s over {repeats} "
              f"(all: {', '.join(f'{t:.3f}' for t in ts)})")
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = bench_model()
    params = sum(p.numel() for p in model.parameters())
    batch = bench_batch(len(tok))
    s = LossSettings(use_kl_loss=True, kl_loss_coef=0.001, entropy_coeff=0.001, horizon=48)

    def plain_update():
        model.zero_grad(set_to_none=True)
        actor_objective(model, batch, s, Denominators.of(batch)).total(s).backward()
        model.zero_grad(set_to_none=True)

    def run(method):
        return lambda: analyse_buckets(model, batch, s, num_buckets=6, method=method)

    fns = {"update": plain_update, "fast": run("fast"), "reference": run("reference")}
    times = interleaved_times(fns, args.repeats)
    fast_update = statistics.median(f / u for f, u in zip(times["fast"], times["update"]))
    ref_fast = statistics.median(r / f for r, f in zip(times["reference"], times["fast"]))
    rep = analyse_buckets(model, batch, s, num_buckets=6, method="fast")
    print(f"model {params / 1e6:.2f}M params, batch {len(batch)} x {batch.input_ids.shape[1]} tokens, "
          f"buckets {rep.buckets.names}, components {sorted(rep.stats.gram)}, threads {torch.get_num_threads()}")
    print(f"fast/update={fast_update:.2f} reference/fast={ref_fast:.2f}")


if __name__ == "__main__":
    main()
