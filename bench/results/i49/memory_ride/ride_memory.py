"""Where the riding task-term pass's extra memory goes, on a Llama of SmolLM2-135M's shapes (width 576, MLP 1536,
9/3 heads, tied 49,152-word vocabulary) with fewer layers and random weights: the peak resident set (as
bench/always_on_cost.py --memory reads it) of one actor update over 4 groups x 8 samples of 60 prompt + up to 32
response tokens in ONE micro-batch (``actor.ppo_micro_batch_size=32``), plain and with the task-term instruments
(buckets, components, per-sample norms) riding on it (``groups.UpdatePass``), as the trainer runs them.

    MALLOC_MMAP_THRESHOLD_=65536 PYTHONPATH=src python bench/results/i49/memory_ride/ride_memory.py LAYERS [PARTS]

Parts (``PARTS``, comma-separated, default all): ``plain`` (the update alone), ``ride`` (the update with the pass
riding, then the instruments' ``after_update``), ``ride_update`` (the riding update alone, its ``GroupPass`` kept),
``after`` (``after_update`` alone, of a pass kept before); ``plain_at_grads`` / ``ride_at_grads``: the resident
set at the update's gradient (``on_grads``, after its backward, before the optimizer step; its graph still referenced)
over the one before the update: what outlives the backward until the graph is dropped.
"""

from __future__ import annotations

import gc
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # bench/
from analysis_cost import smollm2_shaped  # noqa: E402
from per_sample_cost import _status_mb, peak_mb  # noqa: E402

from rlgrad.algos.objective import LossSettings  # noqa: E402
from rlgrad.analysis import hooks_from_config  # noqa: E402
from rlgrad.config.load import load_config  # noqa: E402
from rlgrad.hooks import HookRunner, StepContext  # noqa: E402
from rlgrad.rl.actor import update_actor  # noqa: E402

WEIGHTS = {"correctness": 0.9, "format": 0.1}
TASK = ["analysis.buckets.every=1", "analysis.components.every=1", "analysis.per_sample.every=1",
        "analysis.per_sample.terms=[task]", "analysis.buckets.num_buckets=4"]


class Setup:
    """The model, batch, optimizer and the instruments' hooks; each method one measured part."""

    def __init__(self, layers: int) -> None:
        self.model, self.batch = smollm2_shaped(layers)
        g = torch.Generator().manual_seed(1)
        self.batch.components = {"correctness": (torch.rand(len(self.batch), generator=g) < 0.5).float(),
                                 "format": torch.rand(len(self.batch), generator=g)}
        self.s = LossSettings(horizon=32)  # the task term alone: the pass rides
        self.cfg = load_config(overrides=TASK)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-6)
        self.runner = HookRunner(hooks_from_config(self.cfg))
        self.step = 0
        self.run_dir = Path(tempfile.mkdtemp())  # the instruments write their step files, as in the trainer
        self.kept: list[StepContext] = []

    def ctx(self) -> StepContext:
        self.step += 1
        return StepContext(step=self.step, batch=self.batch, actor=self.model, optimizer=self.optimizer,
                           loss_settings=self.s, config=self.cfg, run_dir=self.run_dir, reward_weights=WEIGHTS,
                           one_pass_update=True)

    def plain(self, tap=None, on_grads=None) -> None:
        update_actor(self.model, self.optimizer, self.batch, self.s, ppo_epochs=1, mini_batch_size=len(self.batch),
                     micro_batch_size=len(self.batch), max_grad_norm=1.0, shuffle=True, seed=0, tap=tap,
                     on_grads=on_grads)

    def _ride_update(self, c: StepContext, on_grads=None) -> None:
        assert not self.runner.before_update(c).metrics  # riding: nothing measured before the update
        tap = self.runner.update_tap(c)
        assert tap is not None
        self.plain(tap, on_grads)

    def ride(self) -> None:
        c = self.ctx()
        self._ride_update(c)
        self.runner.after_update(c)

    def ride_update(self) -> None:
        self.kept.append(self.ctx())
        self._ride_update(self.kept[-1])

    def after(self) -> None:
        self.runner.after_update(self.kept.pop())

    def at_grads(self, riding: bool) -> float:
        gc.collect()
        before, seen = _status_mb("VmRSS"), []

        def on_grads(model, mini) -> None:
            seen.append(_status_mb("VmRSS"))

        if riding:
            self._ride_update(self.ctx(), on_grads)
        else:
            self.plain(None, on_grads)
        return seen[0] - before


def main() -> None:
    layers = int(sys.argv[1])
    parts = sys.argv[2].split(",") if len(sys.argv) > 2 else ["plain", "ride", "ride_update", "after"]
    torch.set_num_threads(1)
    run = Setup(layers)
    run.plain()
    run.ride()  # warm-ups: the optimizer's states, allocator pools
    params = sum(p.numel() for p in run.model.parameters())
    print(f"layers {layers}: params {params / 1e6:.1f}M fp32 {params * 4 / 2 ** 20:.0f} MB; rows {len(run.batch)} x "
          f"{run.batch.input_ids.shape[1]} tokens, one micro-batch")
    for part in parts:
        for rep in range(2):
            if part.endswith("_at_grads"):
                print(f"{part} ({rep + 1}/2): resident set +{run.at_grads(part == 'ride_at_grads'):.0f} MB",
                      flush=True)
                continue
            if part == "after":
                run.ride_update()
            mb = peak_mb(getattr(run, part), torch.device("cpu"))
            print(f"{part} ({rep + 1}/2): peak +{mb:.0f} MB", flush=True)


if __name__ == "__main__":
    main()
