"""Where an analysed step's extra memory goes, on a Llama of SmolLM2-135M's shapes (width 576, MLP 1536, 9/3 heads,
tied 49,152-word vocabulary) with fewer layers and random weights: the peak resident set each part adds (as
bench/always_on_cost.py --memory reads it) at 4 groups x 8 samples of 60 prompt + up to 32 response tokens.

    MALLOC_MMAP_THRESHOLD_=65536 PYTHONPATH=src python bench/results/i49/memory_located/smollm2_shape_memory.py \
        task|all LAYERS

``all``: entropy and KL terms in the loss. Parts: a plain update (forward + backward); the per-sample pass (the
prompt-group pass of every term, the per-row norms and the buckets); neuron health's 32-row nullspace sample where
rlgrad ran it before, at the update's gradient (``on_grads``: the gradient, one fp32 model copy, is alive), alone,
and where rlgrad's trainer runs it now: before the mini-batch's forward (``before_grads``: no gradient held), the
gradient scores at ``on_grads`` (the last line also checks that both give the same Gram, bitwise).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # bench/
from analysis_cost import smollm2_shaped  # noqa: E402
from per_sample_cost import peak_mb  # noqa: E402

from rlgrad.algos.aggregation import Denominators  # noqa: E402
from rlgrad.algos.objective import ActorLoss, LossSettings, actor_objective  # noqa: E402
from rlgrad.analysis.neurons import measure, take_sample  # noqa: E402
from rlgrad.analysis.per_sample import analyse_per_sample  # noqa: E402
from rlgrad.config.analysis import NeuronHealthConfig  # noqa: E402


def main() -> None:
    terms, layers = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    model, batch = smollm2_shaped(layers)
    both = terms == "all"
    s = LossSettings(use_kl_loss=both, kl_loss_coef=0.001, entropy_coeff=0.001 if both else 0.0, horizon=32)
    cpu = torch.device("cpu")

    def update(sample: bool = False) -> None:
        model.zero_grad(set_to_none=True)
        actor_objective(model, batch, s, Denominators.of(batch)).total(s).backward()
        if sample:
            measure(model, batch, NeuronHealthConfig(), role="actor", seed=0, step=1, loss_fn=ActorLoss(s))
        model.zero_grad(set_to_none=True)

    grams = {}

    def update_sample_first() -> None:  # as rlgrad's trainer runs it: the sample at before_grads, then the update
        model.zero_grad(set_to_none=True)
        got = take_sample(model, batch, NeuronHealthConfig(), role="actor", seed=0, step=1, loss_fn=ActorLoss(s))
        actor_objective(model, batch, s, Denominators.of(batch)).total(s).backward()
        grams["before_grads"] = measure(model, batch, NeuronHealthConfig(), role="actor", seed=0, step=1,
                                        sampled=got).gram
        model.zero_grad(set_to_none=True)

    def sample_alone() -> None:
        measure(model, batch, NeuronHealthConfig(), role="actor", seed=0, step=1, loss_fn=ActorLoss(s))

    def per_sample() -> None:
        analyse_per_sample(model, batch, s, num_buckets=4)

    for warm in (update, per_sample, sample_alone):
        warm()
    params = sum(p.numel() for p in model.parameters())
    print(f"params {params / 1e6:.1f}M fp32 {params * 4 / 2 ** 20:.0f} MB; update peak +{peak_mb(update, cpu):.0f} MB;"
          f" per-sample pass ({terms}) peak +{peak_mb(per_sample, cpu):.0f} MB")
    print(f"update + sample at on_grads peak +{peak_mb(lambda: update(sample=True), cpu):.0f} MB; "
          f"sample alone (no grads) +{peak_mb(sample_alone, cpu):.0f} MB")
    model.zero_grad(set_to_none=True)
    actor_objective(model, batch, s, Denominators.of(batch)).total(s).backward()
    grams["on_grads"] = measure(model, batch, NeuronHealthConfig(), role="actor", seed=0, step=1,
                                loss_fn=ActorLoss(s)).gram
    model.zero_grad(set_to_none=True)
    print(f"sample at before_grads, then update + gradient scores at on_grads peak "
          f"+{peak_mb(update_sample_first, cpu):.0f} MB; the same Gram as at on_grads (bitwise): "
          f"{torch.equal(grams['before_grads'], grams['on_grads'])}")


if __name__ == "__main__":
    main()
