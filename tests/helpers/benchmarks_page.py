"""docs/benchmarks.md read by section, for the tests that hold a section to its stored records."""

from __future__ import annotations

import re

from tests.conftest import REPO


def subsection(heading: str) -> str:
    """The ``### `` section of docs/benchmarks.md that begins with ``heading``, up to the next one."""
    page = (REPO / "docs" / "benchmarks.md").read_text()
    section = page[page.index(heading):]
    return section[:section.index("\n### ", 1)]


def paired_difference(stored: str, setting: str, pairs: int, other: str = "after", base: str = "base") -> str:
    """``median [low, high]`` of ``other`` - ``base`` for ``setting`` over ``pairs`` pairs, as a paired.py output
    (session 8's and later) ``stored`` prints it."""
    found = re.search(rf"^\S* {setting}: {other} - {base} .*? median ([-+0-9.]+) (\[[^]]+\]) over {pairs} pairs",
                      stored, re.M)
    return f"{found[1]} {found[2]}"
