"""The pieces ``rlgrad doctor``'s signatures are made of: the thresholds, a finding, the run as one view.

A signature (``rlgrad.doctor.signatures``, ``progress``, ``gradient``) is a function of a ``View`` and the
``Thresholds`` that returns a ``Finding`` or None, registered with ``@signature(id, *needed metrics, reads=...,
fires=...)`` (its row of docs/doctor.md's table, ``findings_table``). Below them: what several signatures read.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from rlgrad import rundata as D
from rlgrad.config.aliases import HOSTS, host_setting
from rlgrad.errors import UserError
from rlgrad.logging.reward_signal import correctness_component
from rlgrad.metrics import key, parse
from rlgrad.metrics.judge import Change, share_error, windows

SEVERITY = {"critical": 0, "warn": 1, "info": 2}  # most serious first: a finding's severity is one of these


def at_or_above(severity: str, bound: str) -> bool:
    """Whether ``severity`` is ``bound`` or more serious; never for a bound that is no severity (``never``: the value
    that turns ``--fail-on`` and ``doctor.halt_on`` off)."""
    return bound in SEVERITY and SEVERITY[severity] <= SEVERITY[bound]


@dataclass(frozen=True)
class Thresholds:
    """What each signature calls abnormal. Override any of them with ``--thresholds FILE.yaml``."""

    window: int = 10  # steps in a "recent" window (median for spikes, the first / last stretch of a run)
    spike_factor: float = 10.0  # grad_norm_spike: a step's gradient norm above this × the previous window's median
    clip_steps_frac: float = 0.9  # clip_every_step: the gradient norm above max_grad_norm on this share of steps
    clip_factor_cv: float = 0.5  # ... under Adam, a clip factor varying more than this (std / mean) reweights steps
    # actor/update_ratio, ‖Δθ‖/‖θ‖ of a step's update (the demo, measured: 4e-4 to 8e-4 at its preset lr 1e-4,
    # 7e-5 at 1e-5 which learns nothing in 40 steps, 1e-2 to 5e-2 at 3e-3 which destroys it in 2 steps)
    update_high: float = 0.01  # update_too_large: the median update of the first window above this
    update_low: float = 2e-4  # lr_too_small: the median update of the last window below this ...
    progress_low: float = 0.05  # ... while the reward rose less than this share of its room to its best (1 - level)
    gain_z: float = 2.0  # ... or by no more than this many standard errors of the rise (a gain within noise)
    lr_low: float = 1e-6  # lr_too_small, last resort (no actor/update_ratio logged): lr at or below this, flat reward
    lr_very_low: float = 1e-7  # ... or at or below this whatever the reward does
    kl_high: float = 1.0  # kl_blowup: the recent KL loss above this is critical
    kl_growth: float = 20.0  # kl_blowup: the recent KL above this × the first window's (and above kl_floor) warns
    kl_floor: float = 0.05
    entropy_drop: float = 0.1  # entropy_collapse: the recent entropy below this share of the first window's
    clipfrac_high: float = 0.4  # clipfrac_saturated: the recent clip fraction above this (healthy ≈ 0.1-0.4)
    zero_var_frac: float = 0.75  # zero_variance_groups: more than this share of prompt groups with equal rewards
    easy_level: float = 0.9  # zero_variance_groups: a [0, 1] reward at or above this: the groups are too easy ...
    hard_level: float = 0.1  # ... at or below this: too hard
    length_clip_high: float = 0.3  # length_runaway: the recent share of responses cut at the length limit
    truncation_high: float = 0.5  # length_truncated: the median share of cut responses over the recent steps
    length_drop: float = 0.3  # length_collapse: the recent mean length below this share of the first window's
    reward_drop: float = 0.5  # reward_collapse: a fall by this share of the run's early level (its first step) ...
    collapse_steps: int = 3  # ... held by this many steps in a row ...
    collapse_z: float = 3.0  # ... and this many times the reward's step-to-step noise
    plateau_delta: float = 0.02  # reward_plateau: the reward's rise from the first to the last window below this
    component_rise: float = 0.1  # format_over_correct: a non-correctness reward rising this much ...
    correct_rise: float = 0.02  # ... while correctness rises less than this
    val_drop: float = 0.05  # val_falls_train_rises: validation accuracy below its best by this much
    reg_ratio: float = 1.0  # regularizer_dominates: the entropy / KL gradient norm above this × the task's
    share_high: float = 0.5  # component_takes_over / _dominates: a component's share of the update above this ...
    # ... while its gradient's cosine with correctness is below this (takes_over): against it beyond noise. Two
    # gradients of one batch whose samples' advantages are unrelated have a cosine of roughly ±1/√(samples), 0.09
    # on the demo's 128; a cosine of -0.03 says nothing
    sim_negative: float = -0.1
    component_steps: int = 2  # ... on at least this many analysis steps (one step is one batch's chance) ...
    component_frac: float = 0.25  # ... and at least this share of them (where correctness varied within a group)
    adv_over_range: float = 1.2  # std_normalisation_amplifies: the largest advantage above this × the reward range
    layer_top2: float = 0.8  # update_concentrated: the two largest layer groups hold this share of the squared norm
    dormant_rise: float = 0.05  # dormant_growing: the dormant ratio rising by this much ...
    dormant_high: float = 0.1  # ... to at least this
    # noisy_verifier: identical responses to one prompt given different rewards (a deterministic reward: never)
    verifier_steps: int = 3  # ... read off the rollout files of the last this many steps ...
    verifier_pairs: int = 20  # ... holding at least this many pairs of identical responses ...
    verifier_flip: float = 0.05  # ... and a per-sample flip rate above this (the advantage shrinks by 1 - 2p)
    # McCandlish et al. 2018: steps S = S_min (1 + B_simple/N), samples E = E_min (1 + N/B_simple); at N = B_simple / 10
    # a 10x larger batch still cuts the steps ~5.5x, at N = 10 B_simple the samples are 11x the least
    noise_below: float = 10.0  # batch_below_noise_scale: the analysed batch (samples) below B_simple / this
    noise_above: float = 10.0  # batch_above_noise_scale: the analysed batch above this × B_simple
    forecast_points: int = 10  # forecasts: fitted to the last this many steps (and never from fewer) ...
    forecast_r2: float = 0.8  # ... given only when the fit explains at least this share of their variance ...
    forecast_horizon: int = 200  # ... and the bound is crossed within this many steps

    @classmethod
    def from_file(cls, path: str | Path) -> Thresholds:
        from omegaconf import OmegaConf

        p = Path(path)
        try:
            raw = OmegaConf.to_container(OmegaConf.load(p))
        except Exception as e:
            raise UserError(f"cannot read thresholds file '{p}': {str(e).splitlines()[0]}") from None
        if not isinstance(raw, dict):
            raise UserError(f"thresholds file '{p}' must hold a mapping of threshold: value")
        known = {f.name: f.type for f in fields(cls)}
        out = {}
        for k, v in raw.items():
            if k not in known:
                raise UserError(f"thresholds file '{p}': unknown threshold '{k}' (known: {', '.join(known)})")
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise UserError(f"thresholds file '{p}': '{k}' must be a non-negative number, got {v!r}")
            out[k] = int(v) if known[k] == "int" else float(v)
        if out.get("window", 1) < 1:
            raise UserError(f"thresholds file '{p}': 'window' must be at least 1")
        return cls(**out)


# Where each threshold came from: the commit that set it and the runs it was fitted on (or checked against), from
# the project's history and docs; "not recorded" where neither says. docs/doctor.md's thresholds table shows it.
_FIRST = "the doctor's first version (ab408a2, 2026-11-23); runs fitted on: not recorded"
_ISSUE37 = ("issue 37 (141a915); checked against its recorded runs (c2916a4: lr_fast_collapse critical by step 4, "
            "nothing on healthy_issue37 or weak_start at any prefix): whether fitted on them is not recorded; "
            "in-sample on those runs")
THRESHOLD_SOURCES: dict[str, str] = {
    "window": _FIRST, "spike_factor": _FIRST, "clip_steps_frac": _FIRST,
    "clip_factor_cv": "9c64458, checked on a tiny model trained under Adam and SGD (test_advice.py); runs fitted on: "
                      "not recorded",
    "update_high": "issue 37 (141a915): between the demo's measured update sizes, 4e-4 to 8e-4 at lr 1e-4 "
                   "(healthy_issue37) and 1e-2 to 5e-2 at 3e-3 (lr_fast_collapse); in-sample on those runs",
    "update_low": "issue 37 (141a915): between the demo's 4e-4 to 8e-4 at lr 1e-4 and its 7e-5 at 1e-5 (lr_slow); "
                  "in-sample on those runs",
    "progress_low": "issue 37 (141a915); runs fitted on: not recorded",
    "gain_z": "issue 46: two standard errors, a convention; written after the lr 1e-5 run the issue reports (in-sample "
              "on it)",
    "lr_low": _FIRST + " (sizes for 7B-class models: common practice)", "lr_very_low": _FIRST,
    "kl_high": _FIRST, "kl_growth": _FIRST, "kl_floor": _FIRST, "entropy_drop": _FIRST,
    "clipfrac_high": _FIRST + "; the demo tops out near it (clip_narrow is read at 0.3)",
    "zero_var_frac": _FIRST + "; read as the median of the last window since healthy_seed3 warned on two early steps "
                              "(8991280): in-sample on healthy_seed3",
    "easy_level": "issue 37 (141a915); runs fitted on: not recorded",
    "hard_level": "issue 37 (141a915); runs fitted on: not recorded",
    "length_clip_high": _FIRST,
    "truncation_high": "issue 37 (141a915), checked on the truncated fixture (75-100% cut); runs fitted "
                       "on: not recorded",
    "length_drop": _FIRST + "; length_squeezed (1.1 of 7.7 tokens) is far below it",
    "reward_drop": _ISSUE37, "collapse_steps": _ISSUE37, "collapse_z": _ISSUE37,
    "plateau_delta": _FIRST, "component_rise": _FIRST, "correct_rise": _FIRST,
    "val_drop": _FIRST + "; the binomial noise over data.val_size added after healthy_seed3's dip (8991280): "
                         "in-sample on healthy_seed3",
    "reg_ratio": _FIRST, "share_high": _FIRST,
    "sim_negative": "0 in the first version (ab408a2); -0.1 since issue 46, from the ±1/√n scale of a cosine over the "
                    "demo's 128 samples, after the healthy TRL run's -0.027: in-sample on that run",
    "component_steps": "issue 46, after the healthy TRL run (format over half the update on 1 of 9 analysis steps): "
                       "in-sample on it, brevity_takeover and format_heavy",
    "component_frac": "issue 46, as component_steps: in-sample on the healthy TRL run, brevity_takeover (3 of 8 steps) "
                      "and format_heavy",
    "adv_over_range": _FIRST, "layer_top2": _FIRST, "dormant_rise": _FIRST, "dormant_high": _FIRST,
    "verifier_steps": "8034c3c: the lead-time bench's noisy run and a healthy seed (tests/data/lead_time); in-sample "
                      "on them",
    "verifier_pairs": "d7dff9d: the lead-time bench's noisy run (flip rate 0.40) and its 12 runs with a deterministic "
                      "reward (no disagreeing pair); in-sample on them",
    "verifier_flip": "d7dff9d, as verifier_pairs; in-sample on the lead-time runs",
    "noise_below": "McCandlish et al. 2018's steps and samples against the batch (a factor of 10: steps still cut "
                   "~5.5x); not fitted on runs (462baf9 made it a field)",
    "noise_above": "McCandlish et al. 2018, as noise_below (11x the least samples); not fitted on runs",
    "forecast_points": "70a4bf0, checked on synthetic trends with a known answer (test_forecasts.py); not fitted on "
                       "runs",
    "forecast_r2": "70a4bf0, as forecast_points; not fitted on runs",
    "forecast_horizon": "70a4bf0, as forecast_points; not fitted on runs",
}


@dataclass
class Finding:
    severity: str  # info | warn | critical
    step: int | None  # the first step it shows at
    confidence: float  # 0..1
    title: str
    evidence: list[str]
    explanation: str
    action: str
    id: str = ""  # a signature's findings take its registered id (``signature``); set by hand only outside one
    explains: list[str] = field(default_factory=list)  # ids of findings this one's evidence explains (its effects)
    cause: str = ""  # set by ``diagnose``: the id of the fired finding that explains this one
    # against a default rlgrad keeps on purpose (doctor/settings.py): the harm the run measured, in words; "" for
    # none, and the finding is then a note (info), not a warning, on a run that keeps the default
    harm: str = ""


@dataclass
class Diagnosis:
    run: str
    source: str
    findings: list[Finding]
    missing: dict[str, list[str]] = field(default_factory=dict)  # signature -> the metrics it needed
    scale: str = ""  # what the gradient-norm scale of this run means
    too_early: dict[str, tuple[int, int]] = field(default_factory=dict)  # signature -> (steps it has, steps it needs)

    @property
    def critical(self) -> bool:
        return any(f.severity == "critical" for f in self.findings)

    def to_json(self) -> dict:
        return {"run": self.run, "source": self.source, "critical": self.critical, "scale": self.scale,
                "findings": [asdict(f) for f in self.findings], "missing": self.missing,
                "too_early": {sid: {"steps": have, "needs": need} for sid, (have, need) in self.too_early.items()}}


# ---------------------------------------------------------------- the view


class View:
    """A run's metrics by rlgrad name, its config under rlgrad's or verl's spelling, and its analysis files."""

    def __init__(self, run: D.RunData):
        self.run = run
        self.steps = sorted(run.rows)
        # what every signature asks again, read once per diagnosis (a view lives for one diagnosis)
        self._series: dict[str, tuple[list[int], list[float]]] = {}
        self._keys = {k for m in run.rows.values() for k in m}
        self._nonfinite = {k for b in run.nonfinite.values() for k in b}
        self._cfg: dict[str, object] = {}

    def series(self, key: str) -> tuple[list[int], list[float]]:
        if key not in self._series:
            self._series[key] = D.series(self.run, key) if key in self._keys else ([], [])
        return self._series[key]

    def has(self, key: str) -> bool:
        """Logged at some step (a value logged only as NaN / inf counts: that is what some signatures look for)."""
        return key in self._keys or key in self._nonfinite

    def cfg(self, *keys: str):
        """The first of ``keys`` the run sets: in its config (rlgrad's or verl's spelling), else among the host
        trainer's own settings (TRL's args by TRL's names, ``RunData.settings``)."""
        for k in keys:
            if k not in self._cfg:
                v = D.config_get(self.run, k)
                self._cfg[k] = self.run.settings.get(k) if v is None else v
            if self._cfg[k] is not None:
                return self._cfg[k]
        return None

    def name(self, key: str) -> str:
        """The metric as the evidence quotes it: under the name the run's own trainer logs it (a TRL run:
        ``grad_norm``, ``reward``, ``rewards/<f>/mean``), rlgrad's otherwise (``data.metric_name``)."""
        return D.metric_name(self.run, key)

    def setting(self, key: str, short: bool = False) -> str:
        """A setting (rlgrad's dotted key, or ``key=value``) as the run's own trainer takes it, for advice: TRL's
        GRPOConfig argument on a TRL run, verl's key on a verl run, rlgrad's otherwise (``config.aliases``).
        ``short``: the name alone, as a sentence says it (``kl_loss_coef``; TRL's ``beta``)."""
        spelled = host_setting(key, self.run.kind if self.run.kind in HOSTS else "rlgrad")
        if not short or self.run.kind == "trl":  # TRL's names are short; one TRL lacks keeps its note
            return spelled
        name, eq, value = spelled.partition("=")
        return name.rsplit(".", 1)[-1] + eq + value

    def label(self, component: str) -> str:
        """A reward component as its trainer names it (``data.label``)."""
        return D.label(self.run, component)

    def keys(self, prefix: str) -> set[str]:
        return {k for k in self._keys if k.startswith(prefix)}

    def all_keys(self) -> set[str]:
        return self._keys


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def first_last(vals: list[float], w: int) -> tuple[float, float]:
    """Means of the first and the last ``w`` values (of the first and last halves on a short series)."""
    k = max(1, min(w, len(vals) // 2))
    return mean(vals[:k]), mean(vals[-k:])


def fmt(x: float) -> str:
    return f"{x:.3g}"


# ---------------------------------------------------------------- what several signatures read


def flat_reward(v: View, t: Thresholds) -> tuple[bool, str]:
    """Whether the reward rose less than ``plateau_delta`` from the first to the last steps, and in words."""
    steps, r = v.series("critic/score/mean")
    if len(r) < 4:
        return False, ""
    a, b = first_last(r, t.window)
    return b - a < t.plateau_delta, f"{v.name('critic/score/mean')} {fmt(a)} (first steps) → {fmt(b)} (last steps)"


def val_size(v: View) -> int | None:
    """The prompts each validation scores (``data.val_size``), None when the run does not say."""
    n = v.cfg("data.val_size")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def validation_change(v: View) -> Change | None:
    """Validation accuracy from the first to the last validations, judged against its binomial noise over
    ``data.val_size`` prompts (``rlgrad.metrics.judge``: the one rule of rises and falls); None under two."""
    _, acc = v.series("val/accuracy")
    return windows(acc, errors=[share_error(a, val_size(v)) for a in acc])


def train_series(v: View, key: str) -> tuple[list[int], list[float]]:
    """A metric over the training steps (step 0 holds the validation before training, nothing trained)."""
    steps, x = v.series(key)
    keep = [i for i, s in enumerate(steps) if s >= 1]
    return [steps[i] for i in keep], [x[i] for i in keep]


def config_lr(v: View) -> float | None:
    """The actor's learning rate: the config's, else the largest logged."""
    lr = v.cfg("actor.optim.lr", "learning_rate")
    if lr is None:
        _, lrs = v.series("actor/lr")
        lr = max(lrs) if lrs else None
    try:
        return None if lr is None else float(lr)
    except (TypeError, ValueError):
        return None


def reward_level(v: View) -> tuple[float | None, str]:
    """The recent level of a reward read as a share of right answers, and the metric it is read from: the
    correctness component, rlgrad's rollout accuracy, or a total reward that stays in [0, 1]; None if unknown."""
    comps = {f["component"] for k in v.keys("reward/") if (f := parse("reward/{component}/mean", k))}
    correct = correctness_component(comps)
    keys = ([key("reward/{component}/mean", component=correct)] if correct else []) + ["rollout/accuracy",
                                                                                      "critic/score/mean"]
    for k in keys:
        _, x = v.series(k)
        if x and (k != "critic/score/mean" or all(0.0 <= a <= 1.0 for a in x)):
            return mean(x[-3:]), v.name(k)
    return None, ""


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


def unpaid_correctness(v: View) -> str | None:
    """The correctness component when its weight is 0 while another component's is not: the reward then does not
    pay for right answers, whatever correctness does (the cause of groups that agree on the reward, and of another
    component making the whole update); None otherwise."""
    weights = reward_weights(v)
    correct = correctness_component(weights)
    if correct is None or weights[correct] != 0:
        return None
    return correct if any(w != 0 for c, w in weights.items() if c != correct) else None


def entropy_coef(v: View) -> float | None:
    """The entropy term's coefficient (rlgrad's / verl's ``entropy_coeff``, TRL's ``entropy_coef``), None if unset."""
    c = v.cfg("actor.entropy_coeff", "actor_rollout_ref.actor.entropy_coeff", "entropy_coef")
    return float(c) if isinstance(c, int | float) and not isinstance(c, bool) else None


def update_size(v: View, until: int | None = None) -> float | None:
    """The median update size ‖Δθ‖/‖θ‖ (``actor/update_ratio``) of the training steps up to ``until`` (all of them
    by default); None when the run logs none: a cause the run's metrics can rule in or out (the learning rate)."""
    steps, u = train_series(v, "actor/update_ratio")
    u = [x for s, x in zip(steps, u) if until is None or s <= until]
    return statistics.median(u) if u else None


def correctness_silent(v: View, correct: str, step: int) -> bool:
    """Whether no prompt group's correctness varied at ``step`` (``reward/{correct}/frac_zero_std`` 1, or its std 0
    over the batch): correctness then adds nothing to the update, and any other component's share is all there is
    (the competing cause of a component "taking over": no signal, not its weight)."""
    m = v.run.rows.get(step, {})
    frac = m.get(key("reward/{component}/frac_zero_std", component=correct))
    std = m.get(key("reward/{component}/std", component=correct))
    return frac == 1.0 if frac is not None else std == 0.0


def dead_steps(v: View) -> tuple[list[int], int, str]:
    """The steps on which every advantage was 0, of how many steps say, and from what: the advantages' max = min =
    0, else a reward std of exactly 0 over the batch (TRL's reward_std: every sample of every group alike), else a
    task gradient of exactly 0 in every bucket the instruments measured (``grad_norm/{bucket}/task``)."""
    ss, amax = v.series("critic/advantages/max")
    if ss:
        _, amin = v.series("critic/advantages/min")
        dead = [s for s, a, b in zip(ss, amax, amin) if a == 0.0 and b == 0.0]
        return dead, len(ss), "critic/advantages max = min = 0"
    ss, std = v.series("critic/score/std")
    if ss and not v.has("critic/score/frac_zero_std"):  # the share of groups says more, where logged
        # 0 up to float rounding (TRL's weighted sum of constant rewards has a std of ~1e-8)
        return [s for s, x in zip(ss, std) if x < 1e-6], len(ss), f"{v.name('critic/score/std')} 0 (every reward alike)"
    rows = {s: [x for k, x in m.items() if k.startswith("grad_norm/") and k.endswith("/task")]
            for s, m in v.run.rows.items()}
    rows = {s: xs for s, xs in rows.items() if xs}
    return ([s for s, xs in rows.items() if max(xs) == 0.0], len(rows),
            "the task gradient 0 in every bucket (grad_norm/{bucket}/task)")


def gradless_steps(v: View) -> set[int]:
    """The steps whose batch gave the task no gradient: every advantage 0 (``dead_steps``), or every prompt group
    with one reward for all its samples (``critic/score/frac_zero_std`` 1, TRL's)."""
    steps, frac = v.series("critic/score/frac_zero_std")
    return set(dead_steps(v)[0]) | {s for s, x in zip(steps, frac) if x >= 1.0}


def task_gradient_rows(v: View, until: int | None = None) -> tuple[list[tuple[int, dict]], int]:
    """The analysis steps (up to ``until``) that had a task gradient, as (step, metrics), and how many analysed steps
    had none and were left out: a step of ``gradless_steps``, or a task gradient of exactly 0. A regulariser's
    gradient against a task gradient that does not exist is no ratio (a healthy TRL run's KL gradient of 0.002 on
    a step where every group had one reward read as the KL term dominating)."""
    gradless = gradless_steps(v)
    rows = [(s, m) for s, m in sorted(v.run.rows.items())
            if "grad_norm/all/task" in m and (until is None or s <= until)]
    kept = [(s, m) for s, m in rows if s not in gradless and m["grad_norm/all/task"] > 0]
    return kept, len(rows) - len(kept)


def entropy_cause(v: View, t: Thresholds) -> tuple[str, str, list[str]]:
    """What drove the entropy down, of the causes the run's metrics can rule in or out: an entropy penalty (a
    negative coefficient), steps too large (the update size), else the reward sharpening the policy.
    (why, what to do, evidence); the advice is right for the coefficient's sign."""
    coef, size, lr = entropy_coef(v), update_size(v), config_lr(v)
    ev = ([f"entropy_coeff {coef:g}"] if coef is not None else []) + (
        [f"actor/update_ratio {fmt(size)} (median)"] if size is not None else [])
    if coef is not None and coef < 0:
        return (f"entropy_coeff is negative ({coef:g}): a penalty whose gradient lowers the entropy.",
                f"Set {v.setting('actor.entropy_coeff')} to 0 (or a small positive bonus): bring it toward 0, do not "
                "lower it.", ev)
    if size is not None and size > t.update_high:
        return (f"The updates are large ({fmt(size)} of the weights' norm, median; typical: 1e-4 to 1e-3).",
                f"Lower the learning rate{f' (now {fmt(lr)})' if lr else ''} toward an actor/update_ratio of about "
                "1e-3; then a small entropy bonus or clip-higher if it still falls.", ev)
    name = v.setting("actor.entropy_coeff", short=True)
    bonus = (f"raise the entropy bonus a little ({name}, now {coef:g})" if coef is not None and coef > 0
             else f"add a small entropy bonus ({name} > 0)")
    return (("The update size is normal: the learning rate is not the first suspect; the reward sharpens the "
             "policy." if size is not None else ""),
            f"Raise the sampling temperature or {bonus}, or use clip-higher ("
            f"{v.setting('actor.clip_ratio_high', short=True)} > {v.setting('actor.clip_ratio_low', short=True)})"
            + ("." if size is not None else "; or lower the learning rate."), ev)


Signature = Callable[[View, Thresholds], "Finding | None"]
SIGNATURES: list[tuple[str, tuple[str, ...], Signature]] = []  # (id, the metrics it needs, the rule)
ROWS: dict[str, tuple[str, str]] = {}  # id -> (what it reads, when it fires): the docs' table (``findings_table``)
# id -> (the metric whose trend it reads, the fewest training steps of it the rule judges from, as a function of
# the thresholds): fewer, and the doctor says "too early" for it instead of judging (``too_early``)
TRENDS: dict[str, tuple[str, Callable[[Thresholds], int]]] = {}


def signature(sid: str, *needs: str, reads: str, fires: str, trend: str = "",
              min_points: int | Callable[[Thresholds], int] = 0):
    """Register a rule under ``sid``, the one spelling of its id: ``--explain``, ``--thresholds`` and every finding
    it returns use it. ``needs``: metrics of which the run must hold at least one ("a|b": either). ``reads`` and
    ``fires`` are its row of docs/doctor.md's table: what it reads (logs, config, buckets ...) and when it fires,
    ``{field}`` standing for a ``Thresholds`` default. A rule that reads a trend names its metric (``trend``) and the
    fewest steps of it it judges from (``min_points``: a number, or one of the thresholds), said once here: with
    fewer the rule is not run (so it never checks the count again) and the doctor says it is too early
    (``too_early``; docs/doctor.md's "judged from")."""
    def deco(fn: Signature) -> Signature:
        @functools.wraps(fn)
        def rule(v: View, t: Thresholds) -> Finding | None:
            found = fn(v, t)
            return None if found is None else dataclasses.replace(found, id=sid)

        SIGNATURES.append((sid, needs, rule))
        ROWS[sid] = (reads, fires)
        if trend:
            TRENDS[sid] = (trend, min_points if callable(min_points) else lambda t, n=min_points: n)
        return rule
    return deco


def too_early(v: View, sid: str, t: Thresholds) -> tuple[int, int] | None:
    """(training steps of its trend metric the run has, the fewest it needs) when signature ``sid`` reads a trend
    the run is too short for; None when it is not (or reads no trend)."""
    if sid not in TRENDS:
        return None
    metric, need = TRENDS[sid]
    alts = metric.split("|")
    alt = next((alt for alt in alts if v.has(alt) or "{" in alt and _keys_of(v, alt)), alts[0])  # the one it reads
    have = len({s for k in (_keys_of(v, alt) if "{" in alt else [alt]) for s in trend_steps(v, k)})
    return (have, need(t)) if have < need(t) else None


def _keys_of(v: View, template: str) -> list[str]:
    """The run's keys of a metric template (``grad_comp/{component}/share``: one per component)."""
    return [k for k in v.all_keys() if parse(template, k) is not None]


def trend_steps(v: View, key: str) -> list[int]:
    """The steps a trend of ``key`` is judged from: its training steps, and for a validation metric (``val/``) the
    validation before training too (step 0: the base a fall is measured from)."""
    return v.series(key)[0] if key.startswith("val/") else train_series(v, key)[0]


# the docs' table lies between these
README_START = "<!-- doctor-findings: generated by scripts/generate/doctor_table.py -->\n"
README_END = "<!-- /doctor-findings -->\n"
THRESHOLDS_START = "<!-- doctor-thresholds: generated by scripts/generate/doctor_table.py -->\n"
THRESHOLDS_END = "<!-- /doctor-thresholds -->\n"


def findings_table() -> str:
    """docs/doctor.md's table of findings, one row per registered signature (``scripts/generate/doctor_table.py``
    writes it)."""
    t = Thresholds()
    defaults = asdict(t)
    rows = ["| finding | reads | fires when (thresholds in `Thresholds`) | judged from |", "|---|---|---|---|"]
    rows += [f"| `{sid}` | {reads} | {fires.format(**defaults)} | "
             + (f"{TRENDS[sid][1](t)} steps of " + " or ".join(f"`{k.replace('{', '<').replace('}', '>')}`"
                                                           for k in TRENDS[sid][0].split("|"))
                if sid in TRENDS else "step 1") + " |"
             for sid, (reads, fires) in ROWS.items()]
    return "\n".join(rows) + "\n"


def thresholds_table() -> str:
    """docs/doctor.md's table of thresholds: each one's default and where it came from (``THRESHOLD_SOURCES``)."""
    rows = ["| threshold | default | where it came from (the runs it was fitted on) |", "|---|---|---|"]
    rows += [f"| `{name}` | {value:g} | {THRESHOLD_SOURCES[name]} |" for name, value in asdict(Thresholds()).items()]
    return "\n".join(rows) + "\n"
