"""rlgrad's instruments inside verl's PPO/GRPO trainer (verl 0.9, model-engine workers), without editing verl.

Launch verl's trainer through rlgrad's entry point, with verl's own config and overrides plus rlgrad's::

    python -m rlgrad.integrations.verl <verl's overrides...> \\
        +actor_rollout_ref.rlgrad.analysis.every=10          # optional; any analysis.* setting of rlgrad

It is verl's ``main_ppo`` with one change made through verl's own extension points: the trainer registered
as ``rlgrad_sync`` (``register_trainer``, selected by ``trainer.v1.trainer_mode``) gives the actor role
rlgrad's worker, a subclass of verl's ``ActorRolloutRefWorker`` whose actor ``TrainingWorker`` runs the
instruments at the analysed steps, on the batch its ``train_mini_batch`` receives and before the update:
the gradient by reward-variance bucket (prompt groups from ``uid``) and loss term (verl's own
``actor.policy_loss``, ``loss_agg_mode``, entropy and KL loss, ``rlgrad.integrations.verl_loss``), and neuron
health on the first mini-batch's gradient. The metrics come back through verl's metric dict (verl prefixes
the actor's metrics with ``actor/``) and go to an rlgrad run directory (``actor_rollout_ref.rlgrad.dir``,
default ``<trainer.default_local_dir>/rlgrad``) that ``rlgrad plot`` and ``rlgrad report`` read.

The analysis runs on verl's own engine module (``strategy=fsdp2``): its FSDP2 shards, mixed precision and
offload (inside verl's ``train_mode``), activation checkpointing turned off for the analysis forward. The fast
gradient engine's hooks see each layer's input and output gradient while FSDP2 holds that layer unsharded and
reduce each parameter's slice gradients over the data-parallel group as soon as its layer's backward is done, so
no more than one layer's slice gradients exist at once and nothing stays between analysed steps
(``docs/scaling.md``). With verl's FSDP1 (``strategy=fsdp``) the analysis runs on a plain replica built for the
analysed step and dropped after it: one more copy of the weights per GPU during that step.

The hooks run through ``rlgrad.hooks.HookRunner``, as in rlgrad's trainer; their tables go to ``tables.jsonl`` in
the run directory (verl's trackers live in the trainer's process, which the worker cannot reach). A hook that asks
to stop (``HookResult.stop``) cannot skip the update it runs inside (verl's actor update is one remote call): the
update finishes, the worker reports ``STOP_METRIC`` in its metrics, and rlgrad's verl trainer (``rlgrad_sync``,
``rlgrad.integrations.verl_trainer``) ends verl's loop after that step, its checkpoint and validation only where
they were due anyway. Under verl's own trainer the report is ignored.
"""

from __future__ import annotations

import copy
import importlib.metadata
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from packaging.version import Version

from rlgrad.analysis import hooks_from_config, schedules
from rlgrad.analysis.engine import fast_unsupported
from rlgrad.collectives import all_reduce_sum, is_main
from rlgrad.distributed import sync_policy
from rlgrad.errors import UserError
from rlgrad.hooks import Hook, HookRunner, Schedule, StepContext
from rlgrad.integrations import activation_checkpointing_off, instrument_settings, open_metrics
from rlgrad.integrations.verl_loss import batch_from_verl, verl_loss_settings
from rlgrad.logging.sinks import JsonlSink, JsonlTableSink
from rlgrad.runfiles import TABLES_FILE

try:
    from verl.single_controller.base.decorator import MAGIC_ATTR, register
    from verl.workers.engine_workers import ActorRolloutRefWorker as _VerlActorRolloutRefWorker
    from verl.workers.engine_workers import TrainingWorker as _VerlTrainingWorker
except ImportError as e:  # pragma: no cover - the module is only imported by people who use verl
    raise ImportError("rlgrad.integrations.verl needs verl: pip install 'rlgrad[verl]'") from e

VERL_VERSIONS = (Version("0.9"), Version("0.10"))  # supported: [low, high); CI tests the newest release
DEFAULTS = ("analysis.every=10",)
UNSUPPORTED = {"analysis.buckets.env_groups": None, "analysis.buckets.group_size": None,
               "analysis.buckets.log_prefilter": False, "analysis.buckets.exit_after": False,
               "analysis.buckets.save_batch": False, "analysis.neurons.actor.reset_every": 0}
# verl's actor metrics (as its TrainingWorker returns them) written to metrics.jsonl under rlgrad's names.
VERL_METRICS = {"actor/pg_loss": "actor/pg_loss", "actor/pg_clipfrac": "actor/pg_clipfrac",
                "actor/ppo_kl": "actor/ppo_kl", "actor/pg_clipfrac_lower": "actor/pg_clipfrac_lower",
                "actor/entropy_loss": "actor/entropy", "kl_loss": "actor/kl_loss", "grad_norm": "actor/grad_norm",
                "lr": "actor/lr"}
# In the worker's metrics (verl's trainer reads it as actor/rlgrad_stop): a hook asked to end the run after this
# step. rlgrad's verl trainer takes it out before verl logs the step; it never reaches metrics.jsonl.
STOP_METRIC = "rlgrad_stop"
# What verl's FSDP engine turns activation checkpointing on with (enable_gradient_checkpointing): the instruments
# turn it off for their forwards and back on with these.
CHECKPOINTING_KWARGS = {"use_reentrant": False}


def stop_requested(step_metrics: dict) -> bool:
    """Takes the actor worker's stop report (``STOP_METRIC``, ``actor/``-prefixed by verl's trainer) out of a
    step's metrics, so that verl never logs it, and says whether a hook asked to end the run after the step."""
    return float(step_metrics.pop(f"actor/{STOP_METRIC}", 0.0) or 0.0) > 0


def registered_as(verl_method):
    """verl's ``@register`` with the dispatch attributes of the verl method an override replaces.

    verl's worker group exposes a worker's method only when it carries these attributes; an override without
    them is invisible to the trainer (``'RayWorkerGroup' object has no attribute 'init_model'``)."""
    return register(**getattr(verl_method, MAGIC_ATTR))


def check_verl_version(version: str | None = None) -> Version:
    """The installed (or given) verl version; a one-line error outside ``VERL_VERSIONS``."""
    v = Version(version or importlib.metadata.version("verl"))
    low, high = VERL_VERSIONS
    if not low <= v < high:
        raise UserError(f"rlgrad.integrations.verl supports verl >={low},<{high}, found {v}")
    return v


def _mean(v) -> float | None:
    """A verl metric value (a number, a list of per-micro-batch values, or a ``Metric``) as one float."""
    if isinstance(v, list):
        vals = [_mean(x) for x in v]
        vals = [x for x in vals if x is not None]
        return sum(vals) / len(vals) if vals else None
    v = getattr(v, "value", v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


class TrainingWorker(_VerlTrainingWorker):
    """verl's ``TrainingWorker`` (the actor's model engine) with rlgrad's instruments (module docstring).

    ``rlgrad_setup`` turns them on; until then it is verl's worker unchanged. The instruments read the
    weights and the batch and write metrics: the update itself, its RNG streams and the optimizer state are
    verl's."""

    rlgrad = None  # the instruments' state, set by rlgrad_setup

    def rlgrad_setup(self, actor_config, overrides: list[str], run_dir: str | os.PathLike,
                     temperature: float = 1.0, hooks: Sequence[Hook] = ()) -> None:
        """Turn the instruments on: ``overrides`` are rlgrad's ``analysis.*`` settings; ``hooks``: hooks of your
        own, run after them at every step (their own schedules decide; a step with any hook refreshes the
        plain replica of the policy)."""
        check_verl_version()
        self.rlgrad = _Instruments(self, actor_config, overrides, Path(run_dir), temperature, hooks)

    @registered_as(_VerlTrainingWorker.train_mini_batch)
    def train_mini_batch(self, data):
        rl = self.rlgrad
        if rl is None:
            return super().train_mini_batch(data)
        rl.step += 1
        metrics = rl.before_update(data)
        output = super().train_mini_batch(data)
        metrics.update(rl.after_update())
        if output is not None:
            from verl.utils import tensordict_utils as tu

            verl_metrics = tu.get(output, "metrics")
            rl.log(verl_metrics, metrics)
            verl_metrics.update({k: [v] for k, v in metrics.items()})  # verl's trainer prefixes them with actor/
            if rl.stop_reason is not None:
                verl_metrics[STOP_METRIC] = [1.0]
        return output

    @registered_as(_VerlTrainingWorker.load_checkpoint)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        out = super().load_checkpoint(local_path, hdfs_path, del_local_after_load)
        m = re.search(r"global_step_(\d+)", str(local_path))
        if self.rlgrad is not None and m:  # verl's checkpoint directories carry the step the run resumes from
            self.rlgrad.resume(int(m.group(1)))
        return out


class _Instruments:
    """rlgrad's hooks run on one verl actor worker's update batches."""

    def __init__(self, worker: _VerlTrainingWorker, actor_config, overrides: list[str], run_dir: Path,
                 temperature: float, hooks: Sequence[Hook] = ()):
        self.worker = worker
        self.cfg = instrument_settings([*DEFAULTS, *overrides], UNSUPPORTED, "verl")
        engine_cfg = worker.engine_config
        if getattr(engine_cfg, "ulysses_sequence_parallel_size", 1) > 1:
            raise UserError("rlgrad's instruments need every data-parallel rank to hold whole sequences: "
                            "ulysses_sequence_parallel_size must be 1")
        if getattr(engine_cfg, "strategy", "fsdp2") not in ("fsdp", "fsdp2"):
            raise UserError(f"rlgrad's instruments support verl's fsdp/fsdp2 engines, not "
                            f"'{engine_cfg.strategy}'")
        self.settings = verl_loss_settings(actor_config, temperature)
        at = schedules(self.cfg)
        at["components"] = Schedule(0)  # verl's reward components are not in the update batch
        at["neurons/critic"] = Schedule(0)
        self.at = at
        self.own_hooks = bool(hooks)  # the user's hooks: every step is one they may act at
        self.hooks = HookRunner([*hooks_from_config(self.cfg, at), *hooks])
        self.run_dir = run_dir
        self.step = 0
        self.ctx: StepContext | None = None
        self.pending: dict[str, float] = {}
        self.stop_reason: str | None = None  # a hook asked, at this step, to end the run after it
        self.neurons_step = 0  # the step whose first mini-batch gradient neuron health has measured
        self.sharded = getattr(engine_cfg, "strategy", "fsdp2") == "fsdp2"  # FSDP1: ``_replica``
        if self.sharded:
            why = fast_unsupported(worker.engine.module)
            if why or self.cfg.analysis.method != "fast":
                raise UserError(f"rlgrad's instruments run on verl's FSDP2 shards with analysis.method=fast only"
                                f"{f' ({why})' if why else ''}")
        self.metrics_log: JsonlSink | None = None
        self.table_log: JsonlTableSink | None = None
        self._opened = False
        worker.engine.optimizer.register_step_pre_hook(self._on_optimizer_step)

    # ---- run directory -----------------------------------------------------------------------------
    def _open(self) -> None:
        if self._opened:
            return
        self._opened = True
        if is_main():  # self.step is the step about to run: the run resumed after step - 1
            self.metrics_log = open_metrics(self.run_dir, self.step - 1,
                                            "set actor_rollout_ref.rlgrad.dir to a new directory",
                                            also=(self.run_dir / TABLES_FILE,))
            self.table_log = JsonlTableSink(self.run_dir / TABLES_FILE)

    def resume(self, step: int) -> None:
        self.step = step

    # ---- the step ----------------------------------------------------------------------------------
    def _due(self) -> bool:
        return self.own_hooks or any(s.due(self.step) for s in self.at.values())

    def _replica(self) -> torch.nn.Module:
        """verl's FSDP1 (``strategy=fsdp``): a plain module with the current weights, built for one analysed
        step and dropped after it (FSDP1's flat parameters hide the layers' own weights from the hooks)."""
        from transformers import AutoModelForCausalLM
        from verl.utils.device import get_device_name

        module = self.worker.engine.module
        dtype = next(module.parameters()).dtype  # verl's actor keeps fp32 master weights
        with torch.device("meta"):
            replica = AutoModelForCausalLM.from_config(self.worker.model_config.hf_config, dtype=dtype)
            if hasattr(module, "peft_config"):  # lora_rank > 0: verl's PeftModel, its adapters the trainable part
                from peft import get_peft_model

                replica = get_peft_model(replica, copy.deepcopy(module.peft_config["default"]))
        replica = replica.to_empty(device=get_device_name())
        replica.tie_weights()
        buffers = dict(module.named_buffers())  # not sharded by FSDP (rotary frequencies)
        with torch.no_grad():
            for name, b in replica.named_buffers():
                b.copy_(buffers[name])
        sync_policy(module, replica)
        return replica

    @contextmanager
    def analysing(self) -> Iterator[torch.nn.Module]:
        """The module the instruments run on: verl's own FSDP2 module (its shards and mixed precision; the
        fast engine sums each layer's slice gradients over ranks), its activation checkpointing off, as verl's
        ``train_mode`` holds it (param/optimizer offload brought back). FSDP1: a replica for this step only."""
        engine = self.worker.engine
        with engine.train_mode(zero_grad_on_exit=False):
            if self.sharded:
                with activation_checkpointing_off(engine.module, CHECKPOINTING_KWARGS):
                    yield engine.module
            else:
                with torch.enable_grad():
                    yield self._replica()

    def before_update(self, data) -> dict[str, float]:
        self._open()
        batch = batch_from_verl(data)
        out = {"critic/score/mean": float(all_reduce_sum(batch.scores.sum().double()) /
                                          max(float(all_reduce_sum(torch.tensor(float(len(batch))))), 1.0))}
        self.stop_reason = None
        if not self._due():
            self.ctx = None
            return out
        with self.analysing() as model:
            module = self.worker.engine.module
            sync = (lambda: None) if model is module else (lambda: sync_policy(module, model))
            self.ctx = StepContext(step=self.step, batch=batch, actor=model, optimizer=self.worker.engine.optimizer,
                                   loss_settings=self.settings, config=self.cfg, run_dir=self.run_dir,
                                   is_main=is_main(), sync_actor=sync)
            res = self.hooks.before_update(self.ctx)
        out.update(res.metrics)
        if self.table_log is not None:
            for key, (columns, rows) in res.tables.items():
                self.table_log.log_table(key, columns, rows, self.step)
        if res.stop:
            self.stop_reason = res.reason
            if is_main():
                print(f"[rlgrad] step {self.step}: the run ends after this step ({res.reason})")
        return out

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        """The first mini-batch's gradient (verl clips it before stepping: neuron health is scale-free)."""
        ctx = self.ctx
        if ctx is None or self.neurons_step == ctx.step:
            return
        self.neurons_step = ctx.step
        module = self.worker.engine.module
        with activation_checkpointing_off(module, CHECKPOINTING_KWARGS):  # inside verl's train_mode already
            self.pending.update(self.hooks.on_grads(ctx, module, ctx.batch, "actor"))

    def after_update(self) -> dict[str, float]:
        out, self.pending = self.pending, {}
        if self.ctx is not None:
            out.update(self.hooks.after_update(self.ctx).metrics)
            self.ctx = None  # nothing of the step (its batch, an FSDP1 replica) stays until the next one
        return out

    def log(self, verl_metrics: dict, ours: dict[str, float]) -> None:
        if self.metrics_log is None:
            return
        row = {name: m for k, name in VERL_METRICS.items() if k in verl_metrics
               and (m := _mean(verl_metrics[k])) is not None}
        self.metrics_log.log(self.step, {**row, **ours})


class ActorRolloutRefWorker(_VerlActorRolloutRefWorker):
    """verl's hybrid actor/rollout/ref worker whose actor is rlgrad's ``TrainingWorker``; the rlgrad settings
    are ``actor_rollout_ref.rlgrad`` (``dir`` and any ``analysis.*`` key of rlgrad's config)."""

    actor_worker_cls = TrainingWorker

    def __init__(self, config, role: str, distillation_config=None, **kwargs):
        super().__init__(config, role, distillation_config, **kwargs)
        _join_cpu_process_group()

    @registered_as(_VerlActorRolloutRefWorker.init_model)
    def init_model(self):
        super().init_model()
        if self.actor is not None:
            from verl.utils.config import omega_conf_to_dataclass

            if self.distillation_enabled:
                raise UserError("rlgrad's instruments do not follow verl's distillation loss")
            rl = self.config.get("rlgrad", None) or {}
            overrides = [f"{k}={v}" for k, v in flatten_settings(rl).items() if k != "dir"]
            self.actor.rlgrad_setup(omega_conf_to_dataclass(self.config.actor), overrides, rl.get("dir", None) or
                                    "rlgrad", temperature=float(self.config.rollout.temperature))


def _join_cpu_process_group() -> None:
    """On verl's CPU platform (``rlgrad.integrations.verl_cpu``), a plain gloo group before verl's workers
    would create theirs: verl's backend string there, ``cpu:gloo,cpu:gloo``, is refused by torch."""
    import torch.distributed as dist
    from verl.utils.device import get_device_name

    if get_device_name() == "cpu" and not dist.is_initialized():
        dist.init_process_group("gloo", rank=int(os.environ.get("RANK", 0)),
                                world_size=int(os.environ.get("WORLD_SIZE", 1)))


def flatten_settings(d, prefix: str = "") -> dict:
    """``actor_rollout_ref.rlgrad`` (nested) as rlgrad's dotted settings: ``{"analysis.every": 10, ...}``."""
    out = {}
    for k, v in d.items():
        if hasattr(v, "items"):
            out.update(flatten_settings(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = "null" if v is None else v
    return out
