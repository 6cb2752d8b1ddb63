"""Resuming a training run: which directory a config trains in, the checkpoint it continues from, the settings a
resume may not change (and the changes it records), and the signals that stop a run between steps. The files
themselves are ``runfiles.py``'s."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from rlgrad.config.saved import from_yaml_file
from rlgrad.config.schema import RLGradConfig, flat_settings, to_yaml
from rlgrad.errors import HALTED_STATUS, UserError
from rlgrad.rl import checkpoint as ckpt
from rlgrad.runfiles import CONFIG_CHANGES_FILE, CONFIG_FILE, atomic_write_text, checkpoint_dirs, holds_a_run

# Settings that define a run: a resume that changes one is refused (a cadence or more steps may change).
DEFINING = ("model.", "data.task", "data.train_files", "data.val_files", "data.reasoning_gym", "data.train_batch_size",
            "data.system_prompt", "data.apply_chat_template", "algorithm.", "reward.", "rollout.n",
            "actor.policy_loss", "actor.loss_agg_mode", "actor.lora.", "critic.model", "trainer.seed", "env.", "agent.")
# Where the run and what it uses live, not what the run is: never compared on a resume. A run directory copied or
# moved (from a cluster, say) and named anew (trainer.default_local_dir, or project_name / experiment_name, the
# parts of its default path) is the same run: it resumes, or has nothing to train, as where it was written.
LOCATION = ("trainer.default_local_dir", "trainer.project_name", "trainer.experiment_name", "trainer.rollout_data_dir",
            "model.cache_dir")


def resolve_run_dir(cfg: RLGradConfig) -> Path:
    """The run directory; a one-line error when it cannot be one (a file, under a file, not writable)."""
    trainer = cfg.trainer
    run_dir = Path(trainer.default_local_dir or Path("runs") / trainer.project_name / trainer.experiment_name)
    for p in (run_dir, *run_dir.parents):
        if p.exists():
            if not p.is_dir():
                raise UserError(f"run directory '{run_dir}': '{p}' is a file")
            if not os.access(p, os.W_OK | os.X_OK):
                raise UserError(f"run directory '{run_dir}': '{p}' is not writable")
            break
    return run_dir


def find_resume_point(cfg: RLGradConfig, run_dir: Path, log: Callable[[str], None] = print) -> Path | None:
    """Which checkpoint to resume from, or None for a fresh run. Refuses to reuse another run's directory. A
    damaged checkpoint is passed over with one line through ``log`` (the trainer's console)."""
    trainer = cfg.trainer
    if trainer.resume_mode == "resume_path":
        src = Path(trainer.resume_from_path)
        if not src.is_dir():
            raise UserError(f"trainer.resume_from_path '{src}' does not exist")
        ckpt.checkpoint_step(src)  # validates
        if holds_a_run(run_dir) and src.resolve().parent != run_dir.resolve():
            raise UserError(f"run directory '{run_dir}' already holds another run; choose a new "
                            "trainer.experiment_name or trainer.default_local_dir")
        return src
    found = checkpoint_dirs(run_dir)
    if trainer.resume_mode == "auto" and found:
        for _, path in reversed(found):  # the newest sound one: a damaged checkpoint is passed over, named
            why = ckpt.damage(path)
            if why is None:
                return path
            log(f"skipping damaged checkpoint '{path}': {why}")
        raise UserError(f"run directory '{run_dir}': every checkpoint is damaged (newest: {found[-1][1]}: "
                        f"{ckpt.damage(found[-1][1])})")
    if holds_a_run(run_dir):
        why = ("has no complete checkpoint to resume from" if trainer.resume_mode == "auto"
               else "is in use (resume_mode=disable)")
        raise UserError(f"run directory '{run_dir}' already holds a run and {why}; choose a new "
                        "trainer.experiment_name or trainer.default_local_dir")
    return None


def config_changes(run_dir: Path, cfg: RLGradConfig) -> dict[str, list]:
    """Settings that differ from the run's config.yaml, its ``LOCATION`` aside: a one-line error for one that
    defines the run (``DEFINING``), else ``{key: [old, new]}``."""
    old, new = flat_settings(from_yaml_file(run_dir / CONFIG_FILE)), flat_settings(cfg)
    diff = {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k) and k not in LOCATION}
    fixed = [k for k in diff if k.startswith(DEFINING)]
    if fixed:
        raise UserError(f"run directory '{run_dir}' holds a run with other " + ", ".join(
            f"{k} ({diff[k][0]!r}, now {diff[k][1]!r})" for k in fixed)
            + "; these define the run: start a new one (trainer.experiment_name or trainer.default_local_dir)")
    return diff


def record_settings(run_dir: Path, cfg: RLGradConfig, step: int, log: Callable[[str], None] = print) -> None:
    """The run's settings on disk: ``config.yaml`` written for a new run, and rewritten on a resume that changed
    settings it may change, each such change appended to ``config_changes.jsonl`` with the step and said once."""
    changes = config_changes(run_dir, cfg) if (run_dir / CONFIG_FILE).is_file() else {}
    if changes or not (run_dir / CONFIG_FILE).exists():
        atomic_write_text(run_dir / CONFIG_FILE, to_yaml(cfg))
    if changes:
        with open(run_dir / CONFIG_CHANGES_FILE, "a") as f:
            f.write(json.dumps({"step": step, "changes": changes}) + "\n")
        log(f"resuming at step {step} with changed settings (recorded in {CONFIG_CHANGES_FILE}): "
            + ", ".join(f"{k}: {old} -> {new}" for k, (old, new) in changes.items()))


def check_finished_run(run_dir: Path, cfg: RLGradConfig, step: int, log: Callable[[str], None] = print) -> None:
    """A run resumed at ``step`` >= trainer.total_training_steps has nothing to train. The very command that
    finished it (as after a kill past the last checkpoint) says so in one line through ``log``; settings the run
    never had, fewer steps than it ran, or another directory's checkpoint are refused (UserError naming the
    settings) rather than silently ignored."""
    diff = config_changes(run_dir, cfg) if (run_dir / CONFIG_FILE).is_file() else None
    if diff is not None:
        diff.pop("trainer.total_training_steps", None)
    changes = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in (diff or {}).items())
    if diff == {} and step == cfg.trainer.total_training_steps:
        log(f"the run in {run_dir} already finished step {step} with these settings: nothing to train (raise "
            "trainer.total_training_steps to continue it)")
        return
    raise UserError(f"the run in {run_dir} already finished step {step}"
                    + (f" with other settings ({changes})" if changes else "")
                    + "; raise trainer.total_training_steps to continue it, or start a new run "
                      "(trainer.experiment_name=NAME)")


class RunStopped(Exception):
    """The run ended early for a reason the user must see (not bad input). ``status``: rlgrad train's exit status;
    ``label``: what its one line of stderr starts with."""

    status = 1
    label = "run stopped: "




class Halted(RunStopped):
    """A hook (the live doctor, ``doctor.halt_on``) stopped the run after a whole step and its checkpoint: neither
    success nor failure (status 3)."""

    status = HALTED_STATUS
    label = ""


class Interrupted(RunStopped):
    """SIGTERM / SIGINT: the run stopped after a whole step and its checkpoint (``signum``: which signal)."""

    label = ""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.status = 128 + signum  # the shell's convention for a signal


@contextmanager
def stop_requests():
    """Note SIGTERM / SIGINT instead of dying mid-step; yields a list that holds the signal once one came."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set there
        yield got
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in previous:
        signal.signal(s, lambda signum, frame: got.append(signum))
    try:
        yield got
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def forget_run_dir(run_dir: Path) -> None:
    """Remove the directory a fresh run created and was rejected in before its first step (the run holds its
    lock: no other run is in it), so the corrected rerun starts."""
    import shutil

    if run_dir.is_dir():
        shutil.rmtree(run_dir, ignore_errors=True)
