"""Write docs/doctor.md's table of ``rlgrad doctor`` findings from the signature registry.

    python scripts/generate/doctor_table.py          # rewrites the tables between docs/doctor.md's markers
    python scripts/generate/doctor_table.py --check  # exit 1 if docs/doctor.md's tables are not the generated ones

Each row is a signature's registration (``@signature(id, ..., reads=..., fires=...)`` in
``rlgrad.doctor.signatures``, ``progress`` and ``gradient``), its thresholds filled in from ``Thresholds``
(``findings_table``); below it, each threshold's default and where it came from (``thresholds_table``, from
``THRESHOLD_SOURCES``). tests/doctor/test_doctor.py and test_unseen_runs.py check that docs/doctor.md holds them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import rlgrad.doctor.command  # noqa: F401  (registers every signature)
from rlgrad.doctor.findings import (
    README_END,
    README_START,
    THRESHOLDS_END,
    THRESHOLDS_START,
    findings_table,
    thresholds_table,
)

README = Path(__file__).resolve().parents[2] / "docs" / "doctor.md"  # the page the tables live on


def replaced(text: str, start: str, end: str, table: str) -> str:
    """``text`` with the block between the markers ``start`` and ``end`` made ``table``."""
    head, found, rest = text.partition(start)
    _, closed, tail = rest.partition(end)
    if not found or not closed:
        sys.exit(f"{README} lacks the markers {start.strip()} ... {end.strip()}")
    return head + start + "\n" + table + "\n" + end + tail


if __name__ == "__main__":
    text = README.read_text()
    new = replaced(text, README_START, README_END, findings_table())
    new = replaced(new, THRESHOLDS_START, THRESHOLDS_END, thresholds_table())
    if "--check" in sys.argv[1:]:
        sys.exit(0 if new == text else
                 "docs/doctor.md's findings or thresholds table is stale: python scripts/generate/doctor_table.py")
    README.write_text(new)
