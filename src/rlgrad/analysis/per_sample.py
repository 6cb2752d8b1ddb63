"""Per-sample gradient norms and the noise scale of a step (``analysis.per_sample``).

For every row i of the analysed batch and every loss term, ``g_i`` is row i's contribution to the gradient
of the batch loss, with the loss's own aggregation (``Σ_i g_i`` is the batch gradient, ``grad_norm/all/{term}``).
Its exact norm, per layer group and in total, comes from the gradient engine's one forward and one backward per
term (``rows.py``: ghost norms or a row's own layer gradient, whichever is cheaper), never a backward per row
and never an ``N × |θ|`` tensor. The same pass gives the prompt groups' gradient sums, hence every bucket's; it is
``groups.group_pass``, which the other instruments due at the same step share (``groups.SharedPass``).

The noise metrics (docs/metrics.md, "Per-sample gradients and the noise scale", has the formulas and the
references: McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"; one-way random-effects
ANOVA for the inter/intra-prompt split) are computed per reward-variance bucket (the bucket analysis'
buckets, ``buckets.py``) from ``h_i = n_b · g_i^b``: the per-sample gradients whose mean over the bucket
is the bucket's own gradient ``grad_norm/{bucket}/{term}`` (``g_i^b``: row i's contribution to the loss
aggregated over the bucket alone).

Data parallel (DDP, FSDP2; every rank calls it, in step): each rank measures its own rows, the prompt groups'
gradient sums are summed over ranks layer by layer (``rows.py``), and the few numbers per row the metrics need
are gathered from every rank, so the metrics are the one-process numbers on the global batch.
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from rlgrad.algos.aggregation import denominator
from rlgrad.algos.objective import LossFn, LossSettings, as_loss_fn
from rlgrad.analysis.buckets import Buckets, global_buckets
from rlgrad.analysis.engine import fast_unsupported
from rlgrad.analysis.groups import (
    PROXY_CHUNK_ELEMENTS,
    GroupPass,
    SharedPass,
    checked,
    group_pass,
    lm_head,
    logit_grad_sq,
    only_terms,
)
from rlgrad.analysis.instrument import InstrumentHook, fast_unsupported_at
from rlgrad.analysis.noise import group_noise
from rlgrad.batch import Batch, check_batch, position_ids_from_mask
from rlgrad.collectives import all_gather_cat, all_gather_sizes, all_reduce_max, all_reduce_sum, rank
from rlgrad.hooks import HookResult, Schedule, StepContext
from rlgrad.metrics import PER_SAMPLE, key

if TYPE_CHECKING:
    from rlgrad.config.analysis import PerSampleConfig

NAN = float("nan")
# group_noise's names -> their catalogue keys
NOISE_KEYS = {"trace": "noise_trace/{bucket}/{term}", "signal": "noise_signal/{bucket}/{term}",
              "scale": "noise_scale/{bucket}/{term}", "trace_se": "noise_trace_se/{bucket}/{term}",
              "signal_se": "noise_signal_se/{bucket}/{term}", "cov": "noise_cov/{bucket}/{term}",
              "scale_low": "noise_scale_low/{bucket}/{term}", "scale_high": "noise_scale_high/{bucket}/{term}",
              "intra": "noise_intra/{bucket}/{term}", "inter": "noise_inter/{bucket}/{term}",
              "coherence": "coherence/{bucket}/{term}", "coherence_floor": "coherence_floor/{bucket}/{term}"}


@dataclass
class PerSampleReport:
    """``norms[term]`` ``[N]``: ``||g_i||`` in batch order; ``layer_norms[term][layer group]`` ``[N]``; ``metrics``:
    ``grad_norm_sample/...``, ``noise_*/...``, ``coherence/...``; ``group_ids`` ``[P]`` and ``group_gram[term][layer
    group]`` ``[P, P]``: the Gram matrix of the prompt groups' gradient sums ``Σ_{i∈group} g_i``. Data parallel:
    ``norms`` and ``layer_norms`` are this rank's rows, everything else is global (every rank's groups)."""

    norms: dict[str, torch.Tensor]
    layer_norms: dict[str, dict[str, torch.Tensor]]
    metrics: dict[str, float]
    buckets: Buckets
    group_ids: torch.Tensor
    group_gram: dict[str, dict[str, torch.Tensor]]


def _proxy_rows(model: nn.Module, batch: Batch) -> int:
    """Rows per forward of verl's proxy: ``PROXY_CHUNK_ELEMENTS`` over the batch's ``[L, V]`` logits."""
    head = lm_head(model)
    vocab = getattr(head, "out_features", None) or getattr(getattr(model, "config", None), "vocab_size", None)
    if not vocab:
        return 8
    return max(1, PROXY_CHUNK_ELEMENTS // (batch.input_ids.shape[-1] * int(vocab)))


@torch.no_grad()
def verl_variance_proxy(model: nn.Module, batch: Batch, rows_per_chunk: int | None = None,
                        per_token: torch.Tensor | None = None) -> torch.Tensor:
    """``[N]``: verl's per-sample variance proxy ``A_i² · W_i`` (verl's ``compute_variance_proxy_metrics``, on-policy,
    no rollout importance weights), ``W_i = Σ_t (1 − 2π_t(y_t) + Σ_v π_t(v)²)`` over the response tokens (the
    squared norm of ∂log π(y_t)/∂logits, summed over t) and ``A_i`` the mean advantage over them. π is the
    current policy at temperature 1, from one no-grad forward (verl takes π(y_t) from old_log_probs: on-policy the
    same). ``rows_per_chunk``: rows per forward (default ``_proxy_rows``). ``per_token``: ``groups.logit_grad_sq`` of a
    forward already run (the prompt-group pass's), which then costs no forward here. Data parallel: this rank's rows;
    every rank runs as many forwards as the rank with the most chunks (FSDP2 gathers each layer's weights in every
    forward), a blank row once its own rows are done."""
    device = next(model.parameters()).device  # the batch may sit on the CPU, as the trainer's does
    mask = batch.response_mask.float().cpu()
    if per_token is not None:
        return _proxy_of(per_token.float().cpu(), mask, batch)
    per_token = torch.zeros_like(mask)
    rows_per_chunk = rows_per_chunk or _proxy_rows(model, batch)
    chunks = int(all_reduce_max(torch.tensor(math.ceil(len(batch) / rows_per_chunk))))
    for i in range(0, chunks * rows_per_chunk, rows_per_chunk):  # the [rows, L, V] softmax a few rows at a time
        part = batch.select(torch.arange(i, min(i + rows_per_chunk, len(batch)))) if i < len(batch) else \
            batch.blank_rows(1)  # this rank's rows are done: a blank row keeps its forwards in step
        ids, att = part.input_ids.to(device), part.attention_mask.to(device)
        logits = model(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att),
                       use_cache=False).logits
        if i < len(batch):
            per_token[i:i + rows_per_chunk] = logit_grad_sq(logits, ids).cpu()
    return _proxy_of(per_token, mask, batch)


def _proxy_of(per_token: torch.Tensor, mask: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``A_i² · W_i`` from the per-token ``logit_grad_sq`` summed over the response tokens."""
    w = (per_token * mask).sum(-1)
    advantage = (batch.advantages.float().cpu() * mask).sum(-1) / mask.sum(-1).clamp_min(1)
    return advantage.pow(2) * w


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks 0..n-1 of ``x``, ties given their mean rank (Spearman's convention)."""
    ranks = torch.empty(len(x), dtype=torch.float64)
    ranks[torch.argsort(x)] = torch.arange(len(x), dtype=torch.float64)
    _, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inverse, ranks)
    return sums[inverse] / counts[inverse]


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    den = float(a.norm() * b.norm())
    return float(a @ b) / den if den > 0 else NAN


NULL_SHUFFLES = 1000  # shuffles of the proxy behind proxy_corr/spearman_null95


@functools.lru_cache(maxsize=4)
def _shuffle_table(size: int) -> torch.Tensor:
    """``[NULL_SHUFFLES, size]``: shuffles of ``size`` items from a fixed seed; ``size`` a power of 2, so a handful of
    tables serve every sample count."""
    rng = torch.Generator().manual_seed(0)
    return torch.stack([torch.randperm(size, generator=rng) for _ in range(NULL_SHUFFLES)])


def null_permutations(n: int) -> torch.Tensor:
    """``[NULL_SHUFFLES, n]``: the null's shuffles of n samples, the same for the same n. Each row is a row of a
    fixed table of shuffles of the next power of 2 (at least 128) with the entries >= n dropped: the order a
    uniform shuffle puts 0..n-1 in is a uniform shuffle of n. The sample count changes from step to step: 1000
    ``randperm`` draws at each new count cost about 3 ms of the embedded default's step, the filter about 1.5 ms
    (``_kept_shuffles`` keeps it for 16 counts)."""
    return _kept_shuffles(n).long()


@functools.lru_cache(maxsize=16)
def _kept_shuffles(n: int) -> torch.Tensor:
    """``null_permutations(n)``, kept for the last 16 sample counts (the samples with a non-zero gradient, which
    change from step to step: the embedded default's are a multiple of its 8 samples per prompt, at most 16 counts),
    as int16 where n fits: at most 16 x 2000·n bytes, 4.4 MB for its 128 rows (int64: 8.7)."""
    table = _shuffle_table(max(128, 1 << max(n - 1, 0).bit_length()))
    kept = torch.masked_select(table, table < n).view(NULL_SHUFFLES, n)
    return kept.to(torch.int16) if n <= 1 << 15 else kept


def proxy_correlation(proxy: torch.Tensor, sq_norms: torch.Tensor) -> dict[str, float]:
    """Spearman and Pearson correlation of verl's proxy with the true squared per-sample norms (``proxy_corr/*``),
    over the samples whose true gradient is not 0: a zero-variance group's samples have a zero gradient and a zero
    proxy both, tied points that agree by construction and would lift any proxy's rank correlation. Beside it, the
    null: the 95th percentile of |Spearman| over the same samples with the proxy shuffled (a fixed seed), what a proxy
    with no information about the samples scores."""
    keep = sq_norms > 0
    proxy, sq_norms = proxy[keep].double(), sq_norms[keep].double()
    # a canonical order (by norm, then proxy), so the shuffles, and the null, do not depend on the samples' order
    # (data parallel: every rank's rows, ranks in order)
    order = torch.sort(proxy, stable=True).indices
    order = order[torch.sort(sq_norms[order], stable=True).indices]
    proxy, sq_norms = proxy[order], sq_norms[order]
    out = {key("proxy_corr/samples"): float(len(proxy)), key("proxy_corr/spearman"): NAN,
           key("proxy_corr/pearson"): NAN, key("proxy_corr/spearman_null95"): NAN}
    if len(proxy) < 3:
        return out
    rank_proxy, rank_norms = _ranks(proxy), _ranks(sq_norms)
    # a shuffle keeps the ranks' mean and spread: only the cross term depends on it
    proxy_c, norms_c = rank_proxy - rank_proxy.mean(), rank_norms - rank_norms.mean()
    perms = null_permutations(len(proxy))
    # proxy_c[perms], by index_select: the same gather at a third of advanced indexing's time (0.5 ms at 128 samples)
    shuffled = proxy_c.index_select(0, perms.view(-1)).view(perms.shape)
    null = (shuffled @ norms_c).abs() / (proxy_c.norm() * norms_c.norm()).clamp_min(1e-300)
    out.update({key("proxy_corr/spearman"): _pearson(rank_proxy, rank_norms),
                key("proxy_corr/pearson"): _pearson(proxy, sq_norms),
                key("proxy_corr/spearman_null95"): float(torch.quantile(null, 0.95))})
    return out


def analyse_per_sample(model: nn.Module, batch: Batch, loss: LossFn | LossSettings | None = None, *,
                       bucket_mode: str = "quantile", num_buckets: int = 6, proxy: bool = False,
                       terms: Sequence[str] | None = None, groups: GroupPass | None = None) -> PerSampleReport:
    """Every sample's exact gradient norm per loss term and layer group, and the step's noise metrics per
    reward-variance bucket (the bucket analysis' buckets: ``bucket_mode``, ``num_buckets``), from one forward
    and one backward per term. ``loss``: any ``LossFn``, or the ``LossSettings`` of rlgrad's actor loss;
    ``terms``: the loss's terms to measure (None: all; each costs one backward, the others none).

    Data parallel: ``batch`` is this rank's share (global group ids; a group may be split over ranks) and every
    rank calls this; the norms are this rank's rows', the metrics those of one process on the global batch. A model
    the fast engine does not cover (``engine.fast_unsupported``): ``NotImplementedError`` saying why. ``groups``: the
    step's prompt-group pass when another instrument ran it already (``groups.group_pass`` of the same model, batch
    and loss, with at least ``terms``), which then costs no pass here (nor a check of the model: the fast engine
    made it).
    """
    check_batch(batch)
    loss_fn = as_loss_fn(loss)
    if terms is not None:
        loss_fn = only_terms(loss_fn, set(terms))
    if groups is None and (why := fast_unsupported(model)):
        raise NotImplementedError(f"per-sample gradient norms need the fast engine: {why}")
    buckets = global_buckets(batch.group_ids, batch.reward_std, mode=bucket_mode, num_buckets=num_buckets)
    if groups is None:
        groups = group_pass(model, batch, checked(loss_fn), proxy=proxy)
    wanted = [t for t in groups.rows if terms is None or t in terms]
    group_ids, inverse = groups.group_ids, groups.inverse
    rows, grams = {t: groups.rows[t] for t in wanted}, {t: groups.grams[t] for t in wanted}
    _, share = loss_fn.agg.weights(batch.response_mask)
    # What the metrics need of every row, every rank's rows (ranks in order): group, bucket number, share of the
    # loss's denominator, ||raw_i||² per term. A few numbers per row: the metrics below are one process's.
    terms = list(rows)
    everyone = all_gather_cat(torch.stack([inverse.double(), _bucket_of(buckets, len(batch)).double(),
                                           share.detach().double().cpu(),
                                           *(sum(rows[t].values()) for t in terms)], 1))
    all_inverse, all_share = everyone[:, 0].long(), everyone[:, 2]
    all_rows = {b: torch.nonzero(everyone[:, 1] == k if k else all_inverse >= 0).squeeze(-1)
                for k, b in enumerate(buckets.names)}
    denom = {b: denominator(float(all_share[idx].sum())) for b, idx in all_rows.items()}
    sizes = torch.bincount(all_inverse, minlength=len(group_ids))
    metrics: dict[str, float] = {}
    norms, layer_norms, group_gram = {}, {}, {}
    for j, term in enumerate(terms):
        row_sq, gram = everyone[:, 3 + j], sum(grams[term].values())
        norms[term] = sum(rows[term].values()).clamp_min(0).sqrt() / denom["all"]
        layer_norms[term] = {g: v.clamp_min(0).sqrt() / denom["all"] for g, v in rows[term].items()}
        group_gram[term] = {g: k / denom["all"] ** 2 for g, k in grams[term].items()}
        for b, idx in all_rows.items():
            metrics[key("noise_samples/{bucket}", bucket=b)] = float(len(idx))
            in_bucket = torch.unique(all_inverse[idx])
            scale = len(idx) / denom[b]  # h_i = n_b · g_i^b = n_b · raw_i / denom_b
            got = group_noise(row_sq[idx] * scale ** 2, gram[in_bucket][:, in_bucket] * scale ** 2,
                                sizes[in_bucket])
            metrics[key("grad_norm_sample/{bucket}/{term}", bucket=b, term=term)] = float(
                row_sq[idx].clamp_min(0).sqrt().mean()) / denom[b]
            metrics[key("noise_groups/{bucket}", bucket=b)] = got.pop("groups")
            for name, value in got.items():
                metrics[key(NOISE_KEYS[name], bucket=b, term=term)] = value
    if proxy and "task" in norms:
        metrics.update(proxy_correlation(all_gather_cat(verl_variance_proxy(model, batch,
                                                                            per_token=groups.proxy_tokens)),
                                         all_gather_cat(norms["task"] ** 2)))
    return PerSampleReport(norms, layer_norms, metrics, buckets, group_ids, group_gram)


def _bucket_of(buckets: Buckets, n: int) -> torch.Tensor:
    """``[n]``: each row's bucket as its place in ``buckets.names`` (0, the place of ``all``: in no bucket)."""
    out = torch.zeros(n, dtype=torch.long)
    for k, name in enumerate(buckets.names[1:], start=1):
        out[buckets.rows[name]] = k
    return out


def rollout_indices(batch: Batch, full: Batch | None) -> list[int]:
    """Each row's index in the step's whole rollout (``index`` in ``rollouts/step_N.jsonl``: every rank's rollout,
    ranks in order): the rollout filter keeps or drops whole prompt groups and keeps their order, so the k-th row of
    group g here is the k-th row of g in this rank's rollout ``full``. Without the whole rollout, the row's index in
    the batch (ranks in order). Data parallel: a collective, every rank calls it."""
    offset = sum(all_gather_sizes(len(batch if full is None else full))[:rank()])
    if full is None:
        return list(range(offset, offset + len(batch)))
    where: dict[int, list[int]] = {}
    for i, g in enumerate(full.group_ids.tolist()):
        where.setdefault(g, []).append(offset + i)
    seen: dict[int, int] = {}
    out = []
    for g in batch.group_ids.tolist():
        out.append(where[g][seen.get(g, 0)])
        seen[g] = seen.get(g, 0) + 1
    return out


def sample_rows(rep: PerSampleReport, batch: Batch, indices: list[int], advantages: list[float]) -> list[dict]:
    """The lines of ``analysis/step_N/samples.jsonl``: one per sample of the analysed batch. Data parallel: every
    rank's rows (``batch``, ``indices``, ``advantages``: this rank's), ranks in order, on every rank (a collective)."""
    terms = list(rep.norms)
    scores = batch.scores if batch.scores is not None else torch.full((len(batch),), NAN)
    table = all_gather_cat(torch.stack([torch.tensor(indices, dtype=torch.float64), batch.group_ids.double().cpu(),
                                        _bucket_of(rep.buckets, len(batch)).double(), scores.double().cpu(),
                                        torch.tensor(advantages, dtype=torch.float64),
                                        *(rep.norms[t].double() for t in terms)], 1))
    names = ["", *rep.buckets.names[1:]]
    return [{"sample": int(r[0]), "group": int(r[1]), "bucket": names[int(r[2])],
             "reward": None if batch.scores is None else r[3], "advantage": r[4],
             **{f"grad_norm/{term}": r[5 + j] for j, term in enumerate(terms)}} for r in table.tolist()]


def layer_summary(rep: PerSampleReport) -> dict[str, dict[str, dict[str, float]]]:
    """``analysis/step_N/sample_layers.json``: per term and layer group, ``grad_norm`` = ||Σ_i g_i|| over the
    group's parameters (their squares sum to the batch gradient's squared norm) and ``grad_norm_sample`` = the mean
    of ||g_i|| over them; the doctor names the layer group that carries a gradient-norm spike from it. Data
    parallel: a collective (every rank's rows; the Gram matrices are global already)."""
    return {term: {group: {"grad_norm": float(rep.group_gram[term][group].sum().clamp_min(0).sqrt()),
                           "grad_norm_sample": float(all_gather_cat(norms.double().cpu()).mean())}
                   for group, norms in rep.layer_norms[term].items()}
            for term in rep.layer_norms}


class PerSampleHook(InstrumentHook):
    """Per-sample gradient norms and the noise scale at the trainer's hook point (``analysis.per_sample``), with
    the bucket analysis' buckets. Data parallel: every rank measures its own rows, rank 0 writes every rank's
    lines. Skipped, with one warning, on a model the fast engine does not cover."""

    declared = PER_SAMPLE

    def __init__(self, settings: PerSampleConfig, schedule: Schedule, *, bucket_mode: str, num_buckets: int,
                 mean_advantage: bool = False, shared: SharedPass | None = None):
        """``shared``: the prompt-group pass this hook shares with the other instruments due at its step."""
        self.settings, self.schedule = settings, schedule
        self.bucket_mode, self.num_buckets, self.mean_advantage = bucket_mode, num_buckets, mean_advantage
        self.shared = shared
        self.warned = False

    def measure(self, ctx: StepContext) -> tuple[HookResult, dict] | None:
        # skipped only when the batch is empty on every rank (a rank without rows joins the others' collectives)
        if float(all_reduce_sum(torch.tensor(float(len(ctx.batch))))) == 0:
            return None
        if why := fast_unsupported_at(ctx):
            if not self.warned:
                warnings.warn(f"analysis.per_sample skipped: {why}", stacklevel=3)
                self.warned = True
            return None
        rep = analyse_per_sample(ctx.actor, ctx.batch, ctx.actor_loss(), bucket_mode=self.bucket_mode,
                                 num_buckets=self.num_buckets, proxy=self.settings.proxy_corr,
                                 terms=self.settings.terms,
                                 groups=self._shared(ctx))
        files = {}
        if self.settings.write_samples:  # every rank: the lines are gathered
            from rlgrad.logging.rollouts import sequence_advantages

            advantages = sequence_advantages(ctx.batch.advantages, ctx.batch.response_mask, self.mean_advantage)
            rows = sample_rows(rep, ctx.batch, rollout_indices(ctx.batch, ctx.unfiltered_batch), advantages)
            layers = layer_summary(rep)  # every rank: a collective too
            if ctx.is_main:
                files = {"samples.jsonl": "".join(json.dumps(r) + "\n" for r in rows),
                         "sample_layers.json": json.dumps(layers, indent=1)}
        return HookResult(metrics=dict(rep.metrics)), files

    def _shared(self, ctx: StepContext) -> GroupPass | None:
        """The step's shared prompt-group pass, when another instrument due at this step shares it."""
        ride = self.shared is not None and self.shared.rides(ctx)
        if self.shared is None or not self.shared.serves(ctx.step, "per_sample", ride):
            return None
        return self.shared.pass_for(ctx.step, ctx.actor, ctx.batch, ctx.actor_loss(), one_pass=ride)
