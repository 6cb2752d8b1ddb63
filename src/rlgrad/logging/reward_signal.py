"""Rewards a run cannot learn from, read off its own metrics from the first steps on.

GRPO learns only from prompt groups whose samples got different rewards. Two ways a reward gives it nothing,
both visible in the first few steps and both easy to miss on a reward curve:

* ``unlearnable_reward``: in every one of the first ``MIN_STEPS`` training steps, every prompt group has the same
  correctness for all its samples (``reward/<correctness>/frac_zero_std`` = 1): all wrong (the task is too hard,
  or the answers are not read: extraction or format), all right (too easy), or a mix of both kinds of group.
  A component that pays almost every response meanwhile (e.g. a lenient format check, 1.0 for a sentence
  that was never the asked form) is named as the likely cause.
* ``constant_component`` (a note, not a fault): a weighted component other than correctness has one value across
  the whole batch in every one of the first ``MIN_STEPS`` steps. GRPO's group baseline cancels a constant, so it
  teaches nothing and only lifts the reward curve; where correctness has no signal either, it is the likely
  cause named by ``unlearnable_reward``. (The demo's format, a bare integer, is such a component: its warm
  start already writes bare integers.)

Only the start of a run counts: a component that becomes constant later has usually been learned. The trainer
prints each problem once, live (``RewardSignalWatch``, a metrics sink), and ``rlgrad doctor`` reports the same
problems as findings (``doctor/progress.py``, live too with ``doctor.live``), from the same function and in the same
words: a ``RewardProblem`` holds them all (severity, title, cause, advice, evidence).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

MIN_STEPS = 3  # training steps that must all show the problem
SATURATED = 0.9  # a component paying at least this share of the maximum on average "pays almost everyone"
FLEXIBLE_HIGH = 0.5  # reward/extraction/flexible_share above this: most responses lack the asked form


@dataclass(frozen=True)
class RewardProblem:
    id: str  # unlearnable_reward | constant_component
    component: str
    step: int  # the step the problem is established at (the MIN_STEPS-th training step)
    evidence: list[str]
    cause: str
    advice: str

    @property
    def severity(self) -> str:
        """As rlgrad doctor grades it: no signal at all is critical; a constant component only a note."""
        return "critical" if self.id == "unlearnable_reward" else "info"

    @property
    def title(self) -> str:
        if self.id == "unlearnable_reward":
            return f"The reward cannot teach: '{self.component}' gives no group a signal"
        return f"'{self.component}' is the same for every response"

    def line(self) -> str:
        """The problem on one console line, as the trainer says it live (the doctor's finding: the same words)."""
        level = "note" if self.severity == "info" else "WARNING"
        return (f"{level} [{self.id}] step {self.step}: {self.title}. {self.cause} {self.advice} "
                f"({'; '.join(self.evidence)})")


def correctness_component(names) -> str | None:
    """The component that says whether an answer is right: rlgrad's ``correctness``, or a TRL reward function
    whose name says so (``correct``, ``accuracy``)."""
    return next((n for n in sorted(names) if "correct" in n or n in ("acc", "accuracy")), None)


def _components(rows: list[Mapping[str, float]]) -> set[str]:
    return {k.split("/")[1] for m in rows for k in m
            if k.startswith("reward/") and k.endswith("/mean") and k.count("/") == 2}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def reward_problems(rows: Mapping[int, Mapping[str, float]], weights: Mapping[str, float] | None = None,
                    min_steps: int = MIN_STEPS) -> list[RewardProblem]:
    """The problems of ``rows`` (step -> metrics; step 0 holds the validation before training), in the order
    above. ``weights``: the reward weights (a component of weight 0 is never blamed for being constant)."""
    train = [(s, rows[s]) for s in sorted(rows) if s >= 1 and any(k.startswith("reward/") for k in rows[s])]
    if len(train) < min_steps:
        return []
    first = train[:min_steps]
    step = first[-1][0]
    names = _components([m for _, m in first])
    correct = correctness_component(names)
    out = []
    if correct is not None and (problem := _no_signal(correct, names, first, rows.get(0, {}), step)):
        out.append(problem)
    for name in sorted(names - {correct}):
        std = [m.get(f"reward/{name}/std") for _, m in first]
        if weights is not None and not weights.get(name):
            continue
        if all(s == 0.0 for s in std):
            value = first[0][1][f"reward/{name}/mean"]
            pays = "every" if value >= 1.0 else "no" if value <= 0.0 else f"the same {value:.3g} to every"
            out.append(RewardProblem(
                "constant_component", name, step,
                [f"reward/{name}/std = 0 and reward/{name}/mean = {value:.3g} on steps "
                 f"{first[0][0]}-{step}"],
                f"'{name}' pays {pays} response: a constant that GRPO's group baseline cancels, so it teaches "
                "nothing and only lifts the reward curve.",
                f"Nothing to fix if that is expected; otherwise check what '{name}' measures (a check too lenient or "
                f"too strict for what this model writes: rlgrad samples RUN), or set its weight to 0."))
    return out


def _no_signal(correct: str, names: set[str], first: list, before: Mapping[str, float],
               step: int) -> RewardProblem | None:
    frac = [m.get(f"reward/{correct}/frac_zero_std") for _, m in first]
    std = [m.get(f"reward/{correct}/std") for _, m in first]
    if not all(f == 1.0 if f is not None else s == 0.0 for f, s in zip(frac, std)):
        return None
    level = sum(m[f"reward/{correct}/mean"] for _, m in first) / len(first)
    evidence = [f"every prompt group has one '{correct}' value for all its samples on steps {first[0][0]}-{step} "
                f"(mean {level:.3g})"]
    if "val/accuracy" in before:
        evidence.append(f"validation accuracy before training (the base rate): {_pct(before['val/accuracy'])}")
    saturated = sorted(n for n in names - {correct}
                       if min(m.get(f"reward/{n}/mean", 0.0) for _, m in first) >= SATURATED)
    flexible = [m["reward/extraction/flexible_share"] for _, m in first if "reward/extraction/flexible_share" in m]
    if level <= 0.0:
        if saturated:
            n = saturated[0]
            evidence.append(f"reward/{n}/mean >= {first[0][1][f'reward/{n}/mean']:.3g} from step {first[0][0]}")
            cause = (f"no answer is ever right while '{n}' pays almost every response from the start: the answers are "
                     f"probably not read (answer extraction), or '{n}' accepts what the prompt did not ask for")
        elif flexible and min(flexible) >= FLEXIBLE_HIGH:
            evidence.append(f"reward/extraction/flexible_share {_pct(min(flexible))} or more")
            cause = ("no answer is right, and most responses lack the asked answer form: check what the flexible "
                     "reading takes as the answer, or the task is too hard for this model")
        elif flexible and max(flexible) == 0.0 and all(m.get("reward/format/mean", 1.0) == 0.0 for _, m in first):
            cause = ("no response has the asked answer form, and strict extraction reads nothing from them "
                     "(reward.answer_extraction=strict)")
        else:
            cause = "every answer is wrong: the task is too hard for this model, or its answers are not read"
        advice = ("Read 10 responses (rlgrad samples RUN): if right answers are there, fix the extraction "
                  "(reward.answer_extraction=auto reads the last number of a sentence) or the prompt's format; "
                  "if not, make the task easier (fewer terms or digits) until 10-60% of samples are right.")
    elif level >= 1.0:
        cause = "every answer is right: the task is too easy, so no group has anything to learn"
        advice = "Make the task harder, or drop the groups with no variance (algorithm.filter_groups)."
    else:
        cause = ("each prompt is either always right or always wrong: the groups split into too easy and too hard "
                 "and none carries a signal")
        advice = "Sample more per prompt (rollout.n), or move the task's difficulty toward the model's level."
    return RewardProblem("unlearnable_reward", correct, step, evidence,
                         f"GRPO has nothing to learn from: {cause}.", advice)


class RewardSignalWatch:
    """A metrics sink that prints each problem of ``reward_problems`` once, as soon as the run's rows show it
    (rows are checked until the first ``MIN_STEPS`` training steps are in: only the start of a run counts)."""

    def __init__(self, say: Callable[[str], None], weights: Mapping[str, float] | None = None):
        self.say, self.weights = say, weights
        self.rows: dict[int, dict[str, float]] = {}
        self.checked = False

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.checked:
            return
        self.rows.setdefault(step, {}).update(metrics)
        trained = [s for s, m in self.rows.items() if s >= 1 and any(k.startswith("reward/") for k in m)]
        if len(trained) < MIN_STEPS:
            return
        self.checked = True
        for p in reward_problems(self.rows, self.weights):
            self.say(p.line())

    def close(self) -> None:
        return None
