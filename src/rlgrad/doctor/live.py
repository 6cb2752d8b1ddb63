"""The doctor while a run trains: the signatures on the run's own metric history after each step, each new finding
said once (one console line) and appended to ``RUN/doctor.jsonl``, and whether the run should halt
(``doctor.halt_on``). The loops call it through one hook (``rlgrad.doctor.hook.DoctorHook``); this module reads and
writes run files only.

Its cost stays under ``budget`` (1%) of the training time: each step earns ``budget`` × its time, and a diagnosis
of the whole history (whose cost grows with the history) runs only when the steps earned what the last one cost;
otherwise the step is skipped (a finding then shows a few steps later; doctor.jsonl counts the steps skipped).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from rlgrad import rundata as D
from rlgrad.doctor.diagnose import diagnose
from rlgrad.doctor.findings import Diagnosis, Finding, Thresholds, at_or_above
from rlgrad.runfiles import DOCTOR_FILE, METRICS_FILE


def halts(finding: Finding, halt_on: str) -> bool:
    """Whether ``finding`` stops a run under ``doctor.halt_on`` (never | warn | critical)."""
    return at_or_above(finding.severity, halt_on)


def one_line(step: int, f: Finding) -> str:
    """A finding on one console line: severity, id, title, first step, what to do."""
    since = f" (from step {f.step})" if f.step is not None and f.step != step else ""
    return f"[doctor] step {step}: {f.severity.upper()} {f.id}: {f.title}{since}. Do: {f.action}"


class LiveDoctor:
    """The doctor of one run as it trains. ``observe(step, metrics)`` after each step: the new findings."""

    def __init__(self, run_dir: Path | None, config: dict | None = None, *, kind: str = "rlgrad",
                 settings: dict | None = None, thresholds: Thresholds | None = None, is_main: bool = True,
                 say: Callable[[str], None] = print, budget: float = 0.01):
        self.run = D.RunData(name=run_dir.name if run_dir else "run", source=str(run_dir or ""), rows={},
                             config=config, run_dir=run_dir, kind=kind, settings=dict(settings or {}))
        self.thresholds = thresholds or Thresholds()
        self.is_main, self.say, self.budget = is_main, say, budget
        self.said: set[tuple[str, str]] = set()  # (finding, severity) already said: a worse severity is new
        self.cost = 0.0  # seconds the diagnoses took
        self.credit = 0.0  # seconds of diagnosis the steps so far paid for (budget × their time) and not spent
        self.skipped = 0
        self.last_spent = 0.0  # the last diagnosis's cost: the one that may overdraw the budget
        self.started = False

    def _resume(self, step: int) -> None:
        """At the first step it sees: a resumed run's history before ``step`` (metrics.jsonl; the trainer dropped
        the rows after its checkpoint) and the findings it already said (doctor.jsonl)."""
        self.started = True
        d = self.run.run_dir
        if d is None:
            return
        if (d / METRICS_FILE).is_file():
            old = D.load_run(d)
            self.run.rows = {s: m for s, m in old.rows.items() if s < step}
            self.run.nonfinite = {s: k for s, k in old.nonfinite.items() if s < step}
        if (d / DOCTOR_FILE).is_file():
            for line in (d / DOCTOR_FILE).read_text().splitlines():
                try:
                    row = json.loads(line)
                    self.said.add((row["finding"], row["severity"]))
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut by a crash

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Add a step's metrics to the history (non-finite values as the readers of run files keep them)."""
        row = self.run.rows.setdefault(step, {})
        for k, v in metrics.items():
            if isinstance(v, int | float) and math.isfinite(v):
                row[k] = float(v)
            elif isinstance(v, float):
                self.run.nonfinite.setdefault(step, []).append(k)

    def observe(self, step: int, metrics: dict[str, float], step_seconds: float = 0.0) -> list[Finding]:
        """Record the step and, unless the cost budget says to skip it, diagnose the history: the findings not said
        before, said now (console, doctor.jsonl)."""
        if not self.started:
            self._resume(step)
        self.record(step, metrics)
        self.credit += self.budget * step_seconds
        if self.credit < self.last_spent:  # the next diagnosis would cost about the last one: not yet paid for
            self.skipped += 1
            return []
        t0 = time.perf_counter()
        found = diagnose(self.run, self.thresholds).findings
        spent = time.perf_counter() - t0
        self.cost += spent
        self.credit -= spent
        self.last_spent = spent
        new = [f for f in found if f.id != "healthy" and (f.id, f.severity) not in self.said]
        for f in new:
            self.said.add((f.id, f.severity))
            if self.is_main:
                self.say(one_line(step, f))
                self._append(step, f)
        return new

    def finish(self, run: D.RunData | None = None) -> Diagnosis | None:
        """At the run's end: the whole history (or ``run``, a follower's fresh read of the run) diagnosed once more,
        no step skipped, as ``rlgrad doctor RUN`` diagnoses it afterwards; one line says what holds at the end and
        which findings said during the run no longer do (a plateau that the later steps lifted). doctor.jsonl keeps
        what was said as the run went. None before any step."""
        run = run or self.run
        if not run.rows:
            return None
        dx = diagnose(run, self.thresholds)
        gone = sorted({finding for finding, _ in self.said} - {f.id for f in dx.findings})
        if self.is_main:
            where = str(run.run_dir) if run.run_dir else run.source or "RUN"
            self.say(final_line(max(run.rows), dx.findings, gone, where))
        return dx

    def _append(self, step: int, f: Finding) -> None:
        if self.run.run_dir is None:
            return
        row = {"step": step, "finding": f.id, "severity": f.severity, "first_step": f.step, "title": f.title,
               "evidence": f.evidence, "action": f.action, "cause": f.cause, "confidence": f.confidence,
               "skipped_steps": self.skipped}
        with open(self.run.run_dir / DOCTOR_FILE, "a") as out:
            out.write(json.dumps(row) + "\n")


def final_line(step: int, findings: list[Finding], gone: list[str], where: str = "RUN") -> str:
    """The live doctor's last line: the findings that hold at the end (those ``rlgrad doctor`` lists), and the ones
    said earlier that no longer hold."""
    held = [f"{f.severity.upper()} {f.id}" for f in findings if f.id != "healthy"]
    news = "; ".join(held) if held else "no sign of trouble"
    later = f"; no longer holding: {', '.join(gone)}" if gone else ""
    return f"[doctor] end of run, step {step}: {news}{later} (in full: rlgrad doctor {where})"


RESUME = {"rlgrad": "the same rlgrad train command resumes from the checkpoint of step {step}",
          "trl": "trainer.train(resume_from_checkpoint=True) resumes from TRL's checkpoint-{step}",
          "verl": "the same python -m rlgrad.integrations.verl_main command resumes from verl's global_step_{step} "
                  "(trainer.resume_mode=auto, verl's default)"}
SAMPLES = ("rlgrad", "trl")  # the trainers whose runs keep their rollouts in the run directory (rlgrad samples)


def halt_message(step: int, f: Finding, run_dir: Path | None, kind: str = "rlgrad") -> str:
    """What a halted run prints: the finding, and the commands that inspect and resume it (by its trainer)."""
    where = str(run_dir) if run_dir else "RUN"
    samples = f"; rlgrad samples {where} --step {step}" if kind in SAMPLES else ""
    return (f"{f.severity} finding {f.id} at step {step}: {f.title}. {f.action} Inspect: rlgrad doctor {where}"
            f"{samples}. Resume: {RESUME.get(kind, RESUME['rlgrad']).format(step=step)} "
            "(with doctor.halt_on=never to go on past this finding)")
