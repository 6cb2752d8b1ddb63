"""Two processes on CPU (gloo): the same numbers as one process on the same global batch.

* unit level (torch.multiprocessing): the actor update under DDP and FSDP2 with uneven shares (a rank
  with fewer micro-batches, padded with zero-loss rows) equals the one-process update; the bucket
  analysis with a rank that holds no sample of some buckets (or none at all) runs every collective,
  does not hang, and equals the one-process analysis -- also with the seeds' DP trimming.
* end to end (torchrun): DDP for step 1, then FSDP2 resuming from DDP's checkpoint for step 2, give the
  one-process run's metrics.jsonl (group-seeded sampling makes the batch layout-independent) and weights.
* a killed rank ends the run quickly, torchrun naming the rank.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
import torch
from safetensors.torch import load_file

from rlgrad.analysis.gradient_probe import analyse_buckets
from rlgrad.config import load_config
from rlgrad.rl.actor import LossSettings, update_actor
from rlgrad.rl.trainer import Trainer
from rlgrad.rundir import read_jsonl

from .conftest import REPO
from .test_analysis import make_batch

S = LossSettings(loss_agg_mode="seq-mean-token-mean", use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, horizon=5)
SPLITS = {"uneven": [[0, 1, 2, 3], [4]], "empty": [[0, 1, 2, 3, 4], []]}  # prompt groups held by rank 0, rank 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def close(a: float, b: float, rel: float = 1e-5, abs_: float = 1e-7) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b)) + abs_


def _model_batch():
    from rlgrad.config import ModelConfig, TinyModelConfig
    from rlgrad.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=48))
    model = build_tiny_model(cfg, tok, seed=3)
    return model, make_batch(model, tok)  # 5 groups x 4 samples, group 0 with zero reward std


def _share(batch, groups):
    return batch.select(torch.nonzero(torch.isin(batch.group_ids, torch.tensor(groups, dtype=torch.long))).squeeze(-1))


def _update(model, batch):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = update_actor(model, opt, batch, S, ppo_epochs=2, mini_batch_size=8, micro_batch_size=3, max_grad_norm=1.0,
                       shuffle=True, seed=5)
    return out


CASES = [("uneven", "fast", 0), ("empty", "fast", 0), ("uneven", "reference", 0), ("empty", "reference", 0),
         ("uneven", "fast", 3)]  # (split, engine, dp_trim)


def _analyses(model, batch_of):
    return {case: analyse_buckets(model, batch_of(case[0]), S, num_buckets=3, method=case[1], dp_trim=case[2]).metrics
            for case in CASES}


def _worker(rank: int, port: int, out_dir: str) -> None:
    import copy

    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from rlgrad.distributed import wrap

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    model, batch = _model_batch()
    results = {"analysis": _analyses(model, lambda split: _share(batch, SPLITS[split][rank]))}
    for strategy in ("ddp", "fsdp2"):
        from rlgrad.analysis.dist import set_replicated_grads

        set_replicated_grads(strategy == "ddp")
        train, plain = wrap(copy.deepcopy(model), strategy)
        stats = _update(train, _share(batch, SPLITS["uneven"][rank]))
        full = get_model_state_dict(train, options=StateDictOptions(full_state_dict=True))
        results[strategy] = (stats, {k: v.detach().clone() for k, v in full.items()})
    if rank == 0:
        torch.save(results, os.path.join(out_dir, "results.pt"))
    dist.destroy_process_group()


def test_two_ranks_equal_one_process_update_and_analysis(tmp_path):
    torch.multiprocessing.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    got = torch.load(tmp_path / "results.pt", weights_only=False)
    model, batch = _model_batch()
    want = _analyses(model, lambda split: batch)
    for case, metrics in want.items():
        assert set(got["analysis"][case]) == set(metrics), case
        for k, v in metrics.items():
            assert close(got["analysis"][case][k], v), (case, k, got["analysis"][case][k], v)
    # trimming to multiples of 3: buckets of 1, 1 and 3 groups (4, 4, 12 samples) keep 3, 3 and 12; `all` is
    # the union of what is kept; the percentages stay relative to the whole batch
    t3 = want[("uneven", "fast", 3)]
    assert [t3[f"grad_norm/bucket_{i}/sample_count"] for i in (1, 2, 3)] == [3.0, 3.0, 12.0]
    assert t3["grad_norm/all/sample_count"] == 18.0 and t3["grad_norm/all/sample_pct"] == 90.0

    plain = _model_batch()[0]
    stats = _update(plain, batch)
    for strategy in ("ddp", "fsdp2"):
        s2, weights = got[strategy]
        for k, v in stats.items():
            assert close(s2[k], v), (strategy, k, s2[k], v)
        for name, p in plain.named_parameters():
            if "k_proj.bias" in name:
                # Its gradient is 0 in exact arithmetic (softmax ignores a shift shared by all keys of a
                # query); Adam turns the round-off left in its place into arbitrary +-lr steps.
                continue
            assert torch.allclose(weights[name], p.detach(), rtol=1e-5, atol=1e-7), (strategy, name)


# ----------------------------------------------------------------------------------- end to end
def _torchrun(args: list[str], timeout: int = 240, script: str | None = None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    target = [script] if script else ["-m", "rlgrad", "train"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           *target, *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


E2E = ["trainer.gradient_analysis_every=1", "rollout.gradient_analysis_num_buckets=3", "actor.ppo_mini_batch_size=2",
       "actor.use_kl_loss=true", "actor.entropy_coeff=0.01", "trainer.save_freq=1", "actor.ppo_micro_batch_size=3"]


def test_torchrun_ddp_then_fsdp2_resume_equal_one_process(tiny, tmp_path):
    base = [o for o in tiny if not o.startswith("trainer.default_local_dir")] + E2E
    one, two = tmp_path / "one", tmp_path / "two"
    Trainer(load_config(overrides=base + ["trainer.total_training_steps=2", "rollout.group_seeded_sampling=true",
                                          f"trainer.default_local_dir={one}"]), log=lambda *a: None).fit()
    r = _torchrun(base + ["trainer.total_training_steps=1", f"trainer.default_local_dir={two}"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("run directory:") == 1  # rank 0 alone prints
    r = _torchrun(base + ["trainer.total_training_steps=2", "trainer.strategy=fsdp2", f"trainer.default_local_dir={two}"])
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = read_jsonl(one / "metrics.jsonl"), read_jsonl(two / "metrics.jsonl")
    assert [x["step"] for x in a] == [x["step"] for x in b] == [0, 1, 2]  # one file, no duplicated rows
    assert {"grad_norm/all/task", "grad_norm/bucket_1/kl", "actor/grad_norm", "val/accuracy"} <= set(b[2]["data"])
    for x, y in zip(a, b):
        extra = {"val/accuracy", "val/score/mean"} if x["step"] == 1 else set()  # step 1 was the first run's last
        assert set(y["data"]) - set(x["data"]) == extra and set(x["data"]) <= set(y["data"])
        for k, v in x["data"].items():
            if not k.startswith("timing_s/"):
                assert close(v, y["data"][k]), (x["step"], k, v, y["data"][k])
    for step in (1, 2):
        la = json.loads((one / "analysis" / f"step_{step}" / "layers.json").read_text())
        lb = json.loads((two / "analysis" / f"step_{step}" / "layers.json").read_text())
        for bucket, comps in la["grad_norm"].items():
            for comp, groups in comps.items():
                for g, v in groups.items():
                    assert close(v, lb["grad_norm"][bucket][comp][g]), (step, bucket, comp, g)
    wa = load_file(one / "global_step_2" / "actor" / "model.safetensors")
    wb = load_file(two / "global_step_2" / "actor" / "model.safetensors")
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=1e-5, atol=1e-7), k


def test_bad_input_under_torchrun_is_one_line(tiny, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "data": {}}\n')  # another run lives here
    r = _torchrun([*tiny, "trainer.resume_mode=disable"], timeout=120)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("rlgrad: error")]
    assert len(lines) == 1 and "already holds a run" in lines[0], r.stderr[-2000:]
    assert "]: Traceback" not in r.stderr  # no "[rankN]: Traceback": the launcher's own summary aside, nothing else


KILL = textwrap.dedent("""
    import os, signal, sys
    from rlgrad import distributed
    from rlgrad.config import load_config
    from rlgrad.hooks import Hook
    from rlgrad.rl.trainer import Trainer

    class Kill(Hook):
        def before_update(self, ctx):
            if distributed.env_rank() == 1:
                os.kill(os.getpid(), signal.SIGKILL)

    cfg = load_config(overrides=sys.argv[1:])
    distributed.setup(cfg)
    try:
        Trainer(cfg, hooks=[Kill()]).fit()
    except RuntimeError as e:
        print("rlgrad: error:", distributed.failure_message(e), file=sys.stderr)
        sys.exit(1)
""")


def test_killed_rank_ends_the_run_naming_it(tiny, tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(KILL)
    Trainer(load_config(overrides=tiny), log=lambda *a: None)  # the warm-start cache: longer than the 5 s timeout
    t0 = time.monotonic()
    r = _torchrun([*tiny, "trainer.dist_timeout_s=20", "trainer.gradient_analysis_mode=false",
                   "trainer.val_before_train=false"], timeout=120, script=str(script))
    assert r.returncode != 0
    assert time.monotonic() - t0 < 100  # a hang would wait for the 120 s subprocess timeout
    out = r.stdout + r.stderr
    assert "rank      : 1" in out and f"Signal {int(signal.SIGKILL)} (SIGKILL)" in out, out[-3000:]


@pytest.mark.parametrize("engine", ["native", "hf"])
def test_group_seeded_sampling_does_not_depend_on_the_split(engine):
    from rlgrad.models import build_char_tokenizer
    from rlgrad.rl.rollout import generate

    model, _ = _model_batch()
    tok = build_char_tokenizer()
    prompts, seeds = ["1+2=", "13+4=", "7*8=", "99-5="], [11, 12, 13, 14]
    kw = dict(n=3, max_new_tokens=5, do_sample=True, engine=engine)
    whole = generate(model, tok, prompts, seeds=seeds, **kw)
    parts = [generate(model, tok, prompts[i:j], seeds=seeds[i:j], **kw) for i, j in ((0, 1), (1, 4))]
    assert whole.responses == parts[0].responses + parts[1].responses
    state = torch.get_rng_state()
    generate(model, tok, prompts, seeds=seeds, **kw)
    assert torch.equal(state, torch.get_rng_state())  # the global stream is left alone
