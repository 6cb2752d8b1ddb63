"""The report's plain-language reading ("What changed"): sentences computed from a run by fixed rules.

Each rule takes a :class:`~rlgrad.rundata.RunData` and returns the sentences of one kind (none when the
run lacks the data the rule reads); :func:`narrative` concatenates them in :data:`RULES` order. Every
sentence names the numbers it rests on.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rlgrad import rundata as D
from rlgrad.metrics import key
from rlgrad.metrics.judge import Change, cosine_word, windows

Rule = Callable[[D.RunData], list[str]]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _change(a: float, b: float) -> str:
    if a == 0:
        return "from zero" if b != 0 else "unchanged"
    return f"{100 * (b - a) / abs(a):+.0f}%"


def _task_norms(m: dict[str, float]) -> list[tuple[str, float]]:
    vals = [(b, D.bucket_value(m, b, "task")) for b in D.bucket_names(m)]
    return [(b, v) for b, v in vals if math.isfinite(v)]


def _top_bucket(m: dict[str, float]) -> tuple[str, float] | None:
    """The bucket of the largest task gradient; None when there is no single largest (every bucket equal, all
    zero included) or no bucket."""
    vals = _task_norms(m)
    if not vals or min(v for _, v in vals) == max(v for _, v in vals):
        return None
    return max(vals, key=lambda bv: bv[1])


def _describe_bucket(m: dict[str, float], b: str) -> str:
    names = D.bucket_names(m)
    where = ("the highest-variance bucket" if b == names[-1]
             else "the lowest-variance bucket" if b == names[0]
             else f"bucket {names.index(b) + 1} of {len(names)}")
    rv = D.bucket_value(m, b, "reward_std_mean")
    return f"{b.replace('_', ' ')} ({where}, mean in-group reward std {rv:.3g})"


def _last_analysis(run: D.RunData) -> tuple[int, dict[str, float], list[str]] | None:
    """The last analysis step, its metric row and its bucket names; None without analysis."""
    steps = D.analysis_steps(run)
    if not steps:
        return None
    m = run.metrics(steps[-1])
    return steps[-1], m, D.bucket_names(m)


# ---------------------------------------------------------------- training curves


def rule_val_accuracy(run: D.RunData) -> list[str]:
    """Validation accuracy, first to last validation."""
    s, v = D.series(run, "val/accuracy")
    if len(s) >= 2:
        return [f"Validation accuracy went from {_pct(v[0])} (step {s[0]}) to {_pct(v[-1])} (step {s[-1]}), "
                f"{100 * (v[-1] - v[0]):+.1f} points."]
    if s:
        return [f"Validation accuracy was {_pct(v[0])} at step {s[0]} (one validation only)."]
    return []


def rule_training_reward(run: D.RunData) -> list[str]:
    """Mean training reward, averaged over up to 5 steps at each end (one step's reward is noisy)."""
    s, v = D.series(run, "critic/score/mean")
    if len(s) < 2:
        return []
    k = max(1, min(5, len(v) // 3))
    a, b = sum(v[:k]) / k, sum(v[-k:]) / k
    if k == 1:
        return [f"Mean training reward went from {a:.3g} at step {s[0]} to {b:.3g} at step {s[-1]} "
                f"({_change(a, b)})."]
    return [f"Mean training reward averaged {a:.3g} over the first {k} steps and {b:.3g} over the last {k} "
            f"({_change(a, b)})."]


def rule_response_length(run: D.RunData) -> list[str]:
    """Mean response length, first to last step, when it changed."""
    s, v = D.series(run, "response_length/mean")
    if len(s) >= 2 and v[0] != v[-1]:
        return [f"Mean response length moved from {v[0]:.3g} to {v[-1]:.3g} tokens."]
    return []


def rule_actor_grad_norm(run: D.RunData) -> list[str]:
    """The actor's gradient norm before clipping: first, last, median."""
    s, v = D.series(run, "actor/grad_norm")
    if len(s) < 2:
        return []
    return [f"The actor's gradient norm (before clipping) went from {v[0]:.3g} at step {s[0]} to "
            f"{v[-1]:.3g} at step {s[-1]}; median {sorted(v)[len(v) // 2]:.3g}."]


# ---------------------------------------------------------------- gradient analysis by bucket


def rule_top_bucket(run: D.RunData) -> list[str]:
    """At the first and the last analysis step: the bucket where the task gradient is largest."""
    steps = D.analysis_steps(run)
    ends = [] if not steps else [steps[0]] if steps[0] == steps[-1] else [steps[0], steps[-1]]
    out: list[str] = []
    for st in ends:
        m = run.metrics(st)
        top, vals = _top_bucket(m), _task_norms(m)
        if top is None and vals and vals[0][1] == 0:
            out.append(f"At step {st} every bucket's task gradient is zero: no group had reward variance, "
                       "so every advantage was zero.")
            continue
        if top is None:
            if vals:
                out.append(f"At step {st} every bucket's task gradient has the same norm, {vals[0][1]:.3g}.")
            continue
        allv = D.bucket_value(m, "all", "task")
        out.append(f"At step {st} the task gradient is largest in {_describe_bucket(m, top[0])}: norm "
                   f"{top[1]:.3g}"
                   + (f", against {allv:.3g} for the whole batch." if math.isfinite(allv) else "."))
    return out


def rule_top_bucket_moved(run: D.RunData) -> list[str]:
    """First to last analysis step: did the largest task gradient change bucket; the whole-batch norm."""
    steps = D.analysis_steps(run)
    if not steps or steps[0] == steps[-1]:
        return []
    first, last = steps[0], steps[-1]
    a, b = D.bucket_value(run.metrics(first), "all", "task"), D.bucket_value(run.metrics(last), "all", "task")
    if not (math.isfinite(a) and math.isfinite(b)):
        return []
    ta, tb = _top_bucket(run.metrics(first)), _top_bucket(run.metrics(last))
    whole = f"the whole-batch task gradient norm went from {a:.3g} to {b:.3g} ({_change(a, b)})"
    if a == b == 0:
        return [f"Between steps {first} and {last} the task gradient stayed zero in every bucket."]
    if ta is None or tb is None:  # no single largest bucket at one end: nothing to compare
        return [f"Between steps {first} and {last} {whole}."]
    moved = "stayed in the same bucket" if ta[0] == tb[0] else "moved to another bucket"
    return [f"Between steps {first} and {last} the largest task gradient {moved}, and {whole}."]


def _zero_std_groups(run: D.RunData, st: int, m: dict[str, float]) -> tuple[int, int] | None:
    """(groups of zero reward std, groups) at step ``st``: the rows of group_rv_table.csv, else the logged counts
    (grad_norm/all/group_rv_zero_count, the same rows counted by the analysis); None when neither is there."""
    table = D.rv_table(run, st)
    if table:
        return sum(sd == 0 for *_, sd in table), len(table)
    zero, groups = (D.bucket_value(m, "all", n) for n in ("group_rv_zero_count", "group_rv_count"))
    return (int(zero), int(groups)) if math.isfinite(zero) and math.isfinite(groups) else None


def rule_zero_variance_buckets(run: D.RunData) -> list[str]:
    """At the last analysis step: the prompt groups of zero reward std (counted group by group, as the console
    and group_rv_table.csv count them) and the buckets holding only such groups; nothing when none or all are."""
    last = _last_analysis(run)
    if last is None:
        return []
    st, m, names = last
    zero = [b for b in names if D.bucket_value(m, b, "reward_std_max", 1.0) == 0]
    counted = _zero_std_groups(run, st, m)
    if (counted is not None and not 0 < counted[0] < counted[1]) or (
            counted is None and (not zero or len(zero) == len(names))):
        return []
    share = sum(D.bucket_value(m, b, "sample_pct", 0.0) for b in zero)
    moves = ("is zero and only the regularisers move them." if any(D.has_component(m, c) for c in ("kl", "entropy"))
             else "is zero and nothing moves them.")
    buckets = f"{len(zero)} of {len(names)} buckets ({share:.0f}% of samples) hold only groups with zero reward std"
    if counted is None:
        return [f"At step {st}, {buckets}: every sample of a prompt got the same reward, so their task gradient "
                + moves]
    return [f"At step {st}, {counted[0]} of {counted[1]} prompt groups ({100 * counted[0] / counted[1]:.0f}%) have "
            "zero reward std: every sample of such a prompt got the same reward, so its task gradient " + moves
            + (f" {buckets}." if zero else "")]


def rule_monotonicity(run: D.RunData) -> list[str]:
    """At the last analysis step (3 buckets or more): does the task gradient grow with reward variance."""
    last = _last_analysis(run)
    if last is None:
        return []
    st, m, names = last
    task = [D.bucket_value(m, b, "task") for b in names]
    fin = [t for t in task if math.isfinite(t)]
    if len(fin) < 3 or max(fin) <= 0:
        return []
    if all(x <= y + 1e-12 for x, y in zip(fin, fin[1:])):
        return [f"At step {st} the task gradient norm never decreases from a lower- to a higher-variance "
                "bucket: it grows with reward variance."]
    peak = names[task.index(max(fin))]
    return [f"At step {st} the task gradient norm is not monotone in reward variance; it peaks at "
            f"{peak.replace('_', ' ')}."]


def rule_regulariser_vs_task(run: D.RunData) -> list[str]:
    """At the last analysis step: buckets where the KL + entropy gradient beats the task gradient."""
    last = _last_analysis(run)
    if last is None:
        return []
    st, m, names = last
    regc = [c for c in ("kl", "entropy") if D.has_component(m, c)]
    if not regc:
        return ["No regulariser gradient was computed (entropy coefficient 0 and no KL loss), so the task "
                "gradient is the whole update."]
    regname = " + ".join("KL" if c == "kl" else c for c in regc)
    reg = {b: sum(D.bucket_value(m, b, c, 0.0) for c in regc) for b in names}
    task = {b: D.bucket_value(m, b, "task", 0.0) for b in names}
    lows = names[: max(1, len(names) // 2)]

    def where(buckets: list[str]) -> str:
        return (", ".join(b.replace("_", " ") for b in buckets)
                + (" — the low-variance half" if set(buckets) <= set(lows) and len(buckets) < len(names) else ""))

    # a bucket whose task gradient is 0 (no reward variance) has no task gradient to exceed: only its regularisers
    # move it, which is said as such, never as "exceeds the task gradient"
    alone = [b for b in names if task[b] == 0 < reg[b]]
    dom = [b for b in names if 0 < task[b] < reg[b]]
    out = []
    if dom:
        out.append(f"At step {st} the regulariser gradient ({regname}) exceeds the task gradient in {where(dom)}: "
                   "those groups are pushed mainly by the regularisers.")
    if alone:
        out.append(f"At step {st} only the regulariser gradient ({regname}) moves {where(alone)}: the task gradient "
                   "there is zero (every sample of a group got the same reward).")
    if out:
        return out
    ratios = [task[b] / reg[b] for b in names if reg[b] > 0]
    ratio = min(ratios) if ratios else math.inf
    return [f"At step {st} the task gradient exceeds the regulariser gradient ({regname}) in "
            f"every bucket" + (f" (by at least {ratio:.3g}×)." if math.isfinite(ratio) else ".")]


def rule_no_analysis(run: D.RunData) -> list[str]:
    """Say so when the run has no gradient-analysis step."""
    if D.analysis_steps(run):
        return []
    return ["This run has no gradient-analysis step (analysis.buckets.enable off, or no step "
            "matched analysis.buckets.every)."]


# ---------------------------------------------------------------- reward components, neurons, critic


def rule_reward_components(run: D.RunData) -> list[str]:
    """Mean of each reward component, first to last step of reward_components.jsonl, and the components that fell
    beyond their noise (``rlgrad.metrics.judge``: the first and last windows of steps, a lone step by its samples'
    standard error)."""
    rc = D.reward_components(run)
    if not rc:
        return []
    steps = sorted(rc)
    parts, fell = [], []
    for c in rc[steps[-1]].get("components", []):
        rows = [rc[s] for s in steps if rc[s].get("stats", {}).get(c, {}).get("mean") is not None]
        if not rows or rows[0] is not rc[steps[0]] or rows[-1] is not rc[steps[-1]]:
            continue  # compared only when measured at both ends
        means = [row["stats"][c]["mean"] for row in rows]
        change = windows(means, errors=[_sample_error(row, c) for row in rows]) or Change(means[0], means[0], math.nan)
        where = "" if change.window == 1 else f" (means of the first and last {change.window} steps)"
        parts.append(f"{D.label(run, c)} {change.before:.3g} → {change.after:.3g}{where}")
        if change.direction < 0:
            fell.append(D.label(run, c))
    if not parts:
        return []
    out = [f"Reward components (mean per sample, step {steps[0]} → {steps[-1]}): {', '.join(parts)}."]
    if fell:  # a component given up while the total is optimised is worth a sentence of its own
        out.append(f"Fell over the run: {', '.join(fell)}.")
    return out


def _sample_error(row: dict, component: str) -> float:
    """The standard error of a step's mean of one component over its samples (NaN without std or count)."""
    std, count = row["stats"][component].get("std"), row.get("num_samples")
    return std / math.sqrt(count) if isinstance(std, int | float) and count else math.nan


def rule_component_cosines(run: D.RunData) -> list[str]:
    """At the last component-analysis step: each pair of component gradients, aligned or in conflict."""
    csteps = D.component_steps(run)
    if not csteps:
        return []
    geom = D.component_geometry(run, csteps[-1]) or {}
    cos = geom.get("global", {}).get("cosine", {})
    words = []
    for pair, c in sorted(cos.items()):
        a, b = (D.label(run, x) for x in pair.split("__", 1))
        if not math.isfinite(c):  # a zero gradient has no direction (components.json writes null)
            words.append(f"{a} and {b}: cosine n/a (zero gradient)")
        else:
            words.append(f"{a} and {b} are {cosine_word(c)} (cosine {c:+.2f})")
    if not words:
        return []
    return [f"At step {csteps[-1]} the reward components' gradients: {'; '.join(words)}."]


def rule_dormant_neurons(run: D.RunData) -> list[str]:
    """Per role (actor, critic): the dormant-neuron ratio, first to last step."""
    out = []
    for role in D.ROLES:
        s, v = D.series(run, key("{role}/neuron/dormant_ratio", role=role))
        if len(s) >= 2:
            change = windows(v)
            means = (f", {_pct(change.before)} to {_pct(change.after)} over the first and last {change.window} "
                     "measurements" if change.window > 1 else "")
            out.append(f"The {role}'s dormant-neuron ratio {change.verb} from {_pct(v[0])} (step {s[0]}) to "
                       f"{_pct(v[-1])} (step {s[-1]}){means}.")
        elif s:
            out.append(f"The {role}'s dormant-neuron ratio was {_pct(v[0])} at step {s[0]}.")
    return out


def rule_neuron_resets(run: D.RunData) -> list[str]:
    """Per role: how many neurons the ReDo-style reset re-initialised, over which steps."""
    out = []
    for role in D.ROLES:
        s, v = D.series(run, key("{role}/neuron/reset_count", role=role))
        hits = [(st, n) for st, n in zip(s, v) if n]
        if hits:
            out.append(f"ReDo reset {int(sum(n for _, n in hits))} {role} neurons over {len(hits)} reset "
                       f"step{'s' if len(hits) > 1 else ''} (steps {hits[0][0]}–{hits[-1][0]}).")
    return out


def rule_critic_explained_variance(run: D.RunData) -> list[str]:
    """The critic's explained variance at the last step (and the first)."""
    s, v = D.series(run, "critic/vf_explained_var")
    if not s:
        return []
    return [f"The critic explains {_pct(v[-1])} of the return variance at step {s[-1]}"
            + (f" (from {_pct(v[0])} at step {s[0]})." if len(s) > 1 else ".")]


RULES: tuple[Rule, ...] = (
    rule_val_accuracy, rule_training_reward, rule_response_length, rule_actor_grad_norm,
    rule_top_bucket, rule_top_bucket_moved, rule_zero_variance_buckets, rule_monotonicity,
    rule_regulariser_vs_task, rule_no_analysis,
    rule_reward_components, rule_component_cosines, rule_dormant_neurons, rule_neuron_resets,
    rule_critic_explained_variance,
)


def narrative(run: D.RunData) -> list[str]:
    """Sentences computed from the data by fixed rules (:data:`RULES`, in order); each names its numbers."""
    return [sentence for rule in RULES for sentence in rule(run)]
