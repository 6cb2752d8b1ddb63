"""scripts/experiments/example_claims.py: its record of a hand-made run, and docs/benchmarks.md's "What the
examples show" tables against the stored records (bench/results/examples/)."""

import json

import pytest

from tests.conftest import REPO
from tests.helpers.scripts import load_script


@pytest.fixture(scope="module")
def claims():
    return load_script("scripts/experiments/example_claims.py")


def write_metrics(run_dir, rows):
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in rows))


def test_a_run_is_summed_up_by_its_curve_and_its_geometry(claims, tmp_path):
    rows = [(0, {"val/accuracy": 0.5}),
            (1, {"grad_comp/acc/share": 0.9, "grad_comp/format/share": 0.1, "grad_comp/rest/share": 0.0,
                 "grad_sim/acc__format": 0.2}),
            (2, {"grad_comp/acc/share": 0.7, "grad_comp/format/share": 0.3, "grad_comp/rest/share": -1e-9,
                 "grad_sim/acc__format": float("nan")}),  # a NaN cosine (a component without variance) is left out
            (3, {"grad_comp/acc/share": 0.8, "grad_comp/format/share": 0.2, "grad_comp/rest/share": 0.0,
                 "grad_sim/acc__format": 0.6, "val/accuracy": 0.75})]
    write_metrics(tmp_path / "run", rows)
    record = claims.summarize(tmp_path / "run")
    assert record["val"] == [[0, 0.5], [3, 0.75]] and record["start"] == 0.5 and record["end"] == 0.75
    geometry = record["geometry"]
    assert geometry["steps"] == 3 and geometry["rest_share_max_abs"] == pytest.approx(1e-9)
    assert geometry["share_median"] == pytest.approx({"acc": 0.8, "format": 0.2})
    assert geometry["cosine_median"] == pytest.approx({"acc__format": 0.4})  # median of 0.2 and 0.6


def test_the_table_reads_start_end_change_and_the_best_point(claims):
    record = {"example": "demo", "seeds": {"2": {"val": [[0, 0.5], [10, 0.9], [20, 0.9], [30, 0.8]], "start": 0.5,
                                                 "end": 0.8, "date": "2026-11-29", "wall_s": 61.4, "load": [2, 3.5]}}}
    row = claims.table(record).splitlines()[-1]
    assert row == "| 2 | 50.0% → 80.0% | +30.0 points | 90.0% (10) | 2026-11-29 | 61 s (2.0 → 3.5) |"
    assert claims.geometry_table(record) is None  # the demo's claim is its accuracy only


def test_the_pages_tables_are_the_stored_records(claims):
    """docs/benchmarks.md shows exactly what `example_claims.py show` makes of bench/results/examples/, each
    example's tables in its own subsection."""
    page = (REPO / "docs" / "benchmarks.md").read_text()
    section = page[page.index("## What the examples show"):]
    subsections = {"demo": "### The demo", "custom_reward_demo": "### The custom reward"}
    found = claims.tables()
    assert set(found) >= set(subsections)
    for name, heading in subsections.items():
        text = section[section.index(heading) + len(heading):]
        text = text[:text.index("\n### ")] if "\n### " in text else text
        text = text[:text.index("\n## ")] if "\n## " in text else text
        for block in found[name]:
            assert block in text, (name, block)
