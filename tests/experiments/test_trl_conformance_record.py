"""docs/trl_conformance.md's 2026-12-06 tables and claims against the stored records of
scripts/checks/trl_conformance.py (bench/results/trl_conformance/)."""

import json
import re

import pytest

from tests.conftest import REPO

RESULTS = REPO / "bench" / "results" / "trl_conformance"
DOC = REPO / "docs" / "trl_conformance.md"
SECTION = "### 2026-12-06"
TRAINERS = {"TRL's `GRPOTrainer`": "trl", "rlgrad's subclass": "rlgrad"}


def section() -> str:
    text = DOC.read_text()
    start = text.index(SECTION)
    return text[start:text.index("\n### ", start + 1)]


def tables(text: str) -> list[dict[str, tuple[int, int, int, int, int]]]:
    """Each table of the section: trainer -> (passed, failed, skipped, deselected, wall seconds)."""
    found, rows = [], {}
    for line in text.splitlines() + [""]:
        m = re.match(r"^\| (.+?) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) s \|$", line)
        if m:
            rows[TRAINERS[m[1]]] = tuple(int(m[i]) for i in range(2, 7))
        elif rows:
            found.append(rows)
            rows = {}
    return found


@pytest.mark.parametrize("name, index", [("subset", 0), ("full", 1)])
def test_the_tables_are_the_stored_summaries(name, index):
    summary = json.loads((RESULTS / f"{name}_2026-12-06_summary.json").read_text())
    table = tables(section())[index]
    for trainer, (passed, failed, skipped, deselected, seconds) in table.items():
        counts = summary[trainer]["counts"]
        assert (counts["passed"], counts["failed"] + counts["error"], counts["skipped"], counts["deselected"]) == (
            passed, failed, skipped, deselected), (name, trainer)
        assert round(summary[trainer]["seconds"]) == seconds, (name, trainer)
    # the record's first line is its command, with the same subset
    raw = (RESULTS / f"{name}_2026-12-06.txt").read_text().splitlines()
    assert "scripts/checks/trl_conformance.py" in raw[0]
    assert (summary["subset"] is None) == (" -k " not in raw[0])


@pytest.mark.parametrize("name, refused", [("subset", 3), ("full", 6)])
def test_no_regressions_and_only_documented_refusals(name, refused):
    summary = json.loads((RESULTS / f"{name}_2026-12-06_summary.json").read_text())
    assert summary["regressions"] == {}
    assert len(summary["refusals"]) == refused
    assert all(m.startswith("rlgrad refusal: ") for m in summary["refusals"].values())
    text = section()
    for test in summary["refusals"]:  # each refused test is named in the section
        base = test.rsplit("::", 1)[1]
        assert base in text or re.sub(r"^.*?(\[.*\])$", r"\1", base) in text, base


def test_the_ride_counts_are_the_probes():
    rows = [line.split(" | ") for line in (RESULTS / "ride_probe_2026-12-06.txt").read_text().splitlines()
            if not line.startswith("#") and " | " in line and "pytest" not in line]
    passed = [r for r in rows if r[1] == "passed"]
    rode = [r for r in passed if int(r[3]) > 0]
    m = re.search(r"finds (\d+) of the subclass's (\d+) passing tests riding", section())
    assert m and (int(m[1]), int(m[2])) == (len(rode), len(passed))
    assert f"The other {len(passed) - len(rode)} pass without riding" in section()
    ridden = {r[0] for r in rode}
    assert "test_train_peft_with_gradient_checkpointing" in ridden and "test_train_beta_non_zero" not in ridden
