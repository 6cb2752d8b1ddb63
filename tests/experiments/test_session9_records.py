"""docs/benchmarks.md's "The riding pass's arithmetic floor" section against its stored raw output
(bench/results/i49/session9/: floor.py's two runs)."""

import re

import pytest

from tests.conftest import REPO
from tests.helpers.benchmarks_page import by_pairs, paired_difference, run_figures, subsection

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


TRIED = "**Tried, not landed: the side's slice with the groups**"


def _tried() -> str:
    section = _section()
    tried = section[section.index(TRIED):]
    return tried[:tried.index("**The reward components' part")]


def test_the_tried_change_s_rows_are_their_runs():
    """Each row of the change tried shows its run's source and by-pairs figure (session 8's parser); every stored run
    of it has its row; the text's differences are paired.txt's and its breakdown figures the stored ones."""
    rows = [line for line in _tried().splitlines() if line.startswith("| ") and "session9/" in line]
    assert len(rows) == 10
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        got = run_figures((RESULTS / re.search(r"session9/(\w+\.txt)", cells[0])[1]).read_text())
        assert cells[1:] == [got["src"], got["pairs"]], row
    stored = sorted(p.name for p in RESULTS.glob("*_r*.txt") if p.name.startswith(("task60_", "always_on_")))
    assert len(stored) == 10 and [n for n in stored if f"session9/{n})" not in _tried()] == []
    text = " ".join(_tried().split())
    paired = (RESULTS / "paired.txt").read_text()
    for setting, pairs in (("task60", 180), ("always_on", 60)):
        assert paired_difference(paired, setting, pairs) in text, setting
    hooks = {}
    for side in ("base", "after"):
        found = re.search(r"steps with a side .*?hooks\s+([0-9.]+) ms \(the side's work\s+([0-9.]+)\)",
                          (RESULTS / f"breakdown_{side}.txt").read_text())
        hooks[side] = (float(found[1]), float(found[2]))
    (base, base_work), (after, after_work) = hooks["base"], hooks["after"]
    assert (f"hooks at the steps with a side {base:.1f} ms (the side's work {base_work:.1f}) against {after:.1f} "
            f"({after_work:.1f})") in text


def test_the_smollm2_figures_are_their_runs():
    """SmolLM2-135M's figures in the text: the task-term run's by-pairs median and interval, the always-on run's total
    and by-pairs figure, each as its stored output prints it."""
    text = " ".join(_section().split())
    task = by_pairs((RESULTS / "smollm2_task.txt").read_text())
    assert "the task-term instruments {} [{}, {}] by pairs".format(*task) in text
    always = (RESULTS / "smollm2_always_on.txt").read_text()
    total = re.search(r"^total with / total without = ([0-9.]+)", always, re.M)[1]
    assert "the always-on setting {} in total, {} [{}, {}] by pairs".format(total, *by_pairs(always)) in text
    assert float(total) <= 1.5 and float(task[0]) <= 1.15  # "within"


@pytest.mark.parametrize("setting, sides", [("components", ("off", "on")), ("deferred", ("base", "batched"))])
def test_the_components_and_batched_rows_are_their_runs(setting, sides):
    """Each run's by-pairs figure as it prints it, in round order, is in the row that names its setting's runs; the
    difference is paired.txt's."""
    row = next(line for line in _section().splitlines() if f"session9/{setting}_{sides[0]}_r1.txt" in line)
    for side in sides:
        runs = [(RESULTS / f"{setting}_{side}_r{r}.txt").read_text() for r in (1, 2, 3)]
        printed = ["{} [{}, {}]".format(*by_pairs(run)) for run in runs]
        assert f"{side}: {', '.join(printed)}" in row, side
    base, other = sides
    stored = (RESULTS / "paired.txt").read_text()
    assert f"{other} - {base} {paired_difference(stored, setting, 180, other, base)} |" in row
