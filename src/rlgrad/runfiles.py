"""A run's files: what sits where in a run directory (verl's names), written atomically, and the rules that keep
two runs from sharing one. Whether and where a training run resumes is ``rl/resume.py``'s.

Layout::

    RUN/config.yaml                      resolved config (a resume's allowed changes update it)
    RUN/config_changes.jsonl             {"step": N, "changes": {key: [old, new]}} per resume that changed one
    RUN/.lock                            held (flock) by the process writing the run
    RUN/metrics.jsonl                    {"step": N, "data": {...}} per step (step 0: validation before training)
    RUN/metrics_catalogue.json           what each key of metrics.jsonl means, for other tools (rlgrad metrics)
    RUN/global_step_N/actor/             Hugging Face model + tokenizer (safetensors)
    RUN/global_step_N/trainer_state.pt   optimizer, scheduler, RNG and loop state
    RUN/latest_checkpointed_iteration.txt
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rlgrad.errors import UserError


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it: put it back at once
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temp file in the same directory, fsync, then rename over ``path``. A path that cannot be
    written (a directory, under a file, read-only, a full disk) is a one-line error naming it; ``path`` is
    then as it was."""
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


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


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
    for p in Path(run_dir).glob("global_step_*"):
        suffix = p.name[len("global_step_"):]
        if suffix.isdigit() and (p / "COMPLETE").is_file():
            out.append((int(suffix), p))
    return sorted(out)


RUN_FILES = ("config.yaml", "config_changes.jsonl", "metrics.jsonl", "metrics.discarded.jsonl",
             "metrics_catalogue.json", "reward_components.jsonl", "latest_checkpointed_iteration.txt", ".lock")


def check_output(out: str | os.PathLike, run_dir: str | os.PathLike) -> Path:
    """``out`` unless it would overwrite one of the run's own records (a one-line error then)."""
    out, rd = Path(out), Path(run_dir)
    try:
        rel = out.resolve().relative_to(rd.resolve())
    except ValueError:
        return out
    if str(rel) in RUN_FILES or rel.parts[0] in ("rollouts", "analysis") or rel.parts[0].startswith("global_step_"):
        raise UserError(f"--output '{out}' would overwrite the run's own {rel}; write somewhere else")
    return out


def lock_run_dir(run_dir: str | os.PathLike):
    """Hold ``RUN/.lock`` (an exclusive ``flock``) for as long as the returned file stays open, so that two
    processes never write one run directory; a one-line error when another process holds it."""
    import fcntl

    p = Path(run_dir) / ".lock"
    f = open(p, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        pid = f.read().strip()
        f.close()
        raise UserError(f"run directory '{run_dir}' is in use by another rlgrad process"
                        + (f" (pid {pid})" if pid else "")) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def being_written(run_dir: str | os.PathLike) -> bool:
    """Whether a process holds ``RUN/.lock`` now (``lock_run_dir``): the run is being trained. It only probes the
    lock (shared, non-blocking) and never creates the file."""
    import fcntl

    p = Path(run_dir) / ".lock"
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
    return any((p / name).exists() for name in ("config.yaml", "metrics.jsonl")) or bool(checkpoint_dirs(p))
