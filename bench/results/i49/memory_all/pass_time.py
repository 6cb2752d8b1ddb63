"""What forming the entropy's softmax again in its backward (``logprobs.softmax_recomputed``, on in the engine's
passes) costs in time: the three-term prompt-group pass (``all``) with it and with the softmax kept, alternating, on
the Llama of SmolLM2's shapes of all_pass_memory.py (random weights, the same batch).

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/results/i49/memory_all/pass_time.py LAYERS [PAIRS]
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # bench/
from analysis_cost import smollm2_shaped  # noqa: E402

from rlgrad.algos.logprobs import softmax_recomputed  # noqa: E402
from rlgrad.algos.objective import ActorLoss, LossSettings  # noqa: E402
from rlgrad.analysis import engine  # noqa: E402
from rlgrad.analysis.groups import group_pass  # noqa: E402


def main() -> None:
    layers, pairs = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 5
    torch.set_num_threads(1)
    model, batch = smollm2_shaped(layers)
    loss = ActorLoss(LossSettings(use_kl_loss=True, kl_loss_coef=0.001, entropy_coeff=0.001, horizon=32))
    times: dict[str, list[float]] = {"recomputed": [], "kept": []}
    for i in range(pairs + 1):  # the first pair warms up
        for name, ctx in (("recomputed", softmax_recomputed), ("kept", nullcontext)):
            engine.softmax_recomputed = ctx
            t0 = time.perf_counter()
            group_pass(model, batch, loss)
            if i:
                times[name].append(time.perf_counter() - t0)
    engine.softmax_recomputed = softmax_recomputed
    r, k = statistics.median(times["recomputed"]), statistics.median(times["kept"])
    print(f"layers {layers}, {pairs} pairs: pass (all) median {r:.2f} s recomputed, {k:.2f} s kept ({r / k:.3f}x); "
          f"recomputed {[round(t, 2) for t in times['recomputed']]}, kept {[round(t, 2) for t in times['kept']]}")


if __name__ == "__main__":
    main()
