"""bench/sokoban_demo.py: the multi-turn demos' records (sokoban_demo, frozen_lake_demo), read from hand-made runs,
and docs/benchmarks.md's tables of them against the stored records (bench/results/examples/)."""

import json

import pytest
import yaml

from tests.conftest import REPO
from tests.helpers.scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/sokoban_demo.py")


def make_run(run_dir, preset, seed, val):
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"trainer": {"seed": seed, "experiment_name": preset}}))
    rows = [{"step": s, "data": {"val/env/success": v}} for s, v in val]
    rows += [{"step": s, "data": {"timing_s/step": 2.0}} for s in range(1, val[-1][0] + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["step"])))
    return run_dir


def test_a_record_and_its_table_rows(bench, tmp_path):
    run = make_run(tmp_path / "fl-s2", "frozen_lake_demo", 2, [(0, 0.5), (10, 0.75), (20, 0.75), (30, 0.625)])
    record = {"runs": [bench.summary(run)]}
    assert record["runs"][0]["gain_points"] == 12.5 and record["runs"][0]["best_points"] == 25.0
    assert record["runs"][0]["step_s_sum"] == 60.0
    assert bench.table(record) == "| 2 | 50.0% | 75.0% (steps 10, 20) | 62.5% | **+12.5** |"


def test_the_pages_tables_are_the_stored_records(bench):
    """docs/benchmarks.md shows each stored demo record's rows (seed, start, best, end, gain) in its subsection."""
    page = (REPO / "docs" / "benchmarks.md").read_text()
    for name, heading in (("sokoban_demo", "### The Sokoban demo"), ("frozen_lake_demo", "### The FrozenLake demo")):
        text = page[page.index(heading):]
        text = text[:text.index("\n### ", 1)] if "\n### " in text[1:] else text
        record = json.loads((REPO / "bench" / "results" / "examples" / f"{name}.json").read_text())
        for row in bench.table(record).splitlines():
            assert row in text, (name, row)
