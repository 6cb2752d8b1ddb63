"""Cost of the reward-component gradient geometry against one plain actor update, in one process run.

The batch of bench/analysis_cost.py (16 prompt groups x 8 samples = 128 samples, 16 prompt + up to 48
response tokens, a ~4M-parameter Qwen2, CPU) with three reward components (correctness, format, length;
weights 0.34 / 0.33 / 0.33) and rldynamic's run_grpo.sh loss (PPO clip, token-mean, k3 KL 0.001, no entropy bonus).

    python bench/component_cost.py [--repeats 5] [--threads N] [--mode shared_std|own_std]

Times, in interleaved rounds: one plain actor update (``update_actor`` with ppo_epochs=1 and one
mini-batch = one micro-batch = the whole batch: forward, backward, clipping, AdamW step) and the component
geometry (``analyse_components``, analysis.method=fast: one forward and one backward for all components
and ``total``). Ends with the median per-round ratio ``components/update=...`` (target <= 1.5).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analysis_cost import bench_batch, bench_model, interleaved_times  # noqa: E402  (the same batch as the bucket-analysis benchmark)

from rlgrad.algos.component_advantages import outcome_advantages  # noqa: E402
from rlgrad.algos.objective import LossSettings  # noqa: E402
from rlgrad.analysis.components import analyse_components
from rlgrad.rl.actor import update_actor  # noqa: E402

WEIGHTS = {"correctness": 0.34, "format": 0.33, "length": 0.33}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--mode", default="shared_std", choices=["shared_std", "own_std"])
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = bench_model()
    params = sum(p.numel() for p in model.parameters())
    batch = bench_batch(len(tok))
    g = torch.Generator().manual_seed(1)
    n = len(batch)
    batch.components = {"correctness": (torch.rand(n, generator=g) < 0.5).float(),
                        "format": torch.randint(0, 5, (n,), generator=g).float() / 4,
                        "length": torch.rand(n, generator=g)}
    batch.scores = sum(WEIGHTS[c] * v for c, v in batch.components.items())
    batch.advantages = outcome_advantages(batch.scores, batch.group_ids, "grpo", True)[:, None] * batch.response_mask
    s = LossSettings(use_kl_loss=True, kl_loss_coef=0.001, entropy_coeff=0.0, horizon=48)

    updated = copy.deepcopy(model)  # the update's own copy: the analysed weights stay fixed
    opt = torch.optim.AdamW(updated.parameters(), lr=1e-6)

    def plain_update():
        update_actor(updated, opt, batch, s, ppo_epochs=1, mini_batch_size=n, micro_batch_size=n, max_grad_norm=1.0,
                     shuffle=False, seed=0)

    def components():
        analyse_components(model, batch, s, weights=WEIGHTS, mode=args.mode, method="fast")

    fns = {"update": plain_update, "components": components}
    times = interleaved_times(fns, args.repeats)
    rep = analyse_components(model, batch, s, weights=WEIGHTS, mode=args.mode, method="fast")
    print(f"model {params / 1e6:.2f}M params, batch {n} x {batch.input_ids.shape[1]} tokens, mode {args.mode}, "
          f"slices {rep.stats.slices}, threads {torch.get_num_threads()}")
    ratio = statistics.median(c / u for c, u in zip(times["components"], times["update"]))
    print(f"components/update={ratio:.2f}")


if __name__ == "__main__":
    main()
