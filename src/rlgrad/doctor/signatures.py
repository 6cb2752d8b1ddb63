"""``rlgrad doctor``'s signatures, one function each: the scalar ones read the logs, the gradient-level ones
rlgrad's instruments. Each names the metrics it needs; its thresholds are ``Thresholds`` fields."""

from __future__ import annotations

import math
import statistics

from rlgrad import rundata as D
from rlgrad.doctor.findings import Finding, Thresholds, View, first_last, fmt, mean, signature
from rlgrad.logging.reward_signal import correctness_component, reward_problems

# ---------------------------------------------------------------- scalar signatures


@signature("nonfinite_steps", "actor/grad_norm|actor/pg_loss|actor/nonfinite_grad_steps",
           reads="logs",
           fires="a NaN / inf loss or gradient, or an update skipped for one (critical)")
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


@signature("grad_norm_spike", "actor/grad_norm",
           reads="logs",
           fires="grad_norm > {spike_factor:g}× the median of the {window} steps before (critical when the reward "
                 "falls after)")
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


@signature("clip_every_step", "actor/grad_norm",
           reads="logs + config",
           fires="grad_norm > `max_grad_norm` on ≥ {clip_steps_frac:.0%} of steps; gives the effective learning rate")
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


def _train_series(v: View, key: str) -> tuple[list[int], list[float]]:
    """A metric over the training steps (step 0 holds the validation before training, nothing trained)."""
    steps, x = v.series(key)
    keep = [i for i, s in enumerate(steps) if s >= 1]
    return [steps[i] for i in keep], [x[i] for i in keep]


def _lr(v: View) -> float | None:
    lr = v.cfg("actor.optim.lr", "learning_rate")
    if lr is None:
        _, lrs = v.series("actor/lr")
        lr = max(lrs) if lrs else None
    try:
        return None if lr is None else float(lr)
    except (TypeError, ValueError):
        return None


def _largest_layer(v: View, step: int) -> str:
    m = v.run.rows.get(step, {})
    layers = {k.rsplit("/", 1)[1]: x for k, x in m.items() if k.startswith("actor/update_ratio/")}
    if not layers:
        return ""
    top = max(layers, key=lambda k: layers[k])
    return f"; the most moved layer group at step {step}: {top} {fmt(layers[top])}"


@signature("update_too_large", "actor/update_ratio",
           reads="logs",
           fires="the median update size ‖Δθ‖/‖θ‖ (`actor/update_ratio`) of the first {window} steps > "
                 "{update_high:g}: every step moves the weights by more than {update_high:.0%} of their norm")
def _update_large(v: View, t: Thresholds) -> Finding | None:
    steps, u = _train_series(v, "actor/update_ratio")
    first = u[:t.window]
    if not first or statistics.median(first) <= t.update_high:
        return None
    med = statistics.median(first)
    s0 = next(s for s, x in zip(steps, u) if x > t.update_high)
    lr = _lr(v)
    warm = v.cfg("actor.optim.lr_warmup_steps")
    return Finding(
        severity="warn", step=s0, confidence=0.8, title="Each update moves the weights too far",
        evidence=[f"actor/update_ratio {fmt(med)} (median of steps {steps[0]}-{steps[len(first) - 1]}; above "
                  f"{fmt(t.update_high)} on {sum(x > t.update_high for x in u)} of {len(u)} steps)"
                  + _largest_layer(v, s0)]
                 + ([f"lr {fmt(lr)}" + (f", lr_warmup_steps {warm}" if warm is not None else "")] if lr else []),
        explanation="The update of one step is a sizeable fraction of the weights themselves: the policy is "
                    "rewritten faster than the reward can guide it, so what it learned in warm-up or pre-training "
                    "is overwritten (typical fine-tuning steps move the weights by 1e-4 to 1e-3 of their norm).",
        action=f"Lower the learning rate{f' (now {fmt(lr)})' if lr else ''} about {med / (t.update_high / 10):.2g}-"
               "fold, to bring actor/update_ratio to about 1e-3, and warm it up (actor.optim.lr_warmup_steps).",
        explains=["reward_collapse", "grad_norm_spike", "kl_blowup", "clipfrac_saturated", "entropy_collapse",
                  "zero_variance_groups", "component_dominates", "component_takes_over", "format_over_correct",
                  "val_falls_train_rises", "nonfinite_steps", "length_collapse", "length_runaway"])


def _room(r: list[float], start: float) -> float:
    """How far the reward could still rise from ``start``: to 1 for a reward that stays in [0, 1] (a share of right
    answers, a weighted sum of such), else to the best the run reached."""
    top = 1.0 if all(0.0 <= x <= 1.0 for x in r) else max(r)
    return top - start


@signature("lr_too_small", "actor/update_ratio|actor/lr|critic/score/mean",
           reads="logs (+ config)",
           fires="the update size ‖Δθ‖/‖θ‖ (`actor/update_ratio`) < {update_low:g} over the last {window} steps while "
                 "the reward gained < {progress_low:.0%} of its room to its best; a run without "
                 "`actor/update_ratio` (last resort): lr ≤ {lr_low:g} with a flat reward, or ≤ {lr_very_low:g}")
def _lr_small(v: View, t: Thresholds) -> Finding | None:
    return _small_updates(v, t) if v.has("actor/update_ratio") else _small_lr(v, t)


def _small_updates(v: View, t: Thresholds) -> Finding | None:
    """The measured update size and the reward's progress (independent of the model's size and the optimizer)."""
    steps, u = _train_series(v, "actor/update_ratio")
    _, r = _train_series(v, "critic/score/mean")
    if len(u) < t.window or len(r) < t.window:
        return None
    recent = statistics.median(u[-t.window:])
    a, b = first_last(r, t.window)
    room = _room(r, a)
    if recent >= t.update_low or (room > 0 and b - a >= t.progress_low * room):
        return None
    lr = _lr(v)
    gained = f"{fmt(100 * (b - a) / room)}% of its room to {fmt(a + room)}" if room > 0 else "nothing"
    return Finding(
        severity="warn", step=steps[0], confidence=0.7,
        title="The updates are too small for the run to move",
        evidence=[f"actor/update_ratio {fmt(recent)} (median of the last {t.window} steps)"
                  + _largest_layer(v, steps[-1]),
                  f"{v.name('critic/score/mean')} {fmt(a)} (first steps) → {fmt(b)} (last steps): {gained}"]
                 + ([f"lr {fmt(lr)}"] if lr else []),
        explanation="Each step moves the weights by a tiny fraction of their norm and the reward barely rises: the "
                    "learning rate (or a clip on every step) keeps the policy where it started.",
        action=f"Raise the learning rate{f' (now {fmt(lr)})' if lr else ''} about "
               f"{fmt(min(10.0, t.update_high / 10 / max(recent, 1e-12)))}-fold, toward an actor/update_ratio of "
               "about 1e-3, and watch the reward and actor/update_ratio.")


def _small_lr(v: View, t: Thresholds) -> Finding | None:
    """The last resort, for runs that log no update size: absolute learning rates (sizes for 7B-class models)."""
    lr = _lr(v)
    if lr is None:
        return None
    flat, ev = flat_reward(v, t)
    if not (lr <= t.lr_very_low or (lr <= t.lr_low and flat)):
        return None
    first = next((s for s in v.steps if s > 0), None)
    return Finding(
        severity="warn", step=first, confidence=0.6 if flat else 0.4,
        title="Learning rate too small for the run to move",
        evidence=[f"lr {fmt(lr)}"] + ([ev] if ev else [])
                 + ["the run logs no update size (actor/update_ratio): judged by the learning rate's value alone"],
        explanation="With this learning rate each update moves the policy too little to change what it samples: "
                    "the reward stays where it started. (RL fine-tuning of LLMs commonly uses 1e-6 to 1e-5 for "
                    "7B-class models, more for small ones.)",
        action="Raise the learning rate by 3-10× and watch the KL and the clip fraction.")


@signature("kl_blowup", "actor/kl_loss|actor/ppo_kl",
           reads="logs",
           fires="the recent KL loss > {kl_high:g} (critical) or > {kl_growth:g}× its start and > {kl_floor:g}")
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


@signature("entropy_collapse", "actor/entropy",
           reads="logs",
           fires="the recent entropy < {entropy_drop:.0%} of its start")
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


@signature("clipfrac_saturated", "actor/pg_clipfrac",
           reads="logs",
           fires="the recent clip fraction > {clipfrac_high:g}")
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


@signature("clipfrac_zero", "actor/pg_clipfrac",
           reads="logs",
           fires="the clip fraction always 0 (info for on-policy updates)")
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


def reward_level(v: View) -> tuple[float | None, str]:
    """The recent level of a reward read as a share of right answers, and the metric it is read from: the
    correctness component, rlgrad's rollout accuracy, or a total reward that stays in [0, 1]; None if unknown."""
    comps = {k.split("/")[1] for k in v.keys("reward/") if k.endswith("/mean") and k.count("/") == 2}
    correct = correctness_component(comps)
    keys = ([f"reward/{correct}/mean"] if correct else []) + ["rollout/accuracy", "critic/score/mean"]
    for k in keys:
        _, x = v.series(k)
        if x and (k != "critic/score/mean" or all(0.0 <= a <= 1.0 for a in x)):
            return mean(x[-3:]), v.name(k)
    return None, ""


def _zero_var_fraction(v: View) -> tuple[list[int], list[float], str]:
    """The share of prompt groups with one reward for all their samples, per step, and where it comes from:
    TRL's frac_reward_zero_std, else rlgrad's rollout-filter count over the groups of a step."""
    steps, f = v.series("critic/score/frac_zero_std")
    if f:
        return steps, f, v.name("critic/score/frac_zero_std")
    zs, zc = v.series("rollout/filter_zero_count")
    batch = v.cfg("data.train_batch_size")
    if zc and isinstance(batch, int | float) and batch > 0:
        return zs, [x / float(batch) for x in zc], f"rollout/filter_zero_count of {int(batch)} groups"
    return [], [], ""


def _difficulty(v: View, t: Thresholds) -> tuple[str, str, list[str]]:
    """Why groups agree (too easy, too hard, or split) from the reward's level, what to do, and the evidence."""
    level, where = reward_level(v)
    if level is None:
        return ("every sample of a group got the same reward: the task is too easy or too hard for this model (the "
                "reward's scale is unknown, so its level cannot tell which)",
                "Read a few groups (rlgrad samples RUN) to see which; then make the task harder or easier, or drop "
                "such groups (rollout filter, DAPO dynamic sampling).", [])
    ev = [f"{where} {fmt(level)} over the last steps"]
    if level >= t.easy_level:
        return ("the task is too easy: nearly every answer is right, so every sample of a group gets the same "
                "reward", "Make the task harder (or train on prompts the model still fails), or drop the groups "
                "with no variance (rollout filter, DAPO dynamic sampling).", ev)
    if level <= t.hard_level:
        return ("the task is too hard: nearly every answer is wrong, so every sample of a group gets the same "
                "reward", "Make the task easier or the model stronger (a longer warm start, SFT), and check that "
                "right answers are read (rlgrad samples RUN).", ev)
    return ("each prompt is either always right or always wrong: the groups split into too easy and too hard",
            "Sample more per prompt (rollout.n) or move the prompts' difficulty toward the model's level; drop the "
            "groups with no variance (rollout filter, DAPO dynamic sampling).", ev)


@signature("zero_variance_groups", "critic/advantages/max|critic/score/frac_zero_std|rollout/filter_zero_count",
           reads="logs (+ config)",
           fires="every advantage 0, or > 95% of the groups with one reward for all their samples (critical); > "
                 "{zero_var_frac:.0%} of them (TRL's frac_reward_zero_std, rlgrad's filter count); says too easy "
                 "(a [0, 1] reward ≥ {easy_level:g}) or too hard (≤ {hard_level:g})")
def _zero_var(v: View, t: Thresholds) -> Finding | None:
    ss, amax = v.series("critic/advantages/max")
    _, amin = v.series("critic/advantages/min")
    dead = [s for s, a, b in zip(ss, amax, amin) if a == 0.0 and b == 0.0]
    zs, frac, where = _zero_var_fraction(v)
    recent = first_last(frac, t.window)[1] if frac else 0.0
    if dead and len(dead) >= max(1, len(ss) // 2):
        ev, s0 = [f"critic/advantages max = min = 0 on {len(dead)} of {len(ss)} steps"], dead[0]
    elif recent > t.zero_var_frac:
        s0 = next(s for s, x in zip(zs, frac) if x > t.zero_var_frac)
        ev = [f"{fmt(100 * recent)}% of the prompt groups per step have one reward for all their samples ({where}; "
              "mean of the last steps)"]
    else:
        return None
    severity = "critical" if dead and len(dead) >= max(1, len(ss) // 2) or recent > 0.95 else "warn"
    why, action, level_ev = _difficulty(v, t)
    _, g = v.series("actor/grad_norm")
    return Finding(
        severity=severity, step=s0, confidence=0.9 if severity == "critical" else 0.8,
        title="No learning signal: (nearly) every advantage is 0" if severity == "critical"
        else "Most prompt groups carry no signal (equal rewards)",
        evidence=ev + level_ev + ([f"{v.name('actor/grad_norm')} {fmt(statistics.median(g))} (median)"] if g else []),
        explanation=f"GRPO learns from differences within a prompt's group; here {why}. Such a group's advantage is "
                    "0: it adds tokens to the loss but nothing to its gradient, so the update shrinks (to the "
                    "regularisers alone when every group agrees).",
        action=action,
        explains=["regularizer_dominates", "reward_plateau", "lr_too_small", "component_dominates",
                  "component_takes_over"])


@signature("length_runaway", "response_length/mean",
           reads="logs",
           fires="the share of responses cut at the length limit rising from < {length_clip_high:.0%} (its first "
                 "steps) to > {length_clip_high:.0%} (its last)")
def _length_runaway(v: View, t: Thresholds) -> Finding | None:
    _, m = v.series("response_length/mean")
    cs, c = _train_series(v, "response_length/clip_ratio")
    if len(c) < 2:
        return None
    a, b = first_last(c, t.window)
    if not (b > t.length_clip_high > a):  # cut from the start is length_truncated's
        return None
    first = next(s for s, x in zip(cs, c) if x > t.length_clip_high)
    return Finding(
        severity="warn", step=first, confidence=0.7,
        title="Responses run into the length limit",
        evidence=[f"{v.name('response_length/clip_ratio')} {fmt(a)} → {fmt(b)}"]
                 + ([f"{v.name('response_length/mean')} {fmt(m[0])} → {fmt(m[-1])}"] if m else []),
        explanation="A growing share of responses is cut at the limit: they get no end-of-answer, usually "
                    "no reward, and their many tokens dominate a token-mean loss.",
        action="Raise the response length, add an overlong penalty (DAPO's soft length penalty), or "
               "check that the model still emits its stop token.",
        explains=["length_truncated", "reward_plateau", "reward_collapse", "zero_variance_groups"])


def truncated_since(c: list[float], t: Thresholds) -> int | None:
    """The index from which the median share of cut responses over the last ``window`` steps (all of them while
    fewer) has stayed above ``truncation_high``, at least 3 steps in; None if it is not above now. A median over
    a window changes slowly: one step's dip neither ends the finding nor moves its first step."""
    since = None
    for n in range(3, len(c) + 1):
        held = statistics.median(c[max(0, n - t.window):n]) > t.truncation_high
        since = (since if since is not None else n - 1) if held else None
    if since is None:
        return None
    start = max(0, since - t.window + 1)  # the first step of the stretch: the first cut one of its first window
    return next((i for i in range(start, since + 1) if c[i] > t.truncation_high), since)


@signature("length_truncated", "response_length/clip_ratio",
           reads="logs (+ config)",
           fires="the median share of responses cut at the length limit over the last {window} steps > "
                 "{truncation_high:.0%} (from the 3rd step on)")
def _length_truncated(v: View, t: Thresholds) -> Finding | None:
    cs, c = _train_series(v, "response_length/clip_ratio")
    i = truncated_since(c, t)
    if i is None:
        return None
    recent = c[-t.window:]
    limit = v.cfg("rollout.response_length", "max_completion_length")
    _, m = _train_series(v, "response_length/mean")
    return Finding(
        severity="warn", step=cs[i], confidence=0.9,
        title="Most responses are cut at the length limit, step after step",
        evidence=[f"{v.name('response_length/clip_ratio')} {fmt(min(recent))}-{fmt(max(recent))} over the last "
                  f"{len(recent)} steps (median {fmt(statistics.median(recent))}), above "
                  f"{fmt(t.truncation_high)} since step {cs[i]}"]
                 + ([f"{v.name('response_length/mean')} {fmt(statistics.median(m[-t.window:]))} (median)"
                     + (f" against a limit of {limit}" if limit is not None else "")] if m else []),
        explanation="A response cut at the limit never reaches its end (no stop token): an answer longer than the "
                    "limit cannot be written, cut responses of a group tend to get the same reward (no signal), and "
                    "the run cannot learn what lies past the limit. This is the limit, not a trend: it holds from "
                    "step to step.",
        action="Raise the response length limit" + (f" (rollout.response_length, now {limit})" if limit is not None
                                                    else "") + " to fit a whole answer; if the answers ramble, add "
               "an overlong penalty (reward.overlong_buffer, DAPO's soft length penalty).",
        explains=["unlearnable_reward", "zero_variance_groups", "reward_plateau", "lr_too_small", "constant_component",
                  "reward_collapse", "format_over_correct", "regularizer_dominates", "component_dominates"])


@signature("length_collapse", "response_length/mean",
           reads="logs",
           fires="the recent mean length < {length_drop:.0%} of its start")
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


def step_noise(vals: list[float]) -> float:
    """A series' step-to-step noise as a standard deviation: the median |Δ| between consecutive values / 0.954 (white
    noise of std σ has a median |Δ| of 0.954σ). A fall's few large steps barely move a median."""
    d = [abs(b - a) for a, b in zip(vals, vals[1:])]
    return statistics.median(d) / 0.954 if d else 0.0


def collapse_at(r: list[float], t: Thresholds) -> tuple[int, float, float] | None:
    """The first window of ``collapse_steps`` steps in a row whose reward fell from the run's early level (its first
    step, sampled before any update) by more than ``reward_drop`` of that level, each step at least half that far
    down, and by more than ``collapse_z`` times the step-to-step noise of the steps up to the window's end: (its
    index, the window's mean, the fall in noise units). Only what precedes a window's end decides it, so a
    collapse found in a run is found in every longer prefix of it."""
    k, early = t.collapse_steps, r[0] if r else 0.0
    need = max(t.reward_drop * abs(early), t.plateau_delta)
    for i in range(1, len(r) - k + 1):
        w = r[i:i + k]
        fall = early - mean(w)
        if fall <= need or max(w) >= early - need / 2:
            continue
        noise = max(step_noise(r[:i + k]), t.plateau_delta / 2)
        z = fall / (noise * math.sqrt(1 + 1 / k))
        if z > t.collapse_z:
            return i, mean(w), z
    return None


def _val_after(v: View, step: int) -> tuple[float | None, list[tuple[int, float]]]:
    """val/accuracy before training (step 0) and at the validations from ``step`` on."""
    steps, acc = v.series("val/accuracy")
    before = acc[0] if steps and steps[0] == 0 else None
    return before, [(s, a) for s, a in zip(steps, acc) if s >= step]


@signature("reward_collapse", "critic/score/mean",
           reads="logs",
           fires="the reward of {collapse_steps} steps in a row below its first step's (the policy before any update) "
                 "by > {reward_drop:.0%} of it and > {collapse_z:g}× its step-to-step noise (critical; a warning "
                 "while validation holds)")
def _reward_collapse(v: View, t: Thresholds) -> Finding | None:
    steps, r = _train_series(v, "critic/score/mean")
    hit = collapse_at(r, t)
    if hit is None:
        return None
    i, low, z = hit
    name, k = v.name("critic/score/mean"), t.collapse_steps
    ev = [f"{name} {fmt(r[0])} at step {steps[0]} (the policy before any update) → {fmt(low)} over steps "
          f"{steps[i]}-{steps[i + k - 1]}: {fmt(100 * (r[0] - low) / abs(r[0]))}% below, {z:.1f}× the reward's "
          "step-to-step noise"]
    if len(r) > i + k:
        ev.append(f"{name} {fmt(mean(r[-k:]))} over the last {k} steps")
    severity, why = "critical", "The policy got worse at what it is rewarded for, fast: the updates are destroying it."
    before, vals = _val_after(v, steps[i])
    if before is not None and vals:
        ev.append(f"val/accuracy {fmt(before)} before training → {fmt(vals[0][1])} at step {vals[0][0]}")
        if all(a >= before * (1 - t.reward_drop / 2) for _, a in vals):
            severity = "warn"
            why += " Validation has held so far, so it may still be the training batches' prompts."
    _, e = _train_series(v, "actor/entropy")
    if len(e) > i + k and mean(e[i:i + k]) > 2 * e[0]:
        ev.append(f"{v.name('actor/entropy')} {fmt(e[0])} → {fmt(mean(e[i:i + k]))}")
        why += " The entropy rose with it: the model drifts toward noise (too large steps)."
    lr = _lr(v)
    return Finding(
        severity=severity, step=steps[i], confidence=0.8 if severity == "critical" else 0.6,
        title="The reward collapsed", evidence=ev, explanation=why,
        action="Lower the learning rate" + (f" (now {fmt(lr)})" if lr else "") + " and keep gradient clipping on; "
               + _restart_from(v, steps[i]) + ".",
        explains=["zero_variance_groups", "component_dominates", "component_takes_over", "format_over_correct",
                  "reward_plateau", "val_falls_train_rises", "length_runaway", "length_collapse"])


def _restart_from(v: View, step: int) -> str:
    """Where to start again from before ``step``: a checkpoint the run saved before it, else the initial weights."""
    freq = v.cfg("trainer.save_freq")
    if isinstance(freq, int) and freq > 0 and step > freq:
        return f"resume from the last checkpoint before step {step} (global_step_{(step - 1) // freq * freq})"
    return f"restart from the initial weights (the run saved no checkpoint before step {step})" if isinstance(
        freq, int) else f"restart from a checkpoint before step {step}, or from the initial weights"


@signature("reward_plateau", "critic/score/mean",
           reads="logs",
           fires="the reward's rise from the first to the last {window} steps < {plateau_delta:g} (info)")
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


@signature("unlearnable_reward", "reward/{component}/mean",
           reads="logs",
           fires="every group with one correctness value on each of the first 3 steps (critical; names the likely "
                 "cause: extraction, format, too hard, too easy)")
def _unlearnable(v: View, t: Thresholds) -> Finding | None:
    return _reward_problem(v, "unlearnable_reward", "critical")


@signature("constant_component", "reward/{component}/std",
           reads="logs",
           fires="a weighted component constant over the batch on each of the first 3 steps (info)")
def _constant_component(v: View, t: Thresholds) -> Finding | None:
    return _reward_problem(v, "constant_component", "info")


def reward_weights(v: View) -> dict[str, float]:
    """The weight of each reward component: the run's config (reward.weights), else what its
    reward_components.jsonl recorded (the task's defaults included); empty when neither says."""
    w = v.cfg("reward.weights")
    if isinstance(w, dict) and w:
        return {str(k): float(x) for k, x in w.items() if isinstance(x, int | float)}
    rows = D.reward_components(v.run)
    first = rows[min(rows)] if rows else {}
    got = first.get("weights") if isinstance(first, dict) else None
    return {str(k): float(x) for k, x in got.items() if isinstance(x, int | float)} if isinstance(got, dict) else {}


@signature("inverted_reward", "reward/{component}/mean",
           reads="logs + config",
           fires="the correctness-like component's weight is negative (reward.weights): the run is paid for wrong "
                 "answers (critical)")
def _inverted(v: View, t: Thresholds) -> Finding | None:
    weights = reward_weights(v)
    correct = correctness_component(weights)
    if correct is None or weights[correct] >= 0:
        return None
    steps, c = _train_series(v, f"reward/{correct}/mean")
    _, total = _train_series(v, "critic/score/mean")
    lc = v.label(correct)
    ev = [f"reward.weights.{correct} = {weights[correct]:g}"]
    if len(c) >= 2:
        a, b = first_last(c, t.window)
        ev.append(f"{v.name(f'reward/{correct}/mean')} {fmt(a)} (first steps) → {fmt(b)} (last steps)")
    if len(total) >= 2:
        a, b = first_last(total, t.window)
        ev.append(f"{v.name('critic/score/mean')} {fmt(a)} → {fmt(b)}: the total rises as '{lc}' falls"
                  if len(c) >= 2 and b > a and c[-1] < c[0] else f"{v.name('critic/score/mean')} {fmt(a)} → {fmt(b)}")
    return Finding(
        severity="critical", step=steps[0] if steps else None, confidence=0.9,
        title=f"The reward pays for wrong answers: '{lc}' has a negative weight", evidence=ev,
        explanation=f"With a negative weight on '{lc}', a right answer lowers the total reward: GRPO's advantage "
                    "favours wrong answers, so the better the run optimises its reward, the worse its accuracy. "
                    "Every other sign of trouble (validation falling, another component taking over) follows.",
        action=f"Make the weight of '{lc}' positive (reward.weights.{correct}); a penalty belongs on a separate "
               "component, not on correctness.",
        explains=["reward_collapse", "val_falls_train_rises", "format_over_correct", "component_dominates",
                  "component_takes_over", "entropy_collapse", "unlearnable_reward", "zero_variance_groups",
                  "reward_plateau", "length_collapse"])


@signature("format_over_correct", "reward/{component}/mean",
           reads="logs",
           fires="a non-correctness reward rising by > {component_rise:g} while correctness rises < {correct_rise:g}")
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


def _checkpoint_words(v: View, best_step: int) -> str:
    """What to keep for the best validation step, in words that are true of the run: step 0 is the validation of
    the initial weights (no checkpoint); a trained step is kept only where the run saved a checkpoint."""
    if best_step == 0:
        return ("No trained step beat the initial weights on validation (step 0 is the validation before training): "
                "keep the initial model")
    freq = v.cfg("trainer.save_freq")
    last = max(v.steps)
    if not isinstance(freq, int):
        return f"Keep the weights of step {best_step} if a checkpoint holds them"
    if (freq > 0 and best_step % freq == 0) or best_step == last:
        return f"Keep the checkpoint of step {best_step} (global_step_{best_step})"
    saved = (best_step // freq) * freq if freq > 0 else 0
    nearest = f"; the nearest one before it is step {saved} (global_step_{saved})" if saved > 0 else ""
    return (f"No checkpoint holds step {best_step} (trainer.save_freq={freq}){nearest}: rerun to step {best_step} "
            "to keep it, with a trainer.save_freq that divides it")


@signature("val_falls_train_rises", "val/accuracy",
           reads="logs (+ config)",
           fires="validation accuracy > {val_drop:g} below its best while the training reward rises")
def _val(v: View, t: Thresholds) -> Finding | None:
    steps, acc = v.series("val/accuracy")
    if len(acc) < 3:
        return None
    best = max(acc)
    best_step = steps[acc.index(best)]
    flat, _ = flat_reward(v, t)
    if acc[-1] < best - t.val_drop and not flat:
        at = "before training (step 0: the initial weights)" if best_step == 0 else f"at step {best_step}"
        return Finding(
            severity="warn", step=best_step, confidence=0.7,
            title="Validation accuracy falls while the training reward rises",
            evidence=[f"val/accuracy best {fmt(best)} {at}, last {fmt(acc[-1])} (step {steps[-1]})"],
            explanation="The training reward keeps improving but held-out accuracy does not: reward hacking (a "
                        "component the validation does not pay for) or over-fitting to the training prompts.",
            action=_checkpoint_words(v, best_step) + "; check which reward component drives the update "
                   "(rlgrad report RUN: the reward-component gradients).")
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


def _regularizer_words(term: str, coef) -> tuple[str, str, str, list[str]]:
    """(title, why, what to do, the findings it explains) for a dominating KL or entropy term, by the sign of
    its coefficient: a negative entropy coefficient is a penalty that pushes toward determinism, and "lower the
    coefficient" would make it stronger."""
    c = float(coef) if isinstance(coef, int | float) and not isinstance(coef, bool) else None
    if term == "kl":
        return ("The KL term's gradient outweighs the task's",
                "The update mostly follows the KL term, not the reward: the policy is held at the reference more "
                "than it learns the task.",
                "Lower kl_loss_coef by about the ratio shown (or drop the KL loss: actor.use_kl_loss=false).",
                ["reward_plateau", "lr_too_small"])
    if c is not None and c < 0:
        return ("The entropy penalty's gradient outweighs the task's",
                f"entropy_coeff is negative ({c:g}): the entropy term is a penalty whose gradient lowers the entropy, "
                "pushing the policy toward determinism (one answer per prompt) harder than the reward moves it. "
                "Groups then agree, their advantages vanish, and the reward falls with the exploration.",
                "Set actor.entropy_coeff to 0 (or a small positive bonus): a negative coefficient penalises "
                "exploration. To keep a penalty, shrink its magnitude (bring it toward 0) by about the ratio shown.",
                ["entropy_collapse", "reward_collapse", "zero_variance_groups", "length_collapse",
                 "val_falls_train_rises", "update_too_large", "reward_plateau", "component_dominates",
                 "component_takes_over", "format_over_correct"])
    return ("The entropy bonus's gradient outweighs the task's",
            "The update mostly follows the entropy bonus, not the reward: the policy is pushed toward randomness "
            "more than it learns the task." + ("" if c is not None else " (The run does not say the entropy "
                                                                        "coefficient's sign.)"),
            "Lower entropy_coeff (toward 0) by about the ratio shown.",
            ["reward_collapse", "reward_plateau", "length_runaway", "val_falls_train_rises"])


@signature("regularizer_dominates", "grad_norm/all/task",
           reads="buckets + config",
           fires="the KL or entropy term's gradient > {reg_ratio:g}× the task's on most analysis steps (its advice "
                 "by the sign of the coefficient: an entropy penalty is not a bonus)")
def _regularizer(v: View, t: Thresholds) -> Finding | None:
    rows = [(s, m) for s, m in v.run.rows.items() if "grad_norm/all/task" in m]
    for term in ("kl", "entropy"):
        hits = [(s, m[f"grad_norm/all/{term}"], m["grad_norm/all/task"]) for s, m in rows
                if f"grad_norm/all/{term}" in m and m[f"grad_norm/all/{term}"] > t.reg_ratio * m["grad_norm/all/task"]]
        if hits and len(hits) >= max(1, len(rows) // 2):
            s, r, task = hits[0]
            name = "kl_loss_coef" if term == "kl" else "entropy_coeff"
            coef = v.cfg("actor.kl_loss_coef" if term == "kl" else "actor.entropy_coeff")
            title, why, action, explains = _regularizer_words(term, coef)
            ratio = f" (ratio {fmt(r / task)})" if task > 0 else " (the task's gradient is 0)"
            return Finding(
                severity="warn", step=s, confidence=0.8, title=title,
                evidence=[f"step {s}: grad_norm/all/{term} {fmt(r)} vs grad_norm/all/task {fmt(task)}{ratio}",
                          f"on {len(hits)} of {len(rows)} analysis steps"]
                         + ([f"{name} {coef}"] if coef is not None else []),
                explanation=why, action=action, explains=explains)
    return None


@signature("component_takes_over", "grad_comp/{component}/share",
           reads="components",
           fires="a non-correctness reward's share of the update > {share_high:g} and its gradient pointing against "
                 "correctness (cosine < {sim_negative:g})")
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
                    evidence=[f"step {s}: grad_comp/{c}/share {fmt(share)} ({D.share_words(share)}), cosine "
                              f"with '{lr}' {fmt(sim)}"],
                    explanation=f"Most of the update comes from the '{lc}' component, and its gradient points away "
                                f"from the '{lr}' gradient: improving '{lc}' costs accuracy.",
                    action=f"Lower the weight of '{lc}' or gate it on correctness.")
    return None


@signature("component_dominates", "grad_comp/{component}/share",
           reads="components",
           fires="a non-correctness reward's share of the update > {share_high:g}")
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
                evidence=[f"grad_comp/{c}/share {fmt(hits[0][1])} at step {hits[0][0]}: "
                          f"{D.share_words(hits[0][1])} (above {fmt(t.share_high)} on {len(hits)} of {len(share)} "
                          f"analysis steps)",
                          f"grad_comp/{correct}/share {fmt(cshare.get(hits[0][0], math.nan))} there: "
                          f"{D.share_words(cshare.get(hits[0][0], math.nan))}"]
                         + ([f"reward.weights.{c} = {weight}"] if weight is not None else []),
                explanation=f"Most of the gradient comes from the '{lc}' component: the run spends its updates on "
                            f"'{lc}' rather than on the task, until '{lc}' is satisfied.",
                action=f"Lower the weight of '{lc}' (reward.weights); a secondary reward should stay a minor "
                       "share of the update once it is mostly satisfied.")
    return None


@signature("update_concentrated", "grad_norm/all/task",
           reads="layers",
           fires="two layer groups hold > {layer_top2:.0%} of the task gradient's squared norm (info)")
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


@signature("dormant_growing", "actor/neuron/dormant_ratio",
           reads="neurons",
           fires="the dormant ratio rising by > {dormant_rise:g} to ≥ {dormant_high:g}")
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
