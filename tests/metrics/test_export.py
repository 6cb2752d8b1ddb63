"""The metric catalogue as JSON for other tools (``rlgrad metrics``, ``RUN/metrics_catalogue.json``): one entry a
template, fields that say what each number is measured on, and other tools' names taken from the one names table."""

import json
import re

import pytest

from rlgrad import cli
from rlgrad.logging.sinks import metrics_sink
from rlgrad.metrics import CATALOGUE, FOREIGN_NAMES, FORMAT_VERSION, RUN_FILE, UNITS, catalogue, foreign_key, key, match
from rlgrad.metrics.export import _DATA_UNIT, _UNIT_KEYS
from tests.conftest import run_cli
from tests.metrics.test_catalogue import SAMPLE


def printed(capsys, *args: str) -> dict:
    assert cli.main(["metrics", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def by_key() -> dict[str, dict]:
    return {e["key"]: e for e in catalogue()["metrics"]}


def test_the_json_holds_every_template_once_with_a_regex_of_its_keys(capsys):
    doc = printed(capsys)
    assert doc["format"] == "rlgrad.metrics_catalogue" and doc["format_version"] == FORMAT_VERSION == 1
    listed = [e["key"] for e in doc["metrics"]]
    assert sorted(listed) == sorted(m.template for m in CATALOGUE) and len(set(listed)) == len(listed)
    for entry, m in zip(doc["metrics"], CATALOGUE, strict=True):  # catalogue order
        concrete = key(m.template, **{f: SAMPLE[f] for f in m.fields})
        assert re.fullmatch(entry["regex"], concrete) and entry["placeholders"] == list(m.fields)
        assert entry["meaning"] == m.meaning and entry["group"] == m.group
        assert set(entry["placeholders"]) <= set(doc["placeholders"]) and entry["data"] in doc["data"]


def test_the_documented_rule_picks_a_concrete_keys_entry_from_the_json_alone(by_key):
    # what a tool without rlgrad does: every regex that full-matches, then the rule docs/metrics.md states
    def pick(concrete: str) -> str:
        hits = [e for e in by_key.values() if re.fullmatch(e["regex"], concrete)]
        return max(hits, key=lambda e: (len(re.sub(r"\{[a-z_]+\}", "", e["key"])), -len(e["placeholders"])))["key"]

    keys = [key(m.template, **{f: SAMPLE[f] for f in m.fields}) for m in CATALOGUE]
    keys += ["grad_norm/all/sample_count", "grad_norm/all/loss/entropy", "actor/grad_norm/entropy", "actor/grad_norm"]
    assert all(pick(k) == match(k).template for k in keys)


def test_training_accuracy_is_not_held_out_and_validation_is(by_key):
    # rldoctor 0.2.0 took rollout/accuracy (the step's training samples) for its held-out eval_score
    train, val = by_key["rollout/accuracy"], by_key["val/accuracy"]
    assert (train["data"], train["held_out"], train["instrument"]) == ("train_rollout", False, "trainer")
    assert (val["data"], val["held_out"]) == ("validation", True)
    assert "val/accuracy" in train["distinct_from"] and "rollout/accuracy" in val["distinct_from"]
    assert val["names"] == {"rldoctor": {"eval_score": "val/accuracy"}} and train["names"] == {}
    assert train["unit"] == val["unit"] == "fraction" and train["range"] == [0.0, 1.0]
    # the agent episodes: env/ trains, val/env/ is held out (one group in the catalogue)
    assert (by_key["env/success"]["held_out"], by_key["val/env/success"]["held_out"]) == (False, True)
    assert [k for k, e in by_key.items() if e["held_out"]] == [k for k in by_key if k.startswith("val/")]


def test_a_per_bucket_loss_entropy_is_not_the_policy_entropy(by_key):
    # rldoctor's suffix match may take any */entropy key (grad_norm/bucket_1/loss/entropy) for the policy entropy
    entropy = by_key["actor/entropy"]
    assert (entropy["data"], entropy["scope"], entropy["unit"]) == ("update", ["whole"], "nats")
    assert entropy["names"] == {"trl": {"entropy": "actor/entropy"}, "openrlhf": {"entropy_loss": "actor/entropy"},
                                "rldoctor": {"entropy": "actor/entropy"}}
    for concrete in ("grad_norm/bucket_1/loss/entropy", "actor/loss/entropy", "grad_norm_prefilter/all/loss/entropy",
                     "actor/grad_norm/entropy", "coherence/bucket_2/entropy"):
        e = by_key[match(concrete).template]
        assert e["data"] == "analysis" and e["instrument"].startswith("analysis.") and e["names"] == {}, concrete
    bucket = by_key["grad_norm/{bucket}/loss/{loss}"]
    assert bucket["scope"] == ["per_bucket", "per_loss"] and "actor/entropy" in bucket["distinct_from"]
    assert all("actor/entropy" in by_key[t]["distinct_from"] for t in (
        "actor/loss/{loss}", "grad_norm_prefilter/{bucket}/loss/{loss}", "coherence/{bucket}/{term}"))
    # named as a concrete key, it gives its template's entry
    assert catalogue(["grad_norm/bucket_1/loss/entropy"])["metrics"] == [bucket]


def test_other_tools_names_are_the_names_table(by_key):
    """Every row of FOREIGN_NAMES appears under the entry its rlgrad key belongs to, and nothing else does but TRL's
    per-reward-function rule, which foreign_key reads back."""
    listed = {(source, name, rlgrad_key) for e in by_key.values() for source, names in e["names"].items()
              for name, rlgrad_key in names.items()}
    table = {(source, name, rlgrad_key) for source, rows in FOREIGN_NAMES.items() for name, rlgrad_key in rows.items()}
    assert table <= listed
    for source, name, rlgrad_key in listed - table:
        assert source == "trl" and "{reward function}" in name, name
        assert foreign_key(name.replace("{reward function}", "my-judge"), "trl") == rlgrad_key.replace(
            "{component}", "my_judge")
    assert by_key["reward/{component}/std"]["names"] == {"trl": {"rewards/{reward function}/std":
                                                                 "reward/{component}/std"}}
    # a template with a closed placeholder carries a name per concrete key
    assert by_key["critic/score/{stat}"]["names"]["rldoctor"] == {
        "reward_mean": "critic/score/mean", "reward_max": "critic/score/max", "reward_min": "critic/score/min"}


def test_units_name_catalogued_keys_and_their_ranges_hold(by_key):
    templates = {m.template for m in CATALOGUE}
    named = [t for keys in _UNIT_KEYS.values() for t in keys]
    assert set(named) <= templates and len(named) == len(set(named))  # no stale or doubled key
    assert set(_UNIT_KEYS) | set(_DATA_UNIT.values()) == set(UNITS)  # every unit is used
    assert all(e["unit"] == "seconds" and e["range"] == [0.0, None] for e in by_key.values() if e["group"] == "timing")
    assert by_key["grad_sim/{pair}"]["range"] == [-1.0, 1.0] and by_key["grad_norm/{bucket}/sample_pct"]["range"] == [
        0.0, 100.0]
    assert by_key["actor/pg_loss"]["unit"] is by_key["actor/pg_loss"]["range"] is None  # no fixed scale


def test_the_run_directory_gets_the_same_document(tmp_path, capsys):
    sink = metrics_sink(tmp_path / "run")
    assert sink.path == tmp_path / "run" / "metrics.jsonl"
    assert cli.main(["metrics"]) == 0
    assert (tmp_path / "run" / RUN_FILE).read_text() == capsys.readouterr().out  # what rlgrad metrics prints
    assert json.loads((tmp_path / "run" / RUN_FILE).read_text()) == catalogue()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [RUN_FILE]  # no temporary file left


def test_a_bad_format_exits_2_with_one_line():
    res = run_cli(["metrics", "--format", "xml"])
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and res.stdout == "", res.stderr
    assert len(lines) == 1 and lines[0].startswith("rlgrad: error:") and "xml" in lines[0]


@pytest.mark.parametrize("args,culprit", [
    (["grad_norm/bucket_1/task", "nope/accuracy"], "nope/accuracy"),
    (["--format", "markdown", "actor/entropy"], "actor/entropy"),
])
def test_a_bad_key_exits_2_with_one_line(capsys, args, culprit):
    # in-process: the same error path as the command line (cli.main), without another torch import per case
    assert cli.main(["metrics", *args]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("rlgrad: error:") and culprit in lines[0]
