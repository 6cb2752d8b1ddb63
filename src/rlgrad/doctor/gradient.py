"""``rlgrad doctor``'s gradient-level signatures, one function each: they read rlgrad's instruments (bucket and
term gradient norms, reward-component geometry, layers, neurons) and say *why* the update did what it did."""

from __future__ import annotations

import math
from pathlib import Path

from rlgrad import rundata as D
from rlgrad.doctor.findings import (
    Finding,
    Thresholds,
    View,
    correctness_silent,
    entropy_coef,
    flat_reward,
    fmt,
    gradless_steps,
    reward_weights,
    signature,
    task_gradient_rows,
    unpaid_correctness,
    update_size,
)
from rlgrad.logging.reward_signal import correctness_component
from rlgrad.metrics import key, parse


def _bucket_series(v: View, name: str) -> dict[int, dict[str, float]]:
    """step -> bucket -> value of ``grad_norm/{bucket}/{name}``."""
    out: dict[int, dict[str, float]] = {}
    for s, m in v.run.rows.items():
        for b in D.bucket_names(m):
            val = D.bucket_value(m, b, name)
            if not math.isnan(val):
                out.setdefault(s, {})[b] = val
    return out


@signature("std_normalisation_amplifies", "critic/advantages/max",
           reads="logs + config + buckets",
           fires="GRPO with std-normalised advantages: the largest advantage > {adv_over_range:g}× the reward range on"
                 " most steps")
def _std_amplifies(v: View, t: Thresholds) -> Finding | None:
    if v.cfg("algorithm.norm_adv_by_std_in_grpo") is not True or v.cfg("algorithm.adv_estimator") != "grpo":
        return None
    steps, amax = v.series("critic/advantages/max")
    _, smax = v.series("critic/score/max")
    _, smin = v.series("critic/score/min")
    rows = [(s, a, hi - lo) for s, a, hi, lo in zip(steps, amax, smax, smin) if hi - lo > 0]
    hits = [(s, a, r) for s, a, r in rows if a > t.adv_over_range * r]
    if not hits or len(hits) * 2 < len(rows):
        return None
    s, a, r = hits[0]
    ev = [f"critic/advantages/max {fmt(a)} against a reward range of {fmt(r)} (step {s}; on {len(hits)} of "
          f"{len(rows)} steps)"]
    per = _bucket_series(v, "per_sample/task")
    std = _bucket_series(v, "reward_std_mean")
    outweighs = False
    for step in sorted(per):  # the gradient side: the lowest-variance groups' per-sample push
        bs = [b for b in D.sort_buckets(per[step]) if b != "all" and std.get(step, {}).get(b, 0) > 0]
        if len(bs) >= 2:
            ev.append(f"step {step}: per-sample task gradient " + ", ".join(
                f"{fmt(per[step][b])} in {b} (reward std {fmt(std[step][b])})" for b in bs))
            outweighs = per[step][bs[0]] > per[step][bs[-1]]
            break
    # the harm the advice prevents: the least-signal groups push hardest AND the run stalls
    stalls, reward = flat_reward(v, t)
    harm = (f"the lowest-variance bucket's per-sample task gradient outweighs the highest's, and the reward stalls "
            f"({reward})" if outweighs and stalls else "")
    return Finding(
        severity="warn", step=s, confidence=0.8,
        title="Std-normalised advantages amplify low-variance groups", evidence=ev,
        explanation="Dividing each group's advantage by its reward std gives a nearly-unanimous group (one lucky "
                    "sample among many) advantages larger than any reward difference: with binary rewards the "
                    "groups with the least signal push hardest, and the per-sample gradient no longer grows with "
                    "the reward variance.",
        action=f"Set {v.setting('algorithm.norm_adv_by_std_in_grpo=false')} (Dr. GRPO), or use RLOO advantages.",
        harm=harm)


def _regularizer_words(v: View, term: str, coef, large_steps: str = "") -> tuple[str, str, str, list[str]]:
    """(title, why, what to do, the findings it explains) for a dominating KL or entropy term, by the sign of
    its coefficient: a negative entropy coefficient is a penalty that pushes toward determinism, and "lower the
    coefficient" would make it stronger. A KL term under too large steps (``large_steps``: the update size in
    words) is their symptom, not its coefficient's fault."""
    c = float(coef) if isinstance(coef, int | float) and not isinstance(coef, bool) else None
    kl_coef, entropy_coeff = v.setting("actor.kl_loss_coef", short=True), v.setting("actor.entropy_coeff", short=True)
    if term == "kl" and large_steps:
        return ("The KL term's gradient outweighs the task's: the policy ran away from the reference",
                f"The updates are too large ({large_steps}): the policy left the reference, and the KL term's gradient "
                "grows with that distance. The coefficient is not the cause; lowering it lets the policy run further.",
                "Lower the learning rate toward an actor/update_ratio of about 1e-3 (update_too_large, kl_blowup); "
                f"leave {kl_coef} as it is.",
                ["reward_plateau", "lr_too_small", "reward_collapse", "val_falls"])
    if term == "kl":
        return ("The KL term's gradient outweighs the task's",
                "The update mostly follows the KL term, not the reward: the policy is held at the reference more "
                "than it learns the task.",
                f"Lower {kl_coef} by about the ratio shown (or drop the KL loss: "
                f"{v.setting('actor.use_kl_loss=false')}).",
                ["reward_plateau", "lr_too_small"])
    if c is not None and c < 0:
        return ("The entropy penalty's gradient outweighs the task's",
                f"entropy_coeff is negative ({c:g}): the entropy term is a penalty whose gradient lowers the entropy, "
                "pushing the policy toward determinism (one answer per prompt) harder than the reward moves it. "
                "Groups then agree, their advantages vanish, and the reward falls with the exploration.",
                f"Set {v.setting('actor.entropy_coeff')} to 0 (or a small positive bonus): a negative coefficient "
                "penalises exploration. To keep a penalty, shrink its magnitude (bring it toward 0) by about the "
                "ratio shown.",
                ["entropy_collapse", "reward_collapse", "val_falls", "zero_variance_groups", "length_collapse",
                 "val_falls_train_rises", "update_too_large", "reward_plateau", "component_dominates",
                 "component_takes_over", "format_over_correct"])
    return ("The entropy bonus's gradient outweighs the task's",
            "The update mostly follows the entropy bonus, not the reward: the policy is pushed toward randomness "
            "more than it learns the task." + ("" if c is not None else " (The run does not say the entropy "
                                                                        "coefficient's sign.)"),
            f"Lower {entropy_coeff} (toward 0) by about the ratio shown.",
            ["reward_collapse", "val_falls", "reward_plateau", "length_runaway", "val_falls_train_rises"])


@signature("regularizer_dominates", "grad_norm/all/task",
           reads="buckets + config",
           fires="the KL or entropy term's gradient > {reg_ratio:g}× the task's on most analysis steps with a task "
                 "gradient (a step whose every group had one reward has none: left out; its advice by the sign of "
                 "the coefficient: an entropy penalty is not a bonus)")
def _regularizer(v: View, t: Thresholds) -> Finding | None:
    rows, left_out = task_gradient_rows(v)
    for term in ("kl", "entropy"):
        k = key("grad_norm/{bucket}/{term}", bucket="all", term=term)
        hits = [(s, m[k], m["grad_norm/all/task"]) for s, m in rows
                if k in m and m[k] > t.reg_ratio * m["grad_norm/all/task"]]
        if hits and len(hits) >= max(1, len(rows) // 2):
            s, r, task = hits[0]
            name = v.setting("actor.kl_loss_coef" if term == "kl" else "actor.entropy_coeff", short=True)
            coef = (v.cfg("actor.kl_loss_coef", "actor_rollout_ref.actor.kl_loss_coef", "beta") if term == "kl"
                    else entropy_coef(v))
            size = update_size(v)
            large = f"actor/update_ratio {fmt(size)}, median" if size is not None and size > t.update_high else ""
            title, why, action, explains = _regularizer_words(v, term, coef, large)
            return Finding(
                severity="warn", step=s, confidence=0.8, title=title,
                evidence=[f"step {s}: grad_norm/all/{term} {fmt(r)} vs grad_norm/all/task {fmt(task)} (ratio "
                          f"{fmt(r / task)})", f"on {len(hits)} of the {len(rows)} analysis steps with a task gradient"
                          + (f"; {left_out} step(s) without one left out" if left_out else "")]
                         + ([f"{name} {coef}"] if coef is not None else []),
                explanation=why, action=action, explains=explains)
    return None


# Components a trainer adds to the task's (rl/trainer.py's reward weights): their size is set elsewhere, not by
# reward.weights, which takes only the task's components.
SHAPING_KNOBS = {"overlong": "reward.overlong_buffer.penalty_factor", "kl_penalty": "algorithm.kl_ctrl.kl_coef"}


def shrink_weight(v: View, component: str, label: str) -> str:
    """"Make this component's pull smaller", by the setting that sets it and right for its sign: a trainer's shaping
    term (DAPO's overlong penalty, the KL in the reward) by its own coefficient; a negative weight (a penalty) is
    brought toward 0, since "lower" would make it pull harder; never the only weighted component while correctness
    has weight 0 (that would leave no reward: correctness needs a weight instead). Under a custom reward function
    the score is the function's own (reward.weights only splits it into components, the rest going to ``rest``), so
    the weight to lower is the one inside the function."""
    if component in SHAPING_KNOBS:
        return f"Lower the '{label}' penalty ({v.setting(SHAPING_KNOBS[component])})"
    unpaid = unpaid_correctness(v)
    if unpaid is not None:
        return (f"Give '{v.label(unpaid)}' a positive weight ({v.setting(f'reward.weights.{unpaid}')}, now 0): it "
                f"pays nothing, so '{label}' is the reward; lowering '{label}' instead would leave no reward at all")
    fn = v.cfg("reward.custom_reward_function.path")
    if isinstance(fn, str) and fn:
        name = v.cfg("reward.custom_reward_function.name") or "compute_score"
        return (f"Lower the weight of '{label}' where your reward function ({name} in {Path(fn).name}, "
                "reward.custom_reward_function) computes its score: reward.weights only splits that score into "
                "components and would not change the reward")
    w = reward_weights(v).get(component)
    if w is not None and w < 0:
        setting = v.setting(f"reward.weights.{component}")
        return f"Bring the weight of '{label}' toward 0 ({setting}, now {w:g}: a penalty)"
    return f"Lower the weight of '{label}' ({v.setting('reward.weights')})"


COMPONENT_SHARE = "grad_comp/{component}/share"  # the component analysis's steps: those that log a share


Hit = tuple[int, float, float | None]  # an analysis step where a component's pattern shows: (step, share, cosine)


def _component_pattern(v: View, t: Thresholds, c: str, correct: str,
                       against: bool) -> tuple[list[Hit], list[tuple[int, float]], int, int]:
    """Where component ``c`` makes more than ``share_high`` of the update (and, ``against``, its gradient points
    against correctness beyond noise: a cosine below ``sim_negative``), over the component analysis's steps:
    (such steps where correctness varied within some group, as (step, share, cosine); such steps where it varied in
    none; the steps where it varied; all the steps)."""
    voiced, silent, n_voiced = [], [], 0
    steps, shares = v.series(key(COMPONENT_SHARE, component=c))
    for s, share in zip(steps, shares):
        m = v.run.rows[s]
        sim = m.get(key("grad_sim/{pair}", pair=f"{c}__{correct}"),
                    m.get(key("grad_sim/{pair}", pair=f"{correct}__{c}")))
        quiet = correctness_silent(v, correct, s)
        n_voiced += not quiet
        if share > t.share_high and (not against or (sim is not None and sim < t.sim_negative)):
            if quiet:
                silent.append((s, share))
            else:
                voiced.append((s, share, sim))
    return voiced, silent, n_voiced, len(steps)


def sustained(hits: list, of: int, t: Thresholds) -> bool:
    """Whether a pattern seen on ``hits`` of ``of`` analysis steps is more than one step's chance: on at least
    ``component_steps`` of them and at least ``component_frac`` of all."""
    return len(hits) >= t.component_steps and len(hits) >= t.component_frac * of


def _components(v: View) -> tuple[str | None, list[str]]:
    """(the correctness component, the others) of the component analysis."""
    comps = {f["component"] for k in v.keys("grad_comp/") if (f := parse(COMPONENT_SHARE, k))} - {"total"}
    correct = correctness_component(comps)
    return correct, sorted(comps - {correct}) if correct else []


@signature("component_takes_over", COMPONENT_SHARE, trend=COMPONENT_SHARE, min_points=lambda t: t.component_steps,
           reads="components",
           fires="a non-correctness reward's share of the update > {share_high:g} and its gradient pointing against "
                 "correctness beyond noise (cosine < {sim_negative:g}), on ≥ {component_steps} analysis steps and "
                 "≥ {component_frac:.0%} of those where correctness varies within some group")
def _takeover(v: View, t: Thresholds) -> Finding | None:
    correct, others = _components(v)
    for c in others:
        hits, _, voiced, _ = _component_pattern(v, t, c, correct, against=True)
        if not sustained(hits, voiced, t):  # a silent correctness has no direction to oppose: its steps don't count
            continue
        s, share, sim = hits[0]
        lc, lr = v.label(c), v.label(correct)
        share_key = key(COMPONENT_SHARE, component=c)
        return Finding(
            severity="warn", step=s, confidence=0.8,
            title=f"The '{lc}' reward drives the update against correctness",
            evidence=[f"step {s}: {share_key} {fmt(share)} ({D.share_words(share)}), cosine with '{lr}' {fmt(sim)}",
                      f"on {len(hits)} of the {voiced} analysis steps where '{lr}' varied within some group (cosines "
                      + ", ".join(fmt(x) for _, _, x in hits) + ")"],
            explanation=f"Most of the update comes from the '{lc}' component, and its gradient points away "
                        f"from the '{lr}' gradient: improving '{lc}' costs accuracy.",
            action=f"{shrink_weight(v, c, lc)} or gate it on correctness.")
    return None


@signature("component_dominates", COMPONENT_SHARE, trend=COMPONENT_SHARE, min_points=lambda t: t.component_steps,
           reads="components",
           fires="a non-correctness reward's share of the update > {share_high:g} on ≥ {component_steps} analysis "
                 "steps and ≥ {component_frac:.0%} of those where correctness varies within some group (info when it "
                 "does so only where no group's correctness varied)")
def _dominates(v: View, t: Thresholds) -> Finding | None:
    correct, others = _components(v)
    for c in others:
        hits, silent, voiced, of = _component_pattern(v, t, c, correct, against=False)
        cshare = dict(zip(*v.series(key(COMPONENT_SHARE, component=correct))))
        if sustained(hits, voiced, t):
            return _dominates_finding(v, t, c, correct, [(s, x) for s, x, _ in hits], voiced, cshare, silent=False)
        if not hits and sustained(silent, of, t):
            return _dominates_finding(v, t, c, correct, silent, of, cshare, silent=True)
    return None


def _dominates_finding(v: View, t: Thresholds, c: str, correct: str, hits: list[tuple[int, float]], of: int,
                       cshare: dict[int, float], silent: bool) -> Finding:
    weights = reward_weights(v)
    lc, lr = v.label(c), v.label(correct)
    s0, x0 = hits[0]
    share_c, share_r = (key(COMPONENT_SHARE, component=x) for x in (c, correct))
    ev = [f"{share_c} {fmt(x0)} at step {s0}: {D.share_words(x0)} (above {fmt(t.share_high)} on "
          f"{len(hits)} of the {of} analysis steps" + ("" if silent else f" where '{lr}' varied") + ")",
          f"{share_r} {fmt(cshare.get(s0, math.nan))} there: {D.share_words(cshare.get(s0, math.nan))}"]
    ev += [f"{v.setting(f'reward.weights.{x}')} = {weights[x]:g}" for x in (c, correct) if x in weights]
    if not silent and unpaid_correctness(v) == correct:
        return Finding(
            severity="warn", step=s0, confidence=0.8,
            title=f"'{lr}' has weight 0: the '{lc}' reward is all the update follows", evidence=ev,
            explanation=f"'{lr}' is in the logs but not in the reward (its weight is 0): right answers are paid "
                        f"nothing, '{lr}' adds nothing to the update, and the run learns '{lc}' alone.",
            action=f"{shrink_weight(v, c, lc)}.")
    if silent:
        return Finding(
            severity="info", step=s0, confidence=0.6,
            title=f"The '{lc}' reward makes most of the update only where '{lr}' gives no signal",
            evidence=ev + [f"on each of those steps every prompt group had one '{lr}' value for all its samples "
                           f"(reward/{correct}/frac_zero_std 1)"],
            explanation=f"On the steps where '{lc}' dominates, no group's '{lr}' varied: '{lr}' added nothing to the "
                        f"update, so '{lc}' was all there was. Its weight is not the cause; lowering it would not "
                        f"give '{lr}' a signal.",
            action=f"Nothing to change in the weights for this. If '{lr}' stays silent on most steps, the task is "
                   "too hard or too easy for the model (zero_variance_groups).")
    return Finding(
        severity="warn", step=s0, confidence=0.7,
        title=f"The '{lc}' reward, not '{lr}', makes most of the update", evidence=ev,
        explanation=f"Most of the gradient comes from the '{lc}' component, on steps where '{lr}' does vary within "
                    f"groups: the run spends its updates on '{lc}' rather than on the task, until '{lc}' is "
                    "satisfied.",
        action=f"{shrink_weight(v, c, lc)}; a secondary reward should stay a minor share of the "
               "update once it is mostly satisfied.")


@signature("update_concentrated", "grad_norm/all/task",
           reads="layers",
           fires="two layer groups hold > {layer_top2:.0%} of the task gradient's squared norm (info)")
def _concentrated(v: View, t: Thresholds) -> Finding | None:
    steps = v.series("grad_norm/all/task")[0]  # the bucket analysis's steps (its "all" bucket is always logged)
    if not steps or v.run.run_dir is None:
        return None
    s = steps[-1]
    layers = (D.layer_norms(v.run, s) or {}).get("all")
    if not layers or len(layers) < 4:
        return None
    sq = sorted((x * x for x in layers.values()), reverse=True)
    share = sum(sq[:2]) / max(sum(sq), 1e-30)
    if share < t.layer_top2:
        return None
    top = sorted(layers, key=lambda k: -layers[k])[:2]
    return Finding(
        severity="info", step=s, confidence=0.6,
        title="The update is concentrated in a few layers",
        evidence=[f"step {s}: {', '.join(top)} hold {fmt(100 * share)}% of the task gradient's squared norm"],
        explanation="Most of the gradient sits in two layer groups (often the embeddings or the LM head): the rest "
                    "of the network barely moves.",
        action="Usually benign for small models; if the head dominates, a lower learning rate for it or "
               "freezing the embeddings steadies training.")


@signature("dormant_growing", "actor/neuron/dormant_ratio", trend="actor/neuron/dormant_ratio", min_points=2,
           reads="neurons",
           fires="the dormant ratio rising by > {dormant_rise:g} to ≥ {dormant_high:g} on the last two steps with a "
                 "task gradient (one step's rise is within its noise; a step whose every advantage is 0 reads every "
                 "unit as dormant: left out; blames the learning rate only at an update size > {update_high:g})")
def _dormant(v: View, t: Thresholds) -> Finding | None:
    # a step whose batch gave no task gradient reads every unit as dormant (its gradient is 0): not the network's
    gradless = gradless_steps(v)
    kept = [(s, x) for s, x in zip(*v.series("actor/neuron/dormant_ratio")) if s not in gradless]
    if len(kept) < 2:
        return None
    steps, d = [s for s, _ in kept], [x for _, x in kept]
    # held on two analysed steps: on one alone a healthy run's ratio went 0.157 -> 0.212 and back (0.14-0.23)
    if not all(x - d[0] > t.dormant_rise and x >= t.dormant_high for x in d[-2:]):
        return None
    size = update_size(v)
    large = size is not None and size > t.update_high
    return Finding(
        severity="warn", step=steps[-1], confidence=0.7, title="Dormant neurons are growing",
        evidence=[f"actor/neuron/dormant_ratio {fmt(d[0])} (step {steps[0]}) → {fmt(d[-1])} (step {steps[-1]})"
                  + (f"; {len(gradless)} step(s) without a task gradient left out" if gradless else "")]
                 + ([f"actor/update_ratio {fmt(size)} (median)"] if size is not None else []),
        explanation="A growing share of neurons receives (almost) no gradient: capacity the policy no longer uses, "
                    "a known precursor of plasticity loss in long RL runs."
                    + (" The updates are too large: they push units past where they fire." if large else ""),
        action="Lower the learning rate toward an actor/update_ratio of about 1e-3." if large else
               f"Consider ReDo resets ({v.setting('analysis.neurons.actor.reset_every')})"
               + (", or a lower learning rate." if size is None else "; the update size is normal."))
