"""docs/doctor.md's measured tables are the stored results' (bench/results/), drawn by the scripts that made them;
the held-out scoring's rates and intervals by hand."""

import json
import math

import pytest

from tests.conftest import REPO
from tests.helpers.scripts import load_script


def load(name: str):
    return load_script(f"bench/{name}.py")


@pytest.fixture(scope="module")
def lead():
    return load("doctor_lead_time")


@pytest.fixture(scope="module")
def heldout(lead):
    return load("doctor_heldout")


def test_the_lead_time_tables_are_the_stored_results(lead):
    results = json.loads((REPO / "bench" / "results" / "doctor_lead_time.json").read_text())
    assert lead.table(results) in (REPO / "docs" / "doctor.md").read_text()


def test_wilson_interval_by_hand(heldout):
    low, high = heldout.wilson(8, 10)  # p = 0.8, n = 10: Wilson's 95% interval is 0.490-0.943
    assert low == pytest.approx(0.4902, abs=1e-3) and high == pytest.approx(0.9433, abs=1e-3)
    assert heldout.wilson(0, 5)[0] == 0.0 and heldout.wilson(5, 5)[1] == 1.0
    assert all(math.isnan(x) for x in heldout.wilson(0, 0))


def test_scores_of_a_hand_made_set(heldout):
    """Two fault runs (one attributed, one not) and two healthy runs (one with an alarm)."""
    def first(*found):
        return {sid: {"step": step, "severity": "warn"} for sid, step in found}

    results = {
        "a": {"fault": "lr_too_high", "truth": {"step": 5}, "rlgrad": first(("update_too_large", 1)),
              "rldoctor": first(("kl_drift", 8))},
        "b": {"fault": "kl_huge", "truth": {"step": None}, "rlgrad": first(("dormant_growing", 3)), "rldoctor": {}},
        "h1": {"fault": "healthy", "truth": {"step": None}, "rlgrad": {}, "rldoctor": first(("kl_drift", 8))},
        "h2": {"fault": "healthy", "truth": {"step": None}, "rlgrad": first(("val_falls", 9), ("kl_blowup", 4)),
               "rldoctor": first(("kl_drift", 8))},
    }
    ours = heldout.score_set(results, "rlgrad")
    assert (ours["detected"], ours["attributed"], ours["leads"]) == (2, 1, [4])
    assert ours["false_alarms"] == [0, 2] and ours["healthy_with_alarm"] == 1
    theirs = heldout.score_set(results, "rldoctor")
    assert (theirs["detected"], theirs["leads"], theirs["healthy_with_alarm"]) == (1, [-3], 2)
    assert "attributed" not in theirs  # rldoctor's names are its own: attribution is scored for rlgrad


def test_the_held_out_tables_are_the_stored_scores(heldout):
    """The page's tables are the held-out scores as scored (each record, under the rules its sets were held out
    from) and the same runs' scores under the rules now; each stored score is what its stored runs give."""
    record, set3_record = heldout.records()
    stored = json.loads(heldout.STORE.read_text())
    page = (REPO / "docs" / "doctor.md").read_text()
    for table in heldout.tables(record, set3_record, stored):
        assert table in page, table
    for data, commit in ((record, heldout.HELD_OUT_AT), (set3_record, heldout.SET3_AT), (stored, heldout.FROZEN)):
        assert data["frozen"] == commit and f"commit `{commit}`" in page
        sets = data["sets"]
        # the stored scores are what the stored runs give (no hand edits): rescore them
        for key in sets:
            for tool in heldout.TOOLS:
                assert sets[key]["scores"][tool] == json.loads(json.dumps(heldout.score_set(sets[key]["runs"], tool)))
        # the union is the two held-out sets' runs, each scored once, and each set is the runs the bench defines
        if "union" in sets:
            assert sets["union"]["runs"] == sets["held_out"]["runs"] | sets["extension"]["runs"]
            assert not set(sets["held_out"]["runs"]) & set(sets["extension"]["runs"])
        for key, runs in heldout.SETS.items():
            if key in sets:  # a set made after the record's rules, or not rescored, is absent
                assert list(sets[key]["runs"]) == [r.name for r in runs]
    assert "set3" not in record["sets"] and "set4" not in set3_record["sets"] and "set4" in stored["sets"]
    # a set is left out of the rescore only where its runs were not kept, and says which
    assert set(heldout.SETS) == set(stored["sets"]) - {"union"} | set(stored.get("not_rescored", {}))


def test_a_rules_change_moves_rlgrads_detections_alone(heldout):
    """Each rescore under later rules keeps the runs' ground truths and rldoctor's findings as recorded (a run
    retrained because its files were not kept gives the same)."""
    record, set3_record = heldout.records()
    stored = json.loads(heldout.STORE.read_text())
    # a rules' change moves rlgrad's detections alone: the runs' ground truths and rldoctor's are as recorded
    for before, after in ((record, set3_record), (set3_record, stored)):
        for key in set(before["sets"]) & set(after["sets"]):
            for name, was in before["sets"][key]["runs"].items():
                now = after["sets"][key]["runs"][name]
                assert (now["truth"], now["rldoctor"], now["rldoctor_spelled"]) == (
                    was["truth"], was["rldoctor"], was["rldoctor_spelled"])
