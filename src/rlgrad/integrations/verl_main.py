"""``python -m rlgrad.integrations.verl_main``: verl's ``main_ppo`` with rlgrad's actor worker.

Takes verl's own Hydra config (``ppo_trainer``) and overrides, plus ``+actor_rollout_ref.rlgrad.*`` (rlgrad's
``analysis.*`` settings and ``dir``). It registers a trainer ``rlgrad_sync`` through verl's
``register_trainer`` (``PPOTrainerSync`` whose actor role gets ``rlgrad.integrations.verl.ActorRolloutRefWorker``),
selects it with ``trainer.v1.trainer_mode``, and starts verl's ``run_ppo`` with a task runner whose Ray
process imports the registration (both in ``rlgrad.integrations.verl_trainer``). Nothing of verl is edited
or patched. The live doctor (``+actor_rollout_ref.rlgrad.doctor.live``, ``.halt_on``, ``.thresholds``) runs in
that trainer; a launch it stopped exits with status 3 (stopped by the doctor), as ``rlgrad train`` does.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import hydra
from omegaconf import OmegaConf, open_dict
from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

from rlgrad.doctor.findings import Thresholds
from rlgrad.errors import HALTED_STATUS, UserError
from rlgrad.integrations.verl import ActorRolloutRefWorker, check_verl_version
from rlgrad.integrations.verl_trainer import (
    ACTOR_ROLES,
    TRAINER,
    RlgradPPOTrainer,
    TaskRunner,
    rlgrad_settings,
)
from rlgrad.runfiles import DOCTOR_FILE, DOCTOR_HALT_FILE

__all__ = ["ACTOR_ROLES", "TRAINER", "ActorRolloutRefWorker", "RlgradPPOTrainer", "TaskRunner", "main", "prepare",
           "preflight", "check", "halted"]
VERL_CONFIG = str(Path(__import__("verl.trainer", fromlist=["x"]).__file__).parent / "config")


def prepare(config) -> None:
    """Check the config for rlgrad and point it at rlgrad's trainer and run directory (in place)."""
    check_verl_version()
    if not config.trainer.get("use_v1", True):
        raise UserError("rlgrad.integrations.verl runs verl's V1 trainer: leave trainer.use_v1=true")
    mode = config.trainer.v1.trainer_mode
    if mode not in ("sync", TRAINER):
        raise UserError(f"rlgrad.integrations.verl supports trainer.v1.trainer_mode=sync, not '{mode}'")
    with open_dict(config):
        config.trainer.v1.trainer_mode = TRAINER
        rl = config.actor_rollout_ref.get("rlgrad", None)
        if rl is None:
            config.actor_rollout_ref.rlgrad = {}
            rl = config.actor_rollout_ref.rlgrad
        # Ray workers do not share the launcher's working directory: the run directory is made absolute here.
        rl.dir = os.path.abspath(rl.get("dir", None) or os.path.join(config.trainer.default_local_dir, "rlgrad"))
        if rl.get("doctor", None) is not None and rl.doctor.get("thresholds", None):
            rl.doctor.thresholds = os.path.abspath(rl.doctor.thresholds)  # read in verl's trainer process
    settings = rlgrad_settings(config)  # a bad rlgrad setting stops here, before Ray, in one line
    if settings.doctor.thresholds:
        Thresholds.from_file(settings.doctor.thresholds)


def _first_prompt(config) -> list[dict]:
    """The first training row's prompt messages, read from ``data.train_files`` as verl's dataset reads them."""
    files = config.data.train_files
    first = files if isinstance(files, str) else (list(files) or [None])[0]
    key = config.data.get("prompt_key", "prompt")
    if not first or not os.path.isfile(first):
        raise UserError(f"data.train_files: no such file '{first}'")
    try:
        import pyarrow.parquet as pq

        rows = next(pq.ParquetFile(first).iter_batches(batch_size=1, columns=[key])).to_pylist()
    except Exception as e:  # noqa: BLE001 - any reader failure is the file's fault, named in one line
        raise UserError(f"data.train_files: cannot read column '{key}' of '{first}': {type(e).__name__}: {e}") from None
    messages = rows[0][key] if rows else None
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise UserError(f"data.train_files: the first row of '{first}' has no chat messages in '{key}' "
                        f"(verl's layout: a list of {{role, content}})")
    return messages


def preflight(config) -> list[int]:
    """Check, before Ray starts, what would otherwise fail inside verl's rollout workers: the tokenizer loads,
    the token builder verl's agent loop picks for the model's ``model_type`` (Qwen's needs ``"\\n"`` as one
    token and ``<|im_end|>``) can be built, and it encodes the first training prompt through the chat template
    with no unknown token. Returns that prompt's ids; a ``UserError`` naming the culprit otherwise.

    Uses verl's own objects (``HFModelConfig``, ``create_continuous_token_builder``), as the agent loop does."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    model = config.actor_rollout_ref.model
    try:
        model_config = omega_conf_to_dataclass(model)
    except Exception as e:  # noqa: BLE001 - verl raises whatever transformers raises
        raise UserError(f"actor_rollout_ref.model.path={model.path}: cannot load its tokenizer or config: "
                        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    tok = model_config.tokenizer
    model_type = getattr(model_config.hf_config, "model_type", None)
    try:
        builder = create_continuous_token_builder(
            tok, hf_model_type=model_type if isinstance(model_type, str) else None,
            chat_template_kwargs=config.data.get("apply_chat_template_kwargs", {}) or {},
            processor=model_config.processor)
    except Exception as e:  # noqa: BLE001 - verl's builders raise ValueError, tokenizers other errors
        raise UserError(f"actor_rollout_ref.model.path={model.path}: verl's agent loop cannot tokenize for "
                        f"model_type '{model_type}': {e}") from None
    messages = _first_prompt(config)
    try:
        ids = [int(i) for i in builder.build_initial_tokens(messages)]
    except Exception as e:  # noqa: BLE001 - a template that refuses the messages, a tokenizer error
        raise UserError(f"actor_rollout_ref.model.path={model.path}: the chat template cannot encode the first "
                        f"training prompt: {type(e).__name__}: {e}") from None
    unk = getattr(tok, "unk_token_id", None)
    if not ids or (unk is not None and unk in ids):
        n = ids.count(unk) if ids else 0
        raise UserError(f"actor_rollout_ref.model.path={model.path}: its tokenizer encodes the first training "
                        f"prompt to {len(ids)} tokens, {n} of them the unknown token {tok.unk_token!r}: "
                        f"a tokenizer that does not match the data")
    return ids


def check(config) -> None:
    """``prepare`` and ``preflight``; bad input exits with status 2 and one line, as rlgrad's command line does."""
    try:
        prepare(config)
        preflight(config)
    except UserError as e:
        print(f"rlgrad: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def halted(run_dir: str | os.PathLike) -> None:
    """After verl's run: if the live doctor stopped it (``RUN/doctor_halt.json``, written by rlgrad's verl trainer),
    its message on stderr and exit status 3 (``HALTED_STATUS``, as ``rlgrad train``); otherwise nothing."""
    path = Path(run_dir) / DOCTOR_HALT_FILE
    if not path.is_file():
        return
    try:
        halt = json.loads(path.read_text())
        step, reason = halt["step"], halt["reason"]
    except (json.JSONDecodeError, KeyError, TypeError):
        step, reason = "?", f"see {Path(run_dir) / DOCTOR_FILE}"
    print(f"rlgrad: stopped by the doctor after step {step}: {reason}", file=sys.stderr)
    raise SystemExit(HALTED_STATUS)


@hydra.main(config_path=VERL_CONFIG, config_name="ppo_trainer", version_base=None)
def main(config) -> None:
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    check(config)
    run_dir = config.actor_rollout_ref.rlgrad.dir
    print(f"[rlgrad] instruments in verl's actor worker; run files in {run_dir}")
    Path(run_dir, DOCTOR_HALT_FILE).unlink(missing_ok=True)  # an earlier launch's halt: this launch says its own
    OmegaConf.set_struct(config, True)
    run_ppo(config, task_runner_class=TaskRunner)
    halted(run_dir)


if __name__ == "__main__":
    main()
