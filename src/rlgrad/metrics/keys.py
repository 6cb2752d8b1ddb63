"""The catalogue: every metric group in document order, the keys they declare, and the lookups on them
(``key``, ``match``, ``parse``; ``declared`` and ``setting_of`` for what a group says of its keys).

Standard library only (and ``rlgrad.errors``), so anything may import it.
"""

from __future__ import annotations

import re
from functools import lru_cache

from rlgrad.metrics import instruments, loop
from rlgrad.metrics.entries import Group, Instrument, Metric
from rlgrad.metrics.fields import FIELD_SETTINGS, FIELDS

# Every group, in the order of docs/metrics.md: the loop's around the instruments' (its validation and timing last).
GROUPS: dict[str, Group] = {g.id: g for g in (
    loop.ROLLOUT, loop.AGENT, loop.FILTER, loop.REWARD, loop.ACTOR, loop.CRITIC_UPDATE, instruments.BUCKET_GROUP,
    instruments.PREFILTER_GROUP, instruments.PER_SAMPLE_GROUP, instruments.COMPONENT_GROUP, instruments.NEURON_GROUP,
    loop.VALIDATION_GROUP, loop.TIMING)}
CATALOGUE: tuple[Metric, ...] = tuple(m for g in GROUPS.values() for m in g.metrics)
# The instruments of rlgrad.analysis, each once (a group of its keys may share it: the buckets' prefilter group).
INSTRUMENTS: tuple[Instrument, ...] = tuple(dict.fromkeys(g.instrument for g in GROUPS.values() if g.instrument))

_FIELD_RE = {name: re.compile(rx) for name, rx in FIELDS.items()}
_BY_TEMPLATE: dict[str, Metric] = {}
for _m in CATALOGUE:
    if _m.template in _BY_TEMPLATE:
        raise ValueError(f"metric template {_m.template!r} is declared twice in rlgrad.metrics.CATALOGUE")
    _BY_TEMPLATE[_m.template] = _m
del _m


def _entry(template: str) -> Metric:
    m = _BY_TEMPLATE.get(template)
    if m is None:
        raise KeyError(f"metric template {template!r} is not in rlgrad.metrics.CATALOGUE; declare it there")
    return m


def key(template: str, **fields: str | int) -> str:
    """The concrete key of a catalogued ``template`` with its placeholders filled from ``fields``.

    ``KeyError`` (naming the template) if the template is not in :data:`CATALOGUE`; ``ValueError`` if a
    field is missing, not one of the template's, or its value does not match :data:`FIELDS`.
    """
    # The instruments fill the same few hundred keys every step (a regex check per field each): those of plain str
    # and int values are remembered. Only exact types, so True (== 1, the same hash) never finds 1's key and still
    # fails; an error is never remembered (lru_cache keeps no exception): it is raised at every call.
    if all(type(v) is str or type(v) is int for v in fields.values()):
        return _remembered(template, tuple(fields.items()))
    return _filled(template, fields)


@lru_cache(maxsize=8192)
def _remembered(template: str, fields: tuple[tuple[str, str | int], ...]) -> str:
    return _filled(template, dict(fields))


def _filled(template: str, fields: dict[str, str | int]) -> str:
    m = _entry(template)
    missing = [f for f in m.fields if f not in fields]
    extra = sorted(set(fields) - set(m.fields))
    if missing or extra:
        why = "; ".join(p for p in (missing and f"missing field(s) {', '.join(missing)}",
                                    extra and f"unknown field(s) {', '.join(extra)}") if p)
        raise ValueError(f"metric template {template!r}: {why}")
    values = {}
    for name in m.fields:
        v = fields[name]
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise ValueError(f"metric template {template!r}: field {name}={v!r} must be a str or an int")
        s = str(v)
        if not _FIELD_RE[name].fullmatch(s):
            raise ValueError(f"metric template {template!r}: field {name}={s!r} does not match "
                             f"{FIELDS[name]!r}")
        values[name] = s
    return template.format(**values)


@lru_cache(maxsize=8192)
def match(key: str) -> Metric | None:
    """The catalogue entry ``key`` is an instance of (the most specific one if several match), or None."""
    hits = [m for m in CATALOGUE if m.regex.fullmatch(key)]
    return max(hits, key=lambda m: m.specificity) if hits else None


def parse(template: str, key: str) -> dict[str, str] | None:
    """The field values of ``key`` under the catalogued ``template``; None if ``key`` is not its key.

    A key that a more specific template claims is not one (``grad_norm/all/sample_count`` is not a
    ``grad_norm/{bucket}/{term}`` key): :func:`match` decides. ``KeyError`` for an unknown template.
    """
    m = _entry(template)
    if match(key) is not m:
        return None
    return m.regex.fullmatch(key).groupdict()


def declared(m: Metric, what: str) -> str:
    """What the catalogue says of ``m``: its ``setting``, ``data`` or ``writer``, its own where it differs from its
    group, else its group's."""
    return getattr(m, what) or getattr(GROUPS[m.group], what)


class _Unfilled(dict):
    def __missing__(self, name: str) -> str:  # a template's placeholder stays a placeholder
        return "{" + name + "}"


def setting_of(name: str) -> str | None:
    """The setting that makes a run log ``name`` (a concrete key or a template), its fields filled in (``critic``
    neurons: the critic's settings, and what brings a critic); ``EVERY_STEP`` when none is needed; None for a key
    the catalogue does not declare."""
    m = match(name) or _BY_TEMPLATE.get(name)
    if m is None:
        return None
    found = m.regex.fullmatch(name)
    values = found.groupdict() if found else {}
    needs = [FIELD_SETTINGS[item] for item in values.items() if item in FIELD_SETTINGS]
    return declared(m, "setting").format_map(_Unfilled(values)) + "".join(f" ({n})" for n in needs)
