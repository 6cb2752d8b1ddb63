"""``rlgrad doctor``'s signatures, one function each: the scalar ones read the logs, the gradient-level ones
rlgrad's instruments. Each names the metrics it needs; its thresholds are ``Thresholds`` fields."""

from __future__ import annotations

import math
import statistics

from rlgrad import rundata as D
from rlgrad.doctor.findings import Finding, Thresholds, View, first_last, fmt, mean, signature
from rlgrad.logging.reward_signal import correctness_component, reward_problems

# ---------------------------------------------------------------- scalar signatures


@signature("nonfinite_steps", "actor/grad_norm|actor/pg_loss|actor/nonfinite_grad_steps")
def _nonfinite(v: View, t: Thresholds) -> Finding | None:
    bad = {s: keys for s, keys in v.run.nonfinite.items()
           if any(k.startswith(("actor/", "critic/score")) for k in keys)}
    steps, skipped = v.series("actor/nonfinite_grad_steps")
    skipped_at = [s for s, x in zip(steps, skipped) if x > 0]
    if not bad and not skipped_at:
        return None
    first = min(list(bad) + skipped_at)
    ev = [f"step {s}: {', '.join(sorted(set(k)))} non-finite" for s, k in sorted(bad.items())[:5]]
    ev += [f"step {s}: the update skipped a non-finite gradient" for s in skipped_at[:5]]
    return Finding(
        severity="critical", step=first, confidence=1.0, title="Non-finite loss or gradient",
        evidence=ev,
        explanation="A NaN or inf reached the loss or the gradient. Once the weights take one, every later step is "
                    "garbage; rlgrad skips such an update, other trainers may not.",
        action="Lower the learning rate, keep gradient clipping on, check bf16 overflow (logits, ratios) and "
               "the reward function for NaN; resume from the last checkpoint before the first bad step.")


@signature("grad_norm_spike", "actor/grad_norm")
def _spike(v: View, t: Thresholds) -> Finding | None:
    steps, g = v.series("actor/grad_norm")
    spikes = []
    for i in range(t.window, len(g)):
        med = statistics.median(g[i - t.window:i])
        if med > 0 and g[i] > t.spike_factor * med:
            spikes.append((steps[i], g[i], med))
    if not spikes:
        return None
    s0, g0, m0 = spikes[0]
    gn = v.name("actor/grad_norm")
    ev = [f"step {s}: {gn} {fmt(x)} against a median of {fmt(m)} over the {t.window} steps before"
          for s, x, m in spikes[:5]]
    severity, after = "warn", ""
    rs, r = v.series("critic/score/mean")
    if r:
        before = [x for s, x in zip(rs, r) if s0 - t.window <= s < s0]
        later = [x for s, x in zip(rs, r) if s0 < s <= s0 + t.window]
        if before and later and mean(later) < mean(before) - 0.2 * (abs(mean(before)) + 1e-8):
            severity = "critical"
            after = f" The reward fell after it: {fmt(mean(before))} → {fmt(mean(later))}."
            ev.append(f"{v.name('critic/score/mean')}: {fmt(mean(before))} before step {s0}, {fmt(mean(later))} after")
    return Finding(
        severity=severity, step=s0, confidence=0.7 if severity == "warn" else 0.9,
        title=f"Gradient-norm spike{'s' if len(spikes) > 1 else ''} ({len(spikes)})", evidence=ev,
        explanation="The gradient jumped an order of magnitude above its recent level: a few sequences with huge "
                    "ratios or advantages, or a numerical blow-up." + after,
        action="Keep max_grad_norm on (it caps the step, not the logged norm); look at the step's samples "
               "(rlgrad samples RUN --step N); lower the learning rate if spikes repeat.")


def _max_grad_norm(v: View) -> float | None:
    c = v.cfg("actor.max_grad_norm", "actor.grad_clip", "actor_rollout_ref.actor.grad_clip", "max_grad_norm")
    try:
        return float(c) if c is not None else None
    except (TypeError, ValueError):
        return None


@signature("clip_every_step", "actor/grad_norm")
def _clip_every_step(v: View, t: Thresholds) -> Finding | None:
    clip = _max_grad_norm(v)
    steps, g = v.series("actor/grad_norm")
    if clip is None or clip <= 0 or len(g) < 2:
        return None
    over = [(s, x) for s, x in zip(steps, g) if x > clip]
    frac = len(over) / len(g)
    if frac < t.clip_steps_frac:
        return None
    scale = statistics.median(clip / x for _, x in over)
    lr = v.cfg("actor.optim.lr", "learning_rate")
    eff = f"; with lr {fmt(float(lr))} that is an effective lr of about {fmt(float(lr) * scale)}" if lr else ""
    return Finding(
        severity="warn", step=over[0][0], confidence=0.9,
        title="Gradient clipping on (nearly) every step",
        evidence=[f"max_grad_norm {fmt(clip)}; {v.name('actor/grad_norm')} above it on {len(over)} of {len(g)} steps "
                  f"(median {fmt(statistics.median(g))})"],
        explanation=f"The logged grad_norm is the norm before clipping, so values above max_grad_norm are normal; "
                    f"but when every step is clipped the update is rescaled by about {fmt(scale)}{eff}: the "
                    "clip, not the learning rate, sets the step size, and the gradient's size carries no "
                    "information any more.",
        action=f"Raise max_grad_norm to about the typical gradient norm ({fmt(statistics.median(g))}) so it "
               "only catches spikes, or lower it knowingly and raise the learning rate.")


def flat_reward(v: View, t: Thresholds) -> tuple[bool, str]:
    steps, r = v.series("critic/score/mean")
    if len(r) < 4:
        return False, ""
    a, b = first_last(r, t.window)
    return b - a < t.plateau_delta, f"{v.name('critic/score/mean')} {fmt(a)} (first steps) → {fmt(b)} (last steps)"


@signature("lr_too_small", "actor/lr|critic/score/mean")
def _lr_small(v: View, t: Thresholds) -> Finding | None:
    lr = v.cfg("actor.optim.lr", "learning_rate")
    if lr is None:
        _, lrs = v.series("actor/lr")
        lr = max(lrs) if lrs else None
    if lr is None:
        return None
    lr = float(lr)
    flat, ev = flat_reward(v, t)
    if not (lr <= t.lr_very_low or (lr <= t.lr_low and flat)):
        return None
    first = next((s for s in v.steps if s > 0), None)
    return Finding(
        severity="warn", step=first, confidence=0.8 if flat else 0.5,
        title="Learning rate too small for the run to move", evidence=[f"lr {fmt(lr)}"] + ([ev] if ev else []),
        explanation="With this learning rate each update moves the policy too little to change what it samples: "
                    "the reward stays where it started. (RL fine-tuning of LLMs commonly uses 1e-6 to 1e-5 for "
                    "7B-class models, more for small ones.)",
        action="Raise the learning rate by 3-10× and watch the KL and the clip fraction.")


@signature("kl_blowup", "actor/kl_loss|actor/ppo_kl")
def _kl(v: View, t: Thresholds) -> Finding | None:
    name = "actor/kl_loss" if v.has("actor/kl_loss") else "actor/ppo_kl"
    steps, k = v.series(name)
    if len(k) < 2:
        return None
    a, b = first_last([abs(x) for x in k], t.window)
    if b > t.kl_high:
        severity = "critical"
    elif b > t.kl_floor and b > t.kl_growth * max(a, 1e-12):
        severity = "warn"
    else:
        return None
    first = next(s for s, x in zip(steps, k) if abs(x) > max(t.kl_floor, min(b, t.kl_high)) / 2)
    coef = v.cfg("actor.kl_loss_coef")
    return Finding(
        severity=severity, step=first, confidence=0.8,
        title="The policy runs away from the reference (KL blow-up)",
        evidence=[f"{v.name(name)}: {fmt(a)} (first steps) → {fmt(b)} (last steps)"]
                 + ([f"kl_loss_coef {coef}"] if coef is not None else []),
        explanation="The KL to the reference grows without bound: the updates are too large for the KL term to "
                    "hold the policy, or the KL coefficient is large enough that its own gradient is unstable "
                    "(the low-variance k3 estimate grows exponentially in the log-ratio).",
        action="Lower the learning rate or the clip range; for an exploding KL term lower kl_loss_coef or use "
               "kl_loss_type=low_var_kl; check the run's samples for degenerate text.")


@signature("entropy_collapse", "actor/entropy")
def _entropy(v: View, t: Thresholds) -> Finding | None:
    steps, e = v.series("actor/entropy")
    if len(e) < 4:
        return None
    a, b = first_last(e, t.window)
    if not (a > 0 and b < t.entropy_drop * a):
        return None
    first = next(s for s, x in zip(steps, e) if x < 2 * t.entropy_drop * a)
    return Finding(
        severity="warn", step=first, confidence=0.8, title="Entropy collapse",
        evidence=[f"{v.name('actor/entropy')} {fmt(a)} (first steps) → {fmt(b)} (last steps)"],
        explanation="The policy became (nearly) deterministic: groups of samples now agree, their rewards have no "
                    "variance, and GRPO's advantage — and with it the gradient — vanishes.",
        action="Raise the sampling temperature or add a small entropy bonus (entropy_coeff), use clip-higher "
               "(clip_ratio_high > clip_ratio_low), lower the learning rate.")


@signature("clipfrac_saturated", "actor/pg_clipfrac")
def _clipfrac_saturated(v: View, t: Thresholds) -> Finding | None:
    steps, c = v.series("actor/pg_clipfrac")
    _, b = first_last(c, t.window) if c else (0.0, 0.0)
    if b > t.clipfrac_high:
        first = next(s for s, x in zip(steps, c) if x > t.clipfrac_high)
        return Finding(
            severity="warn", step=first, confidence=0.7, title="The PPO clip is saturated",
            evidence=[f"{v.name('actor/pg_clipfrac')} {fmt(b)} over the last steps (healthy: roughly 0.1-0.4)"],
            explanation="Most tokens hit the clip: the policy moved far from the one that sampled the batch during "
                        "the update, so most tokens contribute no gradient.",
            action="Lower the learning rate or the number of optimizer steps per batch (ppo_epochs, "
                   "smaller ppo_mini_batch_size means more steps).")
    return None


@signature("clipfrac_zero", "actor/pg_clipfrac")
def _clipfrac_zero(v: View, t: Thresholds) -> Finding | None:
    steps, c = v.series("actor/pg_clipfrac")
    if c and max(c) == 0.0:
        epochs = v.cfg("actor.ppo_epochs")
        mini, batch = v.cfg("actor.ppo_mini_batch_size"), v.cfg("data.train_batch_size")
        on_policy = epochs in (None, 1) and (mini is None or batch is None or mini >= batch)
        return Finding(
            severity="info" if on_policy else "warn", step=steps[0], confidence=0.6,
            title="The clip never acts", evidence=[f"{v.name('actor/pg_clipfrac')} 0 on all {len(c)} logged steps"],
            explanation="Zero clip fraction means every update starts at the sampling policy: with one optimizer "
                        "step per batch the ratio is 1 and the clip (and clip-higher) does nothing, which is fine "
                        "if intended." + ("" if on_policy else " With several optimizer steps per batch it should "
                                          "act sometimes: the old log-probs may be recomputed after the update."),
            action="Nothing to do for on-policy updates; otherwise check that old_log_probs come from the "
                   "sampling policy.")
    return None


@signature("zero_variance_groups", "rollout/filter_zero_count|critic/advantages/max|grad_norm/all/group_rv_count")
def _zero_var(v: View, t: Thresholds) -> Finding | None:
    steps, g = v.series("actor/grad_norm")
    _, loss = v.series("actor/pg_loss")
    ss, amax = v.series("critic/advantages/max")
    _, amin = v.series("critic/advantages/min")
    dead = [s for s, a, b in zip(ss, amax, amin) if a == 0.0 and b == 0.0]
    if dead and len(dead) >= max(1, len(ss) // 2):
        return Finding(
            severity="critical", step=dead[0], confidence=0.9,
            title="No learning signal: every advantage is 0",
            evidence=[f"critic/advantages max = min = 0 on {len(dead)} of {len(ss)} steps"]
                     + ([f"{v.name('actor/grad_norm')} {fmt(statistics.median(g))} (median)"] if g else []),
            explanation="Every prompt group got the same reward for all its samples (all right or all wrong), so "
                        "GRPO's group-relative advantage is zero everywhere: loss and gradient are exactly 0.",
            action="Make the task harder or easier so groups disagree, sample more per prompt (rollout.n), or "
                   "use the reward-variance filter / DAPO dynamic sampling to drop such groups.")
    zs, zc = v.series("rollout/filter_zero_count")
    batch = v.cfg("data.train_batch_size")
    if zc and batch:
        frac = [x / float(batch) for x in zc]
        _, recent = first_last(frac, t.window)
        if recent > t.zero_var_frac:
            first = next(s for s, x in zip(zs, frac) if x > t.zero_var_frac)
            return Finding(
                severity="warn", step=first, confidence=0.8,
                title="Most prompt groups carry no signal (equal rewards)",
                evidence=[f"{fmt(100 * recent)}% of the {batch} groups per step have zero reward variance "
                          "(rollout/filter_zero_count)"],
                explanation="Groups whose samples all got the same reward have zero advantage: they add tokens to "
                            "the loss's denominator but nothing to its gradient, which shrinks the update.",
                action="Filter them out (rollout filter, DAPO dynamic sampling), or adjust task difficulty.")
    return None


@signature("length_runaway", "response_length/mean")
def _length_runaway(v: View, t: Thresholds) -> Finding | None:
    _, m = v.series("response_length/mean")
    cs, c = v.series("response_length/clip_ratio")
    if c and len(c) >= 2:
        a, b = first_last(c, t.window)
        if b > t.length_clip_high and b > a:
            first = next(s for s, x in zip(cs, c) if x > t.length_clip_high)
            return Finding(
                severity="warn", step=first, confidence=0.7,
                title="Responses run into the length limit",
                evidence=[f"{v.name('response_length/clip_ratio')} {fmt(a)} → {fmt(b)}"]
                         + ([f"{v.name('response_length/mean')} {fmt(m[0])} → {fmt(m[-1])}"] if m else []),
                explanation="A growing share of responses is cut at the limit: they get no end-of-answer, usually "
                            "no reward, and their many tokens dominate a token-mean loss.",
                action="Raise the response length, add an overlong penalty (DAPO's soft length penalty), or "
                       "check that the model still emits its stop token.")
    return None


@signature("length_collapse", "response_length/mean")
def _length_collapse(v: View, t: Thresholds) -> Finding | None:
    steps, m = v.series("response_length/mean")
    if len(m) >= 4:
        a, b = first_last(m, t.window)
        if a > 0 and b < t.length_drop * a:
            first = next(s for s, x in zip(steps, m) if x < 2 * t.length_drop * a)
            return Finding(
                severity="warn", step=first, confidence=0.6, title="Responses collapse in length",
                evidence=[f"{v.name('response_length/mean')} {fmt(a)} → {fmt(b)}"],
                explanation="The policy learned to answer shorter and shorter, often because a length or format "
                            "reward pays for it, or because short answers avoid penalties.",
                action="Check the reward weights (a length component) and what the model writes "
                       "(rlgrad samples RUN).")
    return None


@signature("reward_collapse", "critic/score/mean")
def _reward_collapse(v: View, t: Thresholds) -> Finding | None:
    steps, r = v.series("critic/score/mean")
    if len(r) < 6:
        return None
    _, b = first_last(r, t.window)
    smooth = [mean(r[i:i + 3]) for i in range(len(r) - 2)]  # 3-step means: one lucky step is not a peak
    peak = max(range(len(smooth)), key=lambda i: smooth[i])
    a, span = smooth[peak], max(r) - min(r)
    if not (span > 0 and a - b > t.reward_drop * span and a - b > t.plateau_delta):
        return None
    first = next((s for s, x in zip(steps[peak:], r[peak:]) if x < a - t.reward_drop * (a - b)), steps[peak])
    ev = [f"{v.name('critic/score/mean')} {fmt(a)} (its best, steps {steps[peak]}-{steps[peak + 2]}) → {fmt(b)} "
          "(last steps)"]
    why = "The policy got worse at what it is rewarded for: the updates are destroying it."
    es, e = v.series("actor/entropy")
    if len(e) >= 4:
        ea, eb = first_last(e, t.window)
        if eb > 2 * ea:
            ev.append(f"{v.name('actor/entropy')} {fmt(ea)} → {fmt(eb)}")
            why += " The entropy rose with it: the model drifts toward noise (too large steps)."
    _, acc = v.series("val/accuracy")
    if len(acc) >= 2 and acc[-1] < acc[0]:
        ev.append(f"val/accuracy {fmt(acc[0])} → {fmt(acc[-1])}")
    lr = v.cfg("actor.optim.lr", "learning_rate")
    return Finding(
        severity="critical", step=first, confidence=0.8, title="The reward collapsed",
        evidence=ev, explanation=why,
        action="Lower the learning rate" + (f" (now {fmt(float(lr))})" if lr else "") + ", keep gradient "
               "clipping on, and resume from a checkpoint before the fall.")


@signature("reward_plateau", "critic/score/mean")
def _plateau(v: View, t: Thresholds) -> Finding | None:
    steps, r = v.series("critic/score/mean")
    if len(r) < 2 * t.window:
        return None
    a, b = first_last(r, t.window)
    if abs(b - a) >= t.plateau_delta:  # a fall is reward_collapse's (or nothing)
        return None
    ev = f"{v.name('critic/score/mean')} {fmt(a)} (first steps) → {fmt(b)} (last steps)"
    return Finding(
        severity="info", step=None, confidence=0.5, title="Reward plateau", evidence=[ev],
        explanation="The mean reward did not rise between the first and the last steps.",
        action="See the other findings for why; a plateau at the reward's maximum is success.")


def _reward_problem(v: View, pid: str, severity: str) -> Finding | None:
    """The run's ``reward_problems`` of kind ``pid`` (the trainer prints the same ones live), as a finding."""
    weights = v.cfg("reward.weights") or None  # empty: the task's defaults, unknown here
    problems = [p for p in reward_problems(v.run.rows, dict(weights) if weights else None) if p.id == pid]
    if not problems:
        return None
    p = problems[0]
    title = (f"The reward cannot teach: '{p.component}' gives no group a signal" if pid == "unlearnable_reward"
             else f"'{p.component}' is the same for every response")
    return Finding(
        severity=severity, step=p.step, confidence=0.9, title=title, evidence=p.evidence, explanation=p.cause,
        action=p.advice)


@signature("unlearnable_reward", "reward/{component}/mean")
def _unlearnable(v: View, t: Thresholds) -> Finding | None:
    return _reward_problem(v, "unlearnable_reward", "critical")


@signature("constant_component", "reward/{component}/std")
def _constant_component(v: View, t: Thresholds) -> Finding | None:
    return _reward_problem(v, "constant_component", "info")


@signature("format_over_correct", "reward/{component}/mean")
def _format_over_correct(v: View, t: Thresholds) -> Finding | None:
    comps = {k.split("/")[1] for k in v.keys("reward/") if k.endswith("/mean") and k.count("/") == 2}
    correct = correctness_component(comps)
    if correct is None:
        return None
    _, c = v.series(f"reward/{correct}/mean")
    if len(c) < 4:
        return None
    ca, cb = first_last(c, t.window)
    for other in sorted(comps - {correct}):
        steps, o = v.series(f"reward/{other}/mean")
        if len(o) < 4:
            continue
        oa, ob = first_last(o, t.window)
        if ob - oa > t.component_rise and cb - ca < t.correct_rise:
            o, c = v.label(other), v.label(correct)
            return Finding(
                severity="warn", step=steps[0], confidence=0.7,
                title=f"'{o}' reward rises while '{c}' does not",
                evidence=[f"{v.name(f'reward/{other}/mean')} {fmt(oa)} → {fmt(ob)}",
                          f"{v.name(f'reward/{correct}/mean')} {fmt(ca)} → {fmt(cb)}"],
                explanation=f"The policy optimises the easy '{o}' reward instead of the task: the weighted total "
                            "rises, accuracy does not.",
                action=f"Lower the weight of '{o}' (reward.weights) or make it conditional on correctness; "
                       "rlgrad's reward-component analysis shows each component's share of the update.")
    return None


@signature("val_falls_train_rises", "val/accuracy")
def _val(v: View, t: Thresholds) -> Finding | None:
    steps, acc = v.series("val/accuracy")
    if len(acc) < 3:
        return None
    best = max(acc)
    best_step = steps[acc.index(best)]
    flat, _ = flat_reward(v, t)
    if acc[-1] < best - t.val_drop and not flat:
        return Finding(
            severity="warn", step=best_step, confidence=0.7,
            title="Validation accuracy falls while the training reward rises",
            evidence=[f"val/accuracy best {fmt(best)} at step {best_step}, last {fmt(acc[-1])}"],
            explanation="The training reward keeps improving but held-out accuracy does not: reward hacking (a "
                        "component the validation does not pay for) or over-fitting to the training prompts.",
            action=f"Keep the checkpoint of step {best_step}; check which reward component drives the update.")
    return None


# ---------------------------------------------------------------- gradient-level signatures


def _bucket_series(v: View, name: str) -> dict[int, dict[str, float]]:
    """step -> bucket -> value of ``grad_norm/{bucket}/{name}``."""
    out: dict[int, dict[str, float]] = {}
    for s, m in v.run.rows.items():
        for b in D.bucket_names(m):
            val = D.bucket_value(m, b, name)
            if not math.isnan(val):
                out.setdefault(s, {})[b] = val
    return out


@signature("std_normalisation_amplifies", "critic/advantages/max")
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
    for step in sorted(per):  # the gradient side: the lowest-variance groups' per-sample push
        bs = [b for b in D.sort_buckets(per[step]) if b != "all" and std.get(step, {}).get(b, 0) > 0]
        if len(bs) >= 2:
            ev.append(f"step {step}: per-sample task gradient " + ", ".join(
                f"{fmt(per[step][b])} in {b} (reward std {fmt(std[step][b])})" for b in bs))
            break
    return Finding(
        severity="warn", step=s, confidence=0.8,
        title="Std-normalised advantages amplify low-variance groups", evidence=ev,
        explanation="Dividing each group's advantage by its reward std gives a nearly-unanimous group (one lucky "
                    "sample among many) advantages larger than any reward difference: with binary rewards the "
                    "groups with the least signal push hardest, and the per-sample gradient no longer grows with "
                    "the reward variance.",
        action="Set algorithm.norm_adv_by_std_in_grpo=false (Dr. GRPO), or use RLOO advantages.")


@signature("regularizer_dominates", "grad_norm/all/task")
def _regularizer(v: View, t: Thresholds) -> Finding | None:
    rows = [(s, m) for s, m in v.run.rows.items() if "grad_norm/all/task" in m]
    for term in ("kl", "entropy"):
        hits = [(s, m[f"grad_norm/all/{term}"], m["grad_norm/all/task"]) for s, m in rows
                if f"grad_norm/all/{term}" in m and m[f"grad_norm/all/{term}"] > t.reg_ratio * m["grad_norm/all/task"]]
        if hits and len(hits) >= max(1, len(rows) // 2):
            s, r, task = hits[0]
            coef = v.cfg("actor.kl_loss_coef" if term == "kl" else "actor.entropy_coeff")
            return Finding(
                severity="warn", step=s, confidence=0.8,
                title=f"The {term} term's gradient outweighs the task's",
                evidence=[f"step {s}: grad_norm/all/{term} {fmt(r)} vs grad_norm/all/task {fmt(task)}",
                          f"on {len(hits)} of {len(rows)} analysis steps"]
                         + ([f"{'kl_loss_coef' if term == 'kl' else 'entropy_coeff'} {coef}"] if coef else []),
                explanation=f"The update mostly follows the {term} regulariser, not the reward: the policy is held "
                            "in place (KL) or pushed toward randomness (entropy) more than it learns the task.",
                action=f"Lower the {term} coefficient by about the ratio shown.")
    return None


@signature("component_takes_over", "grad_comp/{component}/share")
def _takeover(v: View, t: Thresholds) -> Finding | None:
    for s in sorted(v.run.rows):
        m = v.run.rows[s]
        comps = {k.split("/")[1] for k in m if k.startswith("grad_comp/") and k.endswith("/share")} - {"total"}
        correct = correctness_component(comps)
        if correct is None:
            continue
        for c in sorted(comps - {correct}):
            share = m.get(f"grad_comp/{c}/share", 0.0)
            sim = m.get(f"grad_sim/{c}__{correct}", m.get(f"grad_sim/{correct}__{c}"))
            if share > t.share_high and sim is not None and sim < t.sim_negative:
                lc, lr = v.label(c), v.label(correct)
                return Finding(
                    severity="warn", step=s, confidence=0.8,
                    title=f"The '{lc}' reward drives the update against correctness",
                    evidence=[f"step {s}: grad_comp/{c}/share {fmt(share)}, cosine with '{lr}' {fmt(sim)}"],
                    explanation=f"Most of the update comes from the '{lc}' component, and its gradient points away "
                                f"from the '{lr}' gradient: improving '{lc}' costs accuracy.",
                    action=f"Lower the weight of '{lc}' or gate it on correctness.")
    return None


@signature("component_dominates", "grad_comp/{component}/share")
def _dominates(v: View, t: Thresholds) -> Finding | None:
    comps = {k.split("/")[1] for k in v.keys("grad_comp/") if k.endswith("/share")} - {"total"}
    correct = correctness_component(comps)
    if correct is None:
        return None
    for c in sorted(comps - {correct}):
        steps, share = v.series(f"grad_comp/{c}/share")
        cshare = dict(zip(*v.series(f"grad_comp/{correct}/share")))
        hits = [(s, x) for s, x in zip(steps, share) if x > t.share_high]
        if hits:
            weight = v.cfg(f"reward.weights.{c}")
            lc, lr = v.label(c), v.label(correct)
            return Finding(
                severity="warn", step=hits[0][0], confidence=0.7,
                title=f"The '{lc}' reward, not '{lr}', makes most of the update",
                evidence=[f"grad_comp/{c}/share {fmt(hits[0][1])} at step {hits[0][0]} (above "
                          f"{fmt(t.share_high)} on {len(hits)} of {len(share)} analysis steps); "
                          f"grad_comp/{correct}/share {fmt(cshare.get(hits[0][0], math.nan))} there"]
                         + ([f"reward.weights.{c} = {weight}"] if weight is not None else []),
                explanation=f"Most of the gradient comes from the '{lc}' component: the run spends its updates on "
                            f"'{lc}' rather than on the task, until '{lc}' is satisfied.",
                action=f"Lower the weight of '{lc}' (reward.weights); a secondary reward should stay a minor "
                       "share of the update once it is mostly satisfied.")
    return None


@signature("update_concentrated", "grad_norm/all/task")
def _concentrated(v: View, t: Thresholds) -> Finding | None:
    steps = D.analysis_steps(v.run)
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


@signature("dormant_growing", "actor/neuron/dormant_ratio")
def _dormant(v: View, t: Thresholds) -> Finding | None:
    steps, d = v.series("actor/neuron/dormant_ratio")
    if len(d) < 2 or not (d[-1] - d[0] > t.dormant_rise and d[-1] >= t.dormant_high):
        return None
    return Finding(
        severity="warn", step=steps[-1], confidence=0.7, title="Dormant neurons are growing",
        evidence=[f"actor/neuron/dormant_ratio {fmt(d[0])} (step {steps[0]}) → {fmt(d[-1])} (step {steps[-1]})"],
        explanation="A growing share of neurons receives (almost) no gradient: capacity the policy no longer uses, "
                    "a known precursor of plasticity loss in long RL runs.",
        action="Consider ReDo resets (analysis.neurons.actor.reset_every) or a lower learning rate.")
