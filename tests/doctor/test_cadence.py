"""docs/doctor.md's table of the doctor's detections against the analysis cadence (issue 49) is the stored record's
(bench/results/doctor_cadence.json), as ``bench/doctor_cadence.py --table`` prints it; no training here."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.helpers.scripts import load_script

STORED = REPO / "bench" / "results" / "doctor_cadence.json"


@pytest.fixture(scope="module")
def cadence():
    return load_script("bench/doctor_cadence.py")


def test_the_cadence_tables_are_the_stored_results(cadence):
    printed = subprocess.run([sys.executable, "bench/doctor_cadence.py", "--table", str(STORED)], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    assert printed == cadence.table(json.loads(STORED.read_text()))
    assert printed in (REPO / "docs" / "doctor.md").read_text()


def test_a_missing_table_file_is_a_one_line_error(tmp_path):
    res = subprocess.run([sys.executable, "bench/doctor_cadence.py", "--table", str(tmp_path / "no.json")],
                         cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1


def test_the_stored_runs_are_the_documented_settings(cadence):
    stored = json.loads(STORED.read_text())
    always_on = " ".join(cadence.CADENCES["every1"])
    assert always_on in (REPO / "docs" / "instruments.md").read_text()  # the setting the page tells users to leave on
    for cad, settings in stored["settings"].items():
        assert set(cadence.CADENCES[cad]) <= set(settings)
    for r in stored["runs"].values():
        want = [1 + k * 10 for k in range((r["steps"] + 9) // 10)] if r["cadence"] == "every10" else \
            list(range(1, r["steps"] + 1))
        assert r["analysis_steps"] == want, r


def test_the_table_splits_gradient_level_from_scalar(cadence):
    grad = {"step": 11, "severity": "warn"}
    scalar = {"step": 4, "severity": "critical"}
    runs = {"a": {"case": "kl_huge", "seed": 7, "cadence": "every10", "analysis_steps": [1, 11],
                  "rlgrad": {"regularizer_dominates": grad, "clip_every_step": scalar}},
            "b": {"case": "healthy", "seed": 7, "cadence": "every1", "analysis_steps": [1, 2],
                  "rlgrad": {"component_dominates": grad, "reward_collapse": scalar}}}
    lines = cadence.table({"runs": runs}).splitlines()
    assert "| kl_huge | 7 | not run | `regularizer_dominates` @ 11 | not run | `clip_every_step` @ 4 | — |" in lines
    assert ("| healthy | 7 | every=1 (2) | `component_dominates` (warn @ 11) | `reward_collapse` (critical @ 4) |"
            in lines)
