"""``rlgrad doctor``'s signature of held-out accuracy falling while the training reward does not rise: the policy
gets worse at the task, not better at something else (that, with the reward rising, is
``val_falls_train_rises``). A fall counts only beyond the validation set's own sampling noise: twice the binomial
standard deviation of a difference of two accuracies over ``data.val_size`` prompts, held at the last two
validations.

The cause it checks first is the one a small batch at a large learning rate gives: far below the gradient noise
scale (``analysis.per_sample``), a step follows mostly the sampling noise of its few samples, and the noise a step
adds grows with the learning rate, so a run that first learns drifts away again (issue 32's sweep: at 8 prompts × 8
samples, lr 1e-3 peaked at validation 0.84 and fell to 0.19; lr 1e-4 rose to 0.86 and held). Otherwise the causes
``reward_collapse`` weighs: an entropy term, steps too large.
"""

from __future__ import annotations

import math

from rlgrad.doctor.findings import Finding, Thresholds, View, config_lr, flat_reward, fmt, signature
from rlgrad.doctor.noise import below_noise_scale, noise_scale
from rlgrad.doctor.progress import NO_KNOWN_CAUSE, checkpoint_words, collapse_cause


def _noise(a: float, b: float, n: object) -> float:
    """Twice the binomial std of the difference of two accuracies a, b over ``n`` prompts (0 when n is unknown)."""
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        return 0.0
    return 2 * math.sqrt((a * (1 - a) + b * (1 - b)) / n)


def _cause(v: View, t: Thresholds, fell: int) -> tuple[str, list[str], str]:
    """(why, evidence, what to do): a batch below the noise scale if the run measured it (B < B_simple: a step's
    gradient is more noise than signal), else the causes reward_collapse weighs (collapse_cause)."""
    got = noise_scale(v)
    lr = config_lr(v)
    lower = "Lower the learning rate" + (f" (now {fmt(lr)})" if lr else "")
    if below_noise_scale(got):
        return (f"The batch ({fmt(got.samples)} samples a step) is {fmt(got.scale / got.samples)}× below the "
                f"gradient noise scale (B_simple {fmt(got.scale)}): each step follows mostly the sampling noise of its "
                "few samples, and the noise a step adds grows with the learning rate, so the policy drifts away from "
                "what it learned.",
                [f"{got.interval()} against {fmt(got.samples)} samples per step: the noise outweighs the signal"],
                lower + "; or grow the batch toward B_simple (more samples average the noise out)")
    why, ev, fix = collapse_cause(v, t, fell)
    if got is None and fix == NO_KNOWN_CAUSE:  # neither cause, and no noise measurement to test a third
        return ("The update size is not extreme and no entropy term explains it; the run did not measure the "
                "gradient noise (analysis.per_sample), which tells a batch too small for its learning rate apart.",
                ev, lower + " (a run that learned and then lost it usually steps too far for its batch's noise); "
                "turn analysis.per_sample on to see whether the batch is below the noise scale")
    return why, ev, fix


@signature("val_falls", "val/accuracy", trend="val/accuracy", min_points=3,
           reads="logs (+ config; the noise scale, where measured, for its cause)",
           fires="validation accuracy at the last two validations below its best by > {val_drop:g} and by more than "
                 "twice the binomial noise of the difference over data.val_size prompts, while the training reward "
                 "does not rise (critical when also below its value before training)")
def _val_falls(v: View, t: Thresholds) -> Finding | None:
    steps, acc = v.series("val/accuracy")
    if not flat_reward(v, t)[0]:  # a rising reward: val_falls_train_rises
        return None
    n = v.cfg("data.val_size")
    best = max(acc)
    best_step = steps[acc.index(best)]
    recent = max(acc[-2:])
    if steps[-2] <= best_step or recent >= best - max(t.val_drop, _noise(best, recent, n)):
        return None
    fell = next(s for s, a in zip(steps, acc) if s > best_step and a < best - max(t.val_drop, _noise(best, a, n)))
    before = acc[0] if steps[0] == 0 else None
    worse = before is not None and recent < before - max(t.val_drop, _noise(before, recent, n))
    why, cause_ev, fix = _cause(v, t, fell)
    return Finding(
        severity="critical" if worse else "warn", step=fell, confidence=0.8,
        title="Validation accuracy fell" + (" below where it started" if worse else " from its best"),
        evidence=[f"val/accuracy best {fmt(best)} at step {best_step}, {fmt(acc[-2])} and {fmt(acc[-1])} at the last "
                  f"two validations (steps {steps[-2]}, {steps[-1]})"
                  + (f"; {fmt(before)} before training" if before is not None else "")
                  + (f"; the chance variation over {n} validation prompts is at most {fmt(_noise(0.5, 0.5, n))}"
                     if _noise(0.5, 0.5, n) else ""),
                  f"{flat_reward(v, t)[1]}: the training reward does not rise either"] + cause_ev,
        explanation="The policy gets worse at the task on held-out prompts while the training reward does not rise: "
                    "what it learned is being lost, not traded for a reward validation does not pay. " + why,
        action=fix + ". " + checkpoint_words(v, best_step) + ".",
        explains=["reward_collapse", "reward_plateau"])
