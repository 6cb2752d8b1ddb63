"""``doctor.*``: the live doctor inside a training loop (rlgrad's trainer, rlgrad's TRL and verl integrations): the
doctor's signatures on the run's own metrics after every step, new findings printed and appended to
``RUN/doctor.jsonl``, and, if asked, the run stopped at the end of the step a finding appears at. Part of the config
schema; the field docs are the user documentation.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlgrad.config.fields import setting as _f

HALT_ON = ("never", "warn", "critical")


@dataclass
class DoctorConfig:
    live: bool = _f(True, "Run rlgrad doctor's signatures on the run's metrics after each step: each new finding "
                    "printed once on its own line and appended to RUN/doctor.jsonl (step, finding, evidence). Its "
                    "cost is timing_s/doctor, kept under 1% of the step time by skipping steps when it would not be.")
    halt_on: str = _f("never", "Stop the run at the end of the step where a finding of this severity or worse appears "
                      "(never | warn | critical): it saves a checkpoint, prints the finding and the commands that "
                      "resume or inspect the run, and rlgrad train (or python -m rlgrad.integrations.verl_main) "
                      "exits with status 3 (stopped by the doctor).",
                      choices=HALT_ON)
    thresholds: str | None = _f(None, "A YAML file overriding the doctor's thresholds (as rlgrad doctor "
                                "--thresholds).")
