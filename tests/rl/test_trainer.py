"""End to end: a few steps on a tiny model, resume exactly, SIGKILL-and-resume, never overwrite."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from rlgrad.config.load import load_config
from rlgrad.errors import UserError
from rlgrad.hooks import Hook, HookResult
from rlgrad.logging.sinks import MetricLogger
from rlgrad.metrics import layer_group
from rlgrad.recipes import make_trainer
from rlgrad.rl.resume import Interrupted
from rlgrad.runfiles import being_written, read_jsonl
from tests.conftest import REPO, tiny_overrides


def rows(run_dir):
    return read_jsonl(run_dir / "metrics.jsonl")


def weights(ckpt_dir):
    return load_file(ckpt_dir / "actor" / "model.safetensors")


def test_end_to_end(tiny, tmp_path):
    cfg = load_config(overrides=tiny + ["trainer.total_training_steps=3", "trainer.save_freq=2", "trainer.test_freq=2",
                                        "actor.use_kl_loss=true", "actor.entropy_coeff=0.01",
                                        "trainer.logger=[jsonl,tensorboard]"])
    summary = make_trainer(cfg, log=lambda *a: None).fit()
    run = tmp_path / "run"
    r = rows(run)
    assert [x["step"] for x in r] == [0, 1, 2, 3]
    assert set(r[0]["data"]) == {"val/accuracy", "val/score/mean"}
    for key in ["actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl",
                "actor/grad_norm", "actor/lr", "critic/score/mean", "critic/score/max", "critic/score/min",
                "critic/advantages/mean", "response_length/mean", "response_length/clip_ratio",
                "rollout/filter_kept_ratio", "rollout/filter_kept_count", "rollout/filter_zero_count",
                "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv",
                "timing_s/update_actor", "timing_s/step"]:
        assert key in r[1]["data"], key
    assert "val/accuracy" in r[2]["data"] and "val/accuracy" in r[3]["data"] and "val/accuracy" not in r[1]["data"]
    assert summary["val/accuracy_after"] == r[3]["data"]["val/accuracy"]
    assert (run / "config.yaml").read_text().count("total_training_steps: 3") == 1
    assert (run / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert sorted(p.name for p in run.glob("global_step_*")) == ["global_step_2", "global_step_3"]
    assert list((run / "tensorboard").iterdir())
    # actor/update_ratio: how far step 3's update moved the weights, as the checkpoints before and after it say
    w2, w3 = weights(run / "global_step_2"), weights(run / "global_step_3")
    sq = {}
    for k in w2:
        d, w = sq.setdefault(layer_group(k), [0.0, 0.0])
        sq[layer_group(k)] = [d + float((w3[k].double() - w2[k].double()).pow(2).sum()),
                              w + float(w2[k].double().pow(2).sum())]
    logged = r[3]["data"]
    assert logged["actor/update_ratio"] == pytest.approx(
        (sum(d for d, _ in sq.values()) / sum(w for _, w in sq.values())) ** 0.5, rel=1e-5)
    assert {k: v for k, v in logged.items() if k.startswith("actor/update_ratio/")} == pytest.approx(
        {f"actor/update_ratio/{g}": (d / w) ** 0.5 for g, (d, w) in sq.items()}, rel=1e-5)
    assert 0 < logged["actor/update_ratio"] < 1
    # The checkpoint is a plain Hugging Face model.
    from transformers import AutoModelForCausalLM, AutoTokenizer
    m = AutoModelForCausalLM.from_pretrained(run / "global_step_3" / "actor")
    AutoTokenizer.from_pretrained(run / "global_step_3" / "actor")
    assert sum(p.numel() for p in m.parameters()) > 0


def test_resume_continues_without_lost_or_duplicated_rows(tiny, tmp_path):
    run = tmp_path / "run"
    base = tiny + ["trainer.save_freq=1", "trainer.test_freq=2"]
    make_trainer(load_config(overrides=base + ["trainer.total_training_steps=4"]), log=lambda *a: None).fit()
    straight = weights(run / "global_step_4")

    run2 = tmp_path / "run2"
    b2 = [o for o in base if not o.startswith("trainer.default_local_dir")] + [f"trainer.default_local_dir={run2}"]
    make_trainer(load_config(overrides=b2 + ["trainer.total_training_steps=2"]), log=lambda *a: None).fit()
    # Rows past the checkpoint (as a crash after logging would leave them) must be moved aside, not duplicated.
    with open(run2 / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "data": {"stale": 1.0}}) + "\n" + '{"step": 4, "da')
    (run2 / "global_step_2" / "COMPLETE").unlink()  # the newest checkpoint is incomplete: resume from step 1
    t = make_trainer(load_config(overrides=b2 + ["trainer.total_training_steps=4"]), log=lambda *a: None)
    assert t.step == 1
    t.fit()
    assert [x["step"] for x in rows(run2)] == [0, 1, 2, 3, 4]
    assert all("stale" not in x["data"] for x in rows(run2))
    assert (run2 / "metrics.discarded.jsonl").exists()
    resumed = weights(run2 / "global_step_4")
    assert straight.keys() == resumed.keys()
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k
    # Same metric values as the uninterrupted run (timings aside).
    for a, b in zip(rows(run), rows(run2)):
        for k, v in a["data"].items():
            if not k.startswith("timing_s/"):
                assert b["data"][k] == v, (a["step"], k)


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from rlgrad.config import load_config
    from rlgrad.hooks import Hook
    from rlgrad.recipes import make_trainer

    class Kill(Hook):
        def before_update(self, ctx):
            if ctx.step == int(os.environ["KILL_AT"]):
                os.kill(os.getpid(), signal.SIGKILL)

    make_trainer(load_config(overrides=sys.argv[1:]), hooks=[Kill()], log=lambda *a: None).fit()
""")


@pytest.mark.e2e  # several processes: in scripts/test_e2e.sh, out of the suite's 6 CPU-minutes
def test_sigkill_and_resume_equals_uninterrupted(tiny, tmp_path):
    steps = ["trainer.total_training_steps=4", "trainer.save_freq=2", "trainer.test_freq=-1"]
    straight_dir = tmp_path / "straight"
    ov = [o for o in tiny if not o.startswith("trainer.default_local_dir")] + steps
    make_trainer(load_config(overrides=ov + [f"trainer.default_local_dir={straight_dir}"]), log=lambda *a: None).fit()

    killed_dir = tmp_path / "killed"
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    env = {**os.environ, "KILL_AT": "3"}
    p = subprocess.run([sys.executable, str(script), *ov, f"trainer.default_local_dir={killed_dir}"],
                       env=env, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert (killed_dir / "global_step_2" / "COMPLETE").exists() and not (killed_dir / "global_step_4").exists()

    from tests.conftest import run_cli
    res = run_cli(["train", *ov, f"trainer.default_local_dir={killed_dir}"])
    assert res.returncode == 0, res.stderr[-2000:]
    a, b = weights(straight_dir / "global_step_4"), weights(killed_dir / "global_step_4")
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [x["step"] for x in rows(killed_dir)] == [0, 1, 2, 3, 4]


def test_new_run_never_overwrites(tiny, tmp_path):
    cfg = load_config(overrides=tiny + ["trainer.total_training_steps=1", "trainer.save_freq=-1"])
    make_trainer(cfg, log=lambda *a: None).fit()
    run = tmp_path / "run"
    before = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(UserError, match="already holds a run"):
        make_trainer(load_config(overrides=tiny + ["trainer.resume_mode=disable"]), log=lambda *a: None)
    # A directory with run files but no checkpoint cannot be resumed, and is not overwritten either.
    for p in run.glob("global_step_*"):
        import shutil
        shutil.rmtree(p)
    with pytest.raises(UserError, match="no complete checkpoint"):
        make_trainer(load_config(overrides=tiny + ["trainer.total_training_steps=2"]), log=lambda *a: None)
    assert (run / "metrics.jsonl").read_bytes() == before


class StopAt(Hook):
    def __init__(self, step):
        self.step, self.seen = step, []

    def before_update(self, ctx):
        self.seen.append((ctx.step, len(ctx.batch), ctx.batch.advantages is not None))
        if ctx.step == self.step:
            return HookResult(metrics={"probe/x": 1.0}, stop=True, reason="test")
        return None


def test_hook_sees_prepared_batch_and_can_stop(tiny, tmp_path):
    hook = StopAt(2)
    cfg = load_config(overrides=tiny + ["trainer.total_training_steps=5", "trainer.save_freq=1"])
    summary = make_trainer(cfg, hooks=[hook], log=lambda *a: None).fit()
    assert hook.seen == [(1, 16, True), (2, 16, True)]
    r = rows(tmp_path / "run")
    assert [x["step"] for x in r] == [0, 1, 2] and r[-1]["data"]["probe/x"] == 1.0
    assert "actor/pg_loss" not in r[-1]["data"]  # no actor update at the stopping step
    assert not (tmp_path / "run" / "global_step_2").exists()  # nor a checkpoint
    assert summary["stopped_at_step"] == 2


class TableSink:
    """A metric sink that keeps what it is given (test only)."""

    def __init__(self):
        self.rows, self.tables = [], []

    def log(self, step, metrics):
        self.rows.append((step, dict(metrics)))

    def log_table(self, key, columns, rows, step):
        self.tables.append((step, key, columns, rows))

    def close(self):
        pass


def test_hook_tables_reach_the_loggers_table_sinks(tiny, tmp_path):
    class Table(Hook):
        def before_update(self, ctx):
            return HookResult(metrics={"probe/x": 2.0}, tables={"test/rows": (["step", "rows"], [[ctx.step, 16]])})

    cfg = load_config(overrides=tiny + ["trainer.total_training_steps=1"])
    trainer = make_trainer(cfg, hooks=[Table()], log=lambda *a: None)
    sink = TableSink()
    metrics, stop = trainer.train_step(1, MetricLogger([sink]))
    assert not stop and metrics["probe/x"] == 2.0
    # the bucket analysis (on at step 1 by default) and the test hook, in the order they ran
    assert [(step, key) for step, key, _, _ in sink.tables] == [(1, "grad_norm/group_rv_table"), (1, "test/rows")]
    assert sink.tables[1][2:] == (["step", "rows"], [[1, 16]])


def test_empty_filter_skips_then_stops(tiny, tmp_path):
    from rlgrad.rl.resume import RunStopped
    # include_zero=false with a reward that never varies (weights zero) keeps nothing.
    cfg = load_config(overrides=tiny + ["trainer.total_training_steps=5", "rollout.rollout_filter_include_zero=false",
                                        "reward.weights={correctness: 0.0, format: 0.0}",
                                        "rollout.rollout_filter_empty_stop_steps=2"])
    with pytest.raises(RunStopped, match="2 consecutive steps"):
        make_trainer(cfg, log=lambda *a: None).fit()
    r = rows(tmp_path / "run")
    assert [x["step"] for x in r] == [0, 1, 2]
    assert r[1]["data"]["rollout/filter_empty"] == 1.0 and r[1]["data"]["rollout/filter_kept_count"] == 0.0


def test_wandb_offline(tiny, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config(overrides=tiny + ["trainer.total_training_steps=1", "trainer.logger=[jsonl,wandb]"])
    make_trainer(cfg, log=lambda *a: None).fit()
    run = tmp_path / "run"
    run_id = (run / "wandb_run_id.txt").read_text().strip()
    assert any(run_id in p.name for p in (run / "wandb").glob("offline-run-*"))


def test_a_checkpoint_from_before_torchrun_support_is_refused_in_one_line(tiny, tmp_path):
    """Optimizer state keyed by position (torch's plain state_dict), as rlgrad wrote before 0.1's torchrun
    support: resuming it says so instead of failing deep in torch."""
    cfg = load_config(overrides=tiny + ["trainer.total_training_steps=1", "trainer.save_freq=1"])
    make_trainer(cfg, log=lambda *a: None).fit()
    path = tmp_path / "run" / "global_step_1" / "trainer_state.pt"
    state = torch.load(path, weights_only=False)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    opt.zero_grad()
    state["optimizer"] = opt.state_dict()  # {"state": {0: ...} or {}, "param_groups": [{"params": [0]}]}
    state["optimizer"]["state"] = {0: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(2),
                                       "exp_avg_sq": torch.zeros(2)}}
    torch.save(state, path)
    with pytest.raises(UserError, match="before 0.1's torchrun support"):
        make_trainer(load_config(overrides=tiny + ["trainer.total_training_steps=2"]), log=lambda *a: None)


TERM_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from rlgrad.config import load_config
    from rlgrad.hooks import Hook
    from rlgrad.recipes import make_trainer
    from rlgrad.rl.resume import Interrupted

    class Term(Hook):
        def before_update(self, ctx):
            if ctx.step == int(os.environ["TERM_AT"]):
                os.kill(os.getpid(), getattr(signal, os.environ["SIG"]))  # mid-step: the step still completes

    try:
        make_trainer(load_config(overrides=sys.argv[1:]), hooks=[Term()], log=lambda *a: None).fit()
    except Interrupted as e:
        sys.exit(128 + e.signum)
""")


SIGNAL_STEPS = ["trainer.total_training_steps=4", "trainer.save_freq=-1", "trainer.test_freq=-1"]


@pytest.fixture(scope="module")
def straight_4_steps(model_cache, tmp_path_factory):
    """The uninterrupted run that both signals' stopped-and-resumed runs must equal, trained once."""
    straight = tmp_path_factory.mktemp("straight") / "run"
    make_trainer(load_config(overrides=tiny_overrides(model_cache, straight) + SIGNAL_STEPS), log=lambda *a: None).fit()
    return straight


class SignalAt(Hook):
    def __init__(self, sig: int, step: int):
        self.sig, self.step = sig, step

    def before_update(self, ctx):
        if ctx.step == self.step:
            os.kill(os.getpid(), self.sig)  # mid-step: the step still completes


def not_caught(signum, frame):
    raise AssertionError(f"signal {signum} reached the test: the trainer did not take it")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_after_the_step_with_a_checkpoint_and_resumes_exactly(tiny, tmp_path, sig, straight_4_steps):
    ov = [o for o in tiny if not o.startswith("trainer.default_local_dir")] + SIGNAL_STEPS
    straight = straight_4_steps
    stopped = tmp_path / "stopped"
    if sig == "SIGTERM":  # a process of its own, as a scheduler stops one
        script = tmp_path / "term.py"
        script.write_text(TERM_SCRIPT)
        p = subprocess.run([sys.executable, str(script), *ov, f"trainer.default_local_dir={stopped}"],
                           env={**os.environ, "TERM_AT": "2", "SIG": sig}, capture_output=True, text=True, cwd=REPO,
                           timeout=300)
        assert p.returncode == 128 + getattr(signal, sig), p.stderr[-2000:]
    else:  # in this process (the same handlers and Interrupted; a process launch cost 4 s): Ctrl-C at a terminal
        trainer = make_trainer(load_config(overrides=ov + [f"trainer.default_local_dir={stopped}"]),
                               hooks=[SignalAt(signal.SIGINT, 2)], log=lambda *a: None)
        previous = signal.signal(signal.SIGINT, not_caught)
        try:
            with pytest.raises(Interrupted) as stop:
                trainer.fit()
        finally:
            signal.signal(signal.SIGINT, previous)
        assert stop.value.status == 128 + signal.SIGINT
        assert not being_written(stopped)  # released as it stopped (the traceback keeps the trainer alive)
    assert [x["step"] for x in rows(stopped)] == [0, 1, 2]  # step 2 whole, nothing of step 3
    assert (stopped / "global_step_2" / "COMPLETE").exists()  # a checkpoint although save_freq=-1
    make_trainer(load_config(overrides=ov + [f"trainer.default_local_dir={stopped}"]), log=lambda *a: None).fit()
    a, b = weights(straight / "global_step_4"), weights(stopped / "global_step_4")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [x["step"] for x in rows(stopped)] == [0, 1, 2, 3, 4]
