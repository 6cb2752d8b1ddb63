"""docs/benchmarks.md's "The instruments' work outside the backward" against its stored raw output
(bench/results/i49/hooks7/: bench/always_on_cost.py and instrument_parts.py, main against hooks7)."""

import re
import statistics

from tests.conftest import REPO
from tests.helpers.benchmarks_page import subsection

RESULTS = REPO / "bench" / "results" / "i49" / "hooks7"
HEADING = "### The instruments' work outside the backward"
OUTSIDE = "hooks outside the backward (before_update + on_grads + after_update)"


def _section() -> str:
    return subsection(HEADING)


def _parts(name: str) -> dict[str, tuple[float, float]]:
    """A parts file's lines: label -> (median, mean) ms a step."""
    out = {}
    for line in (RESULTS / name).read_text().splitlines():
        if m := re.match(r"\s*([0-9.]+)\s+([0-9.]+)\s+(.+)$", line):
            out[m[3]] = (float(m[1]), float(m[2]))
    return out


def _mean_over_rounds(side: str, label: str) -> float:
    """The mean ms a step of ``label`` over the three last rounds' parts files of ``side``."""
    return statistics.mean(_parts(f"parts_{side}_{k}.txt")[label][1] for k in (1, 2, 3))


def test_every_row_is_its_raw_output():
    """Each row shows its always-on run's median-pair ratio and total (2 decimals) and its parts run's median of the
    hooks outside the backward (1 decimal); every stored run is linked from the section."""
    section = _section()
    rows = [line for line in section.splitlines() if line.startswith("| [")]
    assert len(rows) >= 10
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        run = re.search(r"hooks7/(always_on_\w+\.txt)", cells[0])
        if run:
            text = (RESULTS / run[1]).read_text()
            ratio = float(re.search(r"^ratio=([0-9.]+)", text, re.M)[1])
            total = float(re.search(r"^total with / total without = ([0-9.]+)", text, re.M)[1])
            assert (cells[2], cells[3]) == (f"{ratio:.2f}", f"{total:.2f}"), (run[1], ratio, total, row)
        parts = re.search(r"hooks7/(parts_\w+\.txt)", cells[0])
        assert parts, row
        assert cells[4] == f"{_parts(parts[1])[OUTSIDE][0]:.1f}", (parts[1], row)
    stored = sorted(p.name for p in RESULTS.glob("*.txt"))
    assert [n for n in stored if f"hooks7/{n})" not in section] == []


def test_the_sections_means_are_the_last_three_rounds():
    """The figures the text gives as means of the three last rounds a side (main -> hooks7)."""
    section = " ".join(_section().split())
    main, ours = _mean_over_rounds("main", OUTSIDE), _mean_over_rounds("hooks7", OUTSIDE)
    assert f"went from {main:.1f} to {ours:.1f} ms a step" in section
    for label, shown in (("per_sample.proxy_correlation [after_update]", "`proxy_correlation` {} -> {} ms"),
                         ("neurons.gradient_stats [on_grads]", "`gradient_stats` {} -> {} ms"),
                         ("neurons.NeuronHealthHook.after_update [after_update]", "`after_update` {} -> {} ms")):
        before, after = (f"{_mean_over_rounds(side, label):.2f}" for side in ("main", "hooks7"))
        assert shown.format(before, after) in section, (label, before, after)
