"""The live doctor (``rlgrad.doctor.live`` through the hook ``rlgrad.doctor.hook.DoctorHook``): findings said once
as the run goes, doctor.jsonl, its cost budget, and ``doctor.halt_on`` stopping rlgrad's trainer after a whole step
with a checkpoint and a distinct exit status, resumable."""

from __future__ import annotations

import gc
import json

import pytest

from rlgrad import rundata as D
from rlgrad.config import load_config
from rlgrad.doctor.diagnose import diagnose
from rlgrad.doctor.live import LiveDoctor
from rlgrad.doctor.selftest import prefixes
from rlgrad.recipes import make_trainer
from rlgrad.rl.resume import HALTED_STATUS, Halted
from rlgrad.runfiles import DOCTOR_FILE
from tests.conftest import run_cli
from tests.doctor.test_doctor import fixture


def replay(name: str, run_dir, budget: float = 1.0, step_seconds: float = 1.0):
    """A recorded run fed to a live doctor step by step, as its trainer would: (doctor, lines it said, by step)."""
    run = D.load_any(fixture(name))
    said: list[str] = []
    doctor = LiveDoctor(run_dir, run.config, say=said.append, budget=budget)
    by_step = {}
    for step in sorted(run.rows):
        by_step[step] = doctor.observe(step, run.rows[step], step_seconds)
    return doctor, said, by_step


def test_each_finding_is_said_once_when_it_first_shows_and_logged(tmp_path):
    doctor, said, by_step = replay("lr_fast_collapse", tmp_path)
    assert len(said) == len({(f.id, f.severity) for fs in by_step.values() for f in fs})  # once each
    assert all(line.startswith("[doctor] step ") and "\n" not in line for line in said)
    # the first critical finding is said at the step a diagnosis of the run so far first holds one
    first_critical = next(n for n, d in prefixes(D.load_any(fixture("lr_fast_collapse"))) if d.critical)
    assert min(s for s, fs in by_step.items() if any(f.severity == "critical" for f in fs)) == first_critical
    rows = [json.loads(x) for x in (tmp_path / DOCTOR_FILE).read_text().splitlines()]
    assert [(r["step"], r["finding"], r["severity"]) for r in rows] == \
        [(s, f.id, f.severity) for s, fs in sorted(by_step.items()) for f in fs]
    assert all(r["evidence"] and r["action"] for r in rows)


def test_a_healthy_run_read_live_says_nothing_serious(tmp_path):
    _, said, _ = replay("healthy_issue37", tmp_path)
    assert not [line for line in said if " WARN " in line or " CRITICAL " in line], said


def test_the_cost_stays_within_its_budget_by_skipping_steps(tmp_path):
    """Steps whose 1% is a third of a diagnosis (measured here first, so the test holds on a fast machine as on a
    loaded one): some steps are skipped, and the time spent before the last diagnosis (the one that may overdraw
    the budget) stays within 1% of the steps' time."""
    steps = len(D.load_any(fixture("healthy_issue37")).rows)
    free, _, _ = replay("healthy_issue37", None, budget=1.0, step_seconds=1.0)
    assert free.skipped == 0  # with time to spare, every step is diagnosed
    step_seconds = free.cost / steps * 100 / 3
    doctor, _, _ = replay("healthy_issue37", tmp_path, budget=0.01, step_seconds=step_seconds)
    assert 0 < doctor.skipped < steps - 1
    assert doctor.cost - doctor.last_spent <= 0.01 * step_seconds * steps


@pytest.mark.parametrize("name", ["healthy", "batch_small", "brevity_takeover", "noisy_verifier", "entropy_collapse"])
def test_the_live_doctors_end_is_the_post_hoc_diagnosis(name, tmp_path):
    """Issue 48: the live doctor said reward_plateau at step 20 and rlgrad doctor RUN did not list it. At the run's
    end the live doctor diagnoses the whole history once more: its last line lists exactly what rlgrad doctor RUN
    finds (step files included: update_concentrated, noisy_verifier), and names what it said earlier that no
    longer holds."""
    import shutil

    run_dir = tmp_path / name
    shutil.copytree(fixture(name), run_dir)
    doctor, said, _ = replay(name, run_dir, budget=1e9)
    final = doctor.finish()
    post = diagnose(D.load_any(fixture(name)))
    assert [(f.id, f.severity) for f in final.findings] == [(f.id, f.severity) for f in post.findings]
    held = [f"{f.severity.upper()} {f.id}" for f in post.findings if f.id != "healthy"]
    gone = sorted({line.split()[4].rstrip(":") for line in said[:-1]} - {f.id for f in post.findings})
    assert said[-1] == (f"[doctor] end of run, step {max(D.load_any(fixture(name)).rows)}: "
                        + ("; ".join(held) or "no sign of trouble")
                        + (f"; no longer holding: {', '.join(gone)}" if gone else "")
                        + f" (in full: rlgrad doctor {run_dir})")
    if name == "batch_small":  # said as the run went, gone at its end
        assert gone == ["length_forecast", "val_falls_train_rises"]


def test_no_plateau_while_validation_rises():
    """A flat training reward while validation accuracy rises beyond its noise is not announced as a plateau (the
    healthy fixture: validation 50% -> 87.5% over 128 prompts, the training reward flat over the first 20 steps)."""
    run = D.load_any(fixture("healthy"))
    run.rows = {s: m for s, m in run.rows.items() if s <= 20}
    assert "reward_plateau" not in {f.id for f in diagnose(run).findings}
    for m in run.rows.values():  # the same run with validation flat (within its binomial noise over 128 prompts)
        if "val/accuracy" in m:
            m["val/accuracy"] = 0.5
    plateau = next(f for f in diagnose(run).findings if f.id == "reward_plateau")
    assert plateau.evidence[1] == "val/accuracy 0.5 → 0.5: stayed within its noise"


def test_halt_on_stops_after_the_step_with_a_checkpoint_and_resumes(tiny, tmp_path):
    """The tiny model gets every answer wrong at first: every group agrees, a critical zero_variance_groups at
    step 1, which halts the run there (rl.resume.Halted: rlgrad train's exit status 3)."""
    run = tmp_path / "run"
    over = [*tiny, "trainer.total_training_steps=3", "trainer.save_freq=-1", "trainer.test_freq=-1",
            "trainer.val_before_train=false"]
    with pytest.raises(Halted, match="critical finding zero_variance_groups at step 1") as stop:
        make_trainer(load_config(overrides=[*over, "doctor.halt_on=critical"]), log=lambda *a: None).fit()
    assert stop.value.status == HALTED_STATUS == 3
    assert f"rlgrad doctor {run}" in str(stop.value) and "the same rlgrad train command resumes" in str(stop.value)
    assert (run / "global_step_1" / "COMPLETE").exists()  # a checkpoint although save_freq=-1
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    del stop  # its traceback holds the stopped trainer, and with it the run's lock (a new process has none)
    gc.collect()
    # resumed past it (doctor.halt_on=never, as the message says): the finding was said and is not said again
    summary = make_trainer(load_config(overrides=[*over, "doctor.halt_on=never"]), log=lambda *a: None).fit()
    assert "stopped_at_step" not in summary
    logged = [json.loads(x) for x in (run / DOCTOR_FILE).read_text().splitlines()]
    assert [(r["finding"], r["severity"]) for r in logged].count(("zero_variance_groups", "critical")) == 1
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all("timing_s/doctor" in r["data"] for r in rows)


@pytest.mark.e2e
def test_rlgrad_train_stopped_by_the_doctor_exits_3(tiny, tmp_path):
    over = [*tiny, "trainer.total_training_steps=3", "trainer.val_before_train=false", "doctor.halt_on=critical"]
    res = run_cli(["train", *over])
    assert res.returncode == HALTED_STATUS, res.stderr[-2000:]
    assert "stopped after step 1" in res.stderr and "critical finding zero_variance_groups" in res.stderr
    assert "[doctor] step 1: CRITICAL zero_variance_groups" in res.stdout


def test_follow_prints_findings_as_a_run_is_written_and_ends_with_it(tmp_path):
    """A writer (here a thread holding RUN/.lock, as rlgrad train does) appends a recorded collapse's rows one by
    one; --follow says each finding once, soon after the step it shows at, and returns when the writer lets go."""
    import threading
    import time

    from rlgrad.doctor.follow import follow
    from rlgrad.runfiles import lock_run_dir

    src = fixture("lr_fast_collapse")
    lines = (src / "metrics.jsonl").read_text().splitlines()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text((src / "config.yaml").read_text())
    (run / "metrics.jsonl").write_text(lines[0] + "\n")
    written: list[int] = []
    lock = lock_run_dir(run)

    def writer():
        for line in lines[1:]:
            time.sleep(0.05)
            with open(run / "metrics.jsonl", "a") as f:
                f.write(line + "\n")
            written.append(json.loads(line)["step"])
        time.sleep(0.2)
        lock.close()  # the run ends

    said: list[tuple[list[int], str]] = []
    thread = threading.Thread(target=writer)
    thread.start()
    worst = follow(str(run), interval=0.02, say=lambda line: said.append((list(written), line)))
    thread.join()
    assert worst == "critical" and said[-1][1].endswith(f"the run ended at step {written[-1]}")
    collapse = next((w, line) for w, line in said if "CRITICAL reward_collapse" in line)
    assert collapse[0][-1] < written[-1]  # said while the run was still being written
    assert len([line for _, line in said if "reward_collapse" in line and line.startswith("[doctor] step ")]) == 1
    # the end: what holds then, as rlgrad doctor RUN says it afterwards (issue 48)
    final = said[-2][1]
    assert final.startswith(f"[doctor] end of run, step {written[-1]}: ") and "CRITICAL reward_collapse" in final
    assert [f"{f.severity.upper()} {f.id}" for f in diagnose(D.load_any(run)).findings if f.id != "healthy"] == \
        final.split(": ", 1)[1].split(" (in full")[0].split("; no longer")[0].split("; ")


def test_follow_on_a_finished_run_reads_it_once_and_exits_by_fail_on(capsys):
    from rlgrad.doctor.command import follow_command

    assert follow_command(str(fixture("lr_fast_collapse")), interval=0.01) == 1
    assert follow_command(str(fixture("lr_slow")), interval=0.01) == 0  # a warning only
    assert follow_command(str(fixture("lr_slow")), fail_on="warn", interval=0.01) == 1
    out = capsys.readouterr().out
    assert "CRITICAL reward_collapse" in out and "the run ended at step" in out
