"""The plumbing every instrument hook shares: the schedule check, the timing key, the step directory and the
writes of its files, done once here for all (``InstrumentHook``).

An instrument's hook names its catalogue declaration (``rlgrad.metrics.BUCKETS``, ...: its timing key; its group's
run files) and measures; it never spells a timing key, a step directory or a write of its own.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlgrad.analysis.engine import fast_unsupported
from rlgrad.hooks import Hook, HookResult, Schedule, StepContext
from rlgrad.metrics import GROUPS, Instrument, key
from rlgrad.runfiles import atomic_write_bytes, atomic_write_json, atomic_write_text
from rlgrad.runfiles import step_dir as run_step_dir


class Deferred(Exception):  # noqa: N818 - a signal, not an error
    """Raised by a measurement that rides on the actor update's own forward and backward (``groups.SharedPass``):
    it is taken again at ``after_update``, from what that backward left."""


STEP_FILE = "analysis/step_N/"  # how the catalogue's groups name a file of a step directory

_asked: tuple[weakref.ref, str | None] | None = None  # the last step context's fast_unsupported_at answer


def fast_unsupported_at(ctx: StepContext) -> str | None:
    """``engine.fast_unsupported(ctx.actor)``, walked once per step context: the instruments due at a step each ask
    it at ``before_update`` and again at ``after_update`` (a walk of the model, about 0.4 ms on the embedded default,
    8 times a step), and a step changes the model's weights, never its modules or which parameters train."""
    global _asked
    if _asked is not None and _asked[0]() is ctx:
        return _asked[1]
    why = fast_unsupported(ctx.actor)
    try:
        _asked = (weakref.ref(ctx), why)  # weak: the memo keeps no step's batch alive
    except TypeError:  # a context that takes no weak reference (a namespace): asked each time
        pass
    return why


def step_dir(ctx: StepContext) -> Path:
    """``RUN/analysis/step_N/``: where an instrument's files of step N go."""
    return run_step_dir(ctx.run_dir, ctx.step)


class InstrumentHook(Hook):
    """A hook that measures at the steps of its ``schedule`` (``before_update``) through ``measure``, and writes its
    files and its time through this base. ``declared``: its instrument in the catalogue.

    An instrument that measures elsewhere than before the update keeps its own step rule (neuron health: a
    schedule per trained model, at ``on_grads``) and still times and writes through ``timing`` and ``write``.
    """

    declared: Instrument
    schedule: Schedule = Schedule(0)
    shared: Any = None  # the step's shared prompt-group pass (``groups.SharedPass``), for the instruments using one
    deferred_step: int | None = None  # the step whose measurement waits for the update's backward (``Deferred``)

    def before_update(self, ctx: StepContext) -> HookResult | None:
        """At a due step, ``measure``'s result with its files written and its time under the instrument's timing
        key; None at any other step, at a step ``measure`` skips, and where it rides on the update (``Deferred``:
        the result comes at ``after_update``)."""
        if not self.schedule.due(ctx.step):
            return None
        try:
            return self._measured(ctx)
        except Deferred:
            self.deferred_step = ctx.step
            return None

    def update_tap(self, ctx: StepContext) -> Any:
        """The shared pass's ride on the update's backward, where this step's measurement waits for it."""
        return self.shared.tap(ctx.step) if self.deferred_step == ctx.step else None

    def after_update(self, ctx: StepContext) -> HookResult | None:
        """The measurement that waited for the update's backward (``before_update``), as it would have been there."""
        if not self._waiting(ctx):
            return None
        try:
            return self._measured(ctx)
        except Deferred:
            raise RuntimeError(f"{self.declared.section}: step {ctx.step}'s actor update did not carry the "
                               "prompt-group pass planned on it (StepContext.one_pass_update)") from None

    def update_skipped(self, ctx: StepContext) -> HookResult | None:
        """No update to ride on (a later hook stopped the run): the measurement that waited for it, now, from a
        pass of its own before the update (the shared pass's plan dropped)."""
        if not self._waiting(ctx):
            return None
        self.shared.drop(ctx.step)
        return self._measured(ctx)

    def _waiting(self, ctx: StepContext) -> bool:
        """Whether this step's measurement waited for the update (and no longer does: it is taken now)."""
        waiting, self.deferred_step = self.deferred_step == ctx.step, None
        return waiting

    def _measured(self, ctx: StepContext) -> HookResult | None:
        timing: dict[str, float] = {}
        with self.timed(timing):
            measured = self.measure(ctx)
            if measured is None:
                return None
            result, files = measured
            self.write(ctx, files)
        result.metrics.update(timing)
        return result

    def measure(self, ctx: StepContext) -> tuple[HookResult, dict[str, Any]] | None:
        """The measurement at a due step, run by every process (its collectives included): the result and the
        files of the step directory (``name -> content``, ``write``'s); None to skip the step."""
        raise NotImplementedError(f"{type(self).__name__} measures at before_update: it must define measure()")

    @contextmanager
    def timed(self, into: dict[str, float], **fields: str) -> Iterator[None]:
        """The seconds the block takes, into ``into`` under the instrument's timing key (``fields``: its
        placeholders, e.g. the role of neuron health's)."""
        started = time.perf_counter()
        yield
        into[key(self.declared.timing, **fields)] = time.perf_counter() - started

    def path(self, ctx: StepContext, name: str) -> Path:
        """Where the instrument's file ``name`` of this step goes; a name its groups do not declare is refused."""
        if STEP_FILE + name not in self.files():
            raise ValueError(f"{self.declared.section} writes {STEP_FILE}{name}, which no group of it declares "
                             "(rlgrad.metrics.instruments)")
        return step_dir(ctx) / name

    def files(self) -> tuple[str, ...]:
        """The run files the catalogue's groups of this instrument declare."""
        return tuple(f for group in GROUPS.values() if group.instrument is self.declared for f in group.files)

    def write(self, ctx: StepContext, files: dict[str, Any]) -> None:
        """Each of ``files`` into the step directory, atomically, by the main process alone: a str as text, bytes
        as they are, anything else as JSON. Not fsynced one by one (``durable=False``): at every step that cost
        about 4 ms a file, 0.15 of a plain step of the embedded default; they are as durable as the checkpoints,
        which are not fsynced either."""
        if not ctx.is_main:
            return
        for name, content in files.items():
            path = self.path(ctx, name)
            if isinstance(content, str):
                atomic_write_text(path, content, durable=False)
            elif isinstance(content, bytes):
                atomic_write_bytes(path, content, durable=False)
            else:
                atomic_write_json(path, content, durable=False)
