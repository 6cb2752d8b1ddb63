"""The doctor for CI and live use: ``--fail-on``, ``--selftest`` (the fixture matrix), no critical finding at any
prefix of a healthy run, and "too early" before a trend signature has the steps it needs."""

from __future__ import annotations

import json
import shutil

import pytest

from rlgrad import rundata as D
from rlgrad.cli import main
from rlgrad.doctor import diagnose, render_text
from rlgrad.doctor.command import doctor_command
from rlgrad.doctor.findings import TRENDS, Thresholds
from rlgrad.doctor.selftest import FAULTS, HEALTHY, check, fixtures_dir, selftest
from tests.conftest import run_cli
from tests.doctor.test_doctor import fixture, healthy_series, run_of


@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_no_critical_finding_at_any_prefix_of_a_healthy_run(name):
    """Read after every step as the live doctor reads it (``selftest.check`` diagnoses each prefix): nothing
    critical at any step, nothing at the fixture's HEALTHY severity or above at its end."""
    ok, line = check(fixtures_dir(), name)
    assert ok and line.startswith("quiet"), line


def test_trend_signatures_say_too_early_until_they_have_their_steps():
    t = Thresholds()
    assert TRENDS["entropy_collapse"][1](t) == 4 and TRENDS["reward_collapse"][1](t) == t.collapse_steps + 1
    assert TRENDS["grad_norm_spike"][1](t) == t.window + 1
    s = healthy_series(3)
    s["actor/entropy"] = [1.5, 0.01, 0.01]  # a collapse, if three steps were enough to say so
    d = diagnose(run_of(s))
    assert d.too_early["entropy_collapse"] == (3, 4) and "entropy_collapse" not in [f.id for f in d.findings]
    assert "entropy_collapse (3 of the 4 steps it needs)" in render_text(d)
    assert d.findings[-1].title == "No sign of trouble yet"
    s = {k: v + [v[-1]] for k, v in s.items()}  # a fourth step: judged
    d = diagnose(run_of(s))
    assert "entropy_collapse" not in d.too_early and "entropy_collapse" in [f.id for f in d.findings]
    assert json.loads(json.dumps(diagnose(run_of(healthy_series(2))).to_json()))["too_early"]["reward_plateau"] == \
        {"steps": 2, "needs": 20}


def test_fail_on_sets_the_exit_status_by_severity(capsys):
    warn_only = fixture("lr_slow")  # lr_too_small (warn), nothing critical
    assert not diagnose(D.load_any(warn_only)).critical
    assert doctor_command(str(warn_only)) == 0
    assert doctor_command(str(warn_only), fail_on="warn") == 1
    critical = str(fixture("lr_fast_collapse"))
    assert doctor_command(critical, fail_on="critical") == 1 and doctor_command(critical, fail_on="never") == 0
    capsys.readouterr()


def test_selftest_prints_each_fixture_and_fails_on_a_miss_or_a_false_alarm(tmp_path, capsys):
    assert selftest() == 0
    out = capsys.readouterr().out
    assert all(name in out for name in [*HEALTHY, *FAULTS])
    assert f"{len(HEALTHY) + len(FAULTS)} of {len(HEALTHY) + len(FAULTS)} fixtures as expected" in out
    shutil.copytree(fixture("healthy"), tmp_path / "lr_too_high")  # a healthy run where a collapse is expected
    shutil.copytree(fixture("lr_fast_collapse"), tmp_path / "healthy")  # a collapse where nothing may fire
    assert selftest(tmp_path) == 1
    out = capsys.readouterr().out
    assert "MISSED    lr_too_high: expected reward_collapse" in out and "FALSE ALARM healthy" in out
    assert "0 of 2 fixtures as expected" in out


def test_the_cli_options(tmp_path, capsys):
    for name in ("healthy", "lr_too_high"):  # two of the matrix: the whole is test_selftest_prints_each_fixture's
        shutil.copytree(fixture(name), tmp_path / name)
    res = run_cli(["doctor", "--selftest", str(tmp_path)])
    assert res.returncode == 0 and "detected  lr_too_high: reward_collapse (critical)" in res.stdout
    capsys.readouterr()  # in process (cli.main): the real entry point is the launch above
    assert main(["doctor", str(fixture("lr_slow")), "--fail-on", "warn"]) == 1
    assert "[WARN] lr_too_small" in capsys.readouterr().out
