"""A run's files: what sits where in a run directory (verl's names), written atomically, and the rules that keep
two runs from sharing one. Every module that reads or writes a run directory names its files through the constants
and functions here (tests/test_runfiles.py fails on another spelling). Whether and where a training run resumes is
``rl/resume.py``'s.

Layout::

    RUN/config.yaml                      resolved config (a resume's allowed changes update it)
    RUN/config_changes.jsonl             {"step": N, "changes": {key: [old, new]}} per resume that changed one
    RUN/.lock                            held (flock) by the process writing the run
    RUN/metrics.jsonl                    {"step": N, "data": {...}} per step (step 0: validation before training)
    RUN/metrics.discarded.jsonl          rows past a resumed checkpoint, moved aside
    RUN/metrics_catalogue.json           what each key of metrics.jsonl means, for other tools (rlgrad metrics)
    RUN/reward_components.jsonl          each step's per-component rewards (logging/rewards.py)
    RUN/doctor.jsonl                     the live doctor's findings, one line per new finding
    RUN/run_source.json                  which trainer wrote the run (rlgrad's TRL / verl integrations)
    RUN/tables.jsonl                     the hooks' tables, outside rlgrad's trainer (integrations)
    RUN/rollouts/step_N.jsonl            what the model wrote at step N (trainer.rollout_data_dir moves it)
    RUN/analysis/step_N/                 the instruments' files of step N (``step_dir``)
    RUN/global_step_N/actor/             Hugging Face model + tokenizer (safetensors)
    RUN/global_step_N/trainer_state.pt   optimizer, scheduler, RNG and loop state
    RUN/global_step_N/COMPLETE           written last: the checkpoint is whole
    RUN/latest_checkpointed_iteration.txt
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from rlgrad.errors import UserError

CONFIG_FILE = "config.yaml"
CONFIG_CHANGES_FILE = "config_changes.jsonl"
LOCK_FILE = ".lock"
METRICS_FILE = "metrics.jsonl"
DISCARDED_METRICS_FILE = "metrics.discarded.jsonl"  # truncate_jsonl_after's side file of METRICS_FILE
CATALOGUE_FILE = "metrics_catalogue.json"
REWARD_COMPONENTS_FILE = "reward_components.jsonl"
DOCTOR_FILE = "doctor.jsonl"
DOCTOR_HALT_FILE = "doctor_halt.json"  # verl's loop stopped by the live doctor: verl_main exits with status 3
RUN_SOURCE_FILE = "run_source.json"
TABLES_FILE = "tables.jsonl"
WANDB_ID_FILE = "wandb_run_id.txt"  # the W&B run a resumed run logs to again
LATEST_CHECKPOINT_FILE = "latest_checkpointed_iteration.txt"
ROLLOUTS_DIR = "rollouts"
ANALYSIS_DIR = "analysis"
STEP_PREFIX = "step_"  # RUN/analysis/step_N, RUN/rollouts/step_N.jsonl
CHECKPOINT_PREFIX = "global_step_"
CHECKPOINT_STATE_FILE = "trainer_state.pt"
CHECKPOINT_COMPLETE = "COMPLETE"
_ROLLOUT_FILE = re.compile(re.escape(STEP_PREFIX) + r"(\d+)\.jsonl")


def step_dir(run_dir: str | os.PathLike, step: int) -> Path:
    """``RUN/analysis/step_N``: where the instruments write their files of step ``step``."""
    return Path(run_dir) / ANALYSIS_DIR / f"{STEP_PREFIX}{int(step)}"


def step_dirs(run_dir: str | os.PathLike, holding: str) -> dict[int, Path]:
    """step -> the step directory of every step whose directory holds the file ``holding``."""
    out = {}
    for p in (Path(run_dir) / ANALYSIS_DIR).glob(f"{STEP_PREFIX}*/{holding}"):
        suffix = p.parent.name[len(STEP_PREFIX):]
        if suffix.isdigit():
            out[int(suffix)] = p.parent
    return dict(sorted(out.items()))


def rollout_dir(run_dir: str | os.PathLike, configured: str | os.PathLike | None = None) -> Path:
    """``trainer.rollout_data_dir`` when set, else ``RUN/rollouts``."""
    return Path(configured) if configured else Path(run_dir) / ROLLOUTS_DIR


def rollout_file(directory: str | os.PathLike, step: int) -> Path:
    """Step ``step``'s file in a rollout directory (``rollout_dir``)."""
    return Path(directory) / f"{STEP_PREFIX}{int(step)}.jsonl"


def rollout_steps(directory: str | os.PathLike) -> list[int]:
    """The steps with a rollout file in ``directory``, ascending (none when it does not exist)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(int(m.group(1)) for p in d.iterdir() if (m := _ROLLOUT_FILE.fullmatch(p.name)) and p.is_file())


def checkpoint_dir(run_dir: str | os.PathLike, step: int) -> Path:
    """``RUN/global_step_N``: the checkpoint of step ``step`` (rlgrad's, and verl's in its own directory)."""
    return Path(run_dir) / f"{CHECKPOINT_PREFIX}{int(step)}"


def checkpoint_due(step: int, save_freq: int, last: bool) -> bool:
    """Whether a run saves a checkpoint after ``step`` as planned: every ``trainer.save_freq``-th step (never
    when it is 0 or negative) and the last. A stop (a signal, a hook) saves one too; ``checkpoint_steps`` says
    which are still on disk (``trainer.max_ckpt_to_keep`` deletes the oldest)."""
    return last or (save_freq > 0 and step % save_freq == 0)


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it: put it back at once
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes, durable: bool = True) -> None:
    """Write to a temp file in the same directory, fsync, then rename over ``path``. A path that cannot be
    written (a directory, under a file, read-only, a full disk) is a one-line error naming it; ``path`` is
    then as it was. ``durable=False``: no fsync, so the file is whole or absent after the process dies but may
    be lost to a crash of the machine (the files an instrument writes at every step: an fsync each cost more
    than their measurement)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"cannot write '{path}': it is a directory")
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600: give the file the mode open() would
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise UserError(f"cannot write '{path}': {e.strerror or e}") from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str, durable: bool = True) -> None:
    atomic_write_bytes(path, text.encode(), durable)


def atomic_write_json(path: str | os.PathLike, obj: Any, durable: bool = True) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", durable)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSONL file; a torn last line (a crash mid-append) is ignored."""
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    for line in p.read_text(errors="replace").splitlines():  # damaged bytes: a line that does not parse
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def truncate_jsonl_after(path: str | os.PathLike, step: int) -> int:
    """Keep rows with ``step <= step``; rows past a resumed checkpoint move to a side file.

    The steps after the checkpoint are recomputed (identically) by the resumed run, so
    keeping them would duplicate rows; they are preserved in ``<name>.discarded.jsonl``.
    Returns the number of rows moved.
    """
    p = Path(path)
    if not p.exists():
        return 0
    rows = read_jsonl(p)
    keep = [r for r in rows if r.get("step", 0) <= step]
    drop = [r for r in rows if r.get("step", 0) > step]
    torn = len(p.read_text().splitlines()) != len(rows)
    if not drop and not torn:
        return 0
    if drop:
        side = p.with_suffix(".discarded.jsonl")
        with open(side, "a") as f:
            for r in drop:
                f.write(json.dumps(r) + "\n")
    atomic_write_text(p, "".join(json.dumps(r) + "\n" for r in keep))
    return len(drop)


def checkpoint_dirs(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints (``global_step_N`` with a COMPLETE marker), oldest first."""
    out = []
    for p in Path(run_dir).glob(f"{CHECKPOINT_PREFIX}*"):
        suffix = p.name[len(CHECKPOINT_PREFIX):]
        if suffix.isdigit() and (p / CHECKPOINT_COMPLETE).is_file():
            out.append((int(suffix), p))
    return sorted(out)


def checkpoint_steps(run_dir: str | os.PathLike) -> list[int]:
    """The steps whose complete checkpoint is on disk now, oldest first: what a resume or a rollback can use."""
    return [step for step, _ in checkpoint_dirs(run_dir)]


RUN_FILES = (CONFIG_FILE, CONFIG_CHANGES_FILE, METRICS_FILE, DISCARDED_METRICS_FILE, CATALOGUE_FILE,
             REWARD_COMPONENTS_FILE, LATEST_CHECKPOINT_FILE, LOCK_FILE)


def check_output(out: str | os.PathLike, run_dir: str | os.PathLike) -> Path:
    """``out`` unless it would overwrite one of the run's own records (a one-line error then)."""
    out, rd = Path(out), Path(run_dir)
    try:
        rel = out.resolve().relative_to(rd.resolve())
    except ValueError:
        return out
    top = rel.parts[0]
    if str(rel) in RUN_FILES or top in (ROLLOUTS_DIR, ANALYSIS_DIR) or top.startswith(CHECKPOINT_PREFIX):
        raise UserError(f"--output '{out}' would overwrite the run's own {rel}; write somewhere else")
    return out


def lock_run_dir(run_dir: str | os.PathLike):
    """Hold ``RUN/.lock`` (an exclusive ``flock``) for as long as the returned file stays open, so that two
    processes never write one run directory; a one-line error when another process holds it."""
    import fcntl

    p = Path(run_dir) / LOCK_FILE
    f = open(p, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        pid = f.read().strip()
        f.close()
        raise _in_use(run_dir, pid) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _in_use(run_dir: str | os.PathLike, pid: str) -> UserError:
    held = f" (pid {pid})" if pid else ""
    return UserError(f"run directory '{run_dir}' is in use by another rlgrad process{held}")


def refuse_if_in_use(run_dir: str | os.PathLike) -> None:
    """The one-line error of ``lock_run_dir``, naming the holder's pid, when another process writes the run now:
    said before anything else looks at the directory (a run with no checkpoint yet would otherwise be refused as
    "already holds a run")."""
    if being_written(run_dir):
        with open(Path(run_dir) / LOCK_FILE) as f:
            raise _in_use(run_dir, f.read().strip())


def being_written(run_dir: str | os.PathLike) -> bool:
    """Whether a process holds ``RUN/.lock`` now (``lock_run_dir``): the run is being trained. It only probes the
    lock (shared, non-blocking) and never creates the file."""
    import fcntl

    p = Path(run_dir) / LOCK_FILE
    if not p.is_file():
        return False
    with open(p) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def holds_a_run(run_dir: str | os.PathLike) -> bool:
    p = Path(run_dir)
    return any((p / name).exists() for name in (CONFIG_FILE, METRICS_FILE)) or bool(checkpoint_dirs(p))


def read_json(path: str | os.PathLike | None) -> dict | None:
    """A file holding one JSON object; None when there is none, it does not parse or holds something else (the
    readers of a run go on without it)."""
    if path is None or not Path(path).is_file():
        return None
    try:
        obj = json.loads(Path(path).read_text(errors="replace"))
    except (OSError, json.JSONDecodeError):
        return None
    return obj if isinstance(obj, dict) else None
