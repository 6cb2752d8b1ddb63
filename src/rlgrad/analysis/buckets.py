"""Reward-variance buckets: which prompt groups an analysis bucket holds.

A group's reward std is the unbiased std of its samples' sequence scores (the same
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

from dataclasses import dataclass

import torch

from rlgrad.collectives import all_gather_cat, all_gather_sizes, rank

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


def make_buckets(group_ids: torch.Tensor, reward_std: torch.Tensor, *, mode: str = "quantile",
                 num_buckets: int = 6) -> Buckets:
    gids, stds = group_table(group_ids, reward_std)
    if mode == "quantile":
        order = sorted(range(len(gids)), key=lambda k: (float(stds[k]), int(gids[k])))
        b = min(num_buckets, len(gids))
        per = len(gids) // b if b else 0
        members = [order[i * per:(i + 1) * per] if i < b - 1 else order[i * per:] for i in range(b)]
    elif mode == "quantile_nonzero":
        order = sorted(range(len(gids)), key=lambda k: (float(stds[k]), int(gids[k])))
        rest = [k for k in order if float(stds[k]) > 0]
        members = [[k for k in order if float(stds[k]) == 0]] + _tied_quantiles(rest, stds, num_buckets - 1)
    elif mode == "fixed_rv":
        members = [[k for k in range(len(gids)) if lo <= float(stds[k]) < hi]
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
        table += [(name, int(gids[k]), float(stds[k]))
                  for k in sorted(ks, key=lambda k: (float(stds[k]), int(gids[k])))]
    return Buckets(rows, table)


def _tied_quantiles(order: list[int], stds: torch.Tensor, b: int) -> list[list[int]]:
    """``order`` (groups by ascending std) in ``b`` consecutive chunks of about equal size: each takes its share
    of the groups left (at least one), extended past the groups that tie with its last; the last takes the rest."""
    out, start = [], 0
    for i in range(max(b, 0)):
        end = len(order) if i == b - 1 else min(start + max((len(order) - start) // (b - i), 1), len(order))
        while 0 < end < len(order) and float(stds[order[end]]) == float(stds[order[end - 1]]):
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
