"""Tried, not landed (issue 49, session 9): the riding reducer's plain Linear hooks deferred to the end of the update's
backward, their group gradients, Grams, sums and ghost norms formed per weight shape across layers (8 shapes for the
embedded default's 29 Linears) instead of one Linear at a time. A prototype on top of c689e31's reducer: it replaces
``RowNormReducer._linear`` and ``UpdatePass.backward`` in this process only; the tied head and any Linear off the
plain riding path (a side, shuffled rows, the rows' own gradients) keep the reducer's own hook.

    BATCHED=1 OMP_NUM_THREADS=1 PYTHONPATH=src python bench/results/i49/session9/batched.py --threads 1 --steps 60 \\
        --paired-batch --instruments task actor.ppo_micro_batch_size=128 analysis.components.every=0

runs bench/always_on_cost.py with it (BATCHED=0: without it, the bench as it is). With CHECK=FILE it instead trains
4 steps of that setting and writes every logged metric to FILE (JSON), to compare the two ways' metrics.
"""

import atexit
import json
import os
import runpy
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from rlgrad.analysis import groups as groups_module
from rlgrad.analysis import rows as rows_module

BENCH = Path(__file__).resolve().parents[3]  # bench/
sys.path.insert(0, str(BENCH))
COUNT: dict[str, int] = defaultdict(int)


def _deferrable(reducer, m, g3, x3) -> bool:
    k = reducer._key(m.weight)
    return (reducer.tiled and reducer.gather is None and reducer.side is None and reducer.row_norms
            and reducer.sums is not None and k in reducer.names and len(reducer.owners.get(k, [])) == 1
            and reducer._present_rows(m.weight) is None and not reducer._from_row_gradients(m, g3, x3)
            and rows_module.ghost_is_cheaper(g3.shape[1], x3.shape[-1], g3.shape[-1]))


def _linear(own):
    def linear(self, m, x, g):
        g3, x3 = rows_module._rows3(g.detach()), rows_module._rows3(x)
        if not _deferrable(self, m, g3, x3):
            COUNT["own"] += 1
            return own(self, m, x, g)
        COUNT["deferred"] += 1
        self._arrived(self._key(m.weight))
        self.__dict__.setdefault("deferred", []).append((m, x3, g3))
        self._bias(m, g3)
        return True
    return linear


def _flush(reducer) -> None:
    """The deferred Linears, by weight shape: one buffer of their group gradients, one batched Gram, one sum, one
    batched product for their ghost norms (the input Grams once per input)."""
    items, reducer.deferred = reducer.__dict__.get("deferred", []), []
    groups = len(reducer.weights)
    by_shape = defaultdict(list)
    for item in items:
        by_shape[tuple(item[0].weight.shape)].append(item)
    input_grams = {}
    for (out, fan_in), batch in by_shape.items():
        buf = torch.empty(len(batch), groups, out, fan_in)
        for slot, (_, x3, g3) in enumerate(batch):
            torch.bmm(g3.reshape(groups, -1, out).transpose(1, 2), x3.reshape(groups, -1, fan_in), out=buf[slot])
        flat = buf.view(len(batch), groups, -1)
        grams = torch.bmm(flat, flat.transpose(1, 2)).double()
        sums = flat.sum(1)
        deltas = torch.stack([g3 for _, _, g3 in batch])
        inputs = []
        for _, x3, _ in batch:
            where = rows_module._where(x3)
            if where not in input_grams:
                input_grams[where] = rows_module.input_gram(x3)
            inputs.append(input_grams[where])
        products = torch.matmul(deltas, deltas.transpose(-1, -2)) * torch.stack(inputs)
        sq = products.flatten(2).sum(2, dtype=torch.float64)
        for slot, (m, _, _) in enumerate(batch):
            k = reducer._key(m.weight)
            reducer._into(reducer.gram, reducer.group_names[k], grams[slot])
            reducer.sums[k] = sums[slot].view(out, fan_in)
            reducer._row(m.weight, sq[slot])


def _backward(model, reducer, loss) -> None:
    """``UpdatePass.backward`` with the deferred Linears formed before the parameters' gradients are set."""
    if reducer.ungraded or not bool(torch.isfinite(loss)):
        loss.backward()
        return
    reducer.sum_groups(model)
    torch.autograd.backward(loss, inputs=reducer.edges)
    _flush(reducer)
    for p in model.parameters():
        total = reducer.sums.pop(id(p), None)
        if total is not None and p.grad is None:
            p.grad = total.to(p.dtype)


def _check(path: str) -> None:
    from always_on_cost import INSTRUMENTS

    from rlgrad.config.load import load_config
    from rlgrad.logging.sinks import MetricLogger
    from rlgrad.recipes import make_trainer

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(overrides=["trainer.logger=[]", f"trainer.default_local_dir={tmp}/run",
                                     "trainer.num_threads=1", "actor.ppo_micro_batch_size=128",
                                     *INSTRUMENTS["task"], "analysis.components.every=0"])
        trainer = make_trainer(cfg, log=lambda *a: None)
        logged = {}
        for step in range(1, 5):
            metrics, _ = trainer.train_step(step, MetricLogger([]))
            logged.update({f"{step}:{n}": float(v) for n, v in metrics.items() if not n.startswith("timing")})
    Path(path).write_text(json.dumps(logged))


if __name__ == "__main__":
    if os.environ.get("BATCHED") == "1":
        rows_module.RowNormReducer._linear = _linear(rows_module.RowNormReducer._linear)
        groups_module.UpdatePass.backward = staticmethod(_backward)
        atexit.register(lambda: print("# Linear hooks: deferred or the reducer's own", dict(COUNT), file=sys.stderr))
    if os.environ.get("CHECK"):
        _check(os.environ["CHECK"])
    else:
        sys.argv = [str(BENCH / "always_on_cost.py"), *sys.argv[1:]]
        runpy.run_path(str(BENCH / "always_on_cost.py"), run_name="__main__")
