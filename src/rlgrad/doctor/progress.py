"""``rlgrad doctor``'s signatures of progress, one function each: is the run learning? The update's size
against the weights (``actor/update_ratio``) and the learning rate, the reward's collapse or plateau, groups
without signal, rewards that cannot teach or pay for the wrong thing, validation falling."""

from __future__ import annotations

import math
import statistics

from rlgrad.doctor.findings import (
    Finding,
    Thresholds,
    View,
    config_lr,
    correctness_silent,
    dead_steps,
    entropy_coef,
    first_last,
    flat_reward,
    fmt,
    mean,
    reward_level,
    reward_weights,
    signature,
    task_gradient_rows,
    train_series,
    unpaid_correctness,
    update_size,
    val_size,
    validation_change,
)
from rlgrad.doctor.gradient import shrink_weight
from rlgrad.logging.reward_signal import MIN_STEPS, correctness_component, reward_problems
from rlgrad.metrics import key
from rlgrad.metrics.judge import Z, share_error, windows
from rlgrad.runfiles import CHECKPOINT_PREFIX, checkpoint_due, checkpoint_steps


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
    steps, u = train_series(v, "actor/update_ratio")
    first = u[:t.window]
    if not first or statistics.median(first) <= t.update_high:
        return None
    med = statistics.median(first)
    s0 = next(s for s, x in zip(steps, u) if x > t.update_high)
    lr = config_lr(v)
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
               f"fold, to bring actor/update_ratio to about 1e-3, and warm it up "
               f"({v.setting('actor.optim.lr_warmup_steps')}).",
        explains=["reward_collapse", "val_falls", "grad_norm_spike", "kl_blowup", "clipfrac_saturated",
                  "entropy_collapse", "zero_variance_groups", "component_dominates", "component_takes_over",
                  "format_over_correct", "val_falls_train_rises", "nonfinite_steps",
                  "length_collapse", "length_runaway", "dormant_growing"])


def _room(r: list[float], start: float) -> float:
    """How far the reward could still rise from ``start``: to 1 for a reward that stays in [0, 1] (a share of right
    answers, a weighted sum of such), else to the best the run reached."""
    top = 1.0 if all(0.0 <= x <= 1.0 for x in r) else max(r)
    return top - start


@signature("lr_too_small", "actor/update_ratio|actor/lr|critic/score/mean",
           reads="logs (+ config)",
           fires="the update size ‖Δθ‖/‖θ‖ (`actor/update_ratio`) < {update_low:g} over the last {window} steps while "
                 "the reward gained < {progress_low:.0%} of its room to its best, or no more than {gain_z:g} "
                 "standard errors (from its step-to-step noise: a gain within noise); a run without "
                 "`actor/update_ratio` (last resort): lr ≤ {lr_low:g} with a flat reward, or ≤ {lr_very_low:g}")
def _lr_small(v: View, t: Thresholds) -> Finding | None:
    return _small_updates(v, t) if v.has("actor/update_ratio") else _small_lr(v, t)


def _small_updates(v: View, t: Thresholds) -> Finding | None:
    """The measured update size and the reward's progress (independent of the model's size and the optimizer)."""
    steps, u = train_series(v, "actor/update_ratio")
    _, r = train_series(v, "critic/score/mean")
    if len(u) < t.window or len(r) < t.window:
        return None
    recent = statistics.median(u[-t.window:])
    a, b = first_last(r, t.window)
    room = _room(r, a)
    # the rise's standard error: the step-to-step noise of a mean of the first and of the last window's steps
    k = max(1, min(t.window, len(r) // 2))
    noise = step_noise(r) * math.sqrt(2 / k)
    if recent >= t.update_low or (room > 0 and b - a >= t.progress_low * room and b - a > t.gain_z * noise):
        return None
    lr = config_lr(v)
    gained = f"{fmt(100 * (b - a) / room)}% of its room to {fmt(a + room)}" if room > 0 else "nothing"
    if room > 0 and b - a >= t.progress_low * room:
        gained += f", within noise (a rise of {fmt(b - a)} against a standard error of {fmt(noise)})"
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
    lr = config_lr(v)
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
    """Why groups agree (correctness not in the reward; too easy, too hard, or split) from the reward's weights and
    level, what to do, and the evidence."""
    unpaid = unpaid_correctness(v)
    if unpaid is not None:  # correctness varies or not, the reward is the other components: its level says nothing
        weights, lc = reward_weights(v), v.label(unpaid)
        paid = ", ".join(f"'{v.label(c)}'" for c, w in sorted(weights.items()) if w != 0)
        return (f"'{lc}' has weight 0 ({v.setting(f'reward.weights.{unpaid}')}): the reward is {paid} alone, and the "
                f"samples of a group get it alike; right and wrong answers are paid the same, so neither the "
                f"group size nor the prompts' difficulty is the cause",
                f"Give '{lc}' a positive weight ({v.setting(f'reward.weights.{unpaid}')}, now 0).",
                [f"{v.setting(f'reward.weights.{c}')} = {w:g}" for c, w in sorted(weights.items())])
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
            f"Sample more per prompt ({v.setting('rollout.n')}) or move the prompts' difficulty toward the model's "
            "level; drop the groups with no variance (rollout filter, DAPO dynamic sampling).", ev)


@signature("zero_variance_groups",
           "critic/advantages/max|critic/score/frac_zero_std|critic/score/std|rollout/filter_zero_count"
           "|grad_norm/all/task",
           reads="logs (+ config)",
           fires="every advantage 0 (or the reward's std over the batch, or every bucket's task gradient), or > 95% of "
                 "the groups with one reward for all their samples (critical); > {zero_var_frac:.0%} of them (TRL's "
                 "frac_reward_zero_std, rlgrad's filter count; the median of the last {window} steps, from the third "
                 "step unless every group agreed); says too easy (a [0, 1] reward ≥ {easy_level:g}) or too hard (≤ "
                 "{hard_level:g})")
def _zero_var(v: View, t: Thresholds) -> Finding | None:
    dead, of, how = dead_steps(v)
    zs, frac, where = _zero_var_fraction(v)
    # the median of the last steps: two noisy early steps of a healthy run (13 and 14 of 16 groups) decide nothing,
    # nor does one alone (a healthy run's first batch had 13 of 16 groups, its next 8): fewer than MIN_STEPS steps
    # decide only where every group of each agreed (no signal at all, which no noise makes)
    recent = statistics.median(frac[-t.window:]) if frac else 0.0
    if dead and len(dead) >= max(1, of // 2):
        ev, s0 = [f"{how} on {len(dead)} of {of} steps"], dead[0]
    elif recent > t.zero_var_frac and (len(frac) >= MIN_STEPS or min(frac) >= 1.0):
        s0 = next(s for s, x in zip(zs, frac) if x > t.zero_var_frac)
        ev = [f"{fmt(100 * recent)}% of the prompt groups per step have one reward for all their samples ({where}; "
              f"median of the last {min(len(frac), t.window)} steps)"]
    else:
        return None
    severity = "critical" if dead and len(dead) >= max(1, of // 2) or recent > 0.95 else "warn"
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


def step_noise(vals: list[float]) -> float:
    """A series' step-to-step noise as a standard deviation: the median |Δ| between consecutive values / 0.954 (white
    noise of std σ has a median |Δ| of 0.954σ). A fall's few large steps barely move a median."""
    d = [abs(b - a) for a, b in zip(vals, vals[1:])]
    return statistics.median(d) / 0.954 if d else 0.0


def collapse_at(r: list[float], t: Thresholds, first_se: float = 0.0) -> tuple[int, float, float] | None:
    """The first window of ``collapse_steps`` steps in a row whose reward fell from the run's early level (its first
    step, sampled before any update) by more than ``reward_drop`` of that level, each step at least half that far
    down, and by more than ``collapse_z`` times the noise of that fall: the step-to-step noise of the steps up to
    the window's end, and ``first_se``, the standard error of the first step's mean itself (a rare large reward
    can lift one step's mean far above the policy's level): (its index, the window's mean, the fall in noise
    units). Only what precedes a window's end decides it, so a collapse found in a run is found in every longer
    prefix of it."""
    k, early = t.collapse_steps, r[0] if r else 0.0
    need = max(t.reward_drop * abs(early), t.plateau_delta)
    for i in range(1, len(r) - k + 1):
        w = r[i:i + k]
        fall = early - mean(w)
        if fall <= need or max(w) >= early - need / 2:
            continue
        noise = max(step_noise(r[:i + k]), t.plateau_delta / 2)
        z = fall / math.hypot(noise * math.sqrt(1 + 1 / k), first_se)
        if z > t.collapse_z:
            return i, mean(w), z
    return None


def first_step_error(v: View, step: int) -> float:
    """An upper bound on the standard error of ``step``'s mean reward μ: a reward within [min, max] (its
    ``critic/score/max|min``) has a variance of at most (max - μ)(μ - min) (the Bhatia-Davis inequality: a rare
    large reward, a jackpot, makes it large), over the batch's samples (``data.train_batch_size`` ×
    ``rollout.n``); 0 when the run logs neither."""
    m = v.run.rows.get(step, {})
    top, low, mid = m.get("critic/score/max"), m.get("critic/score/min"), m.get("critic/score/mean")
    prompts, n = v.cfg("data.train_batch_size"), v.cfg("rollout.n", "actor_rollout_ref.rollout.n")
    if None in (top, low, mid) or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                          for x in (prompts, n)):
        return 0.0
    return math.sqrt(max(0.0, (top - mid) * (mid - low)) / (prompts * n))


def _val_after(v: View, step: int) -> tuple[float | None, list[tuple[int, float]]]:
    """val/accuracy before training (step 0) and at the validations from ``step`` on."""
    steps, acc = v.series("val/accuracy")
    before = acc[0] if steps and steps[0] == 0 else None
    return before, [(s, a) for s, a in zip(steps, acc) if s >= step]


@signature("reward_collapse", "critic/score/mean", trend="critic/score/mean",
           min_points=lambda t: t.collapse_steps + 1,
           reads="logs",
           fires="the reward of {collapse_steps} steps in a row below its first step's (the policy before any update) "
                 "by > {reward_drop:.0%} of it and > {collapse_z:g}× the noise of that fall (the step-to-step noise, "
                 "and the first step's standard error bounded from its max and min: a rare jackpot is not a "
                 "level; critical; a warning while validation holds)")
def _reward_collapse(v: View, t: Thresholds) -> Finding | None:
    steps, r = train_series(v, "critic/score/mean")
    hit = collapse_at(r, t, first_step_error(v, steps[0]) if steps else 0.0)
    if hit is None:
        return None
    i, low, z = hit
    name, k = v.name("critic/score/mean"), t.collapse_steps
    ev = [f"{name} {fmt(r[0])} at step {steps[0]} (the policy before any update) → {fmt(low)} over steps "
          f"{steps[i]}-{steps[i + k - 1]}: {fmt(100 * (r[0] - low) / abs(r[0]))}% below, {z:.1f}× the reward's "
          "step-to-step noise"]
    if len(r) > i + k:
        ev.append(f"{name} {fmt(mean(r[-k:]))} over the last {k} steps")
    severity, why = "critical", "The policy got worse at what it is rewarded for than it was before any update."
    before, vals = _val_after(v, steps[i])
    if before is not None and vals:
        ev.append(f"val/accuracy {fmt(before)} before training → {fmt(vals[0][1])} at step {vals[0][0]}")
        if all(a >= before * (1 - t.reward_drop / 2) for _, a in vals):
            severity = "warn"
            why += " Validation has held so far, so it may still be the training batches' prompts."
    cause, cause_ev, fix = collapse_cause(v, t, steps[i + k - 1])
    return Finding(
        severity=severity, step=steps[i], confidence=0.8 if severity == "critical" else 0.6,
        title="The reward collapsed", evidence=ev + cause_ev, explanation=why + " " + cause,
        action=fix + "; " + _restart_from(v, steps[i]) + ".",
        explains=["zero_variance_groups", "component_dominates", "component_takes_over", "format_over_correct",
                  "reward_plateau", "val_falls_train_rises", "length_runaway", "length_collapse"])


def entropy_term_dominates(v: View, t: Thresholds, until: int) -> tuple[int, int]:
    """On how many of the analysis steps up to ``until`` with a task gradient the entropy term's gradient
    outweighed the task's, of how many (``grad_norm/all/entropy`` > ``reg_ratio`` × ``grad_norm/all/task``)."""
    rows = [m for _, m in task_gradient_rows(v, until)[0]]
    hits = [m for m in rows if m.get("grad_norm/all/entropy", 0.0) > t.reg_ratio * m["grad_norm/all/task"]]
    return len(hits), len(rows)


# collapse_cause's advice when neither the update size nor an entropy term explains a collapse
NO_KNOWN_CAUSE = "Look for the cause in the samples and the reward before changing the learning rate"


def collapse_cause(v: View, t: Thresholds, until: int) -> tuple[str, list[str], str]:
    """What the run's own metrics say drove a collapse by step ``until``, of the causes they can rule in or out:
    an entropy penalty (a negative coefficient with its gradient above the task's, or the entropy falling), an
    entropy bonus (positive, its gradient above the task's, the entropy rising), or steps too large (the update
    size, or the entropy rising with no bonus: drift toward noise). (why, evidence, what to do)."""
    coef, lr = entropy_coef(v), config_lr(v)
    dom, of = entropy_term_dominates(v, t, until)
    _, e = train_series(v, "actor/entropy")
    e = [x for s, x in zip(train_series(v, "actor/entropy")[0], e) if s <= until]
    size = update_size(v, until)
    big = size is not None and size > t.update_high
    ev = ([f"the entropy term's gradient above the task's on {dom} of {of} analysis steps"] if dom else []) + (
        [f"{v.name('actor/entropy')} {fmt(e[0])} → {fmt(e[-1])}"] if len(e) >= 2 else []) + (
        [f"actor/update_ratio {fmt(size)} (median)"] if size is not None else [])
    fell, rose = len(e) >= 2 and e[-1] < e[0] / 2, len(e) >= 2 and e[-1] > 2 * e[0]
    lr_words = "the learning rate" + (f" (now {fmt(lr)})" if lr else "")
    if coef is not None and coef < 0 and (2 * dom >= max(of, 1) or fell):
        return (f"The entropy penalty (entropy_coeff {coef:g}) drove it: its gradient lowers the entropy, and the "
                "groups' answers agree" + ("" if big else ", while the update size is not too large: the learning "
                "rate is not the cause") + ".", ev,
                f"Set {v.setting('actor.entropy_coeff')} to 0 (or a small positive bonus): bring it toward 0, do "
                "not lower it")
    if coef is not None and coef > 0 and 2 * dom >= max(of, 1) and not fell:
        return (f"The entropy bonus (entropy_coeff {coef:g}) drove it: its gradient outweighs the task's and "
                "pushes the policy toward randomness.", ev, f"Lower {v.setting('actor.entropy_coeff')} toward 0")
    if big or (rose and not (coef and coef > 0)):
        return ("The steps are too large" + (" (the update size)" if big else " (the entropy rose with it: the "
                "model drifts toward noise)") + ".", ev, f"Lower {lr_words} and keep gradient clipping on")
    if size is not None:
        return ("Neither the update size nor an entropy term explains it: read what the model writes (rlgrad "
                "samples RUN) and the reward function.", ev,
                NO_KNOWN_CAUSE)
    return ("The run logs no update size (actor/update_ratio) and no entropy term that would explain it: too large "
            "steps are the usual cause.", ev, f"Lower {lr_words} and keep gradient clipping on")


def held_checkpoints(v: View) -> list[int] | None:
    """The steps whose checkpoint the run holds, oldest first: those on disk for an rlgrad run directory (a
    checkpoint ``trainer.max_ckpt_to_keep`` deleted is not offered); else the steps ``trainer.save_freq`` saved up to
    the last logged one, the newest ``trainer.max_ckpt_to_keep`` of them; None when the run does not say."""
    if v.run.run_dir is not None and v.run.kind == "rlgrad":
        return checkpoint_steps(v.run.run_dir)
    freq, keep = v.cfg("trainer.save_freq"), v.cfg("trainer.max_ckpt_to_keep")
    if not isinstance(freq, int) or not v.steps:
        return None
    last = max(v.steps)
    held = [s for s in range(1, last + 1) if checkpoint_due(s, freq, s == last)]
    return held[-keep:] if isinstance(keep, int) and keep > 0 else held


def _restart_from(v: View, step: int) -> str:
    """Where to start again from before ``step``: a checkpoint the run holds before it, else the initial weights."""
    held = held_checkpoints(v)
    if held is None:
        return f"restart from a checkpoint before step {step}, or from the initial weights"
    before = [s for s in held if s < step]
    if before:
        return f"resume from the last checkpoint before step {step} ({CHECKPOINT_PREFIX}{before[-1]})"
    return f"restart from the initial weights (the run holds no checkpoint before step {step})"


@signature("reward_plateau", "critic/score/mean", trend="critic/score/mean", min_points=lambda t: 2 * t.window,
           reads="logs (+ config)",
           fires="the reward's change from the first to the last {window} steps < {plateau_delta:g} and within twice "
                 "its standard error, while validation accuracy does not rise beyond its noise (info)")
def _plateau(v: View, t: Thresholds) -> Finding | None:
    _, r = v.series("critic/score/mean")
    change = windows(r, t.window)
    if abs(change.after - change.before) >= t.plateau_delta or change.direction:  # a fall is reward_collapse's
        return None
    val = validation_change(v)
    if val is not None and val.direction > 0:  # the policy still learns: a flat training reward is not the news
        return None
    ev = [f"{v.name('critic/score/mean')} {fmt(change.before)} (first {change.window} steps) → {fmt(change.after)} "
          f"(last {change.window} steps): {change.verb} (±{fmt(Z * change.noise)})"]
    if val is not None:
        ev.append(f"val/accuracy {fmt(val.before)} → {fmt(val.after)}: {val.verb}")
    return Finding(
        severity="info", step=None, confidence=0.5, title="Reward plateau", evidence=ev,
        explanation="The mean reward did not rise between the first and the last steps, nor did validation accuracy.",
        action="See the other findings for why; a plateau at the reward's maximum is success.")


def _reward_problem(v: View, pid: str) -> Finding | None:
    """The run's ``reward_problems`` of kind ``pid`` as a finding, in the words the trainer prints it live
    (``RewardProblem``: its severity, title, cause, advice and evidence)."""
    weights = v.cfg("reward.weights") or None  # empty: the task's defaults, unknown here
    # reward_problems reads step 0 and the first MIN_STEPS steps with rewards: only those, not a long history
    first = sorted({s for k in v.keys("reward/") for s in v.series(k)[0] if s >= 1})[:MIN_STEPS]
    rows = {s: v.run.rows[s] for s in [0, *first] if s in v.run.rows}
    problems = [p for p in reward_problems(rows, dict(weights) if weights else None) if p.id == pid]
    if not problems:
        return None
    p = problems[0]
    return Finding(severity=p.severity, step=p.step, confidence=0.9, title=p.title, evidence=list(p.evidence),
                   explanation=p.cause, action=p.advice)


@signature("unlearnable_reward", "reward/{component}/mean",
           reads="logs",
           fires=f"every group with one correctness value on each of the first {MIN_STEPS} steps (critical; names "
                 "the likely cause: extraction, format, too hard, too easy)")
def _unlearnable(v: View, t: Thresholds) -> Finding | None:
    return _reward_problem(v, "unlearnable_reward")


@signature("constant_component", "reward/{component}/std",
           reads="logs",
           fires=f"a weighted component constant over the batch on each of the first {MIN_STEPS} steps (info)")
def _constant_component(v: View, t: Thresholds) -> Finding | None:
    return _reward_problem(v, "constant_component")


@signature("inverted_reward", "reward/{component}/mean",
           reads="logs + config",
           fires="the correctness-like component's weight is negative (reward.weights): the run is paid for wrong "
                 "answers (critical)")
def _inverted(v: View, t: Thresholds) -> Finding | None:
    weights = reward_weights(v)
    correct = correctness_component(weights)
    if correct is None or weights[correct] >= 0:
        return None
    steps, c = train_series(v, key("reward/{component}/mean", component=correct))
    _, total = train_series(v, "critic/score/mean")
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
        explains=["reward_collapse", "val_falls", "val_falls_train_rises", "format_over_correct", "component_dominates",
                  "component_takes_over", "entropy_collapse", "unlearnable_reward", "zero_variance_groups",
                  "reward_plateau", "length_collapse"])


COMPONENT_STEPS = 4  # format_over_correct: the fewest steps of the reward and of each component's mean it compares


@signature("format_over_correct", "reward/{component}/mean", trend="critic/score/mean", min_points=COMPONENT_STEPS,
           reads="logs",
           fires="a non-correctness reward rising by > {component_rise:g} while correctness rises < {correct_rise:g} "
                 "(info when no group's correctness varies on most steps: no signal, not the weight)")
def _format_over_correct(v: View, t: Thresholds) -> Finding | None:
    comps = {k.split("/")[1] for k in v.keys("reward/") if k.endswith("/mean") and k.count("/") == 2}
    correct = correctness_component(comps)
    if correct is None:
        return None
    _, c = v.series(key("reward/{component}/mean", component=correct))
    if len(c) < COMPONENT_STEPS:
        return None
    ca, cb = first_last(c, t.window)
    for other in sorted(comps - {correct}):
        steps, o = v.series(key("reward/{component}/mean", component=other))
        if len(o) < COMPONENT_STEPS:
            continue
        oa, ob = first_last(o, t.window)
        if ob - oa > t.component_rise and cb - ca < t.correct_rise:
            silent = [s for s in steps if s >= 1 and correctness_silent(v, correct, s)]
            if 2 * len(silent) > len([s for s in steps if s >= 1]):
                return _silent_correctness(v, correct, other, steps[0], len(silent), (oa, ob), (ca, cb))
            o, c = v.label(other), v.label(correct)
            return Finding(
                severity="warn", step=steps[0], confidence=0.7,
                title=f"'{o}' reward rises while '{c}' does not",
                evidence=[f"{v.name(f'reward/{other}/mean')} {fmt(oa)} → {fmt(ob)}",
                          f"{v.name(f'reward/{correct}/mean')} {fmt(ca)} → {fmt(cb)}"],
                explanation=f"The policy optimises the easy '{o}' reward instead of the task: the weighted total "
                            "rises, accuracy does not.",
                action=f"{shrink_weight(v, other, o)}, or make it conditional on correctness; "
                       "rlgrad's reward-component analysis shows each component's share of the update.")
    return None


def _silent_correctness(v: View, correct: str, other: str, step: int, silent: int, o: tuple[float, float],
                        c: tuple[float, float]) -> Finding:
    """format_over_correct's competing cause: correctness gave no group a signal on most steps, so it could not
    rise whatever the other reward's weight."""
    lo, lc = v.label(other), v.label(correct)
    return Finding(
        severity="info", step=step, confidence=0.6, title=f"'{lo}' reward rises while '{lc}' has no signal",
        evidence=[f"{v.name(f'reward/{other}/mean')} {fmt(o[0])} → {fmt(o[1])}",
                  f"{v.name(f'reward/{correct}/mean')} {fmt(c[0])} → {fmt(c[1])}",
                  f"every group had one '{lc}' value for all its samples on {silent} steps"],
        explanation=f"'{lc}' does not rise because no group's '{lc}' varies on most steps: GRPO has nothing to "
                    f"learn from it, whatever '{lo}''s weight. The weight is not the cause.",
        action="Make the task easier or the model stronger (zero_variance_groups, unlearnable_reward); lowering "
               f"'{lo}''s weight would not give '{lc}' a signal.",
        explains=[])


def checkpoint_words(v: View, best_step: int) -> str:
    """What to keep for the best validation step, in words that are true of the run: step 0 is the validation of
    the initial weights (no checkpoint); a trained step is kept only where the run saved a checkpoint."""
    if best_step == 0:
        return ("No trained step beat the initial weights on validation (step 0 is the validation before training): "
                "keep the initial model")
    held = held_checkpoints(v)
    if held is None:
        return f"Keep the weights of step {best_step} if a checkpoint holds them"
    if best_step in held:
        return f"Keep the checkpoint of step {best_step} ({CHECKPOINT_PREFIX}{best_step})"
    before = [s for s in held if s < best_step]
    nearest = f"; the nearest one before it is step {before[-1]} ({CHECKPOINT_PREFIX}{before[-1]})" if before else ""
    freq, keep = v.cfg("trainer.save_freq"), v.cfg("trainer.max_ckpt_to_keep")
    if isinstance(freq, int) and checkpoint_due(best_step, freq, False) and isinstance(keep, int) and keep > 0:
        return (f"No checkpoint holds step {best_step} any more (trainer.max_ckpt_to_keep={keep} keeps the newest)"
                f"{nearest}: rerun to step {best_step} to keep it, with a larger trainer.max_ckpt_to_keep")
    why = f" (trainer.save_freq={freq})" if isinstance(freq, int) else ""
    return (f"No checkpoint holds step {best_step}{why}{nearest}: rerun to step {best_step} to keep it, with a "
            "trainer.save_freq that divides it")


@signature("val_falls_train_rises", "val/accuracy", trend="val/accuracy", min_points=3,
           reads="logs (+ config)",
           fires="validation accuracy below its best by > {val_drop:g} and by more than twice its binomial noise over "
                 "data.val_size prompts, while the training reward rises")
def _val(v: View, t: Thresholds) -> Finding | None:
    steps, acc = v.series("val/accuracy")
    best = max(acc)
    best_step = steps[acc.index(best)]
    flat, _ = flat_reward(v, t)
    # the competing cause the run can rule out: the validation set's own sampling noise (twice the binomial std of
    # an accuracy of ``best`` over data.val_size prompts; a 128-prompt set at 0.85 moves by ±0.06 by chance)
    n = val_size(v)
    noise = Z * share_error(best, n) if n else 0.0
    drop = max(t.val_drop, noise)
    if acc[-1] < best - drop and not flat:
        at = "before training (step 0: the initial weights)" if best_step == 0 else f"at step {best_step}"
        fell = next(s for s, a in zip(steps, acc) if s > best_step and a < best - drop)
        return Finding(
            severity="warn", step=fell, confidence=0.7,
            title="Validation accuracy falls while the training reward rises",
            evidence=[f"val/accuracy best {fmt(best)} {at}, last {fmt(acc[-1])} (step {steps[-1]}): down more than "
                      f"{fmt(drop)}" + (f" (twice the chance variation over {n} validation prompts)"
                                        if noise > t.val_drop else "")],
            explanation="The training reward keeps improving but held-out accuracy does not: reward hacking (a "
                        "component the validation does not pay for) or over-fitting to the training prompts.",
            action=checkpoint_words(v, best_step) + "; check which reward component drives the update "
                   "(rlgrad report RUN: the reward-component gradients).")
    return None
