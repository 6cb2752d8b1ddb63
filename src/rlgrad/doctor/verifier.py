"""``rlgrad doctor``'s signature of a noisy verifier, read off what the model wrote (``rollouts/step_N.jsonl``).

A verifier is a function of the prompt and the response: the same response to the same prompt gets the same
reward. GRPO samples ``rollout.n`` responses per prompt, and a policy that has learned an answer writes it several
times in a group, so a run holds many pairs of identical (prompt, response) samples. If their rewards differ, the
reward is not a function of the response: a verifier that errs at random (a flaky checker, an LLM judge sampled at
a temperature, a race in a sandbox). Under a verifier that flips the verdict of a sample independently with
probability p, two identical samples disagree with probability 2p(1 - p), so the share ``d`` of disagreeing pairs
gives ``p = (1 - sqrt(1 - 2d)) / 2``; GRPO's advantage for being right then shrinks by 1 - 2p (a mean reward of
p + (1 - 2p) × accuracy). A deterministic reward gives ``d = 0`` exactly, whatever the task or the policy, so the
rule needs no reference run and cannot fire on one. (The training reward against validation is no such test: greedy
validation rises faster than the sampled answers' accuracy, and on the lead-time bench's healthy seeds a fit of the
one on the other reads a flip rate of 0.25-0.37.)
"""

from __future__ import annotations

import math

from rlgrad import rundata as D
from rlgrad.doctor.findings import Finding, Thresholds, View, fmt, signature, train_series
from rlgrad.logging.reward_signal import correctness_component
from rlgrad.logging.rollouts import read_rollouts
from rlgrad.metrics import key
from rlgrad.runfiles import rollout_file


def _verdict(sample: dict, correct: str | None) -> float | None:
    """The sample's correctness component when the run has one, else its total reward."""
    comps = sample.get("components")
    x = comps.get(correct) if correct and isinstance(comps, dict) else sample.get("total")
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


def identical_pairs(samples: list[dict], correct: str | None) -> tuple[int, int]:
    """(pairs of samples of one group with the same response, how many of them got different rewards)."""
    same: dict[tuple, list[float]] = {}
    for r in samples:
        x = _verdict(r, correct)
        if x is not None and isinstance(r.get("group_id"), int) and isinstance(r.get("response"), str):
            same.setdefault((r["group_id"], r["response"]), []).append(x)
    pairs = differ = 0
    for xs in same.values():
        pairs += len(xs) * (len(xs) - 1) // 2
        values = {round(x, 9) for x in xs}
        differ += sum(1 for i, a in enumerate(xs) for b in xs[i + 1:] if round(a, 9) != round(b, 9)) \
            if len(values) > 1 else 0
    return pairs, differ


def flip_rate(disagree: float) -> float:
    """The per-sample flip rate p of a verifier under which identical samples disagree at a rate ``disagree``
    (= 2p(1 - p), solved for p ≤ 1/2; a share above 1/2 is read as 1/2)."""
    return (1 - math.sqrt(max(0.0, 1 - 2 * disagree))) / 2


def _scalar_evidence(v: View, correct: str | None, since: int) -> list[str]:
    """The correctness reward against the task's own verdict on the same samples (``rollout/accuracy``), where the
    run logs both and they differ (a custom reward without an ``acc`` field: the task scores the samples itself)."""
    if not correct:
        return []
    steps, c = train_series(v, key("reward/{component}/mean", component=correct))
    acc = dict(zip(*train_series(v, "rollout/accuracy")))
    both = [(x, acc[s]) for s, x in zip(steps, c) if s >= since and s in acc]
    if not both or all(abs(x - a) < 1e-9 for x, a in both):
        return []
    mc, ma = (sum(p[i] for p in both) / len(both) for i in (0, 1))
    return [f"{v.name(f'reward/{correct}/mean')} {fmt(mc)} against rollout/accuracy (the task's own verdict on the "
            f"same samples) {fmt(ma)}, mean of {len(both)} steps: a flip rate p gives p + (1 - 2p) × accuracy"]


@signature("noisy_verifier", "critic/score/mean",
           reads="logs + rollouts (rollouts/step_N.jsonl)",
           fires="identical responses to one prompt (a group) given different rewards: over the last "
                 "{verifier_steps} steps' rollouts, at least {verifier_pairs} such pairs and a flip rate p > "
                 "{verifier_flip:g} (from the share d of pairs that disagree, d = 2p(1 - p))")
def _noisy_verifier(v: View, t: Thresholds) -> Finding | None:
    where = D.rollout_dir(v.run)
    if where is None:
        return None
    # the newest steps' files only (a diagnosis runs after every step, live; rlgrad writes one every step): a
    # verifier's noise does not drift, and the files of steps after the view's last are never read
    last = [s for s in v.steps if s >= 1][-t.verifier_steps:]
    files = [(s, rollout_file(where, s)) for s in last if rollout_file(where, s).is_file()]
    if not files:
        return None
    comps = {k.split("/")[1] for k in v.keys("reward/") if k.endswith("/mean") and k.count("/") == 2}
    correct = correctness_component(comps)
    pairs = differ = 0
    first = None
    for s, f in files:
        p, d = identical_pairs(read_rollouts(f), correct)
        pairs, differ = pairs + p, differ + d
        first = s if first is None and d else first
    steps = [s for s, _ in files]
    if pairs < t.verifier_pairs or not differ:
        return None
    share = differ / pairs
    p = flip_rate(share)
    if p <= t.verifier_flip:
        return None
    spread = 2 * math.sqrt(share * (1 - share) / pairs)  # two binomial standard errors of the share (near p = 1/2
    low, high = flip_rate(max(0.0, share - spread)), flip_rate(share + spread)  # the point estimate saturates)
    what = f"'{v.label(correct)}'" if correct else "the reward"
    return Finding(
        severity="warn", step=first, confidence=min(0.9, 0.5 + pairs / 500),
        title=f"The verifier is noisy: identical responses get different {what} values",
        evidence=[f"{differ} of {pairs} pairs of identical responses to one prompt got different {what} values "
                  f"(steps {steps[0]}-{steps[-1]}): a flip rate of about {fmt(p)} per sample "
                  f"({fmt(low)}-{fmt(high)} within two standard errors)"]
                 + _scalar_evidence(v, correct, steps[0]),
        explanation=f"A verifier that judges the same answer differently errs at random: about {fmt(100 * low)}-"
                    f"{fmt(100 * high)}% of the verdicts are flipped, so the reward is p + (1 - 2p) × accuracy and the "
                    f"advantage of a right answer shrinks to {fmt(1 - 2 * high)}-{fmt(1 - 2 * low)} of what a clean "
                    "verifier gives. The run learns slower and from noise; the training reward understates and "
                    "flattens its progress.",
        action="Make the reward deterministic: fix the checker's randomness (a judge's temperature 0, a seeded or "
               "retried sandbox) or vote over several calls; read a few disagreeing samples (rlgrad samples RUN "
               f"--step {first}). Until then trust validation, not the training reward.")
