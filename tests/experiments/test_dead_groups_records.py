"""docs/benchmarks.md's "Zero-variance groups not read" section against its stored raw output
(bench/results/i49/dead_groups/: bench/always_on_cost.py runs, before and after, and their bootstrap intervals)."""

import re

from tests.conftest import REPO
from tests.helpers.benchmarks_page import subsection

RESULTS = REPO / "bench" / "results" / "i49" / "dead_groups"
HEADING = "### Zero-variance groups not read"


def _section() -> str:
    return subsection(HEADING)


def _figures(path) -> tuple[float, float, float]:
    """A run's median-pair ratio, total ratio and 1 + instruments / plain update, as the bench printed them."""
    text = path.read_text()
    ratio = float(re.search(r"^ratio=([0-9.]+)", text, re.M)[1])
    total = float(re.search(r"^total with / total without = ([0-9.]+)", text, re.M)[1])
    update = float(re.search(r"1 \+ instruments / plain update = ([0-9.]+)", text)[1])
    return ratio, total, update


def _intervals() -> dict[str, tuple[str, str]]:
    """intervals.txt: file name -> (median pair's interval, total's), as printed."""
    out = {}
    for line in (RESULTS / "intervals.txt").read_text().splitlines():
        if m := re.match(r"(\S+\.txt): \d+ pairs; median pair [0-9.]+ (\[[^]]+\]); total [0-9.]+ (\[[^]]+\])", line):
            out[m[1]] = (m[2], m[3])
    return out


def test_every_row_is_its_raw_output_and_its_verdict_its_target():
    """Each row shows its run's median pair and total (2 decimals) with their intervals, and 1 + instruments / plain
    update; its verdict says "met" exactly where the figure its target reads (the always-on setting: the total
    within 1.5; the task-term instruments: 1 + instruments / plain update within 1.15) is within it."""
    intervals = _intervals()
    rows = [line for line in _section().splitlines() if line.startswith("| ") and "dead_groups/" in line]
    assert len(rows) >= 8
    for row in rows:
        cells = [c.strip().replace("**", "") for c in row.strip("|").split("|")]
        name = re.search(r"dead_groups/(\w+\.txt)", cells[0])[1]
        ratio, total, update = _figures(RESULTS / name)
        median_ci, total_ci = intervals[name]
        assert cells[2] == f"{ratio:.2f} {median_ci}" and cells[3] == f"{total:.2f} {total_ci}", row
        assert cells[4] == f"{update:.2f}", row
        met = total <= 1.5 if "always" in name else update <= 1.15
        assert cells[5].endswith("not met") != met, row
    stored = sorted(p.name for p in RESULTS.glob("*.txt") if p.name != "intervals.txt")
    assert [n for n in stored if f"dead_groups/{n})" not in _section()] == []


def test_the_by_change_ranges_are_the_stored_runs():
    """The text's ranges for each change (median pair and total, lowest-highest) are those of its two runs."""
    section = " ".join(_section().split())

    def span(names: list[str], k: int) -> str:
        values = sorted(f"{_figures(RESULTS / 'by_change' / n)[k]:.2f}" for n in names)
        return values[0] if values[0] == values[-1] else f"{values[0]}-{values[-1]}"

    for names, before in ((["after_1.txt", "after_2.txt"], "with the first two changes"),
                          (["dead_3.txt", "dead_4.txt"], "with the third")):
        assert f"{span(names, 0)} and {span(names, 1)} {before}" in section, names
    assert f"{span(['base_1.txt', 'base_2.txt'], 0)} by the median pair and {span(['base_1.txt', 'base_2.txt'], 1)} " \
           "in total before" in section
    assert f"against {span(['base_3.txt', 'base_4.txt'], 0)} and {span(['base_3.txt', 'base_4.txt'], 1)}" in section
