"""The one plumbing of the instrument hooks (``rlgrad.analysis.instrument``): the schedule check, the timing key from
the catalogue, the step directory and the writes, by the main process only, of the files the catalogue declares."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlgrad.analysis import ComponentGeometryHook, GradientAnalysisHook, NeuronHealthHook, PerSampleHook
from rlgrad.analysis.instrument import InstrumentHook
from rlgrad.hooks import HookResult, Schedule
from rlgrad.metrics import INSTRUMENTS, PER_SAMPLE

SRC = Path(__file__).resolve().parents[2] / "src" / "rlgrad" / "analysis"


class Probe(InstrumentHook):
    declared = PER_SAMPLE

    def __init__(self, schedule, files, skip=False):
        self.schedule, self.files_out, self.skip, self.calls = schedule, files, skip, 0

    def measure(self, ctx):
        self.calls += 1
        return None if self.skip else (HookResult(metrics={"noise_samples/all": 4.0}), self.files_out)


def ctx_at(step, run_dir, is_main=True):
    return SimpleNamespace(step=step, run_dir=run_dir, is_main=is_main)


def test_the_base_measures_at_due_steps_writes_the_files_and_times_under_the_catalogues_key(tmp_path):
    hook = Probe(Schedule(2), {"samples.jsonl": "a\n", "sample_layers.json": {"b": 1}})
    assert hook.before_update(ctx_at(2, tmp_path)) is None and hook.calls == 0  # steps 1, 3, 5, ...
    res = hook.before_update(ctx_at(3, tmp_path))
    assert hook.calls == 1 and list(res.metrics) == ["noise_samples/all", "timing_s/analysis/per_sample"]
    assert res.metrics["timing_s/analysis/per_sample"] >= 0
    step = tmp_path / "analysis" / "step_3"
    assert (step / "samples.jsonl").read_text() == "a\n" and json.loads((step / "sample_layers.json").read_text()) == {
        "b": 1}
    other = tmp_path / "rank1"
    assert Probe(Schedule(1), {"samples.jsonl": "x"}).before_update(ctx_at(1, other, is_main=False)) is not None
    assert not other.exists()  # only the main process writes
    assert Probe(Schedule(1), {}, skip=True).before_update(ctx_at(1, tmp_path)) is None  # a skipped step: no time


def test_a_file_the_catalogue_does_not_declare_is_refused(tmp_path):
    with pytest.raises(ValueError, match="analysis/step_N/other.json"):
        Probe(Schedule(1), {"other.json": {}}).before_update(ctx_at(1, tmp_path))
    assert Probe(Schedule(1), {}).files() == ("analysis/step_N/samples.jsonl", "analysis/step_N/sample_layers.json")


def test_every_instrument_hook_goes_through_the_plumbing_and_spells_no_timing_key_or_step_directory():
    hooks = (GradientAnalysisHook, PerSampleHook, ComponentGeometryHook, NeuronHealthHook)
    assert {h.declared for h in hooks} == set(INSTRUMENTS) and all(issubclass(h, InstrumentHook) for h in hooks)
    for path in sorted(SRC.glob("*.py")):
        if path.name != "instrument.py":
            text = path.read_text()
            assert not re.search(r"timing_s/|perf_counter|\"step_\{|/ \"analysis\"", text), path.name


def test_the_fast_engines_check_walks_the_model_once_per_step_context(monkeypatch):
    """``fast_unsupported_at``: the instruments ask it at before_update and again at after_update; one step context's
    answer is walked once, the next context's again (the answer of the model it carries), and a context that takes
    no weak reference is asked each time."""
    import torch

    from rlgrad.analysis import instrument
    from rlgrad.analysis.engine import fast_unsupported

    walks = []
    monkeypatch.setattr(instrument, "fast_unsupported", lambda m: walks.append(m) or fast_unsupported(m))

    class Ctx:  # a step context (StepContext takes weak references, as any plain class does)
        def __init__(self, actor):
            self.actor = actor

    covered = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5))
    uncovered = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Conv1d(4, 5, 1))
    first, second = Ctx(covered), Ctx(uncovered)
    assert [instrument.fast_unsupported_at(first) for _ in range(3)] == [None] * 3 and walks == [covered]
    assert all("0.weight" not in w and "1.weight" in w for w in (instrument.fast_unsupported_at(second),
                                                                 instrument.fast_unsupported_at(second)))
    assert walks == [covered, uncovered]
    assert instrument.fast_unsupported_at(first) is None and len(walks) == 3  # a new step's context: walked again
    plain = SimpleNamespace(actor=covered)
    assert instrument.fast_unsupported_at(plain) is None and instrument.fast_unsupported_at(plain) is None
    assert len(walks) == 5
