"""docs/benchmarks.md read by section, for the tests that hold a section to its stored records."""

from __future__ import annotations

from tests.conftest import REPO


def subsection(heading: str) -> str:
    """The ``### `` section of docs/benchmarks.md that begins with ``heading``, up to the next one."""
    page = (REPO / "docs" / "benchmarks.md").read_text()
    section = page[page.index(heading):]
    return section[:section.index("\n### ", 1)]
