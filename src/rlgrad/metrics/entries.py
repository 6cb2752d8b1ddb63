"""What the catalogue is made of: a ``Metric`` (one key template and its meaning), a ``Group`` (the keys one writer
logs, with the setting that turns it on, what they are measured on and the run files it writes) and an
``Instrument`` (a measurement of ``rlgrad.analysis`` run at the steps of its schedule).

Standard library only, so anything may import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from rlgrad.metrics.fields import FIELDS, PLACEHOLDER

# What a value is measured on: the words of a group's ``data`` (and of the JSON's), each with its meaning.
DATA: dict[str, str] = {
    "train_rollout": "the step's sampled training responses (or agent episodes), before the rollout filter",
    "train_batch": "the step's kept training batch, as the update sees it",
    "update": "the optimizer update of the step (a mean over its optimizer steps unless the meaning says otherwise)",
    "analysis": "a gradient-analysis pass on the step's training batch, before the update, with no optimizer step; "
                "only at the instrument's analysis steps",
    "validation": "held-out validation examples or episodes, with the weights after the step's update",
    "wall_clock": "seconds of wall-clock time",
    "event": "an event of the training loop",
    "table": "a table (W&B), not a scalar of metrics.jsonl",
}
# A group's setting when no setting is needed: every training step of rlgrad's trainer logs its keys (another
# trainer may not: the doctor then has nothing to advise).
EVERY_STEP = "every training step"
TRAINER = "trainer"  # the writer of the training loop's keys: rlgrad's trainer, or the host trainer (TRL, verl)

_LITERAL = re.compile(r"[A-Za-z0-9_/]*")


@dataclass(frozen=True)
class Metric:
    """One logged key: its template (``{field}`` placeholders from ``FIELDS``) and its meaning. ``setting``,
    ``data`` and ``writer`` are left empty where the key's group says them; a key that differs from its group
    says its own."""

    template: str
    meaning: str
    group: str = ""  # the id of its Group (set by the group)
    setting: str = ""
    data: str = ""
    writer: str = ""
    fields: tuple[str, ...] = field(init=False, repr=False, compare=False)
    regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = tuple(PLACEHOLDER.findall(self.template))
        unknown = [n for n in names if n not in FIELDS]
        if unknown:
            raise ValueError(f"metric template {self.template!r}: placeholder(s) {', '.join(unknown)} not in "
                             f"rlgrad.metrics.FIELDS ({', '.join(FIELDS)})")
        if len(set(names)) != len(names):
            raise ValueError(f"metric template {self.template!r} repeats a placeholder")
        literals = PLACEHOLDER.split(self.template)[::2]
        if not all(_LITERAL.fullmatch(p) for p in literals):
            raise ValueError(f"metric template {self.template!r}: only letters, digits, '_', '/' and "
                             "{field} placeholders are allowed")
        if self.data and self.data not in DATA:
            raise ValueError(f"metric template {self.template!r}: data {self.data!r} is not one of {', '.join(DATA)}")
        parts = PLACEHOLDER.split(self.template)
        rx = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>{FIELDS[p]})" for i, p in enumerate(parts))
        object.__setattr__(self, "fields", names)
        object.__setattr__(self, "regex", re.compile(rx))

    @property
    def specificity(self) -> tuple[int, int]:
        """More literal characters, then fewer placeholders: the more specific of two matching templates."""
        return len(PLACEHOLDER.sub("", self.template)), -len(self.fields)


@dataclass(frozen=True)
class Instrument:
    """A measurement of ``rlgrad.analysis``, run by its hook at the steps of its schedule. Its hook's plumbing
    (``rlgrad.analysis.instrument``) reads its timing key and the files it may write here."""

    name: str  # as the report's table of when each instrument ran names it
    section: str  # its config section, which is also the writer of its keys: analysis.buckets
    schedule: str  # its key in rlgrad.config.schedule.schedules(cfg) ({role}: one schedule per trained model)
    every: str  # the setting of its cadence, as the report names it
    timing: str  # the template of its timing key: the seconds it took at a step (declared in its group)


@dataclass(frozen=True)
class Group:
    """The keys one writer logs, documented together (a table of docs/metrics.md): the training loop's, or an
    instrument's (``instrument``). ``setting``: what makes a run log them (``EVERY_STEP``: nothing); ``data``: what
    they are measured on (a word of ``DATA``); ``files``: the run files the writer writes with them, RUN-relative
    (``analysis/step_N/layers.json``). ``metrics``: ``(template, meaning)`` pairs, or ``Metric`` where a key
    differs from its group; each gets the group's id."""

    id: str
    title: str
    note: str
    setting: str
    data: str
    metrics: tuple[Metric | tuple[str, str], ...]
    files: tuple[str, ...] = ()
    instrument: Instrument | None = None
    writer: str = TRAINER  # an instrument's group: its config section

    def __post_init__(self) -> None:
        if not self.setting or self.data not in DATA:
            raise ValueError(f"metric group {self.id!r} needs a setting and data among {', '.join(DATA)}")
        if self.instrument is not None:
            object.__setattr__(self, "writer", self.instrument.section)
        metrics = tuple(replace(m, group=self.id) if isinstance(m, Metric) else Metric(*m, group=self.id)
                        for m in self.metrics)
        object.__setattr__(self, "metrics", metrics)
