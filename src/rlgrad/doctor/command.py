"""``rlgrad doctor``, the command line: a run's diagnosis as text or JSON (``doctor/diagnose.py`` is the engine), its
exit status by ``--fail-on``, and ``--follow`` (``doctor/follow.py``) for a run being written."""

from __future__ import annotations

import json

from rlgrad import rundata as D
from rlgrad.doctor.diagnose import diagnose
from rlgrad.doctor.findings import Diagnosis, Thresholds, at_or_above
from rlgrad.doctor.settings import KEPT_DEFAULTS, producing_settings, yaml_value
from rlgrad.errors import UserError


def render_text(d: Diagnosis, explain: bool = False) -> str:
    out = [f"rlgrad doctor: {d.run} ({d.source})", ""]
    for f in d.findings:
        at = f" from step {f.step}" if f.step is not None else ""
        out.append(f"[{f.severity.upper()}] {f.id}: {f.title}{at} (confidence {f.confidence:.1f})")
        explained = [g.id for g in d.findings if g.cause == f.id]
        if explained:
            out.append(f"    explains: {', '.join(explained)}")
        if f.cause:
            out.append(f"    cause: {f.cause} (above)")
        out += [f"    evidence: {e}" for e in f.evidence]
        out.append(f"    why: {f.explanation}")
        out.append(f"    do: {f.action}")
        out.append("")
    if d.too_early:
        out.append("Too early to judge: " + ", ".join(f"{sid} ({have} of the {need} steps it needs)"
                                                     for sid, (have, need) in d.too_early.items()))
    out.append(f"Gradient scale: {d.scale}")
    if explain and d.missing:
        out += ["", "Not checked (the run lacks the metrics):"]
        out += [f"    {sid}: needs {' or '.join(keys)}"
                + (f"; logged with {' | '.join(made)}" if (made := producing_settings(keys)) else "")
                for sid, keys in d.missing.items()]
    if explain:
        out += ["", "Defaults kept against the doctor's advice:"]
        out += [f"    {k.setting}={yaml_value(k.default)} ({k.finding}): {k.reason}" for k in KEPT_DEFAULTS]
    elif d.missing:
        out.append(f"({len(d.missing)} signatures not checked for lack of metrics: --explain lists them)")
    return "\n".join(out) + "\n"


def fails(d: Diagnosis, fail_on: str) -> bool:
    """Whether ``d`` holds a finding at or above ``fail_on`` (warn | critical; never: no)."""
    return any(at_or_above(f.severity, fail_on) for f in d.findings)


def doctor_command(run: str | None, wandb_path: str | None = None, as_json: bool = False,
                   explain: bool = False, thresholds: str | None = None, fail_on: str = "critical") -> int:
    """Print the diagnosis (text, or JSON with ``as_json``); exit status 1 when a finding is at or above
    ``fail_on`` (critical by default; ``--fail-on warn`` for CI that stops at warnings)."""
    t = Thresholds.from_file(thresholds) if thresholds else Thresholds()
    d = diagnose(D.load_any(run, wandb_path), t)
    print(json.dumps(d.to_json(), indent=2) if as_json else render_text(d, explain), end="\n" if as_json else "")
    return 1 if fails(d, fail_on) else 0


def follow_command(run: str | None, thresholds: str | None = None, fail_on: str = "critical",
                   interval: float = 2.0) -> int:
    """``--follow``: the findings of a run being written, as they appear (``rlgrad.doctor.follow``); the exit
    status as without it, from the most serious finding said; Ctrl-C ends it (status 130)."""
    from rlgrad.doctor.follow import follow

    if run is None:
        raise UserError("--follow needs a run: a run directory, a TRL output directory or a log file")
    if not interval > 0:
        raise UserError(f"--interval must be a positive number of seconds, got {interval}")
    t = Thresholds.from_file(thresholds) if thresholds else Thresholds()
    try:
        worst = follow(run, t, interval)
    except KeyboardInterrupt:
        return 130
    return 1 if worst and at_or_above(worst, fail_on) else 0
