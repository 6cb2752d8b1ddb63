"""The one hook runner (rlgrad.hooks.HookRunner) that rlgrad's trainer and the TRL and verl integrations share."""

from types import SimpleNamespace

import pytest

from rlgrad.hooks import Hook, HookResult, HookRunner


class Recording(Hook):
    """Answers every hook point with fixed metrics (and at ``before_update`` a table, and a stop if asked);
    records what it was called for."""

    def __init__(self, name: str, stop: bool = False, reason: str = "", close_error: Exception | None = None):
        self.name, self.stop, self.reason, self.close_error = name, stop, reason, close_error
        self.calls: list[str] = []

    def before_update(self, ctx):
        self.calls.append("before_update")
        return HookResult(metrics={f"{self.name}/before": float(ctx.step), "shared": 1.0}, stop=self.stop,
                          reason=self.reason, tables={f"{self.name}/table": (["a", "b"], [[1, 2.5]])})

    def on_grads(self, ctx, model, minibatch, role="actor"):
        self.calls.append(f"on_grads:{role}")
        return {f"{self.name}/grads/{role}": 2.0}

    def after_update(self, ctx):
        self.calls.append("after_update")
        return {f"{self.name}/after": 3.0}

    def close(self):
        self.calls.append("close")
        if self.close_error is not None:
            raise self.close_error


class Silent(Hook):
    """Every hook point left at the base class's answer (None)."""


CTX = SimpleNamespace(step=7)  # the runner hands the context through; these hooks read only its step


def test_metrics_and_tables_of_every_hook_are_merged_in_order():
    first, second = Recording("first"), Recording("second")
    runner = HookRunner([first, Silent(), second])
    res = runner.before_update(CTX)
    assert res.metrics == {"first/before": 7.0, "shared": 1.0, "second/before": 7.0}
    assert res.tables == {"first/table": (["a", "b"], [[1, 2.5]]), "second/table": (["a", "b"], [[1, 2.5]])}
    assert not res.stop and res.reason == ""
    assert runner.on_grads(CTX, None, None, role="critic") == {"first/grads/critic": 2.0, "second/grads/critic": 2.0}
    assert runner.after_update(CTX).metrics == {"first/after": 3.0, "second/after": 3.0}
    assert list(runner) == runner.hooks and len(runner) == 3


def test_the_first_stop_ends_the_hook_point_and_keeps_what_came_before():
    before, stopper, after = Recording("before"), Recording("stopper", stop=True, reason="enough"), Recording("after")
    res = HookRunner([before, stopper, after]).before_update(CTX)
    assert res.stop and res.reason == "enough"
    assert set(res.metrics) == {"before/before", "stopper/before", "shared"}  # the stopper's own metrics kept
    assert set(res.tables) == {"before/table", "stopper/table"}
    assert after.calls == []  # the hooks after the one that stopped do not run at that step
    assert HookRunner([Recording("x", stop=True)]).before_update(CTX).reason == "requested by a hook"


def test_no_hooks_answer_nothing():
    runner = HookRunner()
    res = runner.before_update(CTX)
    assert (res.metrics, res.tables, res.stop) == ({}, {}, False)
    assert runner.on_grads(CTX, None, None) == {} and runner.after_update(CTX).metrics == {} and len(runner) == 0
    runner.close()


def test_close_reaches_every_hook_and_raises_the_first_failure():
    ok, bad, worse = Recording("ok"), Recording("bad", close_error=OSError("disk full")), Recording(
        "worse", close_error=ValueError("second"))
    last = Recording("last")
    with pytest.raises(OSError, match="disk full"):
        HookRunner([ok, bad, worse, last]).close()
    assert [h.calls for h in (ok, bad, worse, last)] == [["close"]] * 4
