"""The catalogue of every metric key rlgrad logs, grouped by what writes it, and the facts each group declares.

The rule: every key the project logs (to ``metrics.jsonl`` and the other sinks, W&B tables included) is declared
ONCE, in a group, as a template such as ``grad_norm/{bucket}/{term}`` whose ``{field}`` placeholders match the
regexes of :data:`FIELDS`, with a one-line meaning. Code that writes a key builds it with the literal template,

    metrics[key("grad_norm/{bucket}/{term}", bucket=b, term=t)] = norm

so that one search for the template finds both its meaning and the lines that write it; the reverse, from a
concrete key to its entry, is :func:`match`, and :func:`parse` reads the field values back out of a key.

A group (``Group``) names its writer (the training loop, or an ``Instrument`` of ``rlgrad.analysis``), the setting
that makes a run log its keys, what they are measured on and the run files the writer writes. Derived from the
groups, never written a second time: ``rlgrad doctor --explain``'s settings (``setting_of``), the report's table
of when each instrument ran (``INSTRUMENTS``), each instrument hook's timing key and files
(``rlgrad.analysis.instrument``), the JSON for other tools and ``docs/metrics.md`` (``rlgrad.metrics.export``:
regenerate the page with ``rlgrad metrics --format markdown > docs/metrics.md`` after changing the catalogue).

The modules: ``fields`` (the placeholders), ``entries`` (``Metric``, ``Group``, ``Instrument``), ``loop`` and
``instruments`` (the groups), ``keys`` (the catalogue in order and its lookups), ``foreign`` (other tools' names),
``export`` (JSON and Markdown). Only the standard library, ``rlgrad.errors`` and ``rlgrad.runfiles`` below it.
"""

from rlgrad.metrics.entries import DATA, EVERY_STEP, TRAINER, Group, Instrument, Metric
from rlgrad.metrics.export import (
    FORMAT,
    FORMAT_VERSION,
    RUN_FILE,
    UNITS,
    catalogue,
    docs_page,
    entry,
    export_markdown,
    foreign_markdown,
    markdown,
    to_json,
    write_run_catalogue,
)
from rlgrad.metrics.fields import (
    FIELD_MEANINGS,
    FIELD_SETTINGS,
    FIELDS,
    PLACEHOLDER,
    RESERVED_COMPONENTS,
    component_keys,
    layer_group,
)
from rlgrad.metrics.foreign import (
    FOREIGN_NAMES,
    FOREIGN_NOTES,
    OPENRLHF_NAMES,
    RLDOCTOR_NAMES,
    TRL_NAMES,
    foreign_key,
    own_key,
    trl_key,
    trl_reward_name,
)
from rlgrad.metrics.instruments import BUCKETS, COMPONENTS, NEURONS, PER_SAMPLE
from rlgrad.metrics.keys import CATALOGUE, GROUPS, INSTRUMENTS, declared, key, match, parse, setting_of

__all__ = [
    "BUCKETS", "CATALOGUE", "COMPONENTS", "DATA", "EVERY_STEP", "FIELDS", "FIELD_MEANINGS", "FIELD_SETTINGS",
    "FOREIGN_NAMES", "FOREIGN_NOTES", "FORMAT", "FORMAT_VERSION", "GROUPS", "INSTRUMENTS", "NEURONS", "OPENRLHF_NAMES",
    "PER_SAMPLE", "PLACEHOLDER", "RESERVED_COMPONENTS", "RLDOCTOR_NAMES", "RUN_FILE", "TRAINER", "TRL_NAMES", "UNITS",
    "Group", "Instrument", "Metric", "catalogue", "component_keys", "declared", "docs_page", "entry",
    "export_markdown", "foreign_key", "foreign_markdown", "key", "layer_group", "markdown", "match", "own_key",
    "parse", "setting_of", "to_json", "trl_key", "trl_reward_name", "write_run_catalogue",
]
