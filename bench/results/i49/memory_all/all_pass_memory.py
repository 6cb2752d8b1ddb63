"""Where the three-term prompt-group pass's extra memory goes (``all``: entropy and KL in the loss), on the same Llama
of SmolLM2-135M's shapes as ../memory_located/smollm2_shape_memory.py (random weights, 4 groups x 8 samples of 60 prompt
+ up to 32 response tokens): the peak resident set each variant adds.

    MALLOC_MMAP_THRESHOLD_=65536 OMP_NUM_THREADS=1 PYTHONPATH=src python \
        bench/results/i49/memory_all/all_pass_memory.py LAYERS [VARIANT ...]

Variants: ``update`` (a plain forward + backward of the whole loss), ``pass`` (``groups.group_pass`` of every term),
``pass_task`` / ``pass_entropy`` / ``pass_kl`` (one term), ``pass_task_kl`` (two terms, no entropy), ``pass_norows``
(``row_terms=()``: the groups' Grams alone), ``pass_half_block`` (``BLOCK_ELEMENTS`` halved), ``pass_proxy`` (with the
LM-head tap), ``autograd3`` (no hooks: one forward, three ``autograd.grad`` of the terms, each but the last retaining
the graph, to the parameters), ``autograd1`` (the same, one backward of the sum); ``pass_entropy_last`` and
``autograd3_entropy_last``: ``pass`` and ``autograd3`` with the backwards in the order task, kl, entropy;
``pass_kept``: ``pass`` with the entropy's softmax kept by its graph (``engine.softmax_recomputed`` off: as before it);
``pass_task_kl_held_kept``: the task and KL terms' pass with the entropy term's graph held alive but not backwarded,
its softmax kept.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # bench/
from analysis_cost import smollm2_shaped  # noqa: E402
from per_sample_cost import peak_mb  # noqa: E402

from rlgrad.algos.aggregation import Denominators  # noqa: E402
from rlgrad.algos.logprobs import softmax_recomputed  # noqa: E402
from rlgrad.algos.objective import (  # noqa: E402
    ActorLoss,
    FunctionLoss,
    LossFn,
    LossSettings,
    actor_objective,
    as_loss_fn,
)
from rlgrad.analysis import engine, groups, rows  # noqa: E402
from rlgrad.analysis.engine import _weighted_terms  # noqa: E402
from rlgrad.analysis.groups import checked, group_pass, only_terms  # noqa: E402
from rlgrad.batch import Batch  # noqa: E402

VARIANTS = ("update", "pass", "pass_task", "pass_entropy", "pass_kl", "pass_task_kl", "pass_norows",
            "pass_half_block", "pass_proxy", "autograd3", "autograd1", "pass_entropy_last", "autograd3_entropy_last",
            "pass_kept", "pass_task_kl_held_kept")
LAST = ("task", "kl", "entropy")  # the order of the backwards in the *_entropy_last variants


def variants(model: torch.nn.Module, batch: Batch, s: LossSettings) -> dict[str, Callable[[], None]]:
    loss = as_loss_fn(ActorLoss(s))

    def update() -> None:
        model.zero_grad(set_to_none=True)
        actor_objective(model, batch, s, Denominators.of(batch)).total(s).backward()
        model.zero_grad(set_to_none=True)

    def entropy_last(m: torch.nn.Module, b: Batch) -> dict[str, torch.Tensor]:
        out = loss(m, b)
        return {k: out[k] for k in LAST}

    def run_pass(terms: set[str] | None = None, last: bool = False, **kw) -> None:
        fn = loss if terms is None else only_terms(loss, terms)
        fn = FunctionLoss(entropy_last, loss.agg) if last else fn
        group_pass(model, batch, checked(fn), **kw)

    def half_block() -> None:
        old = (engine.BLOCK_ELEMENTS, rows.BLOCK_ELEMENTS, groups.BLOCK_ELEMENTS)
        engine.BLOCK_ELEMENTS = rows.BLOCK_ELEMENTS = groups.BLOCK_ELEMENTS = old[0] // 2
        try:
            run_pass()
        finally:
            engine.BLOCK_ELEMENTS, rows.BLOCK_ELEMENTS, groups.BLOCK_ELEMENTS = old

    def task_kl_held(m: torch.nn.Module, b: Batch) -> dict[str, torch.Tensor]:
        out = loss(m, b)
        held.append(out["entropy"])  # the entropy term's graph alive, as in the three-term pass, but not backwarded
        return {k: out[k] for k in ("task", "kl")}

    held: list[torch.Tensor] = []

    def kept(fn: LossFn = loss) -> None:
        engine.softmax_recomputed = nullcontext
        try:
            group_pass(model, batch, checked(fn))
        finally:
            engine.softmax_recomputed = softmax_recomputed
            held.clear()

    def plain_autograd(three: bool, last: bool = False) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        terms = _weighted_terms(FunctionLoss(entropy_last, loss.agg) if last else loss, model, batch)
        if three:
            for i, t in enumerate(terms.values()):
                torch.autograd.grad(t.sum(), params, retain_graph=i < len(terms) - 1, allow_unused=True)
        else:
            torch.autograd.grad(sum(t.sum() for t in terms.values()), params, allow_unused=True)

    return {"update": update, "pass": run_pass, "pass_task": lambda: run_pass({"task"}),
           "pass_entropy": lambda: run_pass({"entropy"}), "pass_kl": lambda: run_pass({"kl"}),
           "pass_task_kl": lambda: run_pass({"task", "kl"}), "pass_norows": lambda: run_pass(row_terms=()),
           "pass_half_block": half_block, "pass_proxy": lambda: run_pass(proxy=True),
           "autograd3": lambda: plain_autograd(True), "autograd1": lambda: plain_autograd(False),
           "pass_entropy_last": lambda: run_pass(last=True),
           "autograd3_entropy_last": lambda: plain_autograd(True, True), "pass_kept": kept,
           "pass_task_kl_held_kept": lambda: kept(FunctionLoss(task_kl_held, loss.agg))}


def main() -> None:
    layers = int(sys.argv[1])
    wanted = sys.argv[2:] or list(VARIANTS)
    if unknown := [v for v in wanted if v not in VARIANTS]:
        sys.exit(f"unknown variant(s) {unknown}; choose from {VARIANTS}")
    torch.set_num_threads(1)
    model, batch = smollm2_shaped(layers)
    s = LossSettings(use_kl_loss=True, kl_loss_coef=0.001, entropy_coeff=0.001, horizon=32)
    fns = variants(model, batch, s)
    print(f"layers {layers}; logits [32, 33, 49152] fp32 = {32 * 33 * 49152 * 4 / 2 ** 20:.0f} MB", flush=True)
    for v in wanted:
        fns[v]()  # warm
        print(f"{v:22s} peak +{peak_mb(fns[v], torch.device('cpu')):.0f} MB", flush=True)


if __name__ == "__main__":
    main()
