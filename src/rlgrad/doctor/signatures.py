"""``rlgrad doctor``'s signatures of the training dynamics, one function each, read off the logs: non-finite
values, gradient spikes and clipping, KL, entropy, the PPO clip and response lengths. ``rlgrad.doctor.progress``
holds those of the reward's progress and the learning rate, ``rlgrad.doctor.gradient`` those that read rlgrad's
instruments. Each names the metrics it needs and its row of docs/doctor.md's table; its thresholds are
``Thresholds`` fields. A finding lists the findings its evidence explains (``Finding.explains``: an entropy penalty
explains the collapse it drives), which ``diagnose`` uses to put causes first."""

from __future__ import annotations

import statistics

from rlgrad.doctor.carriers import spike_carriers
from rlgrad.doctor.findings import (
    Finding,
    Thresholds,
    View,
    config_lr,
    entropy_cause,
    first_last,
    fmt,
    mean,
    reward_level,
    signature,
    train_series,
    update_size,
)

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
    ev = [f"step {s}: {_some(sorted(set(k)))} non-finite" for s, k in sorted(bad.items())[:5]]
    ev += [f"step {s}: the update skipped a non-finite gradient" for s in skipped_at[:5]]
    scores = sorted(s for s, keys in bad.items() if any(k.startswith(SCORE_KEYS) for k in keys))
    if scores and scores[0] == first:  # the reward was not finite before any loss was: the reward function
        return Finding(
            severity="critical", step=first, confidence=1.0, title="Non-finite reward",
            evidence=[f"step {first}: {_some([k for k in sorted(bad[first]) if k.startswith(SCORE_KEYS)])} "
                      "non-finite: the reward"] + ev,
            explanation=f"The batch's reward itself is not finite on {len(scores)} step(s), from step {first}, "
                        "before any loss or gradient: a reward function returning values so large that their sum "
                        "overflows (rlgrad refuses NaN and inf rewards, not huge finite ones, such as "
                        "-sys.float_info.max as a \"worst\" score). The loss and gradient of those steps follow "
                        "it; rlgrad skips such an update, other trainers may not. The learning rate is not the cause.",
            action="Bound the reward function's scores (a worst answer should score like the other wrong ones, "
                   "e.g. 0 or -1); resume from the last checkpoint before the first bad step.",
            explains=SKIPPED_UPDATES)
    return Finding(
        severity="critical", step=first, confidence=1.0, title="Non-finite loss or gradient",
        evidence=ev,
        explanation="A NaN or inf reached the loss or the gradient. Once the weights take one, every later step is "
                    "garbage; rlgrad skips such an update, other trainers may not.",
        action="Lower the learning rate, keep gradient clipping on, check bf16 overflow (logits, ratios) and "
               "the reward function for NaN; resume from the last checkpoint before the first bad step.",
        explains=SKIPPED_UPDATES if skipped_at else [])


SKIPPED_UPDATES = ["lr_too_small", "reward_plateau"]  # a skipped update moves nothing: its update_ratio is 0
SCORE_KEYS = ("critic/score/", "rollout/score/", "critic/rewards/")


def _some(keys: list[str], n: int = 4) -> str:
    """The first ``n`` of ``keys``, and how many more."""
    return ", ".join(keys[:n]) + (f" and {len(keys) - n} more" if len(keys) > n else "")


@signature("grad_norm_spike", "actor/grad_norm", trend="actor/grad_norm", min_points=lambda t: t.window + 1,
           reads="logs; per-sample analysis on the spike's step: who carries it",
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
    for s, _, _ in spikes[:5]:  # a spike on an analysis.per_sample step: who carries it
        ev += spike_carriers(v.run, s)
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
        action=_spike_clipping(v, max(g)) + "; look at the step's samples (rlgrad samples RUN --step N; with "
               "analysis.per_sample on that step, --by grad-norm ranks them by their gradient); lower the learning "
               "rate if spikes repeat.")


def _spike_clipping(v: View, top: float) -> str:
    """Gradient clipping as the run has it: a max_grad_norm above every logged norm clipped no step (a spike's
    unclipped step also inflates Adam's second moment, which then shrinks the following updates)."""
    clip, name = _max_grad_norm(v), v.setting("actor.max_grad_norm", short=True)
    if clip is not None and clip >= top:
        return (f"Turn gradient clipping on: {name} is {fmt(clip)}, above every logged norm, so no step was "
                "clipped (1.0 is verl's and rlgrad's default; it caps the step, not the logged norm)")
    return f"Keep {name} on (it caps the step, not the logged norm)"


def _max_grad_norm(v: View) -> float | None:
    c = v.cfg("actor.max_grad_norm", "actor.grad_clip", "actor_rollout_ref.actor.grad_clip",
              "actor_rollout_ref.actor.optim.clip_grad", "max_grad_norm")
    try:
        return float(c) if c is not None else None
    except (TypeError, ValueError):
        return None


# Optimizers whose update is (nearly) unchanged when every gradient is scaled by one factor: Adam's m/(√v+ε) and
# its kin normalise by the gradient's own running scale (RMSprop, Adagrad, Adafactor, LAMB), Lion takes its sign.
SCALE_FREE = ("adam", "adafactor", "rmsprop", "adagrad", "lamb", "lion", "lomo", "sophia")


def optimizer_of(v: View) -> tuple[str | None, str]:
    """The run's optimizer and where that is known from: its config (rlgrad's ``actor.optim.optimizer``, verl's
    ``actor_rollout_ref.actor.optim.optimizer``, TRL's ``optim``), else the trainer's only or default one."""
    name = v.cfg("actor.optim.optimizer", "actor_rollout_ref.actor.optim.optimizer", "optim")
    if name is not None:
        return str(name), "the run's config"
    if v.run.kind == "rlgrad" and v.cfg("actor.optim.lr") is not None:
        return "AdamW", "rlgrad's trainer uses AdamW"
    if v.run.kind == "verl" and v.cfg("actor_rollout_ref.actor.optim.lr") is not None:
        return "AdamW", "verl's default optim.optimizer"
    if v.run.kind == "trl":
        return "adamw_torch", "TRL's default optim; the run does not record its own"
    return None, ""


def optimizer_family(name: str | None) -> str:
    """``scale_free`` (Adam and kin: ``SCALE_FREE``), ``sgd`` or ``unknown``."""
    low = (name or "").lower()
    if "sgd" in low:
        return "sgd"
    return "scale_free" if any(k in low for k in SCALE_FREE) else "unknown"


def _clip_words(v: View, t: Thresholds, scale: float, cv: float, med: float) -> tuple[str, str, str, float]:
    """(severity, why, what to do, confidence) of clipping on every step, by what the optimizer makes of it."""
    name, known_from = optimizer_of(v)
    family = optimizer_family(name)
    clip_name = v.setting("actor.max_grad_norm", short=True)
    lr = v.cfg("actor.optim.lr", "actor_rollout_ref.actor.optim.lr", "learning_rate")
    eps = v.cfg("actor.optim.eps", "actor_rollout_ref.actor.optim.eps", "adam_epsilon") or 1e-8
    opt = f"{name} ({known_from})" if name else "an optimizer the run does not name"
    sgd = (f"For SGD (with or without momentum) the update is the gradient times the learning rate, so it shrinks "
           f"with the clip: an effective learning rate of about lr × {fmt(scale)}"
           + (f" = {fmt(float(lr) * scale)} (lr {fmt(float(lr))})" if lr else "") + ".")
    adam = (f"For Adam-family optimizers the update is m/(√v+ε): one factor on every gradient scales m and √v alike, "
            f"so the update is unchanged up to ε (ε = {fmt(float(eps))}: it matters only when the clipped gradient's "
            "entries, about max_grad_norm/√(number of weights), come near it). The learning rate, not the clip, "
            "still sets the step size.")
    varies = (f" But the clip factor varies a lot from step to step (std/mean {fmt(cv)}): every clipped gradient has "
              "the same norm, so Adam's moments weigh each step alike, and steps whose raw gradient was large count "
              "less than unclipped.") if cv > t.clip_factor_cv else ""
    base = (f"The logged grad_norm is the norm before clipping; here every step is clipped, by a factor of about "
            f"{fmt(scale)}. The optimizer is {opt}. ")
    if family == "scale_free":
        return ("warn" if varies else "info", base + adam + varies + " What clipping every step removes is the "
                "gradient's size as a signal (a spike is capped like any step).",
                f"Nothing to fix for the learning speed: do not raise the learning rate to make up for the clip. To "
                f"have the clip catch only spikes, raise {clip_name} to about the typical gradient norm "
                f"({fmt(med)}).", 0.8 if known_from == "the run's config" or v.run.kind == "rlgrad" else 0.6)
    if family == "sgd":
        return ("warn", base + sgd + " The clip, not the learning rate, sets the step size.",
                f"Raise {clip_name} to about the typical gradient norm ({fmt(med)}) so it only catches spikes, or "
                f"keep it and raise the learning rate about {fmt(1 / scale)}-fold knowingly.", 0.9)
    return ("warn", base + sgd + " " + adam + varies,
            f"Check which optimizer the run uses. SGD: raise {clip_name} to about {fmt(med)} (or the learning "
            "rate); Adam-family: nothing to fix for the learning speed.", 0.5)


@signature("clip_every_step", "actor/grad_norm",
           reads="logs + config (the optimizer)",
           fires="grad_norm > `max_grad_norm` on ≥ {clip_steps_frac:.0%} of steps; says what that does to the update "
                 "by the optimizer: SGD an effective lr of lr × the clip factor (warn), Adam-family nearly nothing "
                 "(info; warn when the factor's std/mean > {clip_factor_cv:g})")
def _clip_every_step(v: View, t: Thresholds) -> Finding | None:
    clip = _max_grad_norm(v)
    steps, g = v.series("actor/grad_norm")
    if clip is None or clip <= 0 or len(g) < 2:
        return None
    over = [(s, x) for s, x in zip(steps, g) if x > clip]
    if len(over) / len(g) < t.clip_steps_frac:
        return None
    factors = [clip / x for _, x in over]
    scale, med = statistics.median(factors), statistics.median(g)
    cv = statistics.pstdev(factors) / mean(factors)
    severity, why, action, confidence = _clip_words(v, t, scale, cv, med)
    return Finding(
        severity=severity, step=over[0][0], confidence=confidence,
        title="Gradient clipping on (nearly) every step",
        evidence=[f"max_grad_norm {fmt(clip)}; {v.name('actor/grad_norm')} above it on {len(over)} of {len(g)} steps "
                  f"(median {fmt(med)}): clip factor median {fmt(scale)}, std/mean {fmt(cv)}"],
        explanation=why, action=action)


@signature("kl_blowup", "actor/kl_loss|actor/ppo_kl", trend="actor/kl_loss|actor/ppo_kl", min_points=2,
           reads="logs (+ config)",
           fires="the recent KL loss > {kl_high:g} (critical) or > {kl_growth:g}× its start and > {kl_floor:g}; "
                 "blames the learning rate only at an update size > {update_high:g}, else the KL term")
def _kl(v: View, t: Thresholds) -> Finding | None:
    name = "actor/kl_loss" if v.has("actor/kl_loss") else "actor/ppo_kl"
    steps, k = v.series(name)
    a, b = first_last([abs(x) for x in k], t.window)
    if b > t.kl_high:
        severity = "critical"
    elif b > t.kl_floor and b > t.kl_growth * max(a, 1e-12):
        severity = "warn"
    else:
        return None
    first = next(s for s, x in zip(steps, k) if abs(x) > max(t.kl_floor, min(b, t.kl_high)) / 2)
    why, action, cause_ev = _kl_cause(v, t, name)
    size = update_size(v)
    return Finding(
        severity=severity, step=first, confidence=0.8,
        title="The policy runs away from the reference (KL blow-up)",
        evidence=[f"{v.name(name)}: {fmt(a)} (first steps) → {fmt(b)} (last steps)"] + cause_ev,
        explanation="The KL to the reference grows without bound. " + why, action=action,
        explains=["regularizer_dominates"] if size is not None and size > t.update_high else [])


def _kl_cause(v: View, t: Thresholds, name: str) -> tuple[str, str, list[str]]:
    """Which cause of a KL blow-up the run's metrics support, of those they can rule in or out: steps too large
    (the update size ``actor/update_ratio``), or, at a normal update size, the KL term itself (its coefficient and
    estimator; for ``actor/ppo_kl``, the optimizer steps per batch). (why, what to do, evidence)."""
    size, lr = update_size(v), config_lr(v)
    coef = v.cfg("actor.kl_loss_coef", "actor_rollout_ref.actor.kl_loss_coef", "beta")
    kind = v.cfg("actor.kl_loss_type", "actor_rollout_ref.actor.kl_loss_type")
    loss = name == "actor/kl_loss"
    ev = ([f"actor/update_ratio {fmt(size)} (median)"] if size is not None else []) + (
        [f"kl_loss_coef {coef}" + (f", kl_loss_type {kind}" if kind else "")] if loss and coef is not None else [])
    now = f" (now {fmt(lr)})" if lr else ""
    kl_coef = v.setting("actor.kl_loss_coef", short=True)
    estimator = "" if kind == "low_var_kl" or v.run.kind == "trl" else \
        f" or use {v.setting('actor.kl_loss_type=low_var_kl', short=True)} (bounded: verl clamps it)"
    if size is not None and size > t.update_high:
        return (f"The updates are too large (each moves the weights by {fmt(size)} of their norm, median; typical "
                "fine-tuning steps: 1e-4 to 1e-3): the policy leaves the reference faster than the KL term pulls it "
                "back, whose coefficient is not the cause." if loss else "The updates are too large (each moves the "
                f"weights by {fmt(size)} of their norm, median; typical: 1e-4 to 1e-3).",
                f"Lower the learning rate{now} about {size / (t.update_high / 10):.2g}-fold, toward an "
                "actor/update_ratio of about 1e-3, and keep gradient clipping on.", ev)
    if size is not None and loss:
        return (f"The update size is normal ({fmt(size)} of the weights' norm, median): not the learning rate. The "
                "KL term's own gradient is unstable: a large coefficient, or an estimator that grows fast in the "
                "log-ratio (k3 grows exponentially, mse quadratically).",
                f"Lower {kl_coef}{estimator}; check the run's samples for degenerate text.", ev)
    if size is not None:
        return (f"The update size is normal ({fmt(size)} of the weights' norm, median): the policy moves far within "
                "one batch's optimizer steps (ppo_epochs, mini-batches).",
                f"Lower {v.setting('actor.ppo_epochs')} or the number of mini-batches per batch (a larger "
                f"{v.setting('actor.ppo_mini_batch_size', short=True)}); check the run's samples for degenerate "
                "text.", ev)
    return ("The updates are too large for the KL term to hold the policy, or the KL coefficient is large enough "
            "that its own gradient is unstable (the k3 estimate grows exponentially in the log-ratio); the run "
            "logs no update size (actor/update_ratio) to tell which.",
            f"Lower the learning rate{now} or the clip range; for an exploding KL term lower {kl_coef}"
            f"{estimator}; check the run's samples for degenerate text.", ev)


@signature("entropy_collapse", "actor/entropy", trend="actor/entropy", min_points=4,
           reads="logs (+ config)",
           fires="the recent entropy < {entropy_drop:.0%} of its start; its advice by the cause the run supports: a "
                 "negative entropy_coeff, an update size > {update_high:g}, else the sampling")
def _entropy(v: View, t: Thresholds) -> Finding | None:
    steps, e = v.series("actor/entropy")
    a, b = first_last(e, t.window)
    if not (a > 0 and b < t.entropy_drop * a):
        return None
    first = next(s for s, x in zip(steps, e) if x < 2 * t.entropy_drop * a)
    why, action, cause_ev = entropy_cause(v, t)
    return Finding(
        severity="warn", step=first, confidence=0.8, title="Entropy collapse",
        evidence=[f"{v.name('actor/entropy')} {fmt(a)} (first steps) → {fmt(b)} (last steps)"] + cause_ev,
        explanation="The policy became (nearly) deterministic: groups of samples now agree, their rewards have no "
                    "variance, and GRPO's advantage — and with it the gradient — vanishes. " + why,
        action=action)


@signature("clipfrac_saturated", "actor/pg_clipfrac",
           reads="logs (+ config)",
           fires="the recent clip fraction > {clipfrac_high:g}; names the cause the run supports: the update size, "
                 "several optimizer steps per batch (with a narrow clip range), or (one step a batch) old log-probs "
                 "not the sampler's")
def _clipfrac_saturated(v: View, t: Thresholds) -> Finding | None:
    steps, c = v.series("actor/pg_clipfrac")
    _, b = first_last(c, t.window) if c else (0.0, 0.0)
    if b > t.clipfrac_high:
        first = next(s for s, x in zip(steps, c) if x > t.clipfrac_high)
        why, action, cause_ev = _clip_cause(v, t)
        return Finding(
            severity="warn", step=first, confidence=0.7, title="The PPO clip is saturated",
            evidence=[f"{v.name('actor/pg_clipfrac')} {fmt(b)} over the last steps (healthy: roughly 0.1-0.4)"]
                     + cause_ev,
            explanation=f"{fmt(100 * b)}% of the tokens hit the clip: the policy moved far from the one that "
                        "sampled the batch during the update, and a clipped token contributes no gradient. " + why,
            action=action)
    return None


def optimizer_steps_per_batch(v: View) -> int | None:
    """Optimizer steps per batch of rollouts: epochs (``ppo_epochs``; TRL's ``num_iterations``) × mini-batches
    (``train_batch_size`` / ``ppo_mini_batch_size``); None when the run does not say."""
    epochs = v.cfg("actor.ppo_epochs", "actor_rollout_ref.actor.ppo_epochs", "num_iterations")
    mini = v.cfg("actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size")
    batch = v.cfg("data.train_batch_size")
    if not isinstance(epochs, int) or isinstance(epochs, bool):
        return None
    if isinstance(mini, int) and isinstance(batch, int) and 0 < mini < batch:
        return epochs * -(-batch // mini)
    return epochs


NARROW_CLIP = 0.1  # a PPO clip range (either side) below this is narrow: verl's, TRL's and the PPO paper's is 0.2


def clip_range(v: View) -> float | None:
    """The narrower side of the PPO clip range the run sets (verl's clip_ratio_low/high, else its symmetric
    clip_ratio; TRL's epsilon/epsilon_high), or None when the run does not say."""
    sides = [v.cfg(*keys) for keys in (
        ("actor.clip_ratio_low", "actor_rollout_ref.actor.clip_ratio_low", "actor.clip_ratio",
         "actor_rollout_ref.actor.clip_ratio", "epsilon"),
        ("actor.clip_ratio_high", "actor_rollout_ref.actor.clip_ratio_high", "actor.clip_ratio",
         "actor_rollout_ref.actor.clip_ratio", "epsilon_high", "epsilon"))]
    sides = [x for x in sides if isinstance(x, int | float) and not isinstance(x, bool)]
    return min(sides) if sides else None


def _clip_cause(v: View, t: Thresholds) -> tuple[str, str, list[str]]:
    """Which cause of a saturated clip the run's metrics support: a narrow clip range under several optimizer
    steps per batch, steps too large (the update size), several optimizer steps per batch, or, with one step per
    batch (the ratio starts at 1), old log-probs that are not the sampling policy's. (why, what to do, evidence)."""
    size, lr, per_batch = update_size(v), config_lr(v), optimizer_steps_per_batch(v)
    ev = ([f"actor/update_ratio {fmt(size)} (median)"] if size is not None else []) + (
        [f"{per_batch} optimizer step(s) per batch"] if per_batch is not None else [])
    narrow = clip_range(v)
    # a narrow range first: set on purpose or by mistake, it saturates whatever the step size
    if per_batch is not None and per_batch > 1 and narrow is not None and narrow < NARROW_CLIP:
        return (f"Each batch takes {per_batch} optimizer steps and the clip range is narrow (±{fmt(narrow)}; the "
                "usual PPO/GRPO range is ±0.2): a few steps move many ratios past it.",
                f"Widen the clip range ({v.setting('actor.clip_ratio_low')} / "
                f"{v.setting('actor.clip_ratio_high', short=True)} toward 0.2), or take fewer optimizer steps per "
                f"batch (lower {v.setting('actor.ppo_epochs')}, or a larger "
                f"{v.setting('actor.ppo_mini_batch_size', short=True)}).",
                ev + [f"clip range ±{fmt(narrow)} (the narrower side)"])
    if size is not None and size > t.update_high:
        return (f"The updates are too large ({fmt(size)} of the weights' norm, median; typical: 1e-4 to 1e-3).",
                f"Lower the learning rate{f' (now {fmt(lr)})' if lr else ''} toward an actor/update_ratio of about "
                "1e-3.", ev)
    if per_batch is not None and per_batch > 1:
        return (f"Each batch takes {per_batch} optimizer steps: the later ones start far from the sampling policy.",
                f"Take fewer optimizer steps per batch (lower {v.setting('actor.ppo_epochs')}, or a larger "
                f"{v.setting('actor.ppo_mini_batch_size', short=True)}), or lower the learning rate.", ev)
    if per_batch == 1:
        return ("With one optimizer step per batch the ratio starts at 1 and the clip should rarely act: the old "
                "log-probs are probably not the sampling policy's (recomputed after an update, or a sampler whose "
                "numerics differ from the trainer's).",
                f"Check where old_log_probs come from ({v.setting('rollout.recompute_log_probs')}, the rollout "
                "engine's dtype) "
                "before changing the learning rate.", ev)
    return ("", "Lower the learning rate or the number of optimizer steps per batch (ppo_epochs, smaller "
            "ppo_mini_batch_size means more steps).", ev)


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


@signature("length_runaway", "response_length/mean", trend="response_length/clip_ratio", min_points=2,
           reads="logs",
           fires="the share of responses cut at the length limit rising from < {length_clip_high:.0%} (its first "
                 "steps) to > {length_clip_high:.0%} (its last)")
def _length_runaway(v: View, t: Thresholds) -> Finding | None:
    _, m = v.series("response_length/mean")
    cs, c = train_series(v, "response_length/clip_ratio")
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
        explains=["length_truncated", "reward_plateau", "reward_collapse", "val_falls", "zero_variance_groups"])


TRUNCATED_FROM = 3  # length_truncated judges the median share of cut responses from this many steps on


def truncated_since(c: list[float], t: Thresholds) -> int | None:
    """The index from which the median share of cut responses over the last ``window`` steps (all of them while
    fewer) has stayed above ``truncation_high``, at least ``TRUNCATED_FROM`` steps in; None if it is not above now. A
    median over a window changes slowly: one step's dip neither ends the finding nor moves its first step."""
    since = None
    for n in range(TRUNCATED_FROM, len(c) + 1):
        held = statistics.median(c[max(0, n - t.window):n]) > t.truncation_high
        since = (since if since is not None else n - 1) if held else None
    if since is None:
        return None
    start = max(0, since - t.window + 1)  # the first step of the stretch: the first cut one of its first window
    return next((i for i in range(start, since + 1) if c[i] > t.truncation_high), since)


@signature("length_truncated", "response_length/clip_ratio", trend="response_length/clip_ratio",
           min_points=TRUNCATED_FROM, reads="logs (+ config)",
           fires="the median share of responses cut at the length limit over the last {window} steps > "
                 "{truncation_high:.0%}")
def _length_truncated(v: View, t: Thresholds) -> Finding | None:
    cs, c = train_series(v, "response_length/clip_ratio")
    i = truncated_since(c, t)
    if i is None:
        return None
    recent = c[-t.window:]
    limit = v.cfg("rollout.response_length", "max_completion_length")
    _, m = train_series(v, "response_length/mean")
    level, where = reward_level(v)
    why = ("A response cut at the limit never reaches its end (no stop token): an answer longer than the limit "
           "cannot be written, cut responses of a group tend to get the same reward (no signal), and the run cannot "
           "learn what lies past the limit. This is the limit, not a trend: it holds from step to step.")
    explains = ["unlearnable_reward", "zero_variance_groups", "reward_plateau", "lr_too_small", "constant_component",
                "reward_collapse", "val_falls", "format_over_correct", "regularizer_dominates", "component_dominates"]
    if level is not None and level <= t.hard_level:  # nothing right either: the limit or a model that never stops?
        why += (f" But nearly every answer is also wrong ({where} {fmt(level)}): a model that never stops (untrained, "
                "or one that lost its stop token) looks the same as a limit too short; read a few responses "
                "(rlgrad samples RUN) before raising the limit.")
        explains = []
    elif level is not None and level >= t.easy_level:  # cut, yet paid in full: the cut costs this reward nothing
        why += f" Cut or not, nearly every response gets the full reward ({where} {fmt(level)})."
        explains = []
    return Finding(
        severity="warn", step=cs[i], confidence=0.9,
        title="Most responses are cut at the length limit, step after step",
        evidence=[f"{v.name('response_length/clip_ratio')} {fmt(min(recent))}-{fmt(max(recent))} over the last "
                  f"{len(recent)} steps (median {fmt(statistics.median(recent))}), above "
                  f"{fmt(t.truncation_high)} since step {cs[i]}"]
                 + ([f"{v.name('response_length/mean')} {fmt(statistics.median(m[-t.window:]))} (median)"
                     + (f" against a limit of {limit}" if limit is not None else "")] if m else []),
        explanation=why,
        action="Raise the response length limit" + (f" ({v.setting('rollout.response_length')}, now {limit})"
                                                    if limit is not None else "") + " to fit a whole answer; if the "
               f"answers ramble, add an overlong penalty ({v.setting('reward.overlong_buffer')}, DAPO's soft length "
               "penalty).",
        explains=explains)


@signature("length_collapse", "response_length/mean", trend="response_length/mean", min_points=4,
           reads="logs",
           fires="the recent mean length < {length_drop:.0%} of its start")
def _length_collapse(v: View, t: Thresholds) -> Finding | None:
    steps, m = v.series("response_length/mean")
    a, b = first_last(m, t.window)
    if not (a > 0 and b < t.length_drop * a):
        return None
    first = next(s for s, x in zip(steps, m) if x < 2 * t.length_drop * a)
    return Finding(
        severity="warn", step=first, confidence=0.6, title="Responses collapse in length",
        evidence=[f"{v.name('response_length/mean')} {fmt(a)} → {fmt(b)}"] + _overlong_penalty(v),
        explanation="The policy learned to answer shorter and shorter, often because a length or format "
                    "reward pays for it, or because short answers avoid penalties.",
        action="Check the reward weights (a length component, the overlong penalty) and what the model "
               "writes (rlgrad samples RUN).")


def _overlong_penalty(v: View) -> list[str]:
    """DAPO's overlong penalty, when the run has one: from which length it penalises (a buffer covering most of the
    budget pays for shortness itself). Evidence only: on the recorded run (length_squeezed) the default buffer
    did not stop the collapse, so the doctor does not advise a buffer size."""
    on = v.cfg("reward.overlong_buffer.enable", "reward_model.overlong_buffer.enable",
               "reward_model.reward_kwargs.overlong_buffer_cfg.enable")
    buffer = v.cfg("reward.overlong_buffer.len", "reward_model.overlong_buffer.len",
                   "reward_model.reward_kwargs.overlong_buffer_cfg.len")
    limit = v.cfg("rollout.response_length", "data.max_response_length")
    if on is not True or not isinstance(buffer, int) or not isinstance(limit, int):
        return []
    return [f"reward.overlong_buffer: len {buffer} of a {limit}-token limit, so every response longer than "
            f"{max(limit - buffer, 0)} token(s) is penalised"]
