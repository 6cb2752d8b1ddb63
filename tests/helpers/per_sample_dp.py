"""Per-sample gradient norms under data parallel, run in ``tests/test_distributed.py``'s two CPU processes (gloo,
one spawn for all its checks): each rank's part (``rank_results``) and the one-process comparison
(``assert_per_sample_equal``).

Each rank holds a share of the batch's rows: whole prompt groups unevenly ("uneven"), every row on rank 0
("empty": rank 1 holds none and must still join every collective), or every group split over both ranks
("split", as verl's length balancing may split them). The model is a plain module (the trainer's hooks see
DDP's inner module, and FSDP2's full replica) and FSDP2's shards themselves (verl's worker). Each rank's norms
are its own rows'; the metrics, the groups' Gram and samples.jsonl (the hook, written by rank 0) equal one
process's on the whole batch.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import torch

from rlgrad.algos.objective import LossSettings
from rlgrad.analysis.per_sample import PerSampleHook, analyse_per_sample
from rlgrad.config.analysis import PerSampleConfig
from rlgrad.hooks import Schedule, StepContext

SETTINGS = {"seq": LossSettings(loss_agg_mode="seq-mean-token-mean", use_kl_loss=True, kl_loss_coef=0.1,
                                entropy_coeff=0.01, horizon=5),
            "token": LossSettings(loss_agg_mode="token-mean", use_kl_loss=False, entropy_coeff=0.01, horizon=5)}
N = 20  # 5 groups x 4 samples, group 0 with zero reward std
SPLITS = {"uneven": ([*range(16)], [*range(16, 20)]), "empty": ([*range(N)], []),
          "split": ([*range(0, N, 2)], [*range(1, N, 2)])}  # rows held by rank 0, rank 1
CASES = [("plain", split, loss) for split in SPLITS for loss in SETTINGS] + [("shards", split, "seq")
                                                                           for split in SPLITS]


def _analyse(model, batch, loss: str):
    rep = analyse_per_sample(model, batch, SETTINGS[loss], num_buckets=3, proxy=True)
    return {"metrics": rep.metrics, "norms": rep.norms, "layer_norms": rep.layer_norms, "gram": rep.group_gram,
            "group_ids": rep.group_ids}


def _hook(model, batch, full, run_dir: Path) -> dict[str, float]:
    """The hook at step 1 (as rlgrad's trainer runs it); ``full``: the rank's rollout before the filter."""
    hook = PerSampleHook(PerSampleConfig(every=1), Schedule(1), bucket_mode="quantile", num_buckets=3)
    ctx = StepContext(step=1, batch=batch, actor=model, optimizer=None, loss_settings=SETTINGS["seq"], config=None,
                      run_dir=run_dir, is_main=not torch.distributed.is_initialized()
                      or torch.distributed.get_rank() == 0, unfiltered_batch=full)
    return hook.before_update(ctx).metrics


def _filtered(batch):
    """The rollout filter's batch: group 2 dropped (``full`` keeps it: samples.jsonl indexes the whole rollout)."""
    return batch.select(torch.nonzero(batch.group_ids != 2).squeeze(-1))


def rank_results(rank: int, model, batch, out_dir: str) -> None:
    """This rank's reports of every case and the hook's metrics (and samples.jsonl, rank 0) into ``out_dir``:
    ``model`` and ``batch`` the whole batch's, the same on every rank."""
    from rlgrad.distributed import wrap

    shards, _ = wrap(copy.deepcopy(model), "fsdp2")
    out = {}
    for kind, split, loss in CASES:
        share = batch.select(torch.tensor(SPLITS[split][rank], dtype=torch.long))
        out[(kind, split, loss)] = _analyse(model if kind == "plain" else shards, share, loss)
    full = batch.select(torch.tensor(SPLITS["uneven"][rank], dtype=torch.long))
    out["hook"] = _hook(model, _filtered(full), full, Path(out_dir) / "two")
    torch.save(out, Path(out_dir) / f"per_sample_{rank}.pt")


def metric_close(name: str, got: float, want: float, metrics: dict[str, float], rel: float = 1e-5,
                 abs_: float = 1e-12) -> bool:
    """``got`` equals ``want`` (metric ``name``; ``metrics``: the run's others) to ``rel``, or both are NaN (a batch
    that cannot tell, e.g. a signal estimate <= 0). The estimates that are differences lose digits to cancellation
    and are held to ``rel`` of the terms they subtract: |G|² = ||Σ g||² - tr Σ / n to ``rel`` of ||Σ g||², B_simple
    to the same share of itself, the inter-prompt part to ``rel`` of tr Σ."""
    if math.isnan(got) or math.isnan(want):
        return math.isnan(got) and math.isnan(want)
    scale = max(abs(got), abs(want))
    what, _, rest = name.partition("/")
    if what in ("noise_trace_se", "noise_signal_se", "noise_cov", "noise_scale_low", "noise_scale_high"):
        rel = 1e3 * rel  # leave-one-group-out differences of differences: they lose three more digits
    elif what == "noise_trace":  # n (||h̄||² − |G|²): to ``rel`` of n ||h̄||²
        scale += metrics[f"noise_samples/{rest.split('/')[0]}"] * abs(metrics[f"noise_signal/{rest}"])
    if what in ("noise_signal", "noise_scale", "noise_inter"):
        trace, signal = metrics[f"noise_trace/{rest}"], metrics[f"noise_signal/{rest}"]
        whole = abs(signal) + trace / metrics[f"noise_samples/{rest.split('/')[0]}"]  # ||Σ g||²
        if what == "noise_signal":
            scale = whole
        elif what == "noise_scale":  # not NaN: its signal estimate is > 0
            scale *= whole / signal
        else:
            scale += trace
    return abs(got - want) <= rel * scale + abs_


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    scale = float(want.abs().max()) if want.numel() else 0.0
    return got.shape == want.shape and torch.allclose(got.double(), want.double(), rtol=1e-5, atol=1e-9 * scale + 1e-12)


def _assert_equal(got: list[dict], want: dict, rows: tuple[list[int], list[int]], case) -> None:
    """Both ranks' reports (``got``) against one process's (``want``); ``rows``: the rows each rank held."""
    for part in got:
        assert set(part["metrics"]) == set(want["metrics"]), case
        for k, v in want["metrics"].items():
            assert metric_close(k, part["metrics"][k], v, want["metrics"]), (case, k, part["metrics"][k], v)
        assert torch.equal(part["group_ids"], want["group_ids"]), case
        for term, by_group in want["gram"].items():
            assert all(_close(part["gram"][term][g], k) for g, k in by_group.items()), (case, term)
    for part, held in zip(got, rows):
        for term, norms in want["norms"].items():
            assert _close(part["norms"][term], norms[held]), (case, term)
            for g, v in want["layer_norms"][term].items():
                assert _close(part["layer_norms"][term][g], v[held]), (case, term, g)


def assert_per_sample_equal(out_dir: Path, model, batch) -> None:
    """The two ranks' results (``rank_results``) against one process on the whole batch."""
    got = [torch.load(out_dir / f"per_sample_{r}.pt", weights_only=False) for r in (0, 1)]
    for case in CASES:
        want = _analyse(model, batch, case[2])
        assert want["metrics"]["noise_trace/all/task"] > 0 and want["metrics"]["noise_inter/bucket_3/task"] != 0
        _assert_equal([g[case] for g in got], want, SPLITS[case[1]], case)
    one = _hook(model, _filtered(batch), batch, out_dir / "one")
    assert set(got[0]["hook"]) == set(one)
    for k, v in one.items():
        if not k.startswith("timing_s/"):
            assert metric_close(k, got[0]["hook"][k], v, one) and metric_close(k, got[1]["hook"][k], v, one), k

    def lines(run: str) -> list[dict]:
        return [json.loads(x) for x in (out_dir / run / "analysis" / "step_1" / "samples.jsonl").read_text()
                .splitlines()]

    a, b = lines("one"), lines("two")
    assert len(a) == len(b) == 16 and [r["sample"] for r in a] == [*range(8), *range(12, 20)]  # group 2 left out
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if not k.startswith("grad_norm/")} == \
            {k: v for k, v in y.items() if not k.startswith("grad_norm/")}
        assert all(abs(x[k] - y[k]) <= 1e-5 * x[k] + 1e-12 for k in x if k.startswith("grad_norm/")), (x, y)
    # sample_layers.json: the layer groups' batch-gradient norms (global Gram) and mean per-sample norms (every rank's
    # rows gathered) equal one process's
    one_layers, two_layers = (json.loads((out_dir / run / "analysis" / "step_1" / "sample_layers.json").read_text())
                              for run in ("one", "two"))
    assert set(one_layers) == set(two_layers)
    for term, by_group in one_layers.items():
        assert set(by_group) == set(two_layers[term])
        for g, v in by_group.items():
            assert all(abs(v[k] - two_layers[term][g][k]) <= 1e-5 * v[k] + 1e-12 for k in v), (term, g)
