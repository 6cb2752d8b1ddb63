"""docs/benchmarks.md's "The riding pass's arithmetic floor" section against its stored raw output
(bench/results/i49/session9/: floor.py's two runs)."""

import re

import pytest

from tests.conftest import REPO
from tests.helpers.benchmarks_page import subsection

RESULTS = REPO / "bench" / "results" / "i49" / "session9"
RUNS = ("floor.txt", "floor_r2.txt")


def _section() -> str:
    return subsection("### The riding pass's arithmetic floor")


def _figures(text: str) -> dict[str, str]:
    """A run's figures as the section writes them."""
    def ms(pattern: str) -> str:
        return f"{float(re.search(pattern, text)[1]):.1f} ms"

    floor = re.search(r"the floor: ([-+0-9.]+) ms = ([-+0-9.]+) of a plain update", text)
    return {"plain": ms(r"plain update \(median\): ([0-9.]+) ms"), "riding": ms(r"riding update: ([0-9.]+) ms"),
            "hooks": ms(r"as run: ([0-9.]+) ms a step"), "needed": ms(r"cannot leave out: ([0-9.]+) ms"),
            "saved": ms(r"autograd is spared: ([0-9.]+) ms"),
            "floor": f"{float(floor[1]):.1f} ms, {float(floor[2]):.3f}"}


@pytest.mark.parametrize("run", RUNS)
def test_the_table_row_is_the_run_s_output(run):
    row = next(line for line in _section().splitlines() if line.startswith(f"| [{run}]"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    got = _figures((RESULTS / run).read_text())
    assert cells[1:] == [got[k] for k in ("plain", "riding", "hooks", "needed", "saved", "floor")], row


def test_the_parts_of_the_hooks_are_the_runs_outputs():
    """Each part's figures, floor.txt / floor_r2.txt, are the runs' lines of that part; every part a run prints is
    in the table."""
    parts = [dict(re.findall(r"^  (\S.*?)\s{2,}([0-9.]+)$", (RESULTS / run).read_text(), re.M)) for run in RUNS]
    assert parts[0].keys() == parts[1].keys() and len(parts[0]) == 8
    section = " ".join(_section().split())
    for name in parts[0]:
        if name in ("per-row norms, accumulated",):  # (nested in the ghost norms: not a row of its own)
            continue
        assert f"{parts[0][name]} / {parts[1][name]} |" in section, name
