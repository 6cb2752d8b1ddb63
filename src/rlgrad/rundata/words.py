"""Wording helpers of the readers: a run's names in the words of the trainer that wrote it (a TRL reward model by
its repo name, TRL's metric names), a component's share of the update in words, the order of layer groups."""

from __future__ import annotations

import math
import re

from rlgrad.metrics import own_key
from rlgrad.rundata.run import RunData


def layer_sort_key(name: str) -> tuple:
    """embed, layer_0, layer_1, ..., final_norm, lm_head, anything else."""
    m = re.fullmatch(r"layer_(\d+)", name)
    if name == "embed":
        return (0, 0, name)
    if m:
        return (1, int(m.group(1)), name)
    return ({"final_norm": 2, "lm_head": 3}.get(name, 4), 0, name)


def label(run: RunData, component: str) -> str:
    """A reward component as its trainer names it (a TRL reward model: its repo name, not the metric key)."""
    return run.labels.get(component, component)


def pair_label(run: RunData, pair: str) -> str:
    """``a__b`` of ``grad_sim/{pair}`` as "a · b" with the components' own names (a key never holds ``__``)."""
    a, _, b = pair.partition("__")
    return f"{label(run, a)} · {label(run, b)}"


def metric_name(run: RunData, k: str) -> str:
    """The name the run's own trainer logs rlgrad's metric ``k`` under (TRL: ``grad_norm``, ``rewards/<f>/mean``);
    rlgrad's name for a run of rlgrad's trainer or verl (whose names rlgrad's are)."""
    return own_key(k, run.kind, run.labels)


def share_is_fraction(x: float) -> bool:
    """``grad_comp/{component}/share`` is ⟨g_c, g⟩ / |g|²: a share of the update only while it lies in [0, 1]; a
    component whose gradient outgrows the update along it (> 1) or pulls against it (< 0) has a signed
    contribution, no share of 100%."""
    return 0.0 <= x <= 1.0


def share_words(x: float) -> str:
    """A component's ``grad_comp/{component}/share`` in words: a percentage while it is a fraction, else the signed
    contribution it is, with what that means."""
    if not math.isfinite(x):
        return "no share (a zero update gradient)"
    if share_is_fraction(x):
        return f"{100 * x:.0f}% of the update"
    if x > 1:
        return (f"a signed contribution of {x:+.3g}: its gradient, projected on the update, is {x:.3g}× the update "
                "(more than all of it: other components pull back by the rest)")
    return f"a signed contribution of {x:+.3g}: its gradient pulls against the update"


def share_label(x: float) -> str:
    """``share_words`` for a figure: ``45%`` for a fraction, ``signed +1.09`` / ``signed -0.088`` otherwise."""
    return f"{x:.0%}" if share_is_fraction(x) else f"signed {x:+.3g}"
