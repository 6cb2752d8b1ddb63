"""Resident memory and live ``RowNormReducer`` objects after each step of a whole training run on the embedded
default, every instrument every step, riding on the update ("ride": one micro-batch) or not ("plain"), as main has it
("leak") or with the candidate fix ("fix": ``_SliceReducer.close`` forgets the hooked outputs' graph edges).
Usage: leak_run.py ride|plain leak|fix STEPS RUN_DIR."""

from __future__ import annotations

import gc
import sys
import weakref

from rlgrad.analysis import engine
from rlgrad.analysis import rows as rows_mod
from rlgrad.config.load import load_config
from rlgrad.recipes import make_trainer


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def main(mode: str, fix: bool, steps: int, out: str) -> None:
    made: list[weakref.ref] = []
    real_init = rows_mod.RowNormReducer.__init__

    def init(self, *args, **kwargs):
        made.append(weakref.ref(self))
        real_init(self, *args, **kwargs)

    rows_mod.RowNormReducer.__init__ = init
    if fix:
        real_close = engine._SliceReducer.close

        def close(self):
            real_close(self)
            self.forward_modules.clear()

        engine._SliceReducer.close = close
    overrides = [f"trainer.total_training_steps={steps}", "trainer.save_freq=-1", "trainer.num_threads=1",
                 "trainer.logger=[jsonl]", "analysis.every=1", f"trainer.default_local_dir={out}"]
    if mode == "ride":
        overrides.append("actor.ppo_micro_batch_size=128")  # the whole 16 x 8 batch: the instruments ride
    trainer = make_trainer(load_config(overrides=overrides), log=lambda *a: None)
    real_step = trainer.train_step
    rec = []

    def step(s, logger):
        result = real_step(s, logger)
        gc.collect()
        rec.append((s, rss_mb(), sum(r() is not None for r in made), len(made)))
        return result

    trainer.train_step = step
    trainer.fit()
    for s, mb, alive, n in rec:
        if s in (1, 2, 5, 10, 20, 30, 40, 60, 80) or s == rec[-1][0]:
            print(f"{mode} fix={fix} step {s}: rss {mb:.1f} MB, RowNormReducers alive {alive}/{n}", flush=True)
    print(f"{mode} fix={fix}: rss growth step 10 -> {rec[-1][0]}: {rec[-1][1] - rec[9][1]:.1f} MB")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "fix", int(sys.argv[3]), sys.argv[4])
