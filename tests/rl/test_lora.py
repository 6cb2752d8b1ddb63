"""LoRA in rlgrad's trainer (``actor.lora``, ``rl/lora.py``): only the adapters train, the instruments measure the
adapters' gradient (held to plain autograd), checkpoints are PEFT adapters that ``PeftModel.from_pretrained``
loads, and a resumed run is exact."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rlgrad.algos.aggregation import Denominators
from rlgrad.algos.objective import actor_objective
from rlgrad.analysis.buckets import analyse_buckets
from rlgrad.config.load import load_config
from rlgrad.errors import UserError
from rlgrad.hooks import Hook
from rlgrad.models import load_actor
from rlgrad.recipes import make_trainer
from rlgrad.runfiles import read_jsonl
from tests.helpers.lora import adapter_grads, peft, relative_error

LORA = ["actor.lora.rank=4", "actor.lora.alpha=8", "actor.lora.target_modules=[q_proj,v_proj,gate_proj,up_proj]",
        "analysis.every=1", "trainer.save_freq=1", "actor.entropy_coeff=0.01"]  # a gradient also with equal rewards


class AdapterOracle(Hook):
    """Before each update: the trainer's actor, its batch and loss; the bucket analysis's ``all`` gradient of each
    term against plain autograd of the adapters."""

    def __init__(self):
        self.seen: dict[tuple[int, str], tuple[float, float]] = {}  # (step, term) -> (relative error, norm)

    def before_update(self, ctx):
        model, s, b = ctx.actor, ctx.loss_settings, ctx.batch
        rep = analyse_buckets(model, b, s, num_buckets=2, keep_grads=True)
        k = rep.stats.slices.index("all")
        for term in ("task", "entropy"):
            obj = actor_objective(model, b, s, Denominators.of(b))  # a forward per term
            want = adapter_grads(model, obj.task if term == "task" else -s.entropy_coeff * obj.entropy)
            got = {n: g[k] for n, g in rep.stats.grads[term].items()}
            self.seen[ctx.step, term] = (relative_error(got, want),
                                         sum(float(g.double().pow(2).sum()) for g in want.values()) ** 0.5)


def test_a_lora_run_trains_measures_and_saves_the_adapter(tiny, tmp_path):
    cfg = load_config(overrides=tiny + LORA + ["trainer.total_training_steps=2"])
    oracle = AdapterOracle()
    t = make_trainer(cfg, hooks=[oracle], log=lambda *a: None)
    trainable = {n for n, p in t.actor.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    t.fit()
    base, _ = load_actor(cfg.model, t.task, cfg.trainer.seed)
    initial = dict(base.named_parameters())
    frozen = {n.replace(".base_layer.", "."): p for n, p in t.actor.named_parameters() if not p.requires_grad}
    assert frozen.keys() == initial.keys()
    for n, p in initial.items():  # the initial weights are untouched: only the adapters moved
        assert torch.equal(frozen[n], p), n
    rows = {r["step"]: r["data"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")}
    assert sorted(oracle.seen) == [(1, "entropy"), (1, "task"), (2, "entropy"), (2, "task")]
    for (step, term), (err, norm) in oracle.seen.items():
        assert err <= 1e-5, (step, term)
        # the run's own bucket analysis saw the same adapters' gradient
        assert rows[step][f"grad_norm/all/{term}"] == pytest.approx(norm, rel=1e-5, abs=1e-12)
    assert oracle.seen[1, "entropy"][1] > 0 and rows[2]["actor/update_ratio"] > 0
    assert "actor/neuron/dormant_ratio" in rows[2] and "grad_comp/total/norm" in rows[2]
    # the checkpoint is a PEFT adapter, loaded onto the initial weights as PEFT documents
    saved = tmp_path / "run" / "global_step_2" / "actor"
    assert (saved / "adapter_config.json").is_file() and not (saved / "model.safetensors").exists()
    loaded = peft.PeftModel.from_pretrained(base, saved)
    ids = torch.randint(3, 20, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, t.actor(input_ids=ids).logits, rtol=0, atol=0)


def test_a_resumed_lora_run_is_exact(tiny, tmp_path):
    straight = tmp_path / "run"
    make_trainer(load_config(overrides=tiny + LORA + ["trainer.total_training_steps=2"]), log=lambda *a: None).fit()
    run2 = tmp_path / "run2"
    again = [o for o in tiny if not o.startswith("trainer.default_local_dir")] + LORA + [
        f"trainer.default_local_dir={run2}"]
    make_trainer(load_config(overrides=again + ["trainer.total_training_steps=1"]), log=lambda *a: None).fit()
    t = make_trainer(load_config(overrides=again + ["trainer.total_training_steps=2"]), log=lambda *a: None)
    assert t.step == 1
    t.fit()
    want = load_file(straight / "global_step_2" / "actor" / "adapter_model.safetensors")
    got = load_file(run2 / "global_step_2" / "actor" / "adapter_model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    for a, b in zip(read_jsonl(straight / "metrics.jsonl"), read_jsonl(run2 / "metrics.jsonl"), strict=True):
        for k, v in a["data"].items():  # (run2's step 1 also validated: it was that run's last step)
            assert k.startswith("timing_s/") or b["data"][k] == v, (a["step"], k)


def test_lora_settings_verl_spellings_and_refusals(tiny):
    cfg = load_config(overrides=["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=32",
                                 "actor_rollout_ref.model.target_modules=[q_proj,v_proj]"])
    assert (cfg.actor.lora.rank, cfg.actor.lora.alpha, cfg.actor.lora.target_modules) == (8, 32, ["q_proj", "v_proj"])
    assert load_config().actor.lora.rank == 0 and load_config().actor.lora.target_modules == "all-linear"
    with pytest.raises(UserError, match="reset_every"):
        load_config(overrides=["actor.lora.rank=4", "analysis.neurons.actor.reset_every=2"])
    with pytest.raises(UserError, match="save_model"):
        load_config(overrides=["actor.lora.rank=4", "analysis.buckets.save_model=true"])
    with pytest.raises(UserError, match="target_modules"):
        load_config(overrides=["actor.lora.rank=4", "actor.lora.target_modules=[]"])
    with pytest.raises(UserError, match="target_modules.*no_such_proj"):
        make_trainer(load_config(overrides=tiny + ["actor.lora.rank=4", "actor.lora.target_modules=[no_such_proj]"]),
                     log=lambda *a: None)


@pytest.mark.e2e
def test_lora_under_torchrun_ddp_equals_one_process_and_fsdp2_is_refused(tiny, tmp_path):
    from tests.test_distributed import E2E, _torchrun, close

    # E2E's instruments and data, without its ReDo reset (refused under LoRA)
    base = [o for o in tiny if not o.startswith("trainer.default_local_dir")] + [
        o for o in E2E if not o.startswith("actor.redo_reset")] + LORA[:3] + ["trainer.total_training_steps=2"]
    one, two = tmp_path / "one", tmp_path / "two"
    one_process = base + ["rollout.group_seeded_sampling=true", f"trainer.default_local_dir={one}"]
    make_trainer(load_config(overrides=one_process), log=lambda *a: None).fit()
    res = _torchrun(base + [f"trainer.default_local_dir={two}"])
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = read_jsonl(one / "metrics.jsonl"), read_jsonl(two / "metrics.jsonl")
    assert [x["step"] for x in b] == [0, 1, 2] and b[2]["data"]["grad_norm/all/task"] > 0
    for x, y in zip(a, b, strict=True):  # the same numbers as one process, the instruments' included
        assert set(x["data"]) == set(y["data"]), x["step"]
        for k, v in x["data"].items():
            assert k.startswith("timing_s/") or close(v, y["data"][k]), (x["step"], k, v, y["data"][k])
    wa = load_file(one / "global_step_2" / "actor" / "adapter_model.safetensors")
    wb = load_file(two / "global_step_2" / "actor" / "adapter_model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.allclose(wa[k], wb[k], rtol=1e-5, atol=1e-6) for k in wa)
    res = _torchrun(base + ["trainer.strategy=fsdp2", f"trainer.default_local_dir={tmp_path / 'three'}"], timeout=120)
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("rlgrad: error")]
    assert res.returncode != 0 and len(lines) == 1 and "trainer.strategy=ddp" in lines[0], res.stderr[-2000:]
