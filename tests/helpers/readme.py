"""The README and the reference pages it links, read as one document in reading order (tests/test_readme.py runs
their commands in this order: a page's commands may use what an earlier page's left)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PAGES = ("README.md", "docs/training.md", "docs/instruments.md", "docs/real_model.md", "docs/integrations.md",
         "docs/runs.md", "docs/doctor.md")


def pages_text() -> str:
    return "\n".join((REPO / page).read_text() for page in PAGES)
