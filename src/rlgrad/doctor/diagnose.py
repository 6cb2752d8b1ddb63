"""rlgrad doctor's engine: every registered signature on a run, the findings linked to their causes and ranked.

A run (rlgrad's run directory, a TRL output directory, verl's file-logger JSONL or a W&B run: ``rundata.load_any``)
is read into one view with rlgrad's metric names, and every signature looks at it. A signature is a function of the
view and the thresholds that returns a ``Finding`` or nothing (``doctor/findings.py``: ``@signature``); one that
needs metrics the run lacks is listed under ``missing`` (``--explain``) instead of guessing, one whose trend the run
is too short for under ``too_early``. The scalar signatures are what a practitioner reads off the logs (KL, entropy,
clip fraction, gradient norm, lengths, rewards, validation); the gradient-level ones read rlgrad's instruments
(bucket and term norms, reward-component geometry, layers, neurons) and say *why*. Every threshold is a field of
``Thresholds``: documented there, overridable from a YAML file (``--thresholds FILE``).
"""

from __future__ import annotations

import math
import statistics

from rlgrad import rundata as D
from rlgrad.doctor import forecasts, gradient, noise, progress, signatures, validation, verifier
from rlgrad.doctor.findings import (
    SEVERITY,
    SIGNATURES,
    Diagnosis,
    Finding,
    Thresholds,
    View,
    fmt,
    too_early,
)
from rlgrad.doctor.settings import kept_default, yaml_value
from rlgrad.metrics import TRAINER, declared, match
from rlgrad.metrics.judge import windows

# Every module that holds signatures, in the order they register (the order of docs/doctor.md's table and of the
# findings of one severity and step). A module of signatures is run only if it is listed here:
# tests/doctor/test_registry.py fails on a ``@signature`` in a module left off, or registered out of this order.
SIGNATURE_MODULES = (forecasts, gradient, noise, progress, signatures, validation, verifier)


def _needs_met(v: View, need: str) -> bool:
    for alt in need.split("|"):
        if "{" in alt:
            head = alt.split("{")[0]
            tail = alt.split("}")[-1]
            if any(k.startswith(head) and k.endswith(tail) for k in v.all_keys()):
                return True
        elif v.has(alt):
            return True
    return False


HOSTS = {"trl": "rlgrad.integrations.trl", "verl": "rlgrad.integrations.verl"}


def spelled(v: View, key: str) -> str:
    """A needed metric as the run's own trainer would log it (TRL: ``frac_reward_zero_std``), for ``--explain``;
    one only rlgrad's instruments log is named as theirs, with where they come from for that trainer."""
    if v.run.kind == "rlgrad":
        return key
    if v.run.kind == "trl" and key.startswith("reward/{component}/"):
        return "rewards/{reward function}/" + key.rsplit("/", 1)[1]
    own = v.name(key)
    if own != key or v.run.kind == "verl" and not key.startswith(("grad_norm/", "grad_comp/", "actor/neuron/")):
        return own
    if (m := match(key)) is not None and declared(m, "writer") == TRAINER:  # no instrument logs it: the loop does
        return (f"{key} (rlgrad train's own loop logs it; the {v.run.kind} run's trainer does not, with or without "
                "rlgrad's integration)")
    return f"{key} (rlgrad's instruments: {HOSTS.get(v.run.kind, 'rlgrad train')})"


def _scale(v: View) -> str:
    _, g = v.series("actor/grad_norm")
    if not g:
        return "The run logs no gradient norm."
    med = statistics.median(g)
    _, r = v.series("critic/score/mean")
    change = windows(r, Thresholds().window) if len(r) >= 4 else None
    trend = (f" Its reward {change.verb}: {fmt(change.before)} (first {change.window} steps) → {fmt(change.after)} "
             f"(last {change.window} steps)." if change else "")
    return (f"The median gradient norm is {fmt(med)}.{trend} Absolute gradient norms are not comparable across "
            "runs or frameworks: they scale with the model, the loss aggregation (token-mean vs sequence-mean), "
            "the advantage normalisation, the batch size and the share of zero-advantage groups. Small norms are "
            "not a fault while the reward and validation accuracy rise, the loss is stable and the clip fraction "
            "stays moderate (roughly 0.1-0.4, or 0 for on-policy updates).")


def diagnose(run: D.RunData, thresholds: Thresholds | None = None) -> Diagnosis:
    """Every signature on ``run``: findings most serious first, then by step."""
    thresholds = thresholds or Thresholds()
    view = View(run)
    findings: list[Finding] = []
    missing: dict[str, list[str]] = {}
    early: dict[str, tuple[int, int]] = {}
    for sid, needs, rule in SIGNATURES:
        lacking = [n for n in needs if not _needs_met(view, n)]
        if lacking:
            missing[sid] = list(dict.fromkeys(spelled(view, alt) for n in lacking for alt in n.split("|")))
            continue
        if (short := too_early(view, sid, thresholds)) is not None:
            early[sid] = short
            continue
        finding = rule(view, thresholds)
        if finding is not None:
            _note_kept_default(view, finding)
            findings.append(finding)
    if not any(f.severity in ("warn", "critical") for f in findings):
        checked = len(SIGNATURES) - len(missing) - len(early)
        findings.append(Finding(
            id="healthy", severity="info", step=None, confidence=0.6 if missing or early else 0.8,
            title="No sign of trouble" + (" yet" if early else ""),
            evidence=[f"{checked} of {len(SIGNATURES)} signatures checked"
                      + (f", {len(early)} too early to judge (too few steps)" if early else "")],
            explanation=("None of the checked signatures fired." if not findings else  # info findings did
                         "No checked signature fired as a warning or worse (an info finding is a note, not a fault).")
                        + (" Some could not be checked: see --explain." if missing else "")
                        + (f" Too early for {', '.join(early)}." if early else ""),
            action="Keep watching the reward, validation accuracy and KL."))
    findings = rank(findings)
    return Diagnosis(run=run.name, source=run.source, findings=findings, missing=missing, scale=_scale(view),
                     too_early=early)


def _note_kept_default(v: View, f: Finding) -> None:
    """A finding against a default rlgrad keeps on purpose (``doctor/settings.py``) says so. It stays a warning only
    where the run measured the harm the advice prevents (``Finding.harm``), and the evidence says which: a run that
    merely uses rlgrad's default is told it is a note, not that it did something wrong (``--explain`` says why)."""
    if (kept := kept_default(f.id, v.cfg)) is None:
        return
    default = (f"{kept.setting}={yaml_value(kept.default)} is rlgrad's default, kept against this advice: "
               f"{kept.reason.split('. ')[0]} (--explain says why)")
    if f.harm:
        f.evidence += [f"this run measured the harm: {f.harm}", default]
        return
    f.severity = "info"
    f.evidence += [default, f"this run measured no harm from it ({kept.harm}: not seen), so this is a note, "
                            "not a warning"]


def _order(f: Finding) -> tuple:
    return SEVERITY[f.severity], f.step if f.step is not None else math.inf


def _ancestors(f: Finding, by_id: dict[str, Finding]) -> list[Finding]:
    """``f``'s chain of causes, nearest first."""
    out: list[Finding] = []
    while f.cause and f.cause in by_id and all(by_id[f.cause] is not o for o in out):
        f = by_id[f.cause]
        out.append(f)
    return out


def _link_causes(findings: list[Finding]) -> None:
    """Each finding's cause: a fired finding whose evidence explains it (its ``explains`` names it) and which showed
    no later (a cause precedes its effect). Of several, the one the others follow from (a regulariser that explains
    both the large updates and the collapse is the collapse's cause), then the most serious and earliest. Never one
    of a finding's own effects (no cycle); repeated until no link changes."""
    by_id = {f.id: f for f in findings}
    for _ in range(len(findings)):
        changed = False
        for f in sorted(findings, key=lambda f: (f.step if f.step is not None else math.inf, SEVERITY[f.severity])):
            old, f.cause = f.cause, ""
            causes = [c for c in findings if c is not f and f.id in c.explains
                      and (c.step is None or f.step is None or c.step <= f.step)
                      and f not in [c, *_ancestors(c, by_id)]]
            deepest = [c for c in causes if not any(o in _ancestors(c, by_id) for o in causes)]
            f.cause = min(deepest, key=_order).id if deepest else ""
            changed |= f.cause != old
        if not changed:
            return


def rank(findings: list[Finding]) -> list[Finding]:
    """Most serious first, then by step; but a finding whose evidence explains others comes before them (each
    followed by what it explains, in the same order), with the most serious severity of what it explains; each
    explained finding names its cause and defers its advice to it."""
    by_id = {f.id: f for f in findings}
    _link_causes(findings)
    for f in findings:
        if f.cause:
            own = f.action[:1].lower() + f.action[1:] if f.action[1:2].islower() else f.action
            f.action = f"Act on {f.cause} first: it explains this. If it persists after that: {own}"
    for root in (f for f in findings if not f.cause):
        below = [g for g in findings if root in _ancestors(g, by_id)]
        root.severity = min([root.severity] + [g.severity for g in below], key=SEVERITY.get)

    def tree(f: Finding) -> list[Finding]:
        return [f] + [g for c in sorted((c for c in findings if c.cause == f.id), key=_order) for g in tree(c)]

    return [g for root in sorted((f for f in findings if not f.cause), key=_order) for g in tree(root)]
