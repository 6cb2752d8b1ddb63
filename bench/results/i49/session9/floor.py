"""The arithmetic floor of the riding task-term pass on the embedded default (issue 49, session 9).

One Trainer with the task-term instruments (``bench/always_on_cost.py --instruments task``, the batch in one
micro-batch so that the pass rides on the update). For ``--steps`` riding backwards, every Linear hook's output
gradient δ and input x (the rows read: the live prompt groups') and the whole micro-batch's row count are kept; then,
per Linear, two sets of products are timed alone, in a loop, with no bookkeeping:

* what the riding pass cannot do without: the prompt groups' weight gradients (one batched product over the groups'
  tiles), their Gram and their sum (the update's gradient), the rows' ghost norms (δ·δ' and x·x' per row, the input
  Gram once per input that several Linears read);
* what it saves autograd: the weight gradient over every row of the micro-batch (``δᵀx``, as autograd's ``mm``
  backward forms it; dead rows included, which autograd multiplies too).

The difference, over a plain update (the median ``timing_s/update_actor`` of steps with the hooks off, same process),
is the part of the riding overhead that no bookkeeping change removes. The rest of the measured overhead (the hooks'
other work, the instruments after the update) is listed beside it from the same steps.

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/results/i49/session9/floor.py [--steps 8]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from rlgrad.analysis import rows as rows_module
from rlgrad.analysis.engine import _SliceReducer
from rlgrad.analysis.rows import RowNormReducer, _rows3
from rlgrad.config.load import load_config
from rlgrad.hooks import HookRunner
from rlgrad.logging.sinks import MetricLogger
from rlgrad.recipes import make_trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from always_on_cost import INSTRUMENTS  # noqa: E402

PARTS: dict[str, list[float]] = defaultdict(list)  # part of the hooks -> seconds per riding step
CAPTURED: list[list[tuple]] = []  # per riding backward: (module name, δ read [n, T, out], x read [n, T, in], groups)
HOOK_S: list[float] = []
PARTS_NAMES = [
    "the groups' weight gradients (their products)",
    "their Gram and sum (with the side: its part on the groups)",
    "per-row norms, accumulated",
    "the Linears' ghost norms",
    "the norms' hooks",
    "the embedding's hook",
    "the side's own Linear slices",
    "the side's float64 joint Gram",
]


def _capturing(hook):
    def capture(self, module, attrs, fn, x, g):
        started = time.perf_counter()
        try:
            return hook(self, module, attrs, fn, x, g)
        finally:
            HOOK_S[-1] += time.perf_counter() - started
            if isinstance(module, torch.nn.Linear):
                g3 = _rows3(self._read_rows(g.detach()))
                CAPTURED[-1].append((type(module).__name__, id(module), g3.clone(), _rows3(x).clone(),
                                     len(self.weights), x.data_ptr(), g.shape[0]))
    return capture


def _part(fn, name: str, only=lambda self: True):
    """``fn`` timed into this step's part ``name`` (where ``only(self)``); its name kept (the engine calls the side's
    reduction by the name of the group reducer's)."""
    @functools.wraps(fn)
    def timed(self, *args, **kwargs):
        if not only(self):
            return fn(self, *args, **kwargs)
        started = time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            PARTS[name][-1] += time.perf_counter() - started
    return timed


def _time(fn, repeat: int = 20) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat


def _floor(captured: list[tuple]) -> tuple[float, float]:
    """Seconds of the riding products that cannot be left out, and of the weight gradients autograd is spared."""
    needed = saved = 0.0
    grams_of: set[int] = set()
    for _, _, g3, x3, groups, where, all_rows in captured:
        gt, xt = g3.reshape(groups, -1, g3.shape[-1]), x3.reshape(groups, -1, x3.shape[-1])

        def riding(gt=gt, xt=xt, groups=groups, g3=g3):
            per_group = torch.bmm(gt.transpose(1, 2), xt).reshape(groups, -1)
            (per_group @ per_group.t()).double()
            per_group.sum(0)
            torch.bmm(g3, g3.transpose(1, 2))

        needed += _time(riding)
        if where not in grams_of:  # q/k/v and gate/up read one input: one input Gram
            grams_of.add(where)
            needed += _time(lambda x3=x3: torch.bmm(x3, x3.transpose(1, 2)))
        g_all = torch.randn(all_rows * g3.shape[1], g3.shape[-1])  # every row of the micro-batch, as autograd has them
        x_all = torch.randn(all_rows * x3.shape[1], x3.shape[-1])
        saved += _time(lambda g_all=g_all, x_all=x_all: g_all.t() @ x_all)
    return needed, saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8, help="riding steps captured (and as many plain ones)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    RowNormReducer._on_grad = _capturing(RowNormReducer._on_grad)
    group_reducer = lambda self: isinstance(self, RowNormReducer)  # noqa: E731
    RowNormReducer._slices = _part(RowNormReducer._slices, "the groups' weight gradients (their products)",
                                   group_reducer)
    RowNormReducer._fold = _part(RowNormReducer._fold, "their Gram and sum (with the side: its part on the groups)")
    RowNormReducer._row = _part(RowNormReducer._row, "per-row norms, accumulated")
    rows_module.linear_row_sq = _part(rows_module.linear_row_sq, "the Linears' ghost norms")
    RowNormReducer._norm = _part(RowNormReducer._norm, "the norms' hooks")
    RowNormReducer._embedding = _part(RowNormReducer._embedding, "the embedding's hook")
    _SliceReducer._linear_weight = _part(_SliceReducer._linear_weight, "the side's own Linear slices",
                                         lambda self: not group_reducer(self))
    RowNormReducer._fold_joint = _part(RowNormReducer._fold_joint, "the side's float64 joint Gram")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(overrides=["trainer.logger=[]", f"trainer.default_local_dir={tmp}/run",
                                     "trainer.num_threads=1", "actor.ppo_micro_batch_size=128",
                                     *INSTRUMENTS["task"]])
        trainer = make_trainer(cfg, log=lambda *a: None)
        hooks, logger = list(trainer.hooks), MetricLogger([])
        plain, riding, after = [], [], []
        for k in range(2 * args.steps + 2):
            on = k % 2 == 0
            trainer.hooks = HookRunner(hooks if on else [])
            CAPTURED.append([])
            HOOK_S.append(0.0)
            for name in PARTS_NAMES:
                PARTS[name].append(0.0)
            metrics, _ = trainer.train_step(k + 1, logger)
            if k < 2:
                continue
            (riding if on else plain).append(metrics["timing_s/update_actor"])
            if on:
                after.append(sum(v for n, v in metrics.items() if n.startswith("timing_s/analysis/")))
    update = statistics.median(plain)
    riding_at = [i for i, c in enumerate(CAPTURED) if i >= 2 and c]
    rows = [(CAPTURED[i], HOOK_S[i]) for i in riding_at]
    floors = [_floor(c) for c, _ in rows]
    needed = statistics.median(f[0] for f in floors)
    saved = statistics.median(f[1] for f in floors)
    hooks = statistics.median(h for _, h in rows)
    print(f"embedded default, task-term instruments, {len(rows)} riding steps and {len(plain)} plain ones "
          f"(one thread); rows read per step: {sorted(c[0][2].shape[0] for c, _ in rows)}")
    print(f"plain update (median): {update * 1e3:.1f} ms; riding update: {statistics.median(riding) * 1e3:.1f} ms; "
          f"the instruments' timers: {statistics.median(after) * 1e3:.1f} ms")
    print(f"every hook of the riding reducer, as run: {hooks * 1e3:.1f} ms a step")
    print(f"the products the riding Linears cannot leave out: {needed * 1e3:.1f} ms; the weight gradients autograd is "
          f"spared: {saved * 1e3:.1f} ms; the floor: {(needed - saved) * 1e3:+.1f} ms = "
          f"{(needed - saved) / update:+.3f} of a plain update")
    print("within the hooks as run, median ms a riding step (nested: the Linears' ghost norms include their part of "
          "the per-row norms' accumulation):")
    for name in PARTS_NAMES:
        print(f"  {name:60s} {statistics.median(PARTS[name][i] for i in riding_at) * 1e3:6.2f}")
    by_kind = defaultdict(list)
    for c, _ in rows:
        for _, _, g3, x3, *_ in c:
            by_kind[(g3.shape[-1], x3.shape[-1])].append(1)
    print("Linears a step by (out, in):", {k: len(v) // len(rows) for k, v in sorted(by_kind.items())})


if __name__ == "__main__":
    main()
