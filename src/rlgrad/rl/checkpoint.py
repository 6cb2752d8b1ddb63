"""Checkpoints: ``global_step_N/`` with the actor in Hugging Face format plus everything
needed to resume exactly (optimizer, scheduler, RNG streams, loop state).

A checkpoint is written into a temporary directory and renamed into place once complete
(with a ``COMPLETE`` marker), so a crash mid-save never leaves a checkpoint that looks usable.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from rlgrad.errors import UserError
from rlgrad.runfiles import (
    CHECKPOINT_COMPLETE,
    CHECKPOINT_PREFIX,
    CHECKPOINT_STATE_FILE,
    LATEST_CHECKPOINT_FILE,
    atomic_write_text,
    checkpoint_dir,
    checkpoint_dirs,
)


def save_checkpoint(run_dir: Path, step: int, models: dict[str, Any], tokenizer, state: dict[str, Any],
                    max_to_keep: int | None = None) -> Path:
    """``models`` maps a role ("actor", later "critic") to a model with ``save_pretrained``. A write the machine
    stops (a full disk, a quota, permissions) is a one-line UserError naming the disk and the step; nothing of the
    checkpoint is left and the earlier ones are intact."""
    run_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir(run_dir, step)
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=run_dir))
        for role, model in models.items():
            model.save_pretrained(tmp / role, safe_serialization=True)
            tokenizer.save_pretrained(tmp / role)
        torch.save(state, tmp / CHECKPOINT_STATE_FILE)
        (tmp / CHECKPOINT_COMPLETE).write_text(f"{step}\n")
        if final.exists():  # re-saving a step after resuming from an older checkpoint
            old = final.with_name(final.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        atomic_write_text(run_dir / LATEST_CHECKPOINT_FILE, f"{step}\n")
    except Exception as e:  # the writers' own error types; anything else is raised again
        fault = _machine_fault(e, run_dir)  # while the partial checkpoint still fills the disk
        if fault is None:
            raise
        raise UserError(_save_fault_message(fault, final, step)) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if max_to_keep is not None and max_to_keep > 0:  # null or -1: keep every checkpoint
        for _, old in checkpoint_dirs(run_dir)[:-max_to_keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


# Less free space than this after a write failed: the disk is full (torch.save's error names no cause).
_NEARLY_FULL = 1 << 20


def _machine_fault(e: Exception, where: Path) -> OSError | None:
    """The OS error behind a failed write under ``where``, or None when the machine is not the cause. The writers
    report it three ways: an OSError; safetensors' SafetensorError with the OS error's text ("... (os error
    28)"); torch.save's RuntimeError from a short write ("unexpected pos ..."), a full disk when one is left."""
    if isinstance(e, OSError):
        return e
    if found := re.search(r"\(os error (\d+)\)", str(e)):
        return OSError(int(found[1]), os.strerror(int(found[1])))
    if isinstance(e, RuntimeError) and shutil.disk_usage(where).free < _NEARLY_FULL:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return None


def _save_fault_message(fault: OSError, final: Path, step: int) -> str:
    """One line: the step, what stopped its checkpoint ``final`` (a full disk named by its mount point, else the
    OS's words), what is intact, what to fix and that the same command then resumes."""
    run_dir = final.parent
    if fault.errno in (errno.ENOSPC, errno.EDQUOT):
        disk = run_dir.resolve()
        while not os.path.ismount(disk):
            disk = disk.parent
        what, fix = f"the disk at '{disk}' is full ({fault.strerror})", "free space there"
    else:
        what, fix = fault.strerror or str(fault), "fix that"
    return (f"step {step}: checkpoint {final.name} could not be written in '{run_dir}': {what}; the run's "
            f"earlier checkpoints and metrics are intact: {fix}, then the same command resumes")


def remove_unfinished(run_dir: Path) -> list[str]:
    """Remove what a save killed midway left (``save_checkpoint``'s ``.global_step_N.tmp-*`` being written,
    ``global_step_N.old`` being replaced): never resumed from, as large as a checkpoint. Call it only while
    holding the run's lock, when no other process can be saving. Returns the names removed."""
    gone = []
    run_dir = Path(run_dir)
    for p in sorted([*run_dir.glob(f".{CHECKPOINT_PREFIX}*.tmp-*"), *run_dir.glob(f"{CHECKPOINT_PREFIX}*.old")]):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p.name)
    return gone


def checkpoint_step(path: Path) -> int:
    path = Path(path)
    name = path.name
    if not name.startswith(CHECKPOINT_PREFIX) or not name[len(CHECKPOINT_PREFIX):].isdigit():
        raise UserError(f"trainer.resume_from_path '{path}' is not a global_step_N directory")
    if not (path / CHECKPOINT_COMPLETE).is_file() or not (path / CHECKPOINT_STATE_FILE).is_file():
        raise UserError(f"trainer.resume_from_path '{path}' is not a complete rlgrad checkpoint")
    return int(name[len(CHECKPOINT_PREFIX):])


def load_state(path: Path) -> dict[str, Any]:
    f = Path(path) / CHECKPOINT_STATE_FILE
    try:
        return torch.load(f, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated or overwritten: name the file, not the unpickler's internals
        raise UserError(f"checkpoint file '{f}' is damaged ({type(e).__name__}); resume from an earlier "
                        "global_step_N") from None


def damage(path: Path) -> str | None:
    """Why checkpoint ``path`` cannot be resumed from, or None when it looks sound: its trainer state
    unpickles, and every safetensors file is as long as its header says (a truncated copy is not)."""
    path = Path(path)
    try:
        load_state(path)
    except UserError:
        return f"{CHECKPOINT_STATE_FILE} does not load"
    for f in sorted(path.rglob("*.safetensors")):
        try:
            size = f.stat().st_size
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                if size < 8 or 8 + n > size:  # a length read from garbage: never trusted past the file's end
                    return f"{f.relative_to(path)} is not a safetensors file"
                header = json.loads(fh.read(n))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if 8 + n + end != size:
                return f"{f.relative_to(path)} is truncated"
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"{f.relative_to(path)} is not a safetensors file"
    return None


def rng_state() -> dict[str, Any]:
    out = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
