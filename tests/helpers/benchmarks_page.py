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


def by_pairs(run: str) -> tuple[str, str, str]:
    """A bench/always_on_cost.py --paired-batch output's ``1 + instruments / plain update by pairs``: its median and
    95% interval, as printed."""
    found = re.search(r"by pairs: median ([0-9.]+) \[([0-9.]+), ([0-9.]+)\]", run)
    return found[1], found[2], found[3]


def run_figures(run: str) -> dict[str, str]:
    """Such an output's figures as the pages' tables round them: by pairs with its interval, the instruments' timers,
    the median pair, the total, and the source it ran."""
    median, low, high = (float(x) for x in by_pairs(run))
    timers = sum(float(x) for x in re.findall(r"timing_s/(?:analysis|neuron)/\S+: median ([0-9.]+) s", run))
    return {"pairs": f"{median:.2f} [{low:.2f}, {high:.2f}]",
            "timers": f"{1e3 * timers:.0f} ms",
            "median": f"{float(re.search(r'^ratio=([0-9.]+)', run, re.M)[1]):.2f}",
            "total": f"{float(re.search(r'^total with / total without = ([0-9.]+)', run, re.M)[1]):.2f}",
            "src": re.search(r"src=(\w+)", run)[1]}
