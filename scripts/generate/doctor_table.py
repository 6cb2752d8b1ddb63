"""Write docs/doctor.md's table of ``rlgrad doctor`` findings from the signature registry.

    python scripts/generate/doctor_table.py          # rewrites the table between docs/doctor.md's markers
    python scripts/generate/doctor_table.py --check  # exit 1 if docs/doctor.md's table is not the generated one

Each row is a signature's registration (``@signature(id, ..., reads=..., fires=...)`` in
``rlgrad.doctor.signatures``, ``progress`` and ``gradient``), its thresholds filled in from ``Thresholds``
(``findings_table``); tests/doctor/test_doctor.py checks that docs/doctor.md holds exactly this table.
"""

from __future__ import annotations

import sys
from pathlib import Path

import rlgrad.doctor.command  # noqa: F401  (registers every signature)
from rlgrad.doctor.findings import README_END, README_START, findings_table

README = Path(__file__).resolve().parents[2] / "docs" / "doctor.md"  # the page the table lives on

if __name__ == "__main__":
    text = README.read_text()
    head, start, rest = text.partition(README_START)
    _, end, tail = rest.partition(README_END)
    if not start or not end:
        sys.exit(f"{README} lacks the markers {README_START.strip()} ... {README_END.strip()}")
    new = head + README_START + "\n" + findings_table() + "\n" + README_END + tail
    if "--check" in sys.argv[1:]:
        sys.exit(0 if new == text else
                 "docs/doctor.md's findings table is stale: python scripts/generate/doctor_table.py")
    README.write_text(new)
