"""Gradient analysis by reward-variance bucket and loss component (task / entropy / KL).

``grad_norm/<bucket>/<component>`` is the global L2 norm, over all trainable parameters, of the
gradient of that bucket's aggregated component loss (with its coefficient: ``-entropy_coeff·H``,
``kl_loss_coef·KL``), before clipping, aggregated with ``loss_agg_mode`` over the bucket's samples
alone. It is one whole-bucket gradient, not a mean of mini-batch norms. No optimizer step is taken
and weights, optimizer state, gradients and RNG streams are left as they were.
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from rlgrad.analysis.buckets import Buckets, global_buckets
from rlgrad.analysis.dist import all_reduce_sum
from rlgrad.analysis.engine import GradStats, slice_gradients
from rlgrad.batch import Batch
from rlgrad.hooks import Hook, HookResult, StepContext
from rlgrad.rl.actor import LossSettings, TokenLosses, token_losses
from rlgrad.rl.core import agg_token_weights
from rlgrad.rundir import atomic_write_bytes, atomic_write_json, atomic_write_text


@dataclass
class BucketReport:
    metrics: dict[str, float]  # grad_norm/<bucket>/... (prefix applied)
    layers: dict[str, dict[str, dict[str, float]]]  # bucket -> component -> layer group -> norm
    buckets: Buckets
    stats: GradStats
    extra: dict = field(default_factory=dict)


def analyse_buckets(model, batch: Batch, s: LossSettings, *, bucket_mode: str = "quantile", num_buckets: int = 6,
                    method: str = "fast", prefix: str = "grad_norm", keep_grads: bool = False,
                    dp_trim: int = 0) -> BucketReport:
    """Every bucket's (and ``all``'s) gradient norm per loss component, in one engine call.

    Data parallel: ``batch`` is this rank's share (whole prompt groups, global group ids); buckets,
    counts, denominators and losses are global (``global_buckets`` + sums over ranks), the engine sums
    slice gradients over ranks, so every number equals the one-process number on the global batch.
    ``dp_trim > 1``: the seeds' trimming of each bucket to a multiple of ``dp_trim`` samples.
    """
    buckets = global_buckets(batch.group_ids, batch.reward_std, mode=bucket_mode, num_buckets=num_buckets,
                             trim=dp_trim)
    given = batch
    if len(batch) == 0:  # this rank holds nothing: one zero-loss row still runs the engine's collectives
        batch = batch.blank_rows(1)
    real = [n for n in buckets.names if n != "all"]
    omega, u = agg_token_weights(batch.response_mask, s.loss_agg_mode, horizon=s.horizon)
    # count, response tokens and the aggregation denominator of each bucket, over all ranks
    sizes = all_reduce_sum(torch.tensor([[len(buckets.rows[n]), float(batch.response_mask[buckets.rows[n]].sum()),
                                          float(u[buckets.rows[n]].sum())] for n in buckets.names], dtype=torch.float64))
    count = {n: float(sizes[k, 0]) for k, n in enumerate(buckets.names)}
    tokens = {n: float(sizes[k, 1]) for k, n in enumerate(buckets.names)}
    denom = {n: float(sizes[k, 2]) for k, n in enumerate(buckets.names)}
    weights = torch.zeros(len(real), len(batch))
    for k, n in enumerate(real):
        weights[k, buckets.rows[n]] = 1.0 / max(denom[n], 1e-8)
    derived = {"all": {n: denom[n] / max(denom["all"], 1e-8) for n in real}}
    if method == "reference":  # the seeds' procedure: `all` is one more sub-batch, probed on its own
        w_all = torch.zeros(1, len(batch))
        w_all[0, buckets.rows["all"]] = 1.0 / max(denom["all"], 1e-8)
        weights = torch.cat([weights, w_all])
        real, derived = real + ["all"], {}

    stash: list[tuple[Batch, TokenLosses]] = []

    def loss_fn(m, b: Batch) -> dict[str, torch.Tensor]:
        t = token_losses(m, b, s)
        stash.append((b, t))
        w, _ = agg_token_weights(t.mask, s.loss_agg_mode, horizon=s.horizon)
        return {k: v * w.to(v.dtype) for k, v in t.components(s).items()}

    with torch.random.fork_rng(devices=[]):  # nothing random should happen; make sure of it
        try:
            stats = slice_gradients(method, model, batch, loss_fn, weights, real, derived, keep_grads=keep_grads)
        except NotImplementedError as e:  # a model the fast engine's hooks do not cover: same numbers, slower
            import warnings
            warnings.warn(f"{e}; falling back to analysis.method=reference", stacklevel=2)
            return analyse_buckets(model, given, s, bucket_mode=bucket_mode, num_buckets=num_buckets,
                                   method="reference", prefix=prefix, keep_grads=keep_grads, dp_trim=dp_trim)
        if not (stash and len(stash[0][0]) == len(batch)):  # reference: one no-grad forward for the loss values
            with torch.no_grad():
                stash = [(batch, token_losses(model, batch, s))]
    t = stash[0][1]
    terms = {"policy": t.pg.detach(), "entropy": t.entropy.detach()}
    if t.kl is not None:
        terms["kl"] = t.kl.detach()
    if stats.row_order is not None:  # the fast engine ran its forward on rows sorted by bucket
        inv = torch.argsort(stats.row_order)
        terms = {k: v[inv.to(v.device)] for k, v in terms.items()}
    omega = omega.to(t.pg.device)

    # each bucket's loss terms: local numerators, summed over ranks (one collective)
    nums = all_reduce_sum(torch.tensor([[float((v[buckets.rows[n]] * omega[buckets.rows[n]]).sum()) for v in terms.values()]
                                        for n in buckets.names], dtype=torch.float64))
    metrics: dict[str, float] = {}
    layers: dict[str, dict[str, dict[str, float]]] = {}
    n_total = float(all_reduce_sum(torch.tensor(float((batch.group_ids >= 0).sum()))))
    for b, name in enumerate(buckets.names):
        key = f"{prefix}/{name}"
        metrics[f"{key}/sample_count"] = count[name]
        metrics[f"{key}/sample_pct"] = 100.0 * count[name] / max(n_total, 1)
        stds = torch.tensor([sd for bk, _, sd in buckets.groups if name == "all" or bk == name])
        metrics[f"{key}/group_rv_count"] = float(len(stds))
        metrics[f"{key}/reward_std_mean"] = float(stds.mean())
        metrics[f"{key}/reward_std_min"] = float(stds.min())
        metrics[f"{key}/reward_std_max"] = float(stds.max())
        losses = {k: float(nums[b, j]) / max(denom[name], 1e-8) for j, k in enumerate(terms)}
        total = losses["policy"] - s.entropy_coeff * losses["entropy"]
        if "kl" in losses:
            total += s.kl_loss_coef * losses["kl"]
        for k, v in {**losses, "total": total}.items():
            metrics[f"{key}/loss/{k}"] = v
        layers[name] = {}
        for comp in stats.gram:
            norm = stats.norm(comp, name)
            metrics[f"{key}/{comp}"] = norm
            metrics[f"{key}/per_sample/{comp}"] = norm / max(count[name], 1)
            metrics[f"{key}/per_token/{comp}"] = norm / max(tokens[name], 1.0)
            layers[name][comp] = {g: stats.norm(comp, name, g) for g in sorted(stats.gram[comp])}
    return BucketReport(metrics, layers, buckets, stats)


def actor_summary(metrics: dict[str, float], prefix: str = "grad_norm") -> dict[str, float]:
    """The ``all`` bucket's values, copied to ``actor/loss/*`` and ``actor/grad_norm/*``, as the seeds do."""
    out = {}
    for k in ("policy", "entropy", "kl", "total"):
        if f"{prefix}/all/loss/{k}" in metrics:
            out[f"actor/loss/{k}"] = metrics[f"{prefix}/all/loss/{k}"]
    for c in ("task", "entropy", "kl"):
        if f"{prefix}/all/{c}" in metrics:
            out[f"actor/grad_norm/{c}"] = metrics[f"{prefix}/all/{c}"]
    return out


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
        import shutil
        shutil.rmtree(out_dir / "model", ignore_errors=True)
        tmp.rename(out_dir / "model")


class GradientAnalysisHook(Hook):
    """The bucket analysis at the trainer's hook point, with the seeds' cadence and exits."""

    def __init__(self, cfg):
        self.cfg = cfg

    def due(self, step: int) -> bool:
        t = self.cfg.trainer
        return t.gradient_analysis_mode and (step - 1) % t.gradient_analysis_every == 0

    def before_update(self, ctx: StepContext) -> HookResult | None:
        if not self.due(ctx.step):
            return None
        cfg, t, r = self.cfg, self.cfg.trainer, self.cfg.rollout
        batch, unfiltered = ctx.batch, ctx.extras.get("unfiltered_batch")
        if t.gradient_analysis_env_groups or t.gradient_analysis_group_size:
            groups = t.gradient_analysis_env_groups or cfg.data.train_batch_size
            size = t.gradient_analysis_group_size or r.n
            batch, unfiltered = ctx.extras["sample_batch"](groups, size)
        result = HookResult()
        step_dir = ctx.run_dir / "analysis" / f"step_{ctx.step}"
        runs = [("grad_norm", batch)]
        if t.gradient_analysis_log_prefilter and unfiltered is not None:
            runs.append(("grad_norm_prefilter", ctx.extras["prepare"](unfiltered)))
        layers_out = {}
        trim = t.nnodes * t.n_gpus_per_node if cfg.analysis.dp_trim else 0
        for prefix, b in runs:
            # skipped only when the batch is empty on every rank (b is None is decided globally)
            if b is None or float(all_reduce_sum(torch.tensor(float(len(b))))) == 0:
                continue
            rep = analyse_buckets(ctx.actor, b, ctx.loss_settings, bucket_mode=r.gradient_analysis_bucket_mode,
                                  num_buckets=r.gradient_analysis_num_buckets, method=cfg.analysis.method,
                                  prefix=prefix, dp_trim=trim)
            result.metrics.update(rep.metrics)
            layers_out[prefix] = rep.layers
            rows = [[bk, g, sd] for bk, g, sd in rep.buckets.groups]
            result.tables[f"{prefix}/group_rv_table"] = (["bucket", "group_id", "reward_std"], rows)
            if ctx.is_main:
                name = "group_rv_table.csv" if prefix == "grad_norm" else "group_rv_table_prefilter.csv"
                atomic_write_text(step_dir / name, group_table_csv(rep.buckets))
                if prefix == "grad_norm" and cfg.analysis.save_batch:
                    extra = {"step": ctx.step, "bucket_mode": r.gradient_analysis_bucket_mode,
                             "num_buckets": r.gradient_analysis_num_buckets, "method": cfg.analysis.method,
                             "buckets": [n for n in rep.buckets.names]}
                    save_probe_bundle(step_dir, b, rep.buckets, ctx.loss_settings, extra,
                                      ctx.actor if cfg.analysis.save_model else None, ctx.tokenizer)
        result.metrics.update(actor_summary(result.metrics))
        if ctx.is_main:
            atomic_write_json(step_dir / "layers.json", layers_out)
        if t.exit_after_gradient_analysis:
            result.metrics["trainer/exited_after_gradient_analysis"] = 1.0
            result.stop, result.reason = True, "trainer.exit_after_gradient_analysis"
        return result
