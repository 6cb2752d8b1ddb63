"""scripts/experiments/noise_demo.py: docs/noise_scale.md's group-level table is the stored record's."""

import json

import pytest

from tests.conftest import REPO
from tests.helpers.scripts import load_script


@pytest.fixture(scope="module")
def noise_demo():
    return load_script("scripts/experiments/noise_demo.py")


def test_the_pages_tables_are_the_stored_records(noise_demo):
    page = (REPO / "docs" / "noise_scale.md").read_text()
    for model, path in noise_demo.STORES.items():
        assert noise_demo.table(json.loads(path.read_text())) in page, model


def test_a_resolved_step_shows_its_interval_and_an_unresolved_one_says_so(noise_demo):
    step = {"noise_scale/all/task": 412.4, "noise_scale_low/all/task": 198.6, "noise_scale_high/all/task": 1204.9}
    assert noise_demo.scale_cell(step) == "412 (199-1205)"
    assert noise_demo.scale_cell({"noise_scale/all/task": None}) == "unresolved"
    assert noise_demo.scale_cell({"noise_scale/all/task": float("nan")}) == "unresolved"
