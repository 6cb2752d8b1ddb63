"""Two processes on CPU (gloo): the same numbers as one process on the same global batch.

* unit level (torch.multiprocessing): the actor update under DDP and FSDP2 with uneven shares (a rank
  with fewer micro-batches, padded with zero-loss rows) equals the one-process update; the bucket
  analysis with a rank that holds no sample of some buckets (or none at all) runs every collective,
  does not hang, and equals the one-process analysis -- also with the seeds' DP trimming.
* neuron health (unit level) under DDP and FSDP2 on a shuffled mini-batch whose ranks interleave: the same
  metrics, per-layer sums, sampled sequences and per-sequence Gram matrix, and the same reset (weights and
  optimizer moments) as one process; reward-component geometry with a rank holding none / part of a component.
* per-sample gradient norms (``tests/helpers/per_sample_dp.py``) on the plain module and on FSDP2's shards, with
  a rank holding none of the rows and with every group split over both ranks: each rank's norms are its rows'
  one-process norms, the noise metrics, the groups' Gram and samples.jsonl are one process's.
* end to end (torchrun): DDP for step 1, then FSDP2 resuming from DDP's checkpoint for step 2, give the
  one-process run's metrics.jsonl (group-seeded sampling makes the batch layout-independent) and weights,
  with reward-component and neuron-health metrics on and a neuron reset at step 2 (under FSDP2).
* a killed rank ends the run quickly, torchrun naming the rank.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlgrad.algos.objective import ActorLoss, LossSettings
from rlgrad.analysis.buckets import analyse_buckets
from rlgrad.analysis.components import analyse_components
from rlgrad.analysis.neurons import measure
from rlgrad.analysis.redo import reset_dormant, select_reset
from rlgrad.config.analysis import NeuronHealthConfig
from rlgrad.config.load import load_config
from rlgrad.recipes import make_trainer
from rlgrad.rl.actor import update_actor
from rlgrad.runfiles import read_jsonl
from tests.conftest import REPO
from tests.helpers import per_sample_dp
from tests.helpers.batches import make_batch
from tests.helpers.processes import free_port

S = LossSettings(loss_agg_mode="seq-mean-token-mean", use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, horizon=5)
SPLITS = {"uneven": [[0, 1, 2, 3], [4]], "empty": [[0, 1, 2, 3, 4], []]}  # prompt groups held by rank 0, rank 1


def close(a: float | str, b: float | str, rel: float = 1e-5, abs_: float = 1e-7) -> bool:
    if isinstance(a, str) or isinstance(b, str):  # metrics.jsonl writes non-finite values as "nan" / "inf"
        return a == b
    return abs(a - b) <= rel * max(abs(a), abs(b)) + abs_


def _model_batch():
    from rlgrad.config.model import ModelConfig, TinyModelConfig
    from rlgrad.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=48))
    model = build_tiny_model(cfg, tok, seed=3)
    return model, make_batch(model, tok)  # 5 groups x 4 samples, group 0 with zero reward std


def _share(batch, groups):
    return batch.select(torch.nonzero(torch.isin(batch.group_ids, torch.tensor(groups, dtype=torch.long))).squeeze(-1))


def _adamw(model):
    # eps well above the gradients' round-off: Adam's g / sqrt(v) would otherwise turn the last-bit
    # differences of a summed (2-process) gradient in near-zero elements into +-lr steps.
    return torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3)


def _update(model, batch):
    opt = _adamw(model)
    out = update_actor(model, opt, batch, S, ppo_epochs=2, mini_batch_size=8, micro_batch_size=3, max_grad_norm=1.0,
                       shuffle=True, seed=5)
    return out


CASES = [("uneven", "fast", 0), ("empty", "fast", 0), ("uneven", "reference", 0), ("empty", "reference", 0),
         ("uneven", "fast", 3)]  # (split, engine, dp_trim)


def _analyses(model, batch_of, cases=CASES):
    return {case: analyse_buckets(model, batch_of(case[0]), S, num_buckets=3, method=case[1], dp_trim=case[2]).metrics
            for case in cases}


# Neuron health on the first mini-batch of a shuffled update (ranks interleave in it), a 5-of-8 nullspace
# sample (which rows are drawn matters), then the reset after the update, as NeuronHealthHook does.
RC = NeuronHealthConfig(mode="percentage", max_reset_frac=0.5, nullspace_samples=5,
                reset_outgoing="small")


def _neuron_update(train, replica, batch):
    """(report, reset counts, full weights, full optimizer state) of one neuron-measured update with a reset."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from rlgrad.distributed import optimizer_state

    opt = _adamw(train)
    seen = []

    def on_grads(model, mini):
        model = getattr(model, "module", model)  # DDP: the inner module, as the trainer passes it
        if not seen:
            seen.append(measure(model, mini, RC, role="actor", seed=1, step=3, loss_fn=ActorLoss(S),
                                replica=replica))

    # seed 6: the first mini-batch is global rows [10, 11, 17, 12, 14, 2, 19, 7], rank 1's 17 and 19 in between
    update_actor(train, opt, batch, S, ppo_epochs=1, mini_batch_size=8, micro_batch_size=3, max_grad_norm=1.0,
                 shuffle=True, seed=6, on_grads=on_grads)
    rep = seen[0]
    chosen = {s.layer.name: select_reset(s.score, RC.tau, RC.mode, RC.max_reset_frac)
              for s in rep.layers}
    counts = reset_dormant(rep, opt, RC, seed=1, step=3)
    if train is replica:  # one process
        weights = {n: p.detach().clone() for n, p in train.named_parameters()}
        names = {p: n for n, p in train.named_parameters()}
        state = {names[p]: {k: v.clone() for k, v in st.items()} for p, st in opt.state.items()}
    else:
        weights = get_model_state_dict(train, options=StateDictOptions(full_state_dict=True))
        weights = {k: v.detach().clone() for k, v in weights.items()}
        state = optimizer_state(train, opt).get("state")  # rank 0 alone gets the full state
    layers = {s.layer.name: (s.grad_sum.clone(), s.act_sum.clone()) for s in rep.layers}
    return {"metrics": rep.metrics(), "gram": rep.gram, "rows": rep.sample_rows, "layers": layers,
            "counts": counts, "chosen": chosen, "weights": weights, "state": state}


def _components(model, batch_of):
    """Reward-component geometry for each split and mode; component c varies only in group 4 (rank 1's). And
    ("one"), a single component on the prompt-group pass, where its Gram comes from the groups' (``Side.from_groups``:
    every rank's groups, decided alike on every rank, a rank holding none of some)."""
    out = {}
    for split in SPLITS:
        b = batch_of(split)
        for mode in ("shared_std", "own_std"):
            out[(split, mode)] = analyse_components(model, b, S, weights=CW, mode=mode).metrics
        b.components = {"score": b.scores}
        out[(split, "one")] = analyse_components(model, b, S, weights={"score": 1.0},
                                                 shared=lambda side, b=b: _from_groups(model, b, side)).metrics
    return out


def _from_groups(model, batch, side):
    """The side's Grams from the prompt-group pass, having checked that they come from the groups' Gram."""
    from rlgrad.analysis.groups import group_pass
    from rlgrad.collectives import all_gather_cat

    group_ids = torch.unique(all_gather_cat(torch.unique(batch.group_ids)))
    assert side.from_groups(torch.searchsorted(group_ids, batch.group_ids), len(group_ids)) is not None
    return group_pass(model, batch, ActorLoss(S), side, row_terms=()).side


def _with_components(batch):
    g = torch.Generator().manual_seed(2)
    ra = torch.rand(len(batch), generator=g)
    rc = torch.where(batch.group_ids == 4, torch.rand(len(batch), generator=g), torch.zeros(len(batch)))
    batch.components = {"a": ra, "b": 2 * batch.scores - ra, "c": rc}  # 0.5 a + 0.5 b = the score
    return batch


CW = {"a": 0.5, "b": 0.5, "c": 0.0}
WHITENED = ("gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline")  # estimators that whiten over the batch


def _whitened(batch_of, reduce=None):
    """Per split: the batch-whitening estimators' advantages and REINFORCE++'s component split of the rows held."""
    from rlgrad.algos.advantages import compute_advantages
    from rlgrad.algos.component_advantages import component_advantages

    out = {}
    for split in SPLITS:
        b = batch_of(split)
        values = 0.1 * b.scores[:, None] + 0.01 * torch.arange(b.response_mask.shape[1])  # a stand-in critic
        for est in WHITENED:
            out[(split, est)] = compute_advantages(est, b.scores, b.group_ids, b.response_mask, values=values,
                                                   gamma=1.0, lam=0.9, reduce=reduce)[0]
            if est != "gae":
                out[(split, est, "split")] = component_advantages(
                    b.components, CW, b.scores, b.group_ids, mode="shared_std", estimator=est, norm_by_std=True,
                    response_mask=b.response_mask, reduce=reduce)
    return out


def _worker(rank: int, port: int, out_dir: str) -> None:
    import copy

    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from rlgrad.distributed import wrap

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    model, batch = _model_batch()
    per_sample_dp.rank_results(rank, model, batch, out_dir)
    batch = _with_components(batch)
    results = {"analysis": _analyses(model, lambda split: _share(batch, SPLITS[split][rank])),
               "components": _components(model, lambda split: _share(batch, SPLITS[split][rank]))}
    for strategy in ("ddp", "fsdp2"):
        train, plain = wrap(copy.deepcopy(model), strategy)
        stats = _update(train, _share(batch, SPLITS["uneven"][rank]))
        full = get_model_state_dict(train, options=StateDictOptions(full_state_dict=True))
        results[strategy] = (stats, {k: v.detach().clone() for k, v in full.items()})
        train, plain = wrap(copy.deepcopy(model), strategy)
        results[f"neurons/{strategy}"] = _neuron_update(train, plain, _share(batch, SPLITS["uneven"][rank]))
    # the instruments on the FSDP2 shards themselves, no replica (verl's worker): the fast engine only
    train, _ = wrap(copy.deepcopy(model), "fsdp2")
    results["analysis/shards"] = _analyses(train, lambda split: _share(batch, SPLITS[split][rank]),
                                           [c for c in CASES if c[1] == "fast"])
    results["neurons/shards"] = _neuron_update(train, None, _share(batch, SPLITS["uneven"][rank]))
    from rlgrad.collectives import all_reduce_sum

    torch.save(_whitened(lambda split: _share(batch, SPLITS[split][rank]), all_reduce_sum),
               os.path.join(out_dir, f"whitened_{rank}.pt"))
    if rank == 0:
        torch.save(results, os.path.join(out_dir, "results.pt"))
    dist.destroy_process_group()


def _assert_analyses_equal(got: dict, want: dict) -> None:
    """The bucket analysis's metrics of each case, two processes (``got``) against one (``want``)."""
    for case, metrics in want.items():
        assert set(got["analysis"][case]) == set(metrics), case
        for k, v in metrics.items():
            assert close(got["analysis"][case][k], v), (case, k, got["analysis"][case][k], v)


def _assert_updates_equal(got: dict, batch) -> None:
    """DDP's and FSDP2's statistics and weights after the update equal one process's."""
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


def _assert_whitened_over_the_whole_batch(tmp_path, batch) -> None:
    """Whitening over the whole batch (verl whitens on its driver), not over each process's rows."""
    full = _whitened(lambda split: _with_components(_model_batch()[1]))
    for rank in (0, 1):
        part = torch.load(tmp_path / f"whitened_{rank}.pt", weights_only=False)
        for (split, est, *what), v in part.items():
            rows = torch.isin(batch.group_ids, torch.tensor(SPLITS[split][rank], dtype=torch.long))
            want_v = full[(split, est, *what)]
            for got_t, want_t in ([(v[c], want_v[c]) for c in v] if what else [(v, want_v)]):
                assert torch.allclose(got_t, want_t[rows], rtol=1e-5, atol=1e-6), (rank, split, est, what)
        assert part[("uneven", "reinforce_plus_plus")].abs().sum() > 0


@pytest.mark.e2e  # several processes: in scripts/test_e2e.sh, out of the suite's 6 CPU-minutes
def test_two_ranks_equal_one_process_update_and_analysis(tmp_path):
    torch.multiprocessing.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    got = torch.load(tmp_path / "results.pt", weights_only=False)
    model, batch = _model_batch()
    want = _analyses(model, lambda split: batch)
    _assert_analyses_equal(got, want)
    # trimming to multiples of 3: buckets of 1, 1 and 3 groups (4, 4, 12 samples) keep 3, 3 and 12; `all` is
    # the union of what is kept; the percentages stay relative to the whole batch
    t3 = want[("uneven", "fast", 3)]
    assert [t3[f"grad_norm/bucket_{i}/sample_count"] for i in (1, 2, 3)] == [3.0, 3.0, 12.0]
    assert t3["grad_norm/all/sample_count"] == 18.0 and t3["grad_norm/all/sample_pct"] == 90.0

    want_c = _components(model, lambda split: _with_components(batch))
    for case, metrics in want_c.items():
        assert set(got["components"][case]) == set(metrics), case
        assert ("grad_comp/c/norm" if case[1] != "one" else "grad_comp/score/norm") in metrics, case
        for k, v in metrics.items():
            assert close(got["components"][case][k], v), (case, k, got["components"][case][k], v)

    _assert_updates_equal(got, batch)

    one = _model_batch()[0]
    want_n = _neuron_update(one, one, batch)
    for strategy in ("ddp", "fsdp2", "shards"):
        _assert_neurons_equal(got[f"neurons/{strategy}"], want_n, strategy)
    _assert_analyses_equal({"analysis": got["analysis/shards"]}, {c: want[c] for c in got["analysis/shards"]})

    _assert_whitened_over_the_whole_batch(tmp_path, batch)
    per_sample_dp.assert_per_sample_equal(tmp_path, model, batch)


# ----------------------------------------------------------------------------------- end to end
def _torchrun(args: list[str], timeout: int = 240, script: str | None = None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    target = [script] if script else ["-m", "rlgrad", "train"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           *target, *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


E2E = ["trainer.gradient_analysis_every=1", "rollout.gradient_analysis_num_buckets=3", "actor.ppo_mini_batch_size=2",
       "actor.use_kl_loss=true", "actor.entropy_coeff=0.01", "trainer.save_freq=1", "actor.ppo_micro_batch_size=3",
       # reward-component geometry, and neuron health every step (a 5-of-8 nullspace sample of the first shuffled
       # mini-batch) with a reset at step 2, i.e. under FSDP2 in the 2-process run
       "analysis.components_every=1", "actor.redo_metric_freq=1", "actor.redo_reset_freq=2",
       "actor.redo_nullspace_samples=5", "actor.redo_mode=percentage", "actor.redo_max_reset_frac=0.1",
       "actor.redo_reset_outgoing=small",
       # per-sample gradient norms and the noise scale every step: samples.jsonl gathered from both ranks
       "analysis.per_sample.every=1",
       # the shipped tiny math data: a length reward (length_max 3 chars) varies within groups (6-token responses,
       # some ending early), so the policy gradient and the component gradients are not zero
       "rollout.response_length=6", "data.task=math", f"data.train_files=[{REPO / 'tests/data/math_verl.parquet'}]",
       f"data.val_files=[{REPO / 'tests/data/math_val.jsonl'}]", "reward.length_max=3"]
NEURON_KEYS = {f"actor/neuron/{k}"
               for k in ("dormant_ratio", "act_dormant_ratio", "zero_grad_ratio", "nullspace_ratio")}


def _assert_rows_equal(a: list[dict], b: list[dict]) -> None:
    """metrics.jsonl of one process (``a``) and of the two-process runs (``b``): the same keys and numbers."""
    for x, y in zip(a, b):
        extra = {"val/accuracy", "val/score/mean", "timing_s/val"} if x["step"] == 1 else set()  # first run: last step
        assert set(y["data"]) - set(x["data"]) == extra and set(x["data"]) <= set(y["data"])
        for k, v in x["data"].items():
            if not k.startswith("timing_s/"):  # a NaN (a noise estimate the batch cannot tell) is logged "nan"
                assert v == y["data"][k] == "nan" or close(v, y["data"][k]), (x["step"], k, v, y["data"][k])


def _assert_analysis_files_equal(one: Path, two: Path, step: int) -> None:
    """A step's layers.json, neurons.json, components.json and samples.jsonl of the two runs."""

    def read(run: Path, name: str) -> dict:
        return json.loads((run / "analysis" / f"step_{step}" / name).read_text())

    la, lb = read(one, "layers.json"), read(two, "layers.json")
    for bucket, comps in la["grad_norm"].items():
        for comp, groups in comps.items():
            for g, v in groups.items():
                assert close(v, lb["grad_norm"][bucket][comp][g]), (step, bucket, comp, g)
    na, nb = read(one, "neurons.json")["actor"], read(two, "neurons.json")["actor"]
    assert na["layers"] == nb["layers"], step  # per-layer counts: dormant, zero-gradient, reset
    ca, cb = read(one, "components.json"), read(two, "components.json")
    for g, geo in ca["layers"].items():
        for c, v in geo["norm"].items():
            assert close(v, cb["layers"][g]["norm"][c]), (step, g, c)
    sa, sb = (read_jsonl(run / "analysis" / f"step_{step}" / "samples.jsonl") for run in (one, two))
    assert len(sa) == len(sb) > 0 and [r["sample"] for r in sa] == [r["sample"] for r in sb], step
    for x, y in zip(sa, sb):
        assert x.keys() == y.keys() and all(close(v, y[k]) if k.startswith("grad_norm/") else v == y[k]
                                            for k, v in x.items()), (step, x, y)


def _assert_step_2_weights_equal(one: Path, two: Path) -> None:
    """The weights after step 2's reset under FSDP2 (fresh rows written shard by shard) equal one process's."""
    wa = load_file(one / "global_step_2" / "actor" / "model.safetensors")
    wb = load_file(two / "global_step_2" / "actor" / "model.safetensors")
    for k in wa:
        if "k_proj.bias" not in k:  # a gradient of pure round-off, which Adam amplifies (see the unit test)
            # atol 1e-6, a thousandth of one Adam step (lr 1e-3): what round-off leaves after Adam's division by
            # sqrt(v) (one element of 2048 in layer 1's down_proj differs by 4e-7), while a wrong update moves by ~lr
            assert torch.allclose(wa[k], wb[k], rtol=1e-5, atol=1e-6), k


@pytest.mark.e2e
def test_torchrun_ddp_then_fsdp2_resume_equal_one_process(tiny, tmp_path):
    base = [o for o in tiny if not o.startswith("trainer.default_local_dir")] + E2E
    one, two = tmp_path / "one", tmp_path / "two"
    one_process = load_config(overrides=base + ["trainer.total_training_steps=2", "rollout.group_seeded_sampling=true",
                                                f"trainer.default_local_dir={one}"])
    make_trainer(one_process, log=lambda *a: None).fit()
    res = _torchrun(base + ["trainer.total_training_steps=1", f"trainer.default_local_dir={two}"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("run directory:") == 1  # rank 0 alone prints
    res = _torchrun(base + ["trainer.total_training_steps=2", "trainer.strategy=fsdp2",
                            f"trainer.default_local_dir={two}"])
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = read_jsonl(one / "metrics.jsonl"), read_jsonl(two / "metrics.jsonl")
    assert [x["step"] for x in a] == [x["step"] for x in b] == [0, 1, 2]  # one file, no duplicated rows
    assert {"grad_norm/all/task", "grad_norm/bucket_1/kl", "actor/grad_norm", "val/accuracy"} <= set(b[2]["data"])
    for step in (1, 2):  # compared below with every other number: present, so not compared vacuously
        # (only the length reward varies in this tiny run: the cosines are the unit test's)
        assert NEURON_KEYS | {"actor/param/zero_grad_ratio", "grad_comp/length/share"} <= set(b[step]["data"]), step
        assert b[step]["data"]["grad_comp/length/norm"] > 0, step
    assert b[2]["data"]["actor/neuron/reset_count"] > 0
    _assert_rows_equal(a, b)
    for step in (1, 2):
        _assert_analysis_files_equal(one, two, step)
    _assert_step_2_weights_equal(one, two)


@pytest.mark.e2e  # several processes: in scripts/test_e2e.sh, out of the suite's 6 CPU-minutes
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
    from rlgrad.recipes import make_trainer

    class Kill(Hook):
        def before_update(self, ctx):
            if distributed.env_rank() == 1:
                os.kill(os.getpid(), signal.SIGKILL)

    cfg = load_config(overrides=sys.argv[1:])
    distributed.setup(cfg)
    try:
        make_trainer(cfg, hooks=[Kill()]).fit()
    except RuntimeError as e:
        print("rlgrad: error:", distributed.failure_message(e), file=sys.stderr)
        sys.exit(1)
""")


@pytest.mark.e2e
def test_killed_rank_ends_the_run_naming_it(tiny, tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(KILL)
    make_trainer(load_config(overrides=tiny), log=lambda *a: None)  # the warm-start cache: longer than the 5 s timeout
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


def _assert_neurons_equal(got, want, what):
    assert set(got["metrics"]) == set(want["metrics"]), what
    for k, v in want["metrics"].items():
        assert close(got["metrics"][k], v), (what, k, got["metrics"][k], v)
    assert torch.equal(got["rows"], want["rows"]), what  # the same 5 of the mini-batch's 8 sequences
    # The per-sequence Gram itself: slice j is sequence j's gradient, not a sum of two ranks' sequences.
    torch.testing.assert_close(got["gram"], want["gram"], rtol=1e-5, atol=1e-12 * float(want["gram"].abs().max()))
    for name, (g, a) in want["layers"].items():
        torch.testing.assert_close(got["layers"][name][0], g, rtol=1e-5, atol=1e-12, msg=f"{what} {name} grad")
        torch.testing.assert_close(got["layers"][name][1], a, rtol=1e-5, atol=1e-12, msg=f"{what} {name} act")
    assert got["counts"] == want["counts"] and sum(want["counts"].values()) > 0, what
    assert all(torch.equal(got["chosen"][k], v) for k, v in want["chosen"].items()), what
    # Weights after the reset (fresh rows and small outgoing columns drawn alike, from a global RMS) and the
    # optimizer moments (zeroed on exactly the reset rows / columns) equal one process's.
    skip = "k_proj.bias"  # its gradient is round-off (see above): Adam amplifies it arbitrarily
    # Adam's steps are lr-sized (1e-2): two ranks' summed gradient differs from one process's in its last bits,
    # which moves a step by up to ~1e-5 of lr (1.3e-7 seen on one embedding row), hence atol 2e-7.
    for name, w in want["weights"].items():
        if skip not in name:
            assert torch.allclose(got["weights"][name], w, rtol=1e-5, atol=2e-7), (what, name)
        for k in ("exp_avg", "exp_avg_sq"):
            a, b = got["state"][name][k], want["state"][name][k]
            if skip not in name:
                assert torch.allclose(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max())), (what, name, k)
            assert torch.equal(a == 0, b == 0) or skip in name, (what, name, k)
    mlp = "model.layers.0.mlp"
    rows = want["chosen"][mlp]
    for name, dim in ((f"{mlp}.gate_proj.weight", 0), (f"{mlp}.up_proj.weight", 0), (f"{mlp}.down_proj.weight", 1)):
        m = got["state"][name]["exp_avg"]
        others = torch.tensor([i for i in range(m.shape[dim]) if i not in set(rows.tolist())])
        assert bool((m.index_select(dim, rows) == 0).all()), (what, name)
        assert bool((m.index_select(dim, others) != 0).all(dim=1 - dim).all()), (what, name)  # not vacuous


def test_more_processes_than_run_is_an_error_naming_torchrun(tmp_path, monkeypatch, capsys):
    """verl's trainer.n_gpus_per_node starts verl's workers; rlgrad's only describes torchrun's processes, so a
    plain `rlgrad train` asking for 8 stops (one line, exit 2) instead of training in one process."""
    from types import SimpleNamespace

    from rlgrad.cli import main
    from rlgrad.distributed import check_process_count
    from rlgrad.errors import UserError

    for var in ("WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    assert main(["train", "trainer.n_gpus_per_node=8", f"trainer.default_local_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "trainer.n_gpus_per_node=8 asks for 8 processes" in err
    assert "use torchrun --nproc_per_node 8 -m rlgrad train" in err and not (tmp_path / "run").exists()
    with pytest.raises(UserError, match=r"trainer.nnodes=2 and trainer.n_gpus_per_node=4 ask for 8 processes.*"
                                        r"torchrun --nproc_per_node 4 --nnodes 2 "):
        check_process_count(SimpleNamespace(nnodes=2, n_gpus_per_node=4))
    check_process_count(SimpleNamespace(nnodes=1, n_gpus_per_node=1))  # one process asked, one run
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")  # under torchrun the environment wins: no error
    check_process_count(SimpleNamespace(nnodes=1, n_gpus_per_node=8))
