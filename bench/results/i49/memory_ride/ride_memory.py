"""Where the riding task-term pass's extra memory goes, on a Llama of SmolLM2-135M's shapes (width 576, MLP 1536,
9/3 heads, tied 49,152-word vocabulary) with fewer layers and random weights: the peak resident set (as
bench/always_on_cost.py --memory reads it) of one actor update over 4 groups x 8 samples of 60 prompt + up to 32
response tokens in ONE micro-batch (``actor.ppo_micro_batch_size=32``), plain and with the task-term instruments
(buckets, components, per-sample norms) riding on it (``groups.UpdatePass``), as the trainer runs them.

    MALLOC_MMAP_THRESHOLD_=65536 PYTHONPATH=src python bench/results/i49/memory_ride/ride_memory.py LAYERS [PARTS]

Parts (``PARTS``, comma-separated, default all): ``plain`` (the update alone), ``ride`` (the update with the pass
riding, then the instruments' ``after_update``), ``ride_update`` (the riding update alone, its ``GroupPass`` kept),
``after`` (``after_update`` alone, of a pass kept before).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # bench/
from analysis_cost import bench_batch  # noqa: E402
from per_sample_cost import peak_mb  # noqa: E402

from rlgrad.algos.objective import LossSettings  # noqa: E402
from rlgrad.analysis import hooks_from_config  # noqa: E402
from rlgrad.config.load import load_config  # noqa: E402
from rlgrad.hooks import HookRunner, StepContext  # noqa: E402
from rlgrad.rl.actor import update_actor  # noqa: E402

WEIGHTS = {"correctness": 0.9, "format": 0.1}
TASK = ["analysis.buckets.every=1", "analysis.components.every=1", "analysis.per_sample.every=1",
        "analysis.per_sample.terms=[task]", "analysis.buckets.num_buckets=4"]


def main() -> None:
    layers = int(sys.argv[1])
    parts = sys.argv[2].split(",") if len(sys.argv) > 2 else ["plain", "ride", "ride_update", "after"]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                         num_hidden_layers=layers, num_attention_heads=9, num_key_value_heads=3,
                                         tie_word_embeddings=True, max_position_embeddings=2048))
    batch = bench_batch(49152, groups=4, n=8, prompt=60, response=32)
    g = torch.Generator().manual_seed(1)
    batch.components = {"correctness": (torch.rand(len(batch), generator=g) < 0.5).float(),
                        "format": torch.rand(len(batch), generator=g)}
    s = LossSettings(horizon=32)  # the task term alone: the pass rides
    cfg = load_config(overrides=TASK)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    runner = HookRunner(hooks_from_config(cfg))
    step = [0]
    run_dir = Path(tempfile.mkdtemp())  # the instruments write their step files, as in the trainer

    def ctx() -> StepContext:
        step[0] += 1
        return StepContext(step=step[0], batch=batch, actor=model, optimizer=optimizer, loss_settings=s, config=cfg,
                           run_dir=run_dir, reward_weights=WEIGHTS, one_pass_update=True)

    def update(tap=None) -> None:
        update_actor(model, optimizer, batch, s, ppo_epochs=1, mini_batch_size=len(batch),
                     micro_batch_size=len(batch), max_grad_norm=1.0, shuffle=True, seed=0, tap=tap)

    def ride_update(c: StepContext) -> None:
        assert not runner.before_update(c).metrics  # riding: nothing measured before the update
        tap = runner.update_tap(c)
        assert tap is not None
        update(tap)

    def ride() -> None:
        c = ctx()
        ride_update(c)
        runner.after_update(c)

    kept: list[StepContext] = []

    def ride_update_only() -> None:
        kept.append(ctx())
        ride_update(kept[-1])

    def after() -> None:
        runner.after_update(kept.pop())

    update()
    ride()  # warm-ups: the optimizer's states, allocator pools
    cpu = torch.device("cpu")
    params = sum(p.numel() for p in model.parameters())
    print(f"layers {layers}: params {params / 1e6:.1f}M fp32 {params * 4 / 2 ** 20:.0f} MB; rows {len(batch)} x "
          f"{batch.input_ids.shape[1]} tokens, one micro-batch")
    for part in parts:
        for rep in range(2):
            if part == "after":
                ride_update_only()
            mb = peak_mb({"plain": update, "ride": ride, "ride_update": ride_update_only, "after": after}[part], cpu)
            kept.clear()
            print(f"{part} ({rep + 1}/2): peak +{mb:.0f} MB", flush=True)


if __name__ == "__main__":
    main()
