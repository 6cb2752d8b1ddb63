"""Checkpoints: ``global_step_N/`` with the actor in Hugging Face format plus everything
needed to resume exactly (optimizer, scheduler, RNG streams, loop state).

A checkpoint is written into a temporary directory and renamed into place once complete
(with a ``COMPLETE`` marker), so a crash mid-save never leaves a checkpoint that looks usable.
"""

from __future__ import annotations

import json
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
    """``models`` maps a role ("actor", later "critic") to a model with ``save_pretrained``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir(run_dir, step)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=run_dir))
    try:
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
    except OSError as e:  # a full disk, a quota: the earlier checkpoints and the metrics are intact
        raise UserError(f"could not write checkpoint {final.name} in '{run_dir}': {e.strerror or e}; the "
                        "run's earlier checkpoints and metrics are intact (free space, then resume)") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    atomic_write_text(run_dir / LATEST_CHECKPOINT_FILE, f"{step}\n")
    if max_to_keep is not None and max_to_keep > 0:  # null or -1: keep every checkpoint
        for _, old in checkpoint_dirs(run_dir)[:-max_to_keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


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
