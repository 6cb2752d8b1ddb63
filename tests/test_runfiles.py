"""Run directories that cannot be lost: one writer at a time, no trace of a rejected run, resumes that keep what
defines the run, checkpoints that survive damage and retention settings."""

from __future__ import annotations

import ast
import json
import os
import random
from pathlib import Path

import pytest

from rlgrad import cli, runfiles
from rlgrad.config.load import load_config
from rlgrad.errors import UserError
from rlgrad.recipes import make_trainer
from rlgrad.runfiles import being_written, lock_run_dir, read_jsonl


def quiet(overrides):
    return make_trainer(load_config(overrides=overrides), log=lambda *a: None)


def test_two_writers_cannot_share_a_run_directory(tmp_path):
    held = lock_run_dir(tmp_path)
    with pytest.raises(UserError, match="in use by another rlgrad process"):
        lock_run_dir(tmp_path)
    held.close()  # the first writer ends: the directory is free again
    lock_run_dir(tmp_path).close()


def test_a_run_in_use_before_its_first_checkpoint_names_the_writer(tiny, tmp_path, capsys):
    """Issue 48: a second rlgrad train on a run directory being written, before its first checkpoint, was told the
    directory "already holds a run and has no complete checkpoint"; docs/runs.md promises the holder's pid."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("trainer: {}\n")  # a run that started: config written, no checkpoint yet
    held = lock_run_dir(run)  # the first writer (its pid is this process's)
    rc = cli.main(["train", *tiny, "trainer.total_training_steps=1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip().endswith(f"run directory '{run}' is in use by another rlgrad process "
                                            f"(pid {os.getpid()})"), err
    held.close()
    assert sorted(p.name for p in run.iterdir()) == [".lock", "config.yaml"]  # nothing touched


def test_a_resumed_run_says_first_that_it_resumes_and_from_which_checkpoint(tiny, tmp_path):
    """Issue 48: a resume after Ctrl-C said nothing about resuming; its first line was `step 3/20`."""
    run = tmp_path / "run"
    quiet(tiny + ["trainer.total_training_steps=1"]).fit()
    said: list[str] = []
    make_trainer(load_config(overrides=tiny + ["trainer.total_training_steps=2"]), log=said.append).fit()
    assert said[0] == (f"resuming the run in {run} from its checkpoint of step 1 ({run / 'global_step_1'}): steps 2 "
                       "to 2")


def test_a_run_rejected_before_its_first_step_leaves_no_trace(tiny, tmp_path, capsys):
    run = tmp_path / "run"
    rc = cli.main(["train", *tiny, "data.max_prompt_length=3", "trainer.total_training_steps=1"])
    err = capsys.readouterr().err
    assert rc == 2 and "data.max_prompt_length=3" in err and err.count("\n") == 1, err
    assert not run.exists()  # so the corrected rerun is not refused as "already holds a run"
    assert cli.main(["train", *tiny, "trainer.total_training_steps=1"]) == 0
    assert (run / "config.yaml").is_file()


def test_resume_refuses_a_changed_definition_and_records_allowed_changes(tiny, tmp_path):
    run = tmp_path / "run"
    quiet(tiny + ["trainer.total_training_steps=1"]).fit()
    for change, name in (["data.task=countdown", "data.task"], ["rollout.n=2", "rollout.n"],
                         ["actor.policy_loss=cispo", "actor.policy_loss"]):
        with pytest.raises(UserError, match=f"{name} .*define the run"):
            quiet(tiny + ["trainer.total_training_steps=2", change]).fit()
    assert json.loads(json.dumps(read_jsonl(run / "metrics.jsonl")))[-1]["step"] == 1  # untouched
    quiet(tiny + ["trainer.total_training_steps=2", "analysis.every=1"]).fit()
    changes = read_jsonl(run / "config_changes.jsonl")
    assert changes == [{"step": 1, "changes": {"analysis.every": [None, 1],
                                               "trainer.total_training_steps": [1, 2]}}]
    assert "every: 1" in (run / "config.yaml").read_text()


def test_a_damaged_newest_checkpoint_is_skipped_for_the_last_sound_one(tiny, tmp_path, capsys):
    run = tmp_path / "run"
    quiet(tiny + ["trainer.total_training_steps=2", "trainer.save_freq=1"]).fit()
    state = run / "global_step_2" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])  # truncated, COMPLETE marker still there
    lines = []
    t = make_trainer(load_config(overrides=tiny + ["trainer.total_training_steps=3", "trainer.save_freq=1"]),
                     log=lines.append)
    assert t.step == 1
    assert lines == [f"skipping damaged checkpoint '{run / 'global_step_2'}': trainer_state.pt does not load"]
    t.fit()
    assert not being_written(run)  # the finished run's lock is released, the trainer still alive
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2, 3]
    weights = run / "global_step_3" / "actor" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    # On the console: one plain line among the run's own, not a Python warning with its source line (issue 36).
    assert cli.main(["train", *tiny, "trainer.total_training_steps=4", "trainer.save_freq=1"]) == 0
    out, err = capsys.readouterr()
    said = [line for line in (out + err).splitlines() if "damaged checkpoint" in line]
    assert said == [f"skipping damaged checkpoint '{run / 'global_step_3'}': actor/model.safetensors is truncated"]
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2, 3, 4]


def test_a_header_length_from_garbage_is_checked_against_the_file_before_it_is_read(tmp_path):
    """Issue 50: 4 KB of random bytes as the newest checkpoint's weights made ``damage`` read a header as long as
    their first 8 bytes said (a MemoryError); a length past the file's end now means "not a safetensors file"."""
    import torch

    from rlgrad.rl.checkpoint import damage

    ckpt = tmp_path / "global_step_2"
    (ckpt / "actor").mkdir(parents=True)
    torch.save({"step": 2}, ckpt / runfiles.CHECKPOINT_STATE_FILE)
    weights = ckpt / "actor" / "model.safetensors"
    for length in (2**62, 4096 - 8 + 1, 2**64 - 1):  # far past the end, one byte past it, the largest
        weights.write_bytes(length.to_bytes(8, "little") + bytes(4088))
        assert damage(ckpt) == "actor/model.safetensors is not a safetensors file"
    weights.write_bytes(b"\x01\x02")  # shorter than the length field itself
    assert damage(ckpt) == "actor/model.safetensors is not a safetensors file"


def test_random_bytes_as_the_newest_weights_fall_back_to_the_previous_checkpoint(tiny, tmp_path):
    run = tmp_path / "run"
    quiet(tiny + ["trainer.total_training_steps=2", "trainer.save_freq=1"]).fit()
    (run / "global_step_2" / "actor" / "model.safetensors").write_bytes(random.Random(50).randbytes(4096))
    lines = []
    t = make_trainer(load_config(overrides=tiny + ["trainer.total_training_steps=3", "trainer.save_freq=1"]),
                     log=lines.append)
    assert t.step == 1
    assert lines == [f"skipping damaged checkpoint '{run / 'global_step_2'}': actor/model.safetensors is not a "
                     "safetensors file"]


def test_a_resume_removes_what_a_killed_save_left(tiny, tmp_path):
    """A SIGKILL mid-save leaves ``.global_step_N.tmp-*`` (or ``global_step_N.old`` while replacing one), as
    large as a checkpoint; kill-stress runs piled them up. The resumed run, holding the lock, removes them."""
    run = tmp_path / "run"
    quiet(tiny + ["trainer.total_training_steps=1", "trainer.save_freq=1"]).fit()
    for name in (".global_step_2.tmp-k1ll3d", "global_step_1.old"):
        (run / name / "actor").mkdir(parents=True)
        (run / name / "trainer_state.pt").write_bytes(b"half")
    (run / ".global_step_2.tmp-file").write_text("not a directory: not ours to remove")
    lines = []
    make_trainer(load_config(overrides=tiny + ["trainer.total_training_steps=2", "trainer.save_freq=1"]),
                 log=lines.append).fit()
    assert sorted(p.name for p in run.iterdir() if "global_step" in p.name) == [
        ".global_step_2.tmp-file", "global_step_1", "global_step_2"]
    assert ("removed 2 unfinished checkpoint(s) of a save that was killed: .global_step_2.tmp-k1ll3d, "
            "global_step_1.old") in lines


def test_keep_minus_one_keeps_every_checkpoint(tiny, tmp_path):
    quiet(tiny + ["trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.max_ckpt_to_keep=-1"]).fit()
    assert sorted(p.name for p in (tmp_path / "run").glob("global_step_*")) == [f"global_step_{i}" for i in (1, 2, 3)]


def test_summary_without_validation_before_training(tiny, capsys):
    assert cli.main(["train", *tiny, "trainer.total_training_steps=1", "trainer.val_before_train=false"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out and "no validation before training: trainer.val_before_train=false" in out


def test_torchrun_with_one_process_samples_by_group(tiny, monkeypatch):
    assert not quiet(tiny).group_seeded
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")  # what torchrun sets, whatever --nproc_per_node
    assert quiet(tiny).group_seeded


def test_cuda_without_cuda_is_one_line(tiny, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert cli.main(["train", *tiny, "trainer.device=cuda"]) == 2
    err = capsys.readouterr().err
    assert "'trainer.device' is cuda" in err and err.count("\n") == 1


def test_a_run_directory_that_cannot_be_one(tiny, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    for rd in (tmp_path / "afile", tmp_path / "afile" / "run"):
        assert cli.main(["train", *tiny, f"trainer.default_local_dir={rd}"]) == 2
        err = capsys.readouterr().err
        assert f"'{tmp_path / 'afile'}' is a file" in err and err.count("\n") == 1
    assert (tmp_path / "afile").read_text() == "x"


def test_a_data_row_with_a_null_answer_is_named(tmp_path):
    from rlgrad.tasks.math import load_examples

    f = tmp_path / "d.jsonl"
    f.write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": null}\n')
    with pytest.raises(UserError, match=r"d.jsonl:2: null ground-truth answer"):
        load_examples(str(f))


def test_a_prompt_too_long_names_its_data_row(tiny, tmp_path, capsys):
    f = tmp_path / "long.jsonl"
    f.write_text("".join(f'{{"question": "{"x" * 400} {i}", "answer": "{i}"}}\n' for i in range(5)))  # 5: one held out
    rc = cli.main(["train", *tiny, "data.task=math", f"data.train_files=[{f}]", "data.val_size=2",
                   "trainer.total_training_steps=1"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{f}:" in err and "more than data.max_prompt_length=256" in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_run(tiny, tmp_path, monkeypatch):
    import errno

    import torch

    run = tmp_path / "run"
    quiet(tiny + ["trainer.total_training_steps=1", "trainer.save_freq=1"]).fit()
    real_save = torch.save

    def full(obj, f, *a, **k):
        if str(f).endswith("trainer_state.pt"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(UserError, match="No space left on device.*earlier checkpoints and metrics are intact"):
        quiet(tiny + ["trainer.total_training_steps=2", "trainer.save_freq=1"]).fit()
    assert sorted(p.name for p in run.glob("global_step_*")) == ["global_step_1"]  # no half checkpoint
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2]


def test_a_prompt_too_long_is_refused_before_the_run_directory_or_its_parents_exist(tiny, tmp_path, monkeypatch,
                                                                                      capsys):
    """Issue 50: a data row whose prompt is over data.max_prompt_length was refused only at the step that sampled
    it, after the run directory was made: runs/<project_name>/ stayed behind. Every row is now measured first."""
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "long.jsonl"
    rows = [f'{{"question": "{i} + {i}", "answer": "{2 * i}"}}\n' for i in range(10)]
    rows[1] = '{"question": "' + "1 " * 150 + 'what?", "answer": "1"}\n'  # a training row
    f.write_text("".join(rows))
    default_dir = [o for o in tiny if not o.startswith("trainer.default_local_dir=")]
    settings = [*default_dir, "data.task=math", f"data.train_files=[{f}]", "trainer.total_training_steps=1"]
    with pytest.raises(UserError, match=rf"^{f}:2: the prompt has 305 tokens, more than data.max_prompt_length=256"):
        make_trainer(load_config(overrides=settings), log=lambda *a: None)
    assert cli.main(["train", *settings]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.jsonl"]  # no runs/


def _mount_point(path):
    """The highest folder above ``path`` on the same device: the disk's mount point (by device ids)."""
    path = path.resolve()
    while path.parent != path and path.parent.stat().st_dev == path.stat().st_dev:
        path = path.parent
    return path


def _disk_full_in_safetensors(monkeypatch):
    """The issue's fault: safetensors' writer (what save_pretrained calls) meeting a full disk, as it reports it."""
    import transformers.modeling_utils
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)


def _disk_full_in_torch_save(monkeypatch):
    """torch.save on a full disk: a short write that names no cause, the disk left with no free space."""
    import collections
    import shutil

    import torch

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", full)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 << 20, 10 << 20, 0))


@pytest.mark.parametrize("fault", [_disk_full_in_safetensors, _disk_full_in_torch_save])
def test_a_full_disk_names_the_disk_and_step_and_the_same_command_resumes(fault, tiny, tmp_path, capsys):
    """Issue 50: a full disk while writing a checkpoint ended in a traceback (SafetensorError, exit 1)."""
    run = tmp_path / "run"
    command = ["train", *tiny, "trainer.total_training_steps=2", "trainer.save_freq=1"]
    quiet(tiny + ["trainer.total_training_steps=1", "trainer.save_freq=1"]).fit()
    with pytest.MonkeyPatch.context() as patch:
        fault(patch)
        assert cli.main(command) == 2
    err = capsys.readouterr().err
    assert err == (f"rlgrad: error: step 2: checkpoint global_step_2 could not be written in '{run}': the disk at "
                   f"'{_mount_point(run)}' is full (No space left on device); the run's earlier checkpoints and "
                   "metrics are intact: free space there, then the same command resumes\n")
    assert sorted(p.name for p in run.iterdir() if "global_step" in p.name) == ["global_step_1"]  # no temp folder
    assert cli.main(command) == 0  # space freed: the same command
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2]
    assert sorted(p.name for p in run.iterdir() if "global_step" in p.name) == ["global_step_1", "global_step_2"]


def test_probe_of_a_damaged_checkpoint_is_one_line(tiny, tmp_path, capsys):
    run = tmp_path / "run"
    quiet(tiny + ["trainer.total_training_steps=1", "trainer.save_freq=1"]).fit()
    ckpt = run / "global_step_1"
    weights = ckpt / "actor" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    before = sorted(p.name for p in tmp_path.iterdir())
    assert cli.main(["probe", "--resume-from-path", str(ckpt), *tiny[:-1]]) == 2
    err = capsys.readouterr().err
    assert "is damaged (actor/model.safetensors is truncated)" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no probe directory


def test_a_finished_run_refuses_to_train_nothing_and_names_the_settings_it_would_ignore(tiny, tmp_path, capsys):
    """The README's examples in a row used to share runs/rlgrad/default: the second exited 0 having measured
    nothing, its overrides silently ignored."""
    quiet(tiny + ["trainer.total_training_steps=2"]).fit()
    before = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    assert cli.main(["train", *tiny, "trainer.total_training_steps=2", "actor.redo_metric_freq=10"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already finished step 2" in err
    assert "analysis.neurons.actor.metric_every: 0 -> 10" in err and "trainer.experiment_name" in err
    assert cli.main(["train", *tiny, "trainer.total_training_steps=1"]) == 2  # fewer steps than it ran
    assert "already finished step 2;" in capsys.readouterr().err
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == before


def test_the_same_command_on_a_finished_run_is_no_error(tiny, tmp_path, capsys):
    """Issue 34: a run SIGKILLed after its last checkpoint, before it exited, is finished; a retry of the same
    command (what "the same command resumes" promises after a kill) exited 2 ("resume failed") and trained
    nothing. It now exits 0 with one line, the run untouched."""
    quiet(tiny + ["trainer.total_training_steps=1"]).fit()
    run = tmp_path / "run"
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    rows = (run / "metrics.jsonl").read_bytes()
    assert cli.main(["train", *tiny, "trainer.total_training_steps=1"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and f"the run in {run} already finished step 1 with these settings: nothing to train" in out
    assert "validation accuracy: before" in out  # the closing summary, from the checkpoint's
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before
    assert (run / "metrics.jsonl").read_bytes() == rows


def test_a_copied_or_moved_run_directory_is_the_same_run(tiny, tmp_path, capsys):
    """Issue 50: a run directory copied elsewhere (from a cluster, say) and its command rerun with the new
    trainer.default_local_dir was refused as "other settings (trainer.default_local_dir: OLD -> NEW)". Where a run
    lives is not one of its settings: the copy says nothing to train, or resumes."""
    import shutil

    quiet(tiny + ["trainer.total_training_steps=1"]).fit()
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(tmp_path / "run", copy)
    moved = [o for o in tiny if not o.startswith("trainer.default_local_dir=")] + [
        f"trainer.default_local_dir={copy}", f"model.cache_dir={tmp_path / 'another_cache'}"]
    assert cli.main(["train", *moved, "trainer.total_training_steps=1"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and f"the run in {copy} already finished step 1 with these settings: nothing to train" in out
    lines = []
    t = make_trainer(load_config(overrides=moved + ["trainer.total_training_steps=2"]), log=lines.append)
    assert t.step == 1
    t.fit()
    assert [r["step"] for r in read_jsonl(copy / "metrics.jsonl")] == [0, 1, 2]
    assert read_jsonl(copy / "config_changes.jsonl") == [{"step": 1, "changes": {
        "trainer.total_training_steps": [1, 2]}}]
    assert [line for line in lines if "changed settings" in line] == [
        "resuming at step 1 with changed settings (recorded in config_changes.jsonl): "
        "trainer.total_training_steps: 1 -> 2"]
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [0, 1]  # the original untouched


# ---------------------------------------------------------------- the run directory's names live in runfiles

SRC = Path(runfiles.__file__).parent
FILE_NAMES = {v for k, v in vars(runfiles).items() if k.endswith(("_FILE", "_COMPLETE")) and isinstance(v, str)}
DIR_NAMES = {runfiles.ROLLOUTS_DIR, runfiles.ANALYSIS_DIR}
PREFIXES = {runfiles.STEP_PREFIX, runfiles.CHECKPOINT_PREFIX, "." + runfiles.CHECKPOINT_PREFIX}
# The doctor's live modules are being reorganised (issue 44, its doctor part): they switch to runfiles' names there.
PENDING: set[str] = set()  # modules yet to spell their run files through runfiles.py


def spellings(source: str) -> list[tuple[int, str]]:
    """(line, literal) of each place ``source`` spells a run-directory name itself: a string equal to a file
    name, a path joined with a directory name (``run / "analysis"``), a step or checkpoint directory built or
    globbed from its prefix (``f"step_{step}"``, ``"global_step_*"``)."""
    found = []
    tree = ast.parse(source)
    text_parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in text_parts:
            if node.value in FILE_NAMES or any(node.value.startswith(p + "*") for p in PREFIXES):
                found.append((node.lineno, node.value))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant) \
                and node.right.value in DIR_NAMES:
            found.append((node.lineno, node.right.value))
        elif isinstance(node, ast.JoinedStr) and len(node.values) > 1 and isinstance(node.values[0], ast.Constant) \
                and node.values[0].value in PREFIXES and isinstance(node.values[1], ast.FormattedValue):
            found.append((node.lineno, node.values[0].value + "{...}"))
    return found


def test_only_runfiles_spells_the_run_directory():
    """Every reader and writer of a run directory names its files through rlgrad.runfiles (issue 44: the step
    directory was spelled 7 times in 6 files, metrics.jsonl in 9 modules)."""
    bad = [f"{path.relative_to(SRC)}:{line}: {text!r}" for path in sorted(SRC.rglob("*.py"))
           if path.name != "runfiles.py" and str(path.relative_to(SRC)) not in PENDING
           for line, text in spellings(path.read_text())]
    assert bad == [], "spell these through rlgrad.runfiles:\n" + "\n".join(bad)


def test_the_spelling_check_finds_each_form():
    src = ('a = run / "metrics.jsonl"\nb = run / "analysis" / x\nc = f"step_{step}"\nd = run.glob("global_step_*")\n'
           'e = f".global_step_{n}.tmp-"\nok = "the metrics.jsonl of a run"\nfine = f"step {step}"\n')
    assert sorted(line for line, _ in spellings(src)) == [1, 2, 3, 4, 5]


def test_step_dir_and_checkpoint_steps_read_the_layout(tmp_path):
    assert runfiles.step_dir(tmp_path, 3) == tmp_path / "analysis" / "step_3"
    for step, complete in ((2, True), (10, True), (4, False)):  # step 4: a save that never finished
        d = runfiles.checkpoint_dir(tmp_path, step)
        (d / "actor").mkdir(parents=True)
        if complete:
            (d / "COMPLETE").write_text(f"{step}\n")
    (tmp_path / "global_step_x").mkdir()
    assert runfiles.checkpoint_steps(tmp_path) == [2, 10]  # numerically, not by name (10 after 2)
    assert [runfiles.checkpoint_due(s, 3, s == 7) for s in range(1, 8)] == [False, False, True, False, False, True,
                                                                           True]
    assert not runfiles.checkpoint_due(5, 0, False) and runfiles.checkpoint_due(5, -1, True)


def test_a_write_that_need_not_be_durable_skips_the_fsync_and_stays_atomic(tmp_path, monkeypatch):
    """``durable=False`` (an instrument's step files): no fsync, and a write that fails midway still leaves the old
    file whole and no temporary file behind."""
    from rlgrad.runfiles import atomic_write_text

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    path = tmp_path / "layers.json"
    atomic_write_text(path, "old")
    assert len(synced) == 1
    atomic_write_text(path, "new", durable=False)
    assert len(synced) == 1 and path.read_text() == "new"

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(UserError, match="layers.json"):
        atomic_write_text(path, "newer", durable=False)
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["layers.json"]
