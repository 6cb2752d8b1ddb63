"""Gradient analysis by reward-variance bucket and loss component (task / entropy / KL).

``grad_norm/<bucket>/<term>`` is the global L2 norm, over all trainable parameters, of the
gradient of that bucket's aggregated component loss (with its coefficient: ``-entropy_coeff·H``,
``kl_loss_coef·KL``), before clipping, aggregated with ``loss_agg_mode`` over the bucket's samples
alone. It is one whole-bucket gradient, not a mean of mini-batch norms. No optimizer step is taken
and weights, optimizer state, gradients and RNG streams are left as they were.
"""

from __future__ import annotations

import csv
import io
import shutil
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from rlgrad.analysis.buckets import Buckets, global_buckets
from rlgrad.analysis.cadence import schedules
from rlgrad.analysis.engine import GradStats, fast_unsupported, slice_gradients
from rlgrad.batch import Batch
from rlgrad.collectives import all_reduce_sum
from rlgrad.core import denominator
from rlgrad.hooks import Hook, HookResult, Schedule, StepContext
from rlgrad.loss import LossFn, LossSettings, PerTokenLoss, as_loss_fn
from rlgrad.metrics import key, match, parse
from rlgrad.rundir import atomic_write_bytes, atomic_write_json, atomic_write_text

if TYPE_CHECKING:
    from rlgrad.config import RLGradConfig


@dataclass
class BucketReport:
    metrics: dict[str, float]  # grad_norm/{bucket}/...
    layers: dict[str, dict[str, dict[str, float]]]  # bucket -> component -> layer group -> norm
    buckets: Buckets
    stats: GradStats
    extra: dict = field(default_factory=dict)


def analyse_buckets(model: nn.Module, batch: Batch, loss: LossFn | LossSettings | None = None, *,
                    bucket_mode: str = "quantile", num_buckets: int = 6, method: str = "fast",
                    keep_grads: bool = False, dp_trim: int = 0) -> BucketReport:
    """Every bucket's (and ``all``'s) gradient norm per loss term, in one engine call.

    ``loss``: any ``LossFn`` (``rlgrad.loss.per_token_loss`` wraps a training loop's own), or the
    ``LossSettings`` of rlgrad's actor loss (default: its defaults). Data parallel: ``batch`` is this
    rank's share (whole prompt groups, global group ids); buckets, counts, denominators and losses are
    global (``global_buckets`` + sums over ranks), the engine sums slice gradients over ranks, so every
    number equals the one-process number on the global batch. ``dp_trim > 1``: RAGEN's trimming of each
    bucket to a multiple of ``dp_trim`` samples.
    """
    loss_fn = as_loss_fn(loss)
    if method == "fast" and (why := fast_unsupported(model)):  # decided first: reference probes `all` itself
        warnings.warn(f"{why}; falling back to analysis.method=reference", stacklevel=2)
        method = "reference"
    buckets = global_buckets(batch.group_ids, batch.reward_std, mode=bucket_mode, num_buckets=num_buckets,
                             trim=dp_trim)
    count, tokens, denom = _bucket_sizes(batch, buckets, loss_fn)
    real = [n for n in buckets.names if n != "all"]
    weights = torch.zeros(len(real), len(batch))
    for k, n in enumerate(real):
        weights[k, buckets.rows[n]] = 1.0 / denom[n]
    derived = {"all": {n: denom[n] / denom["all"] for n in real}}
    if method == "reference":  # RAGEN's procedure: `all` is one more sub-batch, probed on its own
        w_all = torch.zeros(1, len(batch))
        w_all[0, buckets.rows["all"]] = 1.0 / denom["all"]
        weights = torch.cat([weights, w_all])
        real, derived = real + ["all"], {}
    seen: list[dict] = []

    def capture(m: nn.Module, b: Batch) -> dict[str, torch.Tensor]:
        out = loss_fn(m, b)
        for term in out:  # a name no metric key can hold fails here, before any backward
            key("grad_norm/{bucket}/{term}", bucket="all", term=term)
        seen.append(out)
        return out

    stats = slice_gradients(method, model, batch, PerTokenLoss(capture, loss_fn.agg), weights, real, derived,
                            keep_grads=keep_grads)
    # fast: ONE forward over the whole batch (rows sorted by bucket), whose outputs give the loss values
    values = _loss_values(model, batch, loss_fn, seen[0] if stats.row_order is not None else None,
                          stats.row_order, buckets)
    metrics: dict[str, float] = {}
    layers: dict[str, dict[str, dict[str, float]]] = {}
    n_total = float(all_reduce_sum(torch.tensor(float((batch.group_ids >= 0).sum()))))
    for b in buckets.names:
        stds = torch.tensor([sd for bk, _, sd in buckets.groups if b == "all" or bk == b])
        metrics[key("grad_norm/{bucket}/sample_count", bucket=b)] = count[b]
        metrics[key("grad_norm/{bucket}/sample_pct", bucket=b)] = 100.0 * count[b] / max(n_total, 1)
        metrics[key("grad_norm/{bucket}/group_rv_count", bucket=b)] = float(len(stds))
        metrics[key("grad_norm/{bucket}/reward_std_mean", bucket=b)] = float(stds.mean())
        metrics[key("grad_norm/{bucket}/reward_std_min", bucket=b)] = float(stds.min())
        metrics[key("grad_norm/{bucket}/reward_std_max", bucket=b)] = float(stds.max())
        losses = {name: v / denom[b] for name, v in values[b].items() if name != "total"}
        losses["total"] = sum(c * losses[name] for name, c in values[b]["total"].items())
        for name, v in losses.items():
            metrics[key("grad_norm/{bucket}/loss/{loss}", bucket=b, loss=name)] = v
        layers[b] = {}
        for term in stats.gram:
            norm = stats.norm(term, b)
            metrics[key("grad_norm/{bucket}/{term}", bucket=b, term=term)] = norm
            metrics[key("grad_norm/{bucket}/per_sample/{term}", bucket=b, term=term)] = norm / max(count[b], 1)
            metrics[key("grad_norm/{bucket}/per_token/{term}", bucket=b, term=term)] = norm / max(tokens[b], 1.0)
            layers[b][term] = {g: stats.norm(term, b, g) for g in sorted(stats.gram[term])}
    return BucketReport(metrics, layers, buckets, stats)


def _bucket_sizes(batch: Batch, buckets: Buckets, loss_fn: LossFn
                  ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Each bucket's samples, response tokens and loss denominator (Σ u, ``core.denominator``), over all ranks."""
    _, u = loss_fn.agg.weights(batch.response_mask)
    sizes = all_reduce_sum(torch.tensor([[len(buckets.rows[n]), float(batch.response_mask[buckets.rows[n]].sum()),
                                          float(u[buckets.rows[n]].sum())] for n in buckets.names],
                                        dtype=torch.float64).reshape(len(buckets.names), 3))
    count, tokens, denom = ({n: float(sizes[k, j]) for k, n in enumerate(buckets.names)} for j in range(3))
    return count, tokens, {n: denominator(d) for n, d in denom.items()}


def _loss_values(model: nn.Module, batch: Batch, loss_fn: LossFn, out: dict | None, row_order: torch.Tensor | None,
                 buckets: Buckets) -> dict[str, dict]:
    """bucket -> {name: Σ ω·value over the bucket's rows, all ranks; "total": {name: coefficient}}.

    The values are the loss's ``logged`` quantities and their ``total`` coefficients (``rlgrad.loss.Terms``),
    else its terms and their sum. ``out`` is the fast engine's forward over the rows in ``row_order``;
    without it (reference) one no-grad forward gives them (a rank with no rows: a blank row)."""
    probe = batch if len(batch) else batch.blank_rows(1)
    if out is None:
        with torch.no_grad():
            out, row_order = loss_fn(model, probe), None
    logged = getattr(out, "logged", None) or {k: v.detach() for k, v in out.items()}
    total = getattr(out, "total", None) or {k: 1.0 for k in logged}
    if row_order is not None:
        inv = torch.argsort(row_order)
        logged = {k: v[inv.to(v.device)] for k, v in logged.items()}
    first = next(iter(logged.values()))
    omega, _ = loss_fn.agg.weights(probe.response_mask.to(first.device))
    nums = all_reduce_sum(torch.tensor([[float((v[buckets.rows[n]] * omega[buckets.rows[n]]).sum())
                                         for v in logged.values()] for n in buckets.names],
                                       dtype=torch.float64).reshape(len(buckets.names), len(logged)))
    return {n: {**{k: float(nums[b, j]) for j, k in enumerate(logged)}, "total": total}
            for b, n in enumerate(buckets.names)}


def actor_summary(metrics: dict[str, float]) -> dict[str, float]:
    """The ``all`` bucket's loss values and term norms, copied to ``actor/loss/*`` and ``actor/grad_norm/*``,
    as RAGEN does."""
    out = {}
    for k, v in metrics.items():
        if f := parse("grad_norm/{bucket}/loss/{loss}", k):
            if f["bucket"] == "all":
                out[key("actor/loss/{loss}", loss=f["loss"])] = v
        elif (f := parse("grad_norm/{bucket}/{term}", k)) and f["bucket"] == "all":
            out[key("actor/grad_norm/{term}", term=f["term"])] = v
    return out


def _prefiltered(k: str) -> str:
    """``grad_norm/{bucket}/...`` -> the same key under ``grad_norm_prefilter/`` (its own catalogue entry)."""
    template = match(k).template
    return key(template.replace("grad_norm/", "grad_norm_prefilter/", 1), **parse(template, k))


def group_table_csv(buckets: Buckets) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["bucket", "group_id", "reward_std"])
    w.writerows([[b, g, f"{sd:.8g}"] for b, g, sd in buckets.groups])
    return buf.getvalue()


def save_probe_bundle(out_dir: Path, batch: Batch, buckets: Buckets, s: LossSettings, extra: dict,
                      model=None, tokenizer=None) -> None:
    """Everything needed to recompute the logged numbers offline with plain autograd."""
    from safetensors.torch import save

    tensors = {
        "input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "response_mask": batch.response_mask,
        "advantages": batch.advantages, "old_log_probs": batch.old_log_probs, "group_ids": batch.group_ids,
        "reward_std": batch.reward_std, "bucket_ids": buckets.bucket_ids(len(batch)),
    }
    if batch.ref_log_probs is not None:
        tensors["ref_log_probs"] = batch.ref_log_probs
    atomic_write_bytes(out_dir / "batch.safetensors", save({k: v.contiguous().cpu() for k, v in tensors.items()}))
    atomic_write_json(out_dir / "loss.json", {"loss_settings": asdict(s), **extra})
    if model is not None:
        tmp = out_dir / ".model.tmp"
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        shutil.rmtree(out_dir / "model", ignore_errors=True)
        tmp.rename(out_dir / "model")


class GradientAnalysisHook(Hook):
    """The bucket analysis at the trainer's hook point, with RAGEN's cadence and exit (``analysis.buckets``)."""

    def __init__(self, cfg: RLGradConfig, schedule: Schedule | None = None):
        self.cfg = cfg
        self.schedule = schedule or schedules(cfg)["buckets"]

    def before_update(self, ctx: StepContext) -> HookResult | None:
        if not self.schedule.due(ctx.step):
            return None
        t0 = time.perf_counter()
        b = self.cfg.analysis.buckets
        batch, unfiltered = ctx.batch, ctx.unfiltered_batch
        if b.env_groups or b.group_size:
            batch, unfiltered = ctx.sample_batch(b.env_groups or self.cfg.data.train_batch_size,
                                                 b.group_size or self.cfg.rollout.n)
        runs = [("grad_norm", batch)]
        if b.log_prefilter and unfiltered is not None:
            runs.append(("grad_norm_prefilter", ctx.prepare(unfiltered)))
        result, layers = HookResult(), {}
        for prefix, rows in runs:
            # skipped only when the batch is empty on every rank (rows is None is decided globally)
            if rows is None or float(all_reduce_sum(torch.tensor(float(len(rows))))) == 0:
                continue
            rep = self._analyse(ctx, rows, prefix)
            table = (["bucket", "group_id", "reward_std"], [list(g) for g in rep.buckets.groups])
            if prefix == "grad_norm":
                result.metrics.update(rep.metrics)
                result.metrics.update(actor_summary(rep.metrics))
                result.tables["grad_norm/group_rv_table"] = table
            else:  # the same analysis of the batch before the rollout filter: grad_norm_prefilter/{bucket}/...
                result.metrics.update({_prefiltered(k): v for k, v in rep.metrics.items()})
                result.tables["grad_norm_prefilter/group_rv_table"] = table
            layers[prefix] = rep.layers
        if ctx.is_main:
            atomic_write_json(ctx.run_dir / "analysis" / f"step_{ctx.step}" / "layers.json", layers)
        if b.exit_after:
            result.metrics["trainer/exited_after_gradient_analysis"] = 1.0
            result.stop, result.reason = True, "analysis.buckets.exit_after"
        result.metrics["timing_s/analysis/buckets"] = time.perf_counter() - t0
        return result

    def _analyse(self, ctx: StepContext, batch: Batch, prefix: str) -> BucketReport:
        """One bucket analysis of ``batch``, its group table and (``save_batch``) its probe bundle on disk."""
        cfg, b = self.cfg, self.cfg.analysis.buckets
        trim = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node if b.dp_trim else 0
        rep = analyse_buckets(ctx.actor, batch, ctx.actor_loss(), bucket_mode=b.bucket_mode,
                              num_buckets=b.num_buckets, method=cfg.analysis.method, dp_trim=trim)
        if ctx.is_main:
            step_dir = ctx.run_dir / "analysis" / f"step_{ctx.step}"
            name = "group_rv_table.csv" if prefix == "grad_norm" else "group_rv_table_prefilter.csv"
            atomic_write_text(step_dir / name, group_table_csv(rep.buckets))
            if prefix == "grad_norm" and b.save_batch:
                extra = {"step": ctx.step, "bucket_mode": b.bucket_mode, "num_buckets": b.num_buckets,
                         "method": cfg.analysis.method, "buckets": list(rep.buckets.names)}
                save_probe_bundle(step_dir, batch, rep.buckets, ctx.loss_settings, extra,
                                  ctx.actor if b.save_model else None, ctx.tokenizer)
        return rep
