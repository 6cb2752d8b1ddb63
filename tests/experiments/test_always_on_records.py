"""bench/always_on_cost.py on a preset (``--preset``, ``--gguf``), and docs/benchmarks.md's SmolLM2 rows of it
against the stored raw output (bench/results/i49/smollm2/)."""

import argparse
import re

import pytest

from tests.conftest import REPO
from tests.helpers.scripts import load_script

RESULTS = REPO / "bench" / "results" / "i49" / "smollm2"
HEADING = "### Every instrument every step on SmolLM2-135M"


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/always_on_cost.py")


def args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"preset": None, "gguf": None, **kw})


def test_a_preset_runs_without_validation_and_smollm2_gets_the_wheels_model(bench, tmp_path):
    assert bench._model_overrides(args()) == []  # the embedded default as before
    assert bench._model_overrides(args(preset="sokoban_demo")) == ["trainer.test_freq=-1"]
    gguf = tmp_path / "m.gguf"
    assert bench._model_overrides(args(preset="smollm2_chain_sum", gguf=str(gguf))) == [
        "trainer.test_freq=-1", f"model.path={gguf}"]
    default = bench._model_overrides(args(preset="smollm2_chain_sum"))[1]
    assert default.startswith("model.path=") and default.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def figures(text: str) -> tuple[float, float]:
    """A raw output's step ratio (with / plain, median of pairs) and instruments / plain update."""
    ratio = re.search(r"^ratio=([0-9.]+)", text, re.M)
    update = re.search(r"instruments / plain update = ([0-9.]+)", text)
    assert ratio and update, "not a finished bench/always_on_cost.py output"
    return float(ratio.group(1)), float(update.group(1))


def total(text: str) -> float | None:
    """A raw output's total time ratio (the run's instrumented steps' time over its plain steps'), where printed."""
    found = re.search(r"^total with / total without = ([0-9.]+) over", text, re.M)
    return float(found.group(1)) if found else None


def test_figures_of_a_raw_output():
    text = "timing_s/update_actor: ... instruments / plain update = 0.700; 1 + ...\nratio=1.551 (process CPU time: 1.4)"
    assert figures(text) == (1.551, 0.700)
    assert total(text) is None
    assert total("total with / total without = 1.948 over 30 pairs\n" + text) == 1.948
    with pytest.raises(AssertionError):
        figures("Traceback (most recent call last):")


def _section() -> str:
    page = (REPO / "docs" / "benchmarks.md").read_text()
    section = page[page.index(HEADING):]
    return section[:section.index("\n## ", 1)] if "\n## " in section else section


def test_every_finished_smollm2_run_is_on_the_page():
    """A stored run that printed its figures is linked from the section (a re-measurement is not left out)."""
    section = _section()
    finished = [f.name for f in sorted(RESULTS.glob("*.txt")) if "ratio=" in f.read_text()]
    assert len(finished) >= 3
    assert [n for n in finished if f"smollm2/{n})" not in section] == []


def test_the_smollm2_table_is_the_stored_raw_output():
    """Each row of the page's SmolLM2 table links its raw file, shows its two figures (2 decimals; and the total
    time ratio as "total X" where the row gives it) and says "met" exactly where the figure its target reads
    (step: the median pair, total: the run's total, update: 1 + instruments / plain update) is within it; a row
    saying "killed" links a run that ended with SIGKILL (exit 137) before printing any."""
    section = _section()
    rows = [line for line in section.splitlines() if line.startswith("| ") and "smollm2/" in line]
    assert len(rows) >= 3
    for row in rows:
        name = re.search(r"smollm2/([\w.]+\.txt)", row).group(1)
        text = (RESULTS / name).read_text()
        if "killed" in row:  # a run the kernel ended (out of memory): its file says so, and has no figures
            assert re.search(r"exit 137$", text.strip()) and "ratio=" not in text, (name, row)
            continue
        ratio, update = figures(text)
        assert f"{ratio:.2f}" in row and f"{update:.2f}" in row, (name, ratio, update, row)
        whole = total(text)
        shown = re.search(r"total ([0-9.]+)", row)
        if shown:  # the row gives the run's total time ratio: the raw file's
            assert whole is not None and shown.group(1) == f"{whole:.2f}", (name, whole, row)
        peak = re.search(r"^peak_MB plain_step=([0-9]+) with=([0-9]+) extra=(-?[0-9]+) \(([0-9-]+)%", text, re.M)
        if peak:  # a --memory run: the row shows the peak a step adds, with the instruments and plain (MB)
            plain, with_, extra, share = peak.groups()
            assert f"adds {with_} MB (plain {plain} MB)" in row, (name, plain, with_, row)
            memory = re.search(r"<= 25% of a model copy \(memory\): (met|not met)", row)
            if memory:  # the extra peak as a share of one fp32 model copy, as the bench printed it
                assert f"{extra} MB more, {share}% of one fp32 model copy" in row, (name, extra, share, row)
                assert (memory.group(1) == "met") == (int(share) <= 25), (name, share, row)
        target = re.search(r"<= ([0-9.]+)x? \((step|total|update)\): (met|not met)", row)
        if target:
            bound, of, said = float(target.group(1)), target.group(2), target.group(3)
            assert of != "total" or shown, (name, "a total target needs the row's total figure", row)
            value = {"step": ratio, "total": whole, "update": 1 + update}[of]
            assert (said == "met") == (round(value, 2) <= bound), (name, value, row)


def test_the_one_batch_memory_runs_are_the_pages_figures():
    """docs/benchmarks.md's `all` memory on one batch (``--same-batch``, bench/results/i49/memory_same_batch/): each
    stored run finished, and the page quotes each setting's extra peak with its share of a model copy as the runs
    printed them ("+E MB, S%" or "+E MB, S1-S2%"), saying "met" for the 25% target only where every run is within."""
    page = (REPO / "docs" / "benchmarks.md").read_text()
    shares: dict[str, list[int]] = {}
    runs = sorted((REPO / "bench" / "results" / "i49" / "memory_same_batch").glob("*.txt"))
    assert len(runs) >= 4
    for f in runs:
        text = f.read_text()
        found = re.search(r"^peak_MB plain_step=\d+ with=\d+ extra=(-?\d+) \((-?\d+)%.*\(--same-batch\)$", text, re.M)
        assert found and re.search(r"exit 0$", text, re.M), f.name
        shares.setdefault(found.group(1), []).append(int(found.group(2)))
    for extra, got in shares.items():
        lo, hi = min(got), max(got)
        quoted = f"+{extra} MB, {lo}%" if lo == hi else f"+{extra} MB, {lo}-{hi}%"
        assert quoted in page, quoted
        cell = re.search(rf"\+{extra} MB \(([0-9-]+)%[^)]*\)[^;|]*: (met|not met)", page)
        if cell:  # the targets table's verdict for this figure
            assert (cell.group(2) == "met") == (hi <= 25), (extra, cell.group(0))
