"""How a setting of the config schema is declared: its default, its documentation and what it accepts.

``rlgrad.config`` checks every field against its declaration (``check_field``); the sections that live next to
their subject (``config/agent.py``: the environments) declare theirs the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


def setting(default: Any = dataclasses.MISSING, help: str = "", choices: tuple | None = None, *,
            ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None,
            also: tuple = (), why: str = "", **kw):
    """A setting: its default, its documentation, and what it accepts (checked by ``validate`` for every field):
    ``choices``, or bounds ``ge`` / ``gt`` / ``le`` / ``lt`` (a number must also be finite), ``also`` values
    allowed outside them (``-1``: "off"), ``why`` the reason shown with a refusal."""
    meta = {"help": help, "bounds": {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt))
                                     if v is not None}, "also": also, "why": why}
    if choices:
        meta["choices"] = choices
    if default is not dataclasses.MISSING and isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)
