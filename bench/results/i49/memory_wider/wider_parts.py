"""Where the task-term instruments' extra peak goes on the wider embedded model of docs/benchmarks.md (width 384,
MLP 1024, 6 / 2 heads, 6.3M parameters, 24 MB in fp32; 8 prompts x 8 samples x 32 response tokens in ONE
micro-batch, the prompt-group pass riding on the update), as ``bench/always_on_cost.py --memory --instruments task``
measures the step (+14 MB after bbefaf6): the peak resident set each part of a step adds, measured on rlgrad's
trainer itself, part by part, on one rolled-out batch.

    MALLOC_MMAP_THRESHOLD_=65536 PYTHONPATH=src python bench/results/i49/memory_wider/wider_parts.py [PARTS]

Parts (comma-separated; default all): ``collect`` (rollout, filter, log-probs, advantages: the same with the
instruments or without), ``plain`` (the actor update, hooks off), ``ride`` (the instruments' ``before_update``,
which plans the pass, and the update with the pass riding on it), ``after``
(``after_update`` alone, of a riding update kept before), ``step_plain`` / ``step_ride`` (a whole
``Trainer.train_step`` without / with them, as always_on_cost.py's ``--memory`` measures: each step rolls out a
batch of its own), ``fixed_step_plain`` / ``fixed_step_ride`` (the same on the one batch ``collect`` gave, its
rollout left out). Each part twice; each line also gives the columns of the last batch the trainer rolled out.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # bench/
from always_on_cost import INSTRUMENTS  # noqa: E402
from per_sample_cost import peak_mb  # noqa: E402

from rlgrad.config.load import load_config  # noqa: E402
from rlgrad.hooks import HookRunner  # noqa: E402
from rlgrad.logging.sinks import MetricLogger  # noqa: E402
from rlgrad.recipes import make_trainer  # noqa: E402

WIDER = ["model.tiny.hidden_size=384", "model.tiny.intermediate_size=1024", "model.tiny.num_attention_heads=6",
         "model.tiny.num_key_value_heads=2", "model.warmstart_steps=0", "rollout.response_length=32",
         "data.train_batch_size=8", "actor.ppo_micro_batch_size=64"]


class Parts:
    """The trainer with the task-term instruments, one rolled-out batch; each method one measured part."""

    def __init__(self) -> None:
        tmp = tempfile.mkdtemp()
        self.cfg = load_config(overrides=["trainer.logger=[]", f"trainer.default_local_dir={tmp}/run",
                                          "trainer.num_threads=1", *INSTRUMENTS["task"], *WIDER])
        self.tr = make_trainer(self.cfg, log=lambda *a: None)
        self.hooks, self.off, self.logger = HookRunner(list(self.tr.hooks)), HookRunner([]), MetricLogger([])
        self.step = 0
        self.collected = self.tr.collect(1, {})
        assert self.collected is not None
        self.kept: list = []
        self.shapes: list[tuple[int, ...]] = []  # [rows, columns] of each batch the actor update saw
        update = self.tr.update_actor

        def recorded(ctx, metrics: dict) -> None:
            self.shapes.append(tuple(ctx.batch.input_ids.shape))
            update(ctx, metrics)
        self.tr.update_actor = recorded

    def ctx(self):
        self.step += 1
        c = self.tr.context(self.step, *self.collected)
        c.one_pass_update = self.tr.one_pass_update(c)
        assert c.one_pass_update
        return c

    def collect(self) -> None:
        self.tr.collect(self.step + 1, {})

    def plain(self) -> None:
        self.tr.hooks = self.off
        self.tr.update_actor(self.ctx(), {})

    def ride(self) -> None:
        self.tr.hooks = self.hooks
        self.kept.append(self.ctx())
        self.tr.hooks.before_update(self.kept[-1])
        self.tr.update_actor(self.kept[-1], {})

    def after(self) -> None:
        self.tr.hooks.after_update(self.kept.pop())

    def _on_the_batch(self, step: Callable[[], None]) -> None:
        """A whole step on the one batch: rollouts differ from step to step."""
        self.tr.collect = lambda step, metrics: self.collected
        try:
            step()
        finally:
            del self.tr.collect

    def fixed_step_plain(self) -> None:
        self._on_the_batch(self.step_plain)

    def fixed_step_ride(self) -> None:
        self._on_the_batch(self.step_ride)

    def step_plain(self) -> None:
        self.tr.hooks = self.off
        self.step += 1
        self.tr.train_step(self.step, self.logger)

    def step_ride(self) -> None:
        self.tr.hooks = self.hooks
        self.step += 1
        self.tr.train_step(self.step, self.logger)


def main() -> None:
    parts = sys.argv[1].split(",") if len(sys.argv) > 1 else [
        "collect", "plain", "ride", "after", "step_plain", "step_ride", "fixed_step_plain", "fixed_step_ride"]
    run = Parts()
    # warm-ups: the optimizer's states, allocator pools
    for warm in (run.plain, run.ride, run.after, run.step_plain, run.step_ride, run.fixed_step_plain):
        warm()
    params = sum(p.numel() for p in run.tr.actor.parameters())
    b = run.collected[0]
    print(f"params {params / 1e6:.2f}M fp32 {params * 4 / 2 ** 20:.1f} MB; batch {len(b)} rows x "
          f"{b.input_ids.shape[1]} tokens, micro-batch {run.cfg.actor.ppo_micro_batch_size}")
    for part in parts:
        for rep in range(2):
            if part == "after":
                run.ride()
            mb = peak_mb(getattr(run, part), torch.device("cpu"))
            print(f"{part} ({rep + 1}/2): peak +{mb:.1f} MB; batch {run.shapes[-1]}", flush=True)
            if part == "ride":
                run.after()


if __name__ == "__main__":
    main()
