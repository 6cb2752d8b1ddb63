"""Where the riding prompt-group pass's time goes (issue 49's task-term target, the embedded default by default).

One Trainer with the task-term instruments on every step (``always_on_cost.py --instruments task``, the whole batch
in one micro-batch so that the pass rides on the update's backward), its hooks on and off on alternate steps, each
pair of steps on one batch (``always_on_cost.py --paired-batch``). Timed with wall-clock timers around the calls
(no profiler): every hook of the riding reducer (``RowNormReducer._on_grad``: a module's group gradients, their Gram,
its rows' norms and the side's slices), the riding backward (``UpdatePass.backward``) and the plain one
(``loss.backward`` of the plain steps). The side is the reward components' basis slice (``groups.SideSplit``),
reduced at the steps where two components vary within groups.

    OMP_NUM_THREADS=1 python bench/riding_breakdown.py [--steps 20] [overrides ...]

Prints, per module (layers' modules by their name within a layer), the median time of one hook call at steps with a
side and at steps without; then per step, medians: the rows read (the live groups' rows: the steps with a side are
not the others' batches, and the hooks' work grows with those rows), the hooks in all and the side's work in them
(its own reductions and the joint Gram of its pieces with the groups'), the riding backward and its autograd part
(less the hooks), the plain backward.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from rlgrad.analysis.engine import _SliceReducer
from rlgrad.analysis.groups import UpdatePass
from rlgrad.analysis.rows import RowNormReducer
from rlgrad.config.load import load_config
from rlgrad.recipes import make_trainer

sys.path.insert(0, str(Path(__file__).parent))
from always_on_cost import INSTRUMENTS, _timed  # noqa: E402

HOOKS: dict[tuple[str, bool], list[float]] = defaultdict(list)  # (module, side on) -> seconds per call
STEP: dict[str, float] = defaultdict(float)  # this step's hooks, side work, rows read, riding and plain backward
PER_STEP: list[dict[str, float]] = []


def _timed_hook(hook):
    def timed(self, module, *args):
        started = time.perf_counter()
        try:
            return hook(self, module, *args)
        finally:
            spent = time.perf_counter() - started
            name = re.sub(r"^.*\.\d+\.", "", next(n for n, m in self.model.named_modules() if m is module))
            HOOKS[(name, self.side is not None)].append(spent)
            STEP["hooks"] += spent
            STEP["side"] = max(STEP["side"], float(self.side is not None))
            STEP["rows"] = float(self.read if self.read is not None else len(self.row_group))
    return timed


def _timed_side(fn, of_side):
    """``fn`` timed into the step's side work where ``of_side(self)``, and not inside another such call."""
    def timed(self, *args, **kwargs):
        if not of_side(self) or STEP.get("in_side"):
            return fn(self, *args, **kwargs)
        STEP["in_side"], started = 1.0, time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            STEP["side_work"] += time.perf_counter() - started
            STEP["in_side"] = 0.0
    return timed


def _timed_call(fn, into: str):
    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            STEP[into] += time.perf_counter() - started
    return timed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20, help="timed pairs of steps")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(1)
    RowNormReducer._on_grad = _timed_hook(RowNormReducer._on_grad)
    # the side's work: its own reductions (a side reducer is a plain _SliceReducer) and the joint Gram of its pieces
    for name in ("_linear", "_linear_weight", "_norm", "_embedding", "_add"):  # (the names of every version)
        if hasattr(_SliceReducer, name):
            setattr(_SliceReducer, name, _timed_side(getattr(_SliceReducer, name), lambda r: type(r) is _SliceReducer))
    RowNormReducer._join = _timed_side(RowNormReducer._join, lambda r: True)
    UpdatePass.backward = staticmethod(_timed_call(UpdatePass.backward, "riding"))
    torch.Tensor.backward = _timed_call(torch.Tensor.backward, "plain")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(overrides=["trainer.logger=[]", f"trainer.default_local_dir={tmp}/run",
                                     "trainer.num_threads=1",
                                     "actor.ppo_micro_batch_size=128", *INSTRUMENTS["task"], *args.overrides])
        tr = make_trainer(cfg, log=lambda *a: None)
        step = tr.train_step

        def train_step(k: int, logger):
            STEP.clear()
            try:
                return step(k, logger)
            finally:
                if k > 2:  # (the warm-up pair left out, as _timed leaves it)
                    PER_STEP.append(dict(STEP))

        tr.train_step = train_step
        _timed(tr, list(tr.hooks), args.steps, paired_batch=True)
    print(f"embedded default unless overridden ({' '.join(args.overrides) or 'no overrides'}), task-term instruments, "
          f"{args.steps} pairs of steps on one batch each; one hook call, median ms: with a side / without")
    for name in dict.fromkeys(n for n, _ in HOOKS):
        with_side, without = HOOKS.get((name, True), []), HOOKS.get((name, False), [])
        print(f"  {name:28s} {_ms(with_side)} / {_ms(without)}  ({len(with_side)} / {len(without)} calls)")
    riding = [s for s in PER_STEP if "riding" in s]
    plain = [s["plain"] for s in PER_STEP if "riding" not in s and "plain" in s]
    for label, chosen in (("with a side", [s for s in riding if s["side"]]),
                          ("without", [s for s in riding if not s["side"]])):
        if chosen:
            print(f"steps {label} ({len(chosen)}): rows read {statistics.median(s['rows'] for s in chosen):.0f}, hooks "
                  f"{_ms([s['hooks'] for s in chosen])} ms (the side's work "
                  f"{_ms([s.get('side_work', 0.0) for s in chosen])}), "
                  f"riding backward {_ms([s['riding'] for s in chosen])} ms, its autograd part "
                  f"{_ms([s['riding'] - s['hooks'] for s in chosen])} ms")
    print(f"plain steps ({len(plain)}): backward {_ms(plain)} ms")


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:6.2f}" if values else "     -"


if __name__ == "__main__":
    main()
