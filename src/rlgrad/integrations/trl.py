"""rlgrad's instruments inside TRL's ``GRPOTrainer``: change one import.

    from rlgrad.integrations.trl import GRPOTrainer        # instead of: from trl import GRPOTrainer

    trainer = GRPOTrainer(model=..., reward_funcs=[correct, fmt], args=GRPOConfig(...), train_dataset=...,
                          rlgrad=["analysis.every=5"])   # optional: rlgrad settings as key=value (default every=10)

At the analysed steps (``analysis.every``, or each instrument's own ``analysis.*`` cadence) it measures, on
TRL's own generation batch and loss (``rlgrad.integrations.trl_loss``), before the step's update: the
gradient by reward-variance bucket and loss term (``grad_norm/...``), the reward functions' gradient geometry
(``grad_comp/...``, ``grad_sim/...``: TRL's ``reward_funcs`` weighted by ``reward_weights`` are the
components), and, on the step's accumulated gradient, neuron health (``actor/neuron/...``). The numbers go to
TRL's own logs (so every ``report_to`` sink shows them next to TRL's metrics, at TRL's next logging step) and
to an rlgrad run directory, ``args.output_dir`` unless ``rlgrad_dir`` says otherwise: ``metrics.jsonl`` (the
analysis at its own step, TRL's scalars under rlgrad's names, ``rlgrad.metrics.TRL_NAMES``), ``analysis/step_N/``,
``reward_components.jsonl`` and ``rollouts/step_N.jsonl``, which ``rlgrad plot``, ``report`` and ``samples`` read,
and the hooks' tables (the bucket analysis's group table), ``tables.jsonl``. TRL's console prints rlgrad's keys
as the one line ``rlgrad train`` prints (``rlgrad.integrations.trl_console``).
A reward function's (or model's) name is escaped in metric keys (``rlgrad.metrics.component_keys``: TRL names a
reward model after its repo, dashes and dots included); ``run_source.json`` keeps the original names, which the
report and ``rlgrad doctor`` show.

The hooks run through ``rlgrad.hooks.HookRunner``, as in rlgrad's trainer. A hook that asks to stop
(``HookResult.stop``, e.g. one of ``rlgrad_hooks``) cannot stop TRL before the update: the hook point is inside
TRL's training step, between its generation and its loss, where TRL offers no way to skip the step. The step
finishes, then TRL's own ``TrainerControl.should_training_stop`` ends training, as ``max_steps`` would (TRL's
end-of-step logging and saving run as usual).

Where TRL's optimizer step is one forward and backward over the whole generation batch of the policy loss alone
(``one_pass_update``; ``beta=0``), the instruments ride on it instead of running a pass of their own before it
(``rlgrad.analysis.groups``, "the update's own pass"): ``compute_loss`` opens the hooks' tap on TRL's forward, which
``training_step`` closes after TRL's backward, and ``TRLLoss.fused_head`` shows TRL's fused LM head to the hooks;
the rows are told apart after TRL shuffles them by a key of the generation output (``ROWS``).

Only TRL's documented extension points are used: this subclass calls TRL's own methods and adds to them
(``_calculate_rewards``, ``_generate_and_score_completions``, ``log``, ``training_step``, ``compute_loss``), a
``TrainerCallback`` and module hooks; nothing is patched. The instruments change nothing TRL computes: weights,
gradients, optimizer state and RNG streams are as without them. Under ``accelerate launch`` / torchrun every process
runs them on its rows, the metrics are global, and only the main process writes.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from packaging.version import Version
from transformers import TrainerCallback

from rlgrad import collectives
from rlgrad.algos.objective import LossSettings
from rlgrad.analysis import hooks_from_config
from rlgrad.doctor.hook import doctor_hooks
from rlgrad.errors import UserError
from rlgrad.hooks import Hook, HookResult, HookRunner, StepContext
from rlgrad.integrations import activation_checkpointing_off, instrument_settings, open_metrics
from rlgrad.integrations.trl_console import use_summary_console
from rlgrad.integrations.trl_loss import (
    TRLLoss,
    TRLLossSettings,
    batch_from_trl,
    plain_fused_head,
    trl_reward_view,
)
from rlgrad.logging.rewards import RewardComponentLog, step_record
from rlgrad.logging.rollouts import RolloutLog, gather_samples, prompt_texts, step_samples
from rlgrad.logging.sinks import JsonlSink, JsonlTableSink
from rlgrad.metrics import component_keys, foreign_key
from rlgrad.runfiles import REWARD_COMPONENTS_FILE, RUN_SOURCE_FILE, TABLES_FILE, atomic_write_json, rollout_dir

try:
    from trl import GRPOTrainer as _TRLGRPOTrainer
except ImportError as e:  # pragma: no cover - the module is only imported by people who use TRL
    raise ImportError("rlgrad.integrations.trl needs TRL: pip install 'rlgrad[trl]'") from e

TRL_VERSIONS = (Version("1.16"), Version("2"))  # supported: [low, high); CI tests the newest release
ROWS = "rlgrad_rows"  # a key of TRL's generation output where the instruments ride on its update: each row's place
DEFAULTS = ("analysis.every=10",)  # before the user's settings: every instrument at steps 1, 11, 21, ...
# rlgrad settings that need rlgrad's own trainer (a second rollout, the rollout filter, a stop, a reset).
UNSUPPORTED = {"analysis.buckets.env_groups": None, "analysis.buckets.group_size": None,
               "analysis.buckets.log_prefilter": False, "analysis.buckets.exit_after": False,
               "analysis.buckets.save_batch": False, "analysis.components.mode": "shared_std",
               "analysis.neurons.actor.reset_every": 0}


def check_trl_version(version: str | None = None) -> Version:
    """The installed (or given) TRL version; a one-line error outside ``TRL_VERSIONS``."""
    v = Version(version or importlib.metadata.version("trl"))
    low, high = TRL_VERSIONS
    if not low <= v < high:
        raise UserError(f"rlgrad.integrations.trl supports TRL >={low},<{high}, found {v}: "
                        f"pip install 'trl>={low},<{high}'")
    return v


def trl_metrics(logs: dict[str, float], components: dict[str, str] | None = None) -> dict[str, float]:
    """TRL's logged scalars under rlgrad's names (``rlgrad.metrics.TRL_NAMES``); ``components``: each reward
    function's (or model's) name -> its metric key (``reward_keys``)."""
    return {name: float(v) for k, v in logs.items()
            if isinstance(v, int | float) and (name := foreign_key(k, "trl", components)) is not None}


SETTINGS = ("optim", "learning_rate", "max_grad_norm", "adam_epsilon", "beta", "max_completion_length",
            "num_generations", "scale_rewards")  # TRL's args that rlgrad doctor reads (its advice depends on them)


def trl_settings(args) -> dict:
    """The TRL args ``rlgrad doctor`` reads, by TRL's names, as plain values (``optim`` is an enum)."""
    out = {}
    for name in SETTINGS:
        val = getattr(args, name, None)
        val = getattr(val, "value", val)
        if isinstance(val, str | int | float | bool):
            out[name] = val
    return out


def reward_keys(names: Sequence[str]) -> dict[str, str]:
    """TRL's reward function (and model) names -> their keys in rlgrad's metrics (``metrics.component_keys``:
    TRL names a reward model after its repo, ``tiny-Qwen2ForSequenceClassification-2.5``, which no metric key
    may hold). Two functions of one name (two lambdas) share TRL's logs; the first one's key is the name's."""
    out: dict[str, str] = {}
    for name, k in zip(names, component_keys(list(names))):
        out.setdefault(name, k)
    return out


log = logging.getLogger(__name__)


def one_pass_update(trainer: _TRLGRPOTrainer) -> bool:
    """Whether TRL's optimizer step of this generation batch is ONE forward and backward over all of its rows at the
    current weights, which the instruments can ride on (``hooks.StepContext.one_pass_update``): one process, the
    batch in one accumulation step (``steps_per_generation`` = ``gradient_accumulation_steps`` = 1), one iteration
    per generation and TRL's own loss code (no Liger kernel), with an LM head ``TRLLoss.fused_head`` can show to the
    hooks (``plain_fused_head``), and a backward of the loss as it is: fp16's ``GradScaler`` (accelerate's
    ``scaler``) backwards the loss times its scale. Activation checkpointing (TRL's default) may be on: the
    engine's hooks skip a layer's recompute inside the backward (``engine._SliceReducer._recomputed``)."""
    a = trainer.args
    return (trainer.accelerator.num_processes == 1 and getattr(trainer.accelerator, "scaler", None) is None
            and a.steps_per_generation == 1
            and a.gradient_accumulation_steps == 1 and trainer.num_iterations == 1
            and not getattr(trainer, "use_liger_kernel", False) and not getattr(a, "use_liger_kernel", False)
            and plain_fused_head(trainer.accelerator.unwrap_model(trainer.model)))


class GRPOTrainer(_TRLGRPOTrainer):
    """TRL's ``GRPOTrainer`` with rlgrad's instruments (module docstring); every argument is TRL's, plus:

    ``rlgrad``: rlgrad settings as ``key=value`` strings, the ``analysis.*`` section of ``rlgrad train``'s
    config (docs/configuration.md), applied after ``DEFAULTS``; ``trainer.seed`` is TRL's ``args.seed``.
    ``rlgrad_dir``: where rlgrad's run files go (default: ``args.output_dir``).
    ``rlgrad_hooks``: hooks of your own (``rlgrad.hooks.Hook``), run after the instruments at every step TRL
    generates for; their ``StepContext`` is the instruments' (TRL's batch and loss). A stop they ask for ends
    training after the step (module docstring).
    """

    def __init__(self, *args, rlgrad: Sequence[str] = (), rlgrad_dir: str | None = None,
                 rlgrad_hooks: Sequence[Hook] = (), **kwargs):
        check_trl_version()
        super().__init__(*args, **kwargs)
        self.rlgrad = _Instruments(self, list(rlgrad), Path(rlgrad_dir or self.args.output_dir), rlgrad_hooks)
        self.add_callback(_Callback(self.rlgrad))
        use_summary_console(self, lambda: self.rlgrad.on_console)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.rlgrad.rewards = rewards  # every process's rows: TRL gathers them to normalise by group
        return rewards

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self.rlgrad.before_update(out)
            if self.rlgrad.rides():  # which row is which after TRL shuffles them (``compute_loss``)
                out[ROWS] = torch.arange(len(out["advantages"]))
        return out

    def training_step(self, model, inputs, num_items_in_batch):
        with self.rlgrad.update():
            return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if ROWS in inputs and model.training:
            self.rlgrad.ride(inputs[ROWS])
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        self.rlgrad.on_console = ()
        if not any(k.startswith("eval_") for k in logs):  # a training log
            step, ours = self.rlgrad.take_unlogged()
            logs.update(ours)
            if ours:  # the console prints them as one line (integrations.trl_console); the loggers get them all
                self.rlgrad.on_console = (step, ours)
        super().log(logs, start_time)


class _Instruments:
    """rlgrad's hooks run on one TRL trainer's batches (the state the subclass and its callback share)."""

    def __init__(self, trainer: _TRLGRPOTrainer, overrides: list[str], run_dir: Path, hooks: Sequence[Hook] = ()):
        self.trainer = trainer
        self.cfg = instrument_settings([*DEFAULTS, *overrides, f"trainer.seed={trainer.args.seed}"], UNSUPPORTED,
                                       "TRL")
        self.loss = TRLLoss(TRLLossSettings.of(trainer))
        self.run_dir = run_dir
        self.is_main = trainer.accelerator.is_main_process
        # the live doctor last: it reads TRL's logged scalars of a step (under rlgrad's names) with its analysis
        live = doctor_hooks(self.cfg, run_dir, kind="trl", settings=trl_settings(trainer.args), is_main=self.is_main)
        self.hooks = HookRunner([*hooks_from_config(self.cfg), *hooks, *live])
        self.analysed: dict[int, dict[str, float]] = {}  # the analysis metrics of a step, for the doctor
        self.halted = ""  # why the live doctor stopped training (doctor.halt_on), empty while it has not
        # The reward functions as rlgrad's metric keys name them (TRL's names, escaped: metrics.component_keys).
        self.components = component_keys(list(trainer.reward_func_names))
        self.key_of = reward_keys(trainer.reward_func_names)
        self.rewards: torch.Tensor | None = None
        self.ctx: StepContext | None = None
        self.pending: dict[str, float] = {}  # the analysed step's metrics, until the step ends
        self.unlogged: dict[str, float] = {}  # analysis metrics TRL's loggers have not seen yet
        self.unlogged_step = 0  # the step they were measured at
        self.on_console: tuple[int, dict[str, float]] | tuple[()] = ()  # rlgrad's keys in the log being printed
        self.stop_at: int | None = None  # the step a hook asked to end training after
        self.riding: ExitStack | None = None  # inside TRL's training_step: the tap entered at its compute_loss
        self.metrics_log: JsonlSink | None = None
        self.table_log: JsonlTableSink | None = None
        self.reward_log: RewardComponentLog | None = None
        self.rollout_log: RolloutLog | None = None

    # ---- run directory -----------------------------------------------------------------------------
    def open(self, step: int) -> None:
        """At the start of training (``step``: the resumed global step): refuse another run's files, resume ours."""
        self.stop_at, self.pending = None, {}  # (a failed attempt's measurements are not the retried step's)
        if self.is_main:
            self.metrics_log = open_metrics(self.run_dir, step, "use a new output_dir (or rlgrad_dir)",
                                            also=(self.run_dir / REWARD_COMPONENTS_FILE, self.run_dir / TABLES_FILE))
            self.table_log = JsonlTableSink(self.run_dir / TABLES_FILE)
            self.reward_log = RewardComponentLog(self.run_dir)
            self.rollout_log = RolloutLog(rollout_dir(self.run_dir))
            self.rollout_log.discard_after(step)
            # Which trainer wrote the run, and the original reward names behind its component keys, for rlgrad
            # report / doctor (the metric keys hold the escaped ones).
            atomic_write_json(self.run_dir / RUN_SOURCE_FILE, {
                "trainer": "trl", "trl_version": importlib.metadata.version("trl"),
                "reward_names": dict(zip(self.components, self.trainer.reward_func_names)),
                "settings": trl_settings(self.trainer.args)})

    # ---- the step ----------------------------------------------------------------------------------
    def before_update(self, out: dict) -> None:
        """At a generation: the batch and loss as rlgrad's hooks see them, and the hooks' before-update part."""
        t = self.trainer
        step = t.state.global_step + 1
        view = trl_reward_view(self.rewards, t.reward_weights, self.components, t.num_generations,
                               scale_rewards=t.scale_rewards, aggregation=t.multi_objective_aggregation)
        n = out["prompt_ids"].shape[0]
        rows = slice(t.accelerator.process_index * n, (t.accelerator.process_index + 1) * n)
        # TRL's advantages must be its rewards' (the shares' sum) up to TRL's own float rounding (view.tol); a
        # subclass's custom advantage is refused
        view.check(out["advantages"], rows)
        local = {k: v[rows] for k, v in view.split.items()}
        batch = batch_from_trl(out, group_ids=view.group_ids[rows], scores=torch.nan_to_num(view.total[rows]),
                               reward_std=view.reward_std[rows],
                               components={k: v[rows] for k, v in view.components.items()})
        weights = dict(zip(self.components, t.reward_weights.tolist()))
        self.ctx = StepContext(step=step, batch=batch, actor=t.accelerator.unwrap_model(t.model), optimizer=t.optimizer,
                               loss_settings=LossSettings(), config=self.cfg, run_dir=self.run_dir,
                               tokenizer=t.processing_class, is_main=self.is_main, reward_weights=weights,
                               loss=self.loss, component_advantages=lambda b: local,
                               one_pass_update=one_pass_update(t))
        self._log_rollouts(step, out, batch)
        lengths = collectives.all_gather_cat(out["completion_mask"].sum(1).cpu())
        if self.reward_log is not None:
            self.reward_log.append(step_record(step, view.components, weights, torch.nan_to_num(view.total),
                                               view.group_ids, lengths, None))
        with self._running():
            self._record(step, self.hooks.before_update(self.ctx))

    def rides(self) -> bool:
        """Whether a measurement of this step waits for its update's backward (``hooks.UpdateTap``)."""
        return self.ctx is not None and self.ctx.one_pass_update and self.hooks.update_tap(self.ctx) is not None

    @contextmanager
    def update(self):
        """The span of TRL's ``training_step``: what ``ride`` enters in it is left at its end (after the backward)."""
        try:
            with ExitStack() as self.riding:
                yield
        finally:
            self.riding = None

    def ride(self, rows: torch.Tensor) -> None:
        """At ``compute_loss`` of a step that rides (``rides``): the tap wraps TRL's forward and backward of the rows
        ``rows`` (their places in the step's batch, after TRL's shuffle), reading TRL's per-token loss from its
        forward (``TRLLoss.fused_head``)."""
        tap = self.hooks.update_tap(self.ctx) if self.rides() and self.riding is not None else None
        if tap is None:
            return
        rows = rows.cpu()
        mb = self.ctx.batch.select(rows)
        self.riding.enter_context(tap.around(self.ctx.actor, mb, rows))
        self.riding.enter_context(self.loss.fused_head(self.ctx.actor, mb, tap.seen))

    def _record(self, step: int, res: HookResult) -> None:
        """The hook point's answer: metrics until the step ends, tables to tables.jsonl, a stop for the step's end."""
        self.pending.update(res.metrics)
        if self.table_log is not None:
            for key, (columns, rows) in res.tables.items():
                self.table_log.log_table(key, columns, rows, step)
        if res.stop:
            self.stop_at = step
            if self.is_main:
                log.warning("rlgrad: step %d: training ends after this step (%s)", step, res.reason)

    def _log_rollouts(self, step: int, out: dict, batch) -> None:
        """``rollouts/step_N.jsonl`` (``rlgrad samples``, the report's samples): every process's completions."""
        t = self.trainer
        ids, mask = out["completion_ids"].cpu(), out["completion_mask"].bool().cpu()
        lengths = mask.sum(1)
        eos = set(getattr(t, "eos_token_ids", None) or [t.processing_class.eos_token_id])
        truncated = torch.tensor([n == 0 or int(row[n - 1]) not in eos for row, n in zip(ids, lengths.tolist())])
        samples = gather_samples(step_samples(
            step, prompts=prompt_texts(t.processing_class, batch.input_ids, batch.attention_mask, batch.response_mask),
            responses=t.processing_class.batch_decode([r[m] for r, m in zip(ids, mask)], skip_special_tokens=True),
            group_ids=batch.group_ids, components=batch.components, totals=batch.scores,
            reward_std=batch.reward_std, lengths=lengths, truncated=truncated,
            kept=torch.ones(len(ids), dtype=torch.bool),
            advantages=[float(a) for a in out["advantages"].float().cpu()]))
        if self.rollout_log is not None:
            self.rollout_log.write(step, samples)

    def on_grads(self, model: torch.nn.Module) -> None:
        """The step's accumulated gradient, before the optimizer step: neuron health."""
        ctx = self.ctx
        if ctx is None or ctx.step != self.trainer.state.global_step + 1:
            return  # a step without its own generation (steps_per_generation > gradient_accumulation_steps)
        with self._running():
            self.pending.update(self.hooks.on_grads(ctx, model, ctx.batch, "actor"))

    def after_update(self) -> None:
        ctx = self.ctx
        if ctx is None or ctx.step != self.trainer.state.global_step:
            return
        res = self.hooks.after_update(ctx)  # with what rode on the update (its tables too)
        res.stop = False
        self._record(ctx.step, res)
        if self.pending:
            if self.metrics_log is not None:
                self.metrics_log.log(ctx.step, self.pending)
            self.unlogged.update(self.pending)
            self.unlogged_step = ctx.step
            self.analysed[ctx.step] = self.pending
            self.pending = {}

    @contextmanager
    def _running(self):
        """Grad mode on, activation checkpointing off (``activation_checkpointing_off``), TRL's settings restored."""
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        a = self.trainer.args
        kwargs = (getattr(a, "activation_checkpointing_kwargs", None)
                  if hasattr(model, "activation_checkpointing_disable") else a.gradient_checkpointing_kwargs)
        with activation_checkpointing_off(model, kwargs):
            yield

    def take_unlogged(self) -> tuple[int, dict[str, float]]:
        """(the step they were measured at, the metrics TRL's loggers have not seen), which they then have."""
        out, self.unlogged = self.unlogged, {}
        return self.unlogged_step, out

    def log_trl(self, step: int, logs: dict[str, float]) -> bool:
        """TRL's log of ``step`` to metrics.jsonl, and to the hooks' ``after_step`` (the live doctor) with the step's
        analysis; True when one of them asks to stop (``doctor.halt_on``): TRL then saves and ends training."""
        m = trl_metrics(logs, self.key_of)
        if not m:
            return False
        res = self.hooks.after_step(step, {**self.analysed.pop(step, {}), **m})
        self.analysed = {s: a for s, a in self.analysed.items() if s > step}
        if self.metrics_log is not None:
            self.metrics_log.log(step, {**m, **res.metrics})
        if res.stop and not self.halted:
            self.halted = res.reason
            log.warning("rlgrad: stopping TRL after step %d (checkpoint saved): %s", step, res.reason)
        return res.stop

    def stop_requested(self, step: int) -> bool:
        """Whether a hook asked to end training at or before ``step`` (TRL's global step that just ended)."""
        return self.stop_at is not None and step >= self.stop_at

    def close(self) -> None:
        self.hooks.close()


class _Callback(TrainerCallback):
    """The transformers callback events the instruments need (documented ``TrainerCallback`` methods)."""

    def __init__(self, instruments: _Instruments):
        self.rl = instruments

    def on_train_begin(self, args, state, control, **kwargs):
        self.rl.open(state.global_step)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.rl.on_grads(self.rl.trainer.accelerator.unwrap_model(self.rl.trainer.model))

    def on_step_end(self, args, state, control, **kwargs):
        self.rl.after_update()
        if self.rl.stop_requested(state.global_step):
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        # every process: the doctor's halt must end training on all of them (only the main one writes)
        if logs and self.rl.log_trl(state.global_step, logs):
            control.should_save = True  # Trainer saves after on_log, then stops (should_training_stop)
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        self.rl.close()
