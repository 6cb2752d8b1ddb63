"""The bucket analysis (``analysis.buckets``, RAGEN's gradient analysis): the gradient by reward-variance bucket
and loss term (task / entropy / KL).

``grad_norm/<bucket>/<term>`` is the global L2 norm, over all trainable parameters, of the
gradient of that bucket's aggregated component loss (with its coefficient: ``-entropy_coeff·H``,
``kl_loss_coef·KL``), before clipping, aggregated with ``loss_agg_mode`` over the bucket's samples
alone. It is one whole-bucket gradient, not a mean of mini-batch norms. No optimizer step is taken
and weights, optimizer state, gradients and RNG streams are left as they were.

Buckets. A group's reward std is the unbiased std of its samples' sequence scores (the same
``reward_std`` the rollout filter computes and every sample carries).

* ``quantile``: groups sorted by std ascending (ties by group id), ``B = min(num_buckets,
  num_groups)`` buckets of ``num_groups // B`` consecutive groups, the remainder going to
  the last bucket. ``bucket_1`` holds the lowest variance.
* ``quantile_nonzero``: ``bucket_1`` holds every group whose rewards are all equal (std 0: no task gradient
  under GRPO), and the other groups are split by std into ``num_buckets - 1`` quantile buckets, ties never
  split across two. With most groups at std 0 (a small model on a hard task) ``quantile`` would fill several
  buckets with identical zero-variance groups; this shows them once and spreads the quantiles over the rest.
* ``fixed_rv``: ``[0,1) [1,2) [2,3) [3,4) [4,5) [5,inf)``.

Empty buckets are skipped (their names are not reused: ``bucket_k`` keeps its meaning).

``all`` (the whole batch) is always included. Every sample is in exactly one real bucket.
"""

from __future__ import annotations

import csv
import io
import shutil
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from rlgrad.algos.aggregation import denominator
from rlgrad.algos.objective import LossFn, LossSettings, as_loss_fn
from rlgrad.analysis.engine import GradStats, fast_unsupported, slice_gradients
from rlgrad.analysis.groups import GroupPass, SharedPass, checked, logged_values
from rlgrad.analysis.instrument import InstrumentHook, fast_unsupported_at, step_dir
from rlgrad.batch import Batch, check_batch
from rlgrad.collectives import all_gather_cat, all_gather_sizes, all_reduce_sum, rank
from rlgrad.hooks import HookResult, Schedule, StepContext
from rlgrad.metrics import BUCKETS, key, match, parse
from rlgrad.runfiles import atomic_write_bytes, atomic_write_json

if TYPE_CHECKING:
    from rlgrad.config.analysis import BucketAnalysisConfig

FIXED_RV_EDGES = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, float("inf"))


@dataclass
class Buckets:
    rows: dict[str, torch.Tensor]  # bucket name -> sample indices (ascending); "all" first
    groups: list[tuple[str, int, float]]  # (bucket, group_id, reward_std) for every group

    @property
    def names(self) -> list[str]:
        return list(self.rows)

    def bucket_ids(self, n: int) -> torch.Tensor:
        """[n] bucket number per sample (1-based, the k of bucket_k)."""
        out = torch.zeros(n, dtype=torch.long)
        for name, idx in self.rows.items():
            if name != "all":
                out[idx] = int(name.split("_")[1])
        return out


def group_table(group_ids: torch.Tensor, reward_std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique group ids (ascending) and each group's reward std."""
    gids, first = _first_occurrence(group_ids)
    return gids, reward_std[first].float()


def _first_occurrence(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    uniq, inv = torch.unique(x, return_inverse=True)
    pos = torch.arange(len(x), device=x.device)
    first = torch.full((len(uniq),), len(x), dtype=torch.long, device=x.device).scatter_reduce(0, inv, pos, "amin")
    return uniq, first


def _clamped(num_buckets: int, most: int, mode: str) -> int:
    """``num_buckets``, or ``most`` (with a warning naming both) when it asks for more buckets than there can be."""
    if mode == "fixed_rv" or num_buckets <= most or most < 1:
        return num_buckets
    warnings.warn(f"analysis.buckets.num_buckets={num_buckets} is more than the {most} bucket(s) the batch's "
                  f"prompt groups can fill (bucket_mode={mode}); using {most}", stacklevel=3)
    return most


def make_buckets(group_ids: torch.Tensor, reward_std: torch.Tensor, *, mode: str = "quantile",
                 num_buckets: int = 6) -> Buckets:
    """The groups of ``group_ids`` in buckets by ``reward_std`` (module docstring). ``num_buckets`` beyond what the
    groups can fill -- the number of groups; under ``quantile_nonzero`` one more, the zero-std bucket -- is clamped
    to it with a warning that names both numbers (the buckets it would add are empty, and empty buckets are
    skipped anyway)."""
    gids, std_t = group_table(group_ids, reward_std)
    num_buckets = _clamped(num_buckets, len(gids) + (mode == "quantile_nonzero"), mode)
    stds, ids = std_t.tolist(), gids.tolist()  # Python numbers once, not a tensor element per comparison

    def by_std(k: int) -> tuple[float, int]:
        return stds[k], ids[k]

    if mode == "quantile":
        order = sorted(range(len(ids)), key=by_std)
        b = min(num_buckets, len(ids))
        per = len(ids) // b if b else 0
        members = [order[i * per:(i + 1) * per] if i < b - 1 else order[i * per:] for i in range(b)]
    elif mode == "quantile_nonzero":
        order = sorted(range(len(ids)), key=by_std)
        rest = [k for k in order if stds[k] > 0]
        members = [[k for k in order if stds[k] == 0]] + _tied_quantiles(rest, stds, num_buckets - 1)
    elif mode == "fixed_rv":
        members = [[k for k in range(len(ids)) if lo <= stds[k] < hi]
                   for lo, hi in zip(FIXED_RV_EDGES[:-1], FIXED_RV_EDGES[1:])]
    else:
        raise ValueError(f"unknown analysis.buckets.bucket_mode '{mode}' (quantile | quantile_nonzero | fixed_rv)")
    rows = {"all": torch.arange(len(group_ids))}
    table = []
    for i, ks in enumerate(members, start=1):
        if not ks:
            continue
        name = f"bucket_{i}"
        in_bucket = torch.isin(group_ids, gids[ks])
        rows[name] = torch.nonzero(in_bucket).squeeze(-1)
        table += [(name, ids[k], stds[k]) for k in sorted(ks, key=by_std)]
    return Buckets(rows, table)


def _tied_quantiles(order: list[int], stds: list[float], b: int) -> list[list[int]]:
    """``order`` (groups by ascending std) in ``b`` consecutive chunks of about equal size: each takes its share
    of the groups left (at least one), extended past the groups that tie with its last; the last takes the rest."""
    out, start = [], 0
    for i in range(max(b, 0)):
        end = len(order) if i == b - 1 else min(start + max((len(order) - start) // (b - i), 1), len(order))
        while 0 < end < len(order) and stds[order[end]] == stds[order[end - 1]]:
            end += 1
        out.append(order[start:end])
        start = end
    return out


def global_buckets(group_ids: torch.Tensor, reward_std: torch.Tensor, *, mode: str = "quantile",
                   num_buckets: int = 6, trim: int = 0) -> Buckets:
    """``make_buckets`` over the groups of EVERY rank; ``rows`` index this rank's samples.

    ``group_ids`` and ``reward_std`` are global (a group split over ranks, as verl's length balancing does,
    has the same id and std on each), so gathering each rank's (id, std) pairs, once per group, gives every
    rank the same buckets, names and group table; a bucket this rank holds no sample of has empty local rows.
    Rows whose group id is unknown (``Batch.blank_rows``) belong to no bucket.
    ``trim > 1``: RAGEN's DP trimming -- a bucket keeps the largest multiple of ``trim`` of its
    samples, dropping its LAST samples in global order (rank by rank); a bucket left empty is skipped
    and ``all`` becomes the union of the trimmed buckets. One process: ``make_buckets`` (then trimmed).
    """
    gids, stds = group_table(group_ids, reward_std)
    gids, stds = all_gather_cat(gids), all_gather_cat(stds)
    per_group = make_buckets(gids, stds, mode=mode, num_buckets=num_buckets)
    rows = {"all": torch.nonzero(torch.isin(group_ids, gids)).squeeze(-1)}
    for name in per_group.names[1:]:
        rows[name] = torch.nonzero(torch.isin(group_ids, gids[per_group.rows[name]])).squeeze(-1)
    groups = per_group.groups
    if trim > 1:
        for name in list(rows)[1:]:
            counts = all_gather_sizes(len(rows[name]))
            keep = sum(counts) - sum(counts) % trim
            before = sum(counts[:rank()])
            rows[name] = rows[name][:min(max(keep - before, 0), len(rows[name]))]
            if keep == 0:
                del rows[name]
        rows["all"] = torch.sort(torch.cat([rows["all"][:0]] + [rows[n] for n in list(rows)[1:]])).values
        groups = [g for g in groups if g[0] in rows]
    return Buckets(rows, groups)


@dataclass
class BucketReport:
    metrics: dict[str, float]  # grad_norm/{bucket}/...
    layers: dict[str, dict[str, dict[str, float]]]  # bucket -> component -> layer group -> norm
    buckets: Buckets
    stats: GradStats
    extra: dict = field(default_factory=dict)


def analyse_buckets(model: nn.Module, batch: Batch, loss: LossFn | LossSettings | None = None, *,
                    bucket_mode: str = "quantile", num_buckets: int = 6, method: str = "fast",
                    keep_grads: bool = False, dp_trim: int = 0, groups: GroupPass | None = None) -> BucketReport:
    """Every bucket's (and ``all``'s) gradient norm per loss term, in one engine call.

    ``loss``: any ``LossFn`` (``rlgrad.loss.per_token_loss`` wraps a training loop's own), or the
    ``LossSettings`` of rlgrad's actor loss (default: its defaults). Data parallel: ``batch`` is this
    rank's share (whole prompt groups, global group ids); buckets, counts, denominators and losses are
    global (``global_buckets`` + sums over ranks), the engine sums slice gradients over ranks, so every
    number equals the one-process number on the global batch. ``dp_trim > 1``: RAGEN's trimming of each
    bucket to a multiple of ``dp_trim`` samples. ``num_buckets`` beyond the number of prompt groups is clamped to
    it, with a warning (``make_buckets``). ``batch`` is checked first (``check_batch``: its fields set after
    construction too), a ``UserError`` naming a field of the wrong shape. ``groups``: the prompt-group pass of the
    same model, batch and loss (``groups.group_pass``, every term), which gives every bucket's Gram without a pass
    of its own (``fast``, no ``dp_trim``, no ``keep_grads``; otherwise the engine runs as usual).
    """
    check_batch(batch)
    loss_fn = as_loss_fn(loss)
    # decided first (reference probes `all` itself); a model the fast engine made ``groups`` of is covered
    if method == "fast" and groups is None and (why := fast_unsupported(model)):
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
    if groups is not None and method == "fast" and dp_trim <= 1 and not keep_grads:
        for term in groups.grams:
            key("grad_norm/{bucket}/{term}", bucket="all", term=term)
        stats = _from_groups(groups, buckets, denom)
        values = _loss_values(model, batch, loss_fn, (groups.logged, groups.total), groups.row_order, buckets)
    else:
        seen: list[tuple] = []
        stats = slice_gradients(method, model, batch, checked(loss_fn, seen), weights,
                                real, derived, keep_grads=keep_grads)
        # fast: ONE forward over the whole batch (rows sorted by bucket), whose outputs give the loss values
        values = _loss_values(model, batch, loss_fn, seen[0] if stats.row_order is not None else None,
                              stats.row_order, buckets)
    metrics: dict[str, float] = {}
    layers: dict[str, dict[str, dict[str, float]]] = {}
    n_total = float(all_reduce_sum(torch.tensor(float((batch.group_ids >= 0).sum()))))
    norms = {term: _slice_norms(stats, term) for term in stats.gram}
    for b in buckets.names:
        stds = torch.tensor([sd for bk, _, sd in buckets.groups if b == "all" or bk == b])
        metrics[key("grad_norm/{bucket}/sample_count", bucket=b)] = count[b]
        metrics[key("grad_norm/{bucket}/sample_pct", bucket=b)] = 100.0 * count[b] / max(n_total, 1)
        metrics[key("grad_norm/{bucket}/group_rv_count", bucket=b)] = float(len(stds))
        # the same stds group_rv_table.csv lists: the console's zero-variance share is read from these two counts
        metrics[key("grad_norm/{bucket}/group_rv_zero_count", bucket=b)] = float((stds == 0).sum())
        metrics[key("grad_norm/{bucket}/reward_std_mean", bucket=b)] = float(stds.mean())
        metrics[key("grad_norm/{bucket}/reward_std_min", bucket=b)] = float(stds.min())
        metrics[key("grad_norm/{bucket}/reward_std_max", bucket=b)] = float(stds.max())
        losses = {name: v / denom[b] for name, v in values[b].items() if name != "total"}
        losses["total"] = sum(c * losses[name] for name, c in values[b]["total"].items())
        for name, v in losses.items():
            metrics[key("grad_norm/{bucket}/loss/{loss}", bucket=b, loss=name)] = v
        layers[b] = {}
        k = stats.slices.index(b)
        for term in stats.gram:
            norm = norms[term][None][k]
            metrics[key("grad_norm/{bucket}/{term}", bucket=b, term=term)] = norm
            metrics[key("grad_norm/{bucket}/per_sample/{term}", bucket=b, term=term)] = norm / max(count[b], 1)
            metrics[key("grad_norm/{bucket}/per_token/{term}", bucket=b, term=term)] = norm / max(tokens[b], 1.0)
            layers[b][term] = {g: norms[term][g][k] for g in sorted(stats.gram[term])}
    return BucketReport(metrics, layers, buckets, stats)


def _slice_norms(stats: GradStats, term: str) -> dict[str | None, list[float]]:
    """``stats.norm(term, s, group)`` of every slice s (in ``stats.slices``' order) by layer group, None: in total. The
    same operations on the same Gram entries, one per Gram: a bucket's norm and its groups' were a total Gram's sum
    and a few tensor operations each, about 0.8 ms of the embedded default's step."""
    grams = {None: stats.total_gram(term), **stats.gram[term]}
    return {g: gram.diagonal().clamp_min(0).sqrt().tolist() for g, gram in grams.items()}


def _from_groups(groups: GroupPass, buckets: Buckets, denom: dict[str, float]) -> GradStats:
    """The buckets' (and ``all``'s) gradient Grams from the prompt groups' of the same loss (``groups.py``):
    ``A K Aᵀ`` with ``A[b, g] = 1/D_b`` for each group g of bucket b (every group is in ``all``)."""
    place = {int(g): k for k, g in enumerate(groups.group_ids.tolist())}
    A = torch.zeros(len(buckets.names), len(place), dtype=torch.float64)
    for name, gid, _ in buckets.groups:
        A[buckets.names.index(name), place[gid]] = 1.0 / denom[name]
        A[buckets.names.index("all"), place[gid]] = 1.0 / denom["all"]
    gram = {term: {g: A @ k @ A.t() for g, k in per_group.items()} for term, per_group in groups.grams.items()}
    return GradStats(list(buckets.names), gram, row_order=groups.row_order)


def _bucket_sizes(batch: Batch, buckets: Buckets, loss_fn: LossFn
                  ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Each bucket's samples, response tokens and loss denominator (Σ u, ``core.denominator``), over all ranks."""
    _, u = loss_fn.agg.weights(batch.response_mask)
    sizes = all_reduce_sum(torch.tensor([[len(buckets.rows[n]), float(batch.response_mask[buckets.rows[n]].sum()),
                                          float(u[buckets.rows[n]].sum())] for n in buckets.names],
                                        dtype=torch.float64).reshape(len(buckets.names), 3))
    count, tokens, denom = ({n: float(sizes[k, j]) for k, n in enumerate(buckets.names)} for j in range(3))
    return count, tokens, {n: denominator(d) for n, d in denom.items()}


def _loss_values(model: nn.Module, batch: Batch, loss_fn: LossFn, out: tuple | None,
                 row_order: torch.Tensor | None, buckets: Buckets) -> dict[str, dict]:
    """bucket -> {name: Σ ω·value over the bucket's rows, all ranks; "total": {name: coefficient}}.

    The values are the loss's ``logged`` quantities and their ``total`` coefficients (``groups.logged_values``).
    ``out`` is those of the fast engine's forward over the rows in ``row_order``;
    without it (reference) one no-grad forward gives them (a rank with no rows: a blank row)."""
    probe = batch if len(batch) else batch.blank_rows(1)
    if out is None:
        with torch.no_grad():
            out, row_order = logged_values(loss_fn(model, probe)), None
    logged, total = out
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


class GradientAnalysisHook(InstrumentHook):
    """The bucket analysis at the trainer's hook point, with RAGEN's cadence and exit (``analysis.buckets``).

    ``settings``: the ``analysis.buckets`` section; ``schedule``: the steps it runs at (``schedules(cfg)``'s
    ``buckets``); ``method``: the gradient engine (``analysis.method``); ``train_batch_size`` / ``rollout_n``:
    the shape of a separate analysis batch whose ``env_groups`` / ``group_size`` are left unset (the training
    batch's); ``dp_size``: the data-parallel size ``dp_trim`` trims to (``trainer.nnodes x n_gpus_per_node``)."""

    declared = BUCKETS

    def __init__(self, settings: BucketAnalysisConfig, schedule: Schedule, *, method: str, train_batch_size: int,
                 rollout_n: int, dp_size: int = 1, shared: SharedPass | None = None):
        """``shared``: the prompt-group pass (``groups.py``) this hook shares with the other instruments due at its
        step; the analysis of the training batch then takes its buckets from it. ``hooks_from_config`` makes this
        hook a user of it only where the pass can serve it (``analysis.method=fast``, the training batch, no
        ``dp_trim`` over several ranks)."""
        self.settings, self.schedule, self.method = settings, schedule, method
        self.train_batch_size, self.rollout_n, self.dp_size = train_batch_size, rollout_n, dp_size
        self.shared = shared

    def measure(self, ctx: StepContext) -> tuple[HookResult, dict]:
        b = self.settings
        batch, unfiltered = ctx.batch, ctx.unfiltered_batch
        if b.env_groups or b.group_size:
            batch, unfiltered = ctx.sample_batch(b.env_groups or self.train_batch_size, b.group_size or self.rollout_n)
        runs = [("grad_norm", batch)]
        if b.log_prefilter and unfiltered is not None:
            runs.append(("grad_norm_prefilter", ctx.prepare(unfiltered)))
        result, layers, files = HookResult(), {}, {}
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
                files["group_rv_table.csv"] = group_table_csv(rep.buckets)
            else:  # the same analysis of the batch before the rollout filter: grad_norm_prefilter/{bucket}/...
                result.metrics.update({_prefiltered(k): v for k, v in rep.metrics.items()})
                result.tables["grad_norm_prefilter/group_rv_table"] = table
                files["group_rv_table_prefilter.csv"] = group_table_csv(rep.buckets)
            layers[prefix] = rep.layers
        files["layers.json"] = layers
        if b.exit_after:
            result.metrics["trainer/exited_after_gradient_analysis"] = 1.0
            result.stop, result.reason = True, "analysis.buckets.exit_after"
        return result, files

    def after_update_safe(self) -> bool:
        """Whether the analysis can be taken after the update from what its backward left: nothing else of it
        reads the model (no analysis of the batch before the filter, no model saved) and it stops nothing."""
        b = self.settings
        return not (b.log_prefilter or b.exit_after or (b.save_batch and b.save_model))

    def _analyse(self, ctx: StepContext, batch: Batch, prefix: str) -> BucketReport:
        """One bucket analysis of ``batch`` and (``save_batch``) its probe bundle on disk."""
        b = self.settings
        loss_fn, trim = ctx.actor_loss(), self.dp_size if b.dp_trim else 0
        groups = None
        ride = self.shared is not None and self.shared.rides(ctx) and self.after_update_safe()
        if self.shared is not None and self.shared.serves(ctx.step, "buckets", ride) \
                and batch is ctx.batch and not fast_unsupported_at(ctx):
            groups = self.shared.pass_for(ctx.step, ctx.actor, batch, loss_fn, one_pass=ride)
        rep = analyse_buckets(ctx.actor, batch, loss_fn, bucket_mode=b.bucket_mode, num_buckets=b.num_buckets,
                              method=self.method, dp_trim=trim, groups=groups)
        if ctx.is_main and prefix == "grad_norm" and b.save_batch:
            extra = {"step": ctx.step, "bucket_mode": b.bucket_mode, "num_buckets": b.num_buckets,
                     "method": self.method, "buckets": list(rep.buckets.names)}
            save_probe_bundle(step_dir(ctx), batch, rep.buckets, ctx.loss_settings, extra,
                              ctx.actor if b.save_model else None, ctx.tokenizer)
        return rep
