"""docs/benchmarks.md's "Pairs of steps on one batch" section against its stored raw output
(bench/results/i49/session8/: bench/always_on_cost.py --paired-batch runs, before and after, and paired.txt)."""

import re

from tests.conftest import REPO
from tests.helpers.benchmarks_page import paired_difference, run_figures, subsection

RESULTS = REPO / "bench" / "results" / "i49" / "session8"
HEADING = "### Pairs of steps on one batch"


def _section() -> str:
    return subsection(HEADING)


def test_every_row_is_its_raw_output_and_its_verdict_its_target():
    """Each row shows its run's source and figures; its verdict says "met" exactly where the figure its target reads
    (the task-term instruments: 1 + instruments / plain update by pairs within 1.15; the always-on setting: the total
    within 1.5) is within it; every stored run has its row."""
    rows = [line for line in _section().splitlines() if line.startswith("| ") and "session8/" in line]
    assert len(rows) == 10
    for row in rows:
        cells = [c.strip().replace("**", "") for c in row.strip("|").split("|")]
        name = re.search(r"session8/(\w+\.txt)", cells[0])[1]
        got = run_figures((RESULTS / name).read_text())
        assert cells[1:6] == [got["src"], got["pairs"], got["timers"], got["median"], got["total"]], row
        met = float(got["total"]) <= 1.5 if name.startswith("always") else float(got["pairs"].split()[0]) <= 1.15
        assert cells[6].endswith("not met") != met, row
    stored = sorted(p.name for p in RESULTS.glob("*_r*.txt"))
    assert [n for n in stored if f"session8/{n})" not in _section()] == []


def test_the_paired_differences_quoted_are_those_stored():
    """The text's after - base differences are paired.txt's lines (paired.py's output)."""
    section = " ".join(_section().split())
    stored = (RESULTS / "paired.txt").read_text()
    for setting, pairs in (("task60", 180), ("always_on", 60)):
        assert paired_difference(stored, setting, pairs) in section, setting
    for setting in ("task", "task60"):
        line = re.search(rf"^mid {setting}: mid - base .*? median ([-+0-9.]+) (\[[^]]+\])", stored, re.M)
        assert f"{line[1]} {line[2]}" in section, setting
