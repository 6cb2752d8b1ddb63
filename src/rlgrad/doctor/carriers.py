"""Which samples, bucket and layer group carry a step's gradient, read off an ``analysis.per_sample`` step's files
(``analysis/step_N/samples.jsonl`` and ``sample_layers.json``): the evidence ``grad_norm_spike`` adds when a spike
lands on an analysed step.

A sample's share is ||g_i||² / Σ_j ||g_j||², as ``rlgrad samples RUN --step N --by grad-norm`` lists it (the
per-sample gradients are not orthogonal, so the shares say who is large, not who points where the sum does); a
layer group's share is its part of the batch gradient's squared norm, ||Σ_i g_i||² on its parameters, which sum
over the groups to the whole.
"""

from __future__ import annotations

import math

from rlgrad import rundata as D
from rlgrad.doctor.findings import fmt

TOP_SAMPLES = 3  # samples named in the evidence


def _sample_norms(run: D.RunData, step: int, term: str) -> list[tuple[dict, float]]:
    field = f"grad_norm/{term}"
    out = []
    for row in D.per_sample_rows(run, step):
        x = row.get(field)
        if isinstance(x, int | float) and math.isfinite(x):
            out.append((row, float(x)))
    return out


def _bucket_line(run: D.RunData, step: int, term: str, norms: list[tuple[dict, float]], total: float) -> str:
    sq: dict[str, float] = {}
    count: dict[str, int] = {}
    for row, x in norms:
        b = str(row.get("bucket") or "?")
        sq[b] = sq.get(b, 0.0) + x * x
        count[b] = count.get(b, 0) + 1
    top = max(sq, key=lambda b: sq[b])
    std = D.bucket_value(run.metrics(step), top, "reward_std_mean")
    spread = f", mean reward std {fmt(std)}" if math.isfinite(std) else ""
    return (f"step {step} (analysed): {top} ({count[top]} of {len(norms)} samples{spread}) holds "
            f"{sq[top] / total:.0%} of the summed squared per-sample {term} norms Σ_i ||g_i||²")


def _layer_line(run: D.RunData, step: int, term: str) -> str | None:
    layers = D.per_sample_layers(run, step, term)
    if not layers:
        return None
    sq = {g: float(v["grad_norm"]) ** 2 for g, v in layers.items() if math.isfinite(float(v["grad_norm"]))}
    whole = sum(sq.values())
    if whole <= 0:
        return None
    top = max(sq, key=lambda g: sq[g])
    return (f"step {step}: layer group {top} carries {sq[top] / whole:.0%} of the {term} gradient's squared norm "
            f"(||Σ_i g_i|| {fmt(math.sqrt(sq[top]))} there, {fmt(math.sqrt(whole))} in all)")


def _samples_line(step: int, norms: list[tuple[dict, float]], total: float) -> str:
    top = sorted(norms, key=lambda p: -p[1])[:TOP_SAMPLES]
    named = [f"{row.get('sample')} (group {row.get('group')}, reward {fmt(float(row.get('reward') or 0.0))}, "
             f"advantage {fmt(float(row.get('advantage') or 0.0))}: {x * x / total:.0%})" for row, x in top]
    return (f"step {step}: the largest per-sample norms are samples {', '.join(named)} of "
            f"{len(norms)} (rlgrad samples RUN --step {step} --by grad-norm)")


def spike_carriers(run: D.RunData, step: int, term: str = "task") -> list[str]:
    """Evidence lines naming the bucket, layer group and samples that carry ``step``'s ``term`` gradient; empty
    where the step was not analysed (no ``samples.jsonl``) or its per-sample norms are all zero."""
    norms = _sample_norms(run, step, term)
    total = sum(x * x for _, x in norms)
    if total <= 0:
        return []
    lines = [_bucket_line(run, step, term, norms, total)]
    if layer := _layer_line(run, step, term):
        lines.append(layer)
    lines.append(_samples_line(step, norms, total))
    return lines
