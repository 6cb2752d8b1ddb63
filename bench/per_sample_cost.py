"""Cost of the per-sample analysis (``analyse_per_sample``: per-sample norms + noise metrics) against one plain
actor update (forward + backward of the full loss + an AdamW step), in one process run.

The batch and model of bench/analysis_cost.py (16 prompt groups x 8 samples, 16 prompt + up to 48 response tokens,
a ~4M-parameter Qwen2), or ``--smollm2 PATH`` (a local SmolLM2-135M directory or .gguf). ``--terms task`` measures
the policy loss alone (one backward), ``--terms all`` task + entropy + KL (three backwards: the engine takes one
per term, the update one for their sum).

    python bench/per_sample_cost.py [--repeats 5] [--threads N] [--terms task|all] [--device cpu|cuda]

Prints the interleaved times and ``per_sample/update=...``; on CUDA also the peak memory of each (``peak_MiB``).
Target (issue 32): <= 1.3x one update.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analysis_cost import bench_batch, bench_model, interleaved_times  # noqa: E402  (the same batch as the bucket-analysis benchmark)

from rlgrad.algos.aggregation import Denominators  # noqa: E402
from rlgrad.algos.objective import LossSettings, actor_objective  # noqa: E402
from rlgrad.analysis.per_sample import analyse_per_sample  # noqa: E402


def _model(args):
    if not args.smollm2:
        return bench_model()
    from rlgrad.models import load_pretrained, resolve_model_path

    return load_pretrained(resolve_model_path(args.smollm2))


def _peak_mib(fn, device: torch.device) -> float:
    """Peak CUDA memory of one call above what was allocated before it (NaN on CPU)."""
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2 ** 20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--terms", choices=("task", "all"), default="all")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--smollm2", default=None, help="a local SmolLM2-135M directory or .gguf, not the bench model")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, tok = _model(args)
    model = model.to(device)
    batch = bench_batch(len(tok)).to(device)
    everything = args.terms == "all"
    s = LossSettings(use_kl_loss=everything, kl_loss_coef=0.001, entropy_coeff=0.001 if everything else 0.0,
                     horizon=48)
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
    print(f"model {params / 1e6:.2f}M params, batch {len(batch)} x {batch.input_ids.shape[1]} tokens, "
          f"terms {args.terms}, device {device}, threads {torch.get_num_threads()}")
    print(f"peak_MiB update={_peak_mib(plain_update, device):.0f} per_sample={_peak_mib(per_sample, device):.0f}")
    print(f"per_sample/update={ratio:.2f}")


if __name__ == "__main__":
    main()
