"""rlgrad's instruments inside TRL's GRPOTrainer (rlgrad.integrations.trl), held to TRL's own loss.

The oracle is plain autograd of TRL's ``_compute_loss`` on TRL's own generation batch: a bucket's gradient is
that of TRL's loss over the bucket's rows alone; a reward function's gradient is that of TRL's loss with the
advantages replaced by the function's share of them, minus the same loss at zero advantage (the KL part).
"""

import contextlib
import json
import random
from pathlib import Path

import pytest
import torch

trl = pytest.importorskip("trl", reason="the TRL integration tests need TRL: pip install 'rlgrad[trl]'")
datasets = pytest.importorskip("datasets")

from trl import GRPOConfig  # noqa: E402

from rlgrad.analysis import analyse_buckets, analyse_components, analyse_per_sample  # noqa: E402
from rlgrad.cli import main  # noqa: E402
from rlgrad.config.model import ModelConfig, TinyModelConfig  # noqa: E402
from rlgrad.errors import UserError  # noqa: E402
from rlgrad.hooks import Hook, HookResult  # noqa: E402
from rlgrad.integrations.trl import GRPOTrainer, check_trl_version, trl_metrics  # noqa: E402
from rlgrad.integrations.trl_loss import trl_reward_view  # noqa: E402
from rlgrad.models import build_char_tokenizer, build_tiny_model  # noqa: E402
from rlgrad.tasks import build_task  # noqa: E402
from tests.conftest import run_cli  # noqa: E402


def shorter(prompts, completions, **kw):  # varies within every group of an untrained model: EOS comes at random
    return [-len(c) / 8 for c in completions]


def digits(prompts, completions, **kw):
    return [float(sum(ch.isdigit() for ch in c) > 1) for c in completions]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl")
    tok = build_char_tokenizer()
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=64))
    model = build_tiny_model(cfg, tok, 1)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    task = build_task("arithmetic", seed=1, val_size=8)
    rows = task.train_examples(64, random.Random(1))
    data = datasets.Dataset.from_dict({"prompt": [r.prompt for r in rows]})
    return root, tok, data


class Capturing(GRPOTrainer):
    """Keeps TRL's generation output of each step (test only)."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.captured = out
        return out


def make(setup, tmp_path, cls=GRPOTrainer, steps=1, rlgrad=("analysis.every=1", "analysis.buckets.num_buckets=2"),
         funcs=(shorter, digits), rlgrad_hooks=(), peft_config=None, **cfg):
    root, tok, data = setup
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=steps, logging_steps=1, report_to=[],
                      learning_rate=1e-3, seed=1, reward_weights=[0.7, 0.3],
                      **{"per_device_train_batch_size": 16, "num_generations": 4, "max_completion_length": 8,
                         "save_strategy": "no", "beta": 0.04, "loss_type": "dapo", "disable_tqdm": True, **cfg})
    kw = {} if cls is trl.GRPOTrainer else {"rlgrad": list(rlgrad), "rlgrad_hooks": list(rlgrad_hooks)}
    if peft_config is not None:
        kw["peft_config"] = peft_config
    return cls(model=str(root / "model"), reward_funcs=list(funcs), args=args, train_dataset=data,
               processing_class=tok, **kw)


def trl_grads(trainer, out: dict, rows: torch.Tensor, **replace) -> dict[str, torch.Tensor]:
    """Plain autograd of TRL's own loss on ``rows`` of its generation output, as if they were the batch."""
    inputs = {k: (v[rows] if isinstance(v, torch.Tensor) and v.dim() > 0 and len(v) == len(out["advantages"]) else v)
              for k, v in out.items()}
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()
    inputs.update(replace)
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.zero_grad()
    trainer._compute_loss(model, inputs).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}  # LoRA: the adapters
    model.zero_grad()
    return grads


def rel_err(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    num = sum(float((ours[n] - ref[n]).pow(2).sum()) for n in ref)
    den = sum(float(ref[n].pow(2).sum()) for n in ref)
    assert den > 0  # a zero gradient would make the comparison vacuous
    return (num / den) ** 0.5


@pytest.mark.parametrize("loss_type,extra", [("dapo", {}), ("grpo", {}), ("dr_grpo", {}), ("bnpo", {}),
                                             ("cispo", {"epsilon_high": 5.0}), ("sapo", {}), ("luspo", {}),
                                             ("grpo", {"importance_sampling_level": "sequence"})])
def test_bucket_and_reward_function_gradients_equal_trl_autograd(setup, tmp_path, loss_type, extra):
    # fp32: TRL's default bf16=True runs the model under bf16 autocast, even on CPU, whose backward is linear
    # in the upstream gradient only to bf16 precision (~0.4% here), so no split of a gradient is exact there.
    off = ["analysis.every=null", "analysis.buckets.enable=false"]  # the hooks are called below, by hand
    t = make(setup, tmp_path, cls=Capturing, loss_type=loss_type, rlgrad=off, bf16=False, **extra)
    model = t.accelerator.unwrap_model(t.model)
    t.train()  # one step; its generation batch is held to TRL's loss at the weights after it, on both sides
    out = t.captured  # (no old log-probs: both sides take the current ones, detached, as TRL does)
    ctx = t.rlgrad.ctx
    batch = ctx.batch
    with t.rlgrad._running():  # as the integration runs them: activation checkpointing (TRL's default) off
        rep = analyse_buckets(model, batch, t.rlgrad.loss, num_buckets=2, keep_grads=True)
        comps = analyse_components(model, batch, t.rlgrad.loss, weights=ctx.reward_weights,
                                   advantages=ctx.component_advantages(batch), keep_grads=True)
    for k, name in enumerate(rep.stats.slices):
        rows = rep.buckets.rows[name]
        ref = trl_grads(t, out, rows)
        ours = {n: sum(rep.stats.grads[term][n][k] for term in rep.stats.grads) for n in ref}
        assert rel_err(ours, ref) < 1e-5, (loss_type, name, rel_err(ours, ref))
    # Each reward function's gradient: TRL's loss with the advantages replaced by its share, minus the KL part.
    everything = torch.arange(len(batch))
    kl_only = trl_grads(t, out, everything, advantages=torch.zeros(len(batch)))
    split = ctx.component_advantages(batch)
    for k, name in enumerate(comps.stats.slices):
        adv = split[name] if name in split else sum(split.values())
        full = trl_grads(t, out, everything, advantages=adv.to(out["advantages"].dtype))
        ref = {n: full[n] - kl_only[n] for n in full}
        ours = {n: comps.stats.grads["task"][n][k] for n in ref}
        assert rel_err(ours, ref) < 1e-5, (loss_type, name, rel_err(ours, ref))


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_per_sample_norms_equal_trl_autograd_per_row(setup, tmp_path, loss_type):
    """Each row's gradient norm per term (``analysis.per_sample`` on TRL's loss) is that of TRL's loss on that row
    alone, rescaled from the row's own denominator to the batch's (``u_i / Σ u``); beta=0: one term, ``task``."""
    off = ["analysis.every=null", "analysis.buckets.enable=false"]
    t = make(setup, tmp_path, cls=Capturing, loss_type=loss_type, rlgrad=off, bf16=False, beta=0.0)
    model = t.accelerator.unwrap_model(t.model)
    t.train()  # one step; its generation batch is held to TRL's loss at the weights after it, on both sides
    batch = t.rlgrad.ctx.batch
    with t.rlgrad._running():
        rep = analyse_per_sample(model, batch, t.rlgrad.loss, num_buckets=2)
    assert set(rep.norms) == {"task"}
    _, share = t.rlgrad.loss.agg.weights(batch.response_mask)
    want = torch.tensor([float(sum(g.double().pow(2).sum() for g in trl_grads(t, t.captured, torch.tensor([i]))
                                   .values()).sqrt()) for i in range(len(batch))]) * share.double() / share.sum()
    assert float(want.max()) > 0
    assert torch.allclose(rep.norms["task"].double(), want, rtol=1e-5, atol=1e-7 * float(want.max())), loss_type


def test_a_peft_lora_model_is_measured_on_its_adapters(setup, tmp_path):
    """TRL with ``peft_config``, as TRL documents it: the buckets' and the reward functions' gradients are those of
    TRL's loss with respect to the LoRA adapters alone, grouped by the decoder layer they adapt."""
    peft = pytest.importorskip("peft", reason="the LoRA test needs peft: pip install 'rlgrad[lora]'")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "up_proj"],
                             lora_dropout=0.0, task_type="CAUSAL_LM")
    on = ["analysis.every=null", "analysis.buckets.enable=false", "analysis.neurons.actor.metric_every=1"]
    t = make(setup, tmp_path, cls=Capturing, rlgrad=on, bf16=False, peft_config=config)
    model = t.accelerator.unwrap_model(t.model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    t.train()  # one step: lora_B leaves its zero start, so lora_A's gradient is no longer zero either
    out, ctx = t.captured, t.rlgrad.ctx
    with t.rlgrad._running():
        rep = analyse_buckets(model, ctx.batch, t.rlgrad.loss, num_buckets=2, keep_grads=True)
        comps = analyse_components(model, ctx.batch, t.rlgrad.loss, weights=ctx.reward_weights,
                                   advantages=ctx.component_advantages(ctx.batch), keep_grads=True)
    assert sorted(rep.stats.gram["task"]) == ["layer_0", "layer_1"]
    for k, name in enumerate(rep.stats.slices):
        ref = trl_grads(t, out, rep.buckets.rows[name])
        assert sorted(ref) == sorted(trainable) and any(float(g.abs().sum()) > 0 for n, g in ref.items()
                                                         if ".lora_A." in n)
        ours = {n: sum(rep.stats.grads[term][n][k] for term in rep.stats.grads) for n in ref}
        assert rel_err(ours, ref) < 1e-5, (name, rel_err(ours, ref))
    everything = torch.arange(len(ctx.batch))
    kl_only = trl_grads(t, out, everything, advantages=torch.zeros(len(ctx.batch)))
    split = ctx.component_advantages(ctx.batch)
    for k, name in enumerate(comps.stats.slices):
        adv = split[name] if name in split else sum(split.values())
        full = trl_grads(t, out, everything, advantages=adv.to(out["advantages"].dtype))
        ours = {n: comps.stats.grads["task"][n][k] for n in full}
        assert rel_err(ours, {n: full[n] - kl_only[n] for n in full}) < 1e-5, name
    logged = [json.loads(line)["data"] for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert any("actor/neuron/dormant_ratio" in row for row in logged)  # neuron health on the adapters' rows


def test_training_is_bitwise_unchanged_and_run_files(setup, tmp_path):
    plain = make(setup, tmp_path / "plain", cls=trl.GRPOTrainer, steps=2)
    plain.train()
    # per-sample measures the task term by default; kl opted in (analysis.per_sample.terms)
    ours = make(setup, tmp_path / "ours", steps=2, rlgrad=("analysis.every=1", "analysis.buckets.num_buckets=2",
                                                            "analysis.per_sample.terms=[task,kl]"))
    ours.train()
    a, b = plain.model.state_dict(), ours.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], v) for k, v in
               build_tiny_model(ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=2,
                                                                 num_attention_heads=2, num_key_value_heads=1,
                                                                 intermediate_size=64)),
                                build_char_tokenizer(), 1).state_dict().items())  # training moved the weights
    run = tmp_path / "ours" / "out"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = {}
    for r in rows:
        steps.setdefault(r["step"], {}).update(r["data"])
    assert sorted(steps) == [1, 2]
    assert json.loads((run / "metrics_catalogue.json").read_text())["format"] == "rlgrad.metrics_catalogue"
    for s in (1, 2):
        assert {"grad_norm/all/task", "grad_norm/bucket_1/kl", "grad_comp/shorter/norm", "grad_sim/shorter__digits",
                "actor/neuron/dormant_ratio", "critic/score/mean", "actor/grad_norm", "grad_norm_sample/all/task",
                "noise_trace/all/kl", "coherence/bucket_1/task", "proxy_corr/spearman"} <= set(steps[s]), s
        assert steps[s]["grad_norm/all/task"] > 0
        assert {"layers.json", "components.json", "neurons.json", "group_rv_table.csv", "samples.jsonl"} <= {
            p.name for p in (run / "analysis" / f"step_{s}").iterdir()}
        # per-sample: Σ_i g_i is the bucket analysis' gradient (the unbiased |G|² and tr Σ give back its norm²)
        n = steps[s]["grad_norm/all/sample_count"]
        assert steps[s]["noise_signal/all/task"] + steps[s]["noise_trace/all/task"] / n == pytest.approx(
            steps[s]["grad_norm/all/task"] ** 2, rel=1e-4)
    # TRL's own log history carries the analysis next to TRL's metrics
    logged = [h for h in ours.state.log_history if "grad_norm/all/task" in h]
    assert len(logged) == 2 and all("reward" in h for h in logged)
    # the TRL scalars in metrics.jsonl are TRL's logged values
    trl_reward = [h["reward"] for h in ours.state.log_history if "reward" in h]
    assert [steps[s]["critic/score/mean"] for s in (1, 2)] == pytest.approx(trl_reward)
    # what the model wrote: every completion of each step, readable with rlgrad samples
    lines = [json.loads(x) for x in (run / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert len(lines) == 16 and [x["group_id"] for x in lines] == [g for g in range(4) for _ in range(4)]
    assert all(x["prompt"] and x["finish_reason"] in ("eos", "length") and x["advantage"] is not None for x in lines)
    assert [x["total"] for x in lines] == pytest.approx(
        [0.7 * x["components"]["shorter"] + 0.3 * x["components"]["digits"] for x in lines])
    res = run_cli(["samples", str(run), "--step", "1", "--max", "1"])
    assert res.returncode == 0 and lines[0]["prompt"].strip()[:3] in res.stdout, res.stderr[-1000:]
    samples = [json.loads(x) for x in (run / "analysis" / "step_1" / "samples.jsonl").read_text().splitlines()]
    assert [(x["sample"], x["group"]) for x in samples] == [(i, x["group_id"]) for i, x in enumerate(lines)]
    assert [x["advantage"] for x in samples] == pytest.approx([x["advantage"] for x in lines], abs=1e-6)
    assert all(x["grad_norm/task"] >= 0 and x["grad_norm/kl"] >= 0 for x in samples)
    assert sum(x["grad_norm/task"] > 0 for x in samples) > len(samples) // 2  # a zero advantage: a zero gradient
    # a second run into the same directory is refused, the first run's files untouched
    before = (run / "metrics.jsonl").read_text()
    with pytest.raises(UserError, match="already holds"):
        make(setup, tmp_path / "ours", steps=1).train()
    assert (run / "metrics.jsonl").read_text() == before


class TableAndStop(Hook):
    """A hook of the user's: a table at every step, and a request to stop at ``stop_at``."""

    def __init__(self, stop_at: int):
        self.stop_at, self.steps, self.closed = stop_at, [], False

    def before_update(self, ctx):
        self.steps.append(ctx.step)
        return HookResult(tables={"test/rows": (["step", "rows"], [[ctx.step, len(ctx.batch)]])},
                          stop=ctx.step == self.stop_at, reason="test")

    def close(self):
        self.closed = True


def test_hooks_tables_are_kept_and_a_stop_ends_training_after_its_step(setup, tmp_path):
    hook = TableAndStop(stop_at=2)
    t = make(setup, tmp_path, steps=4, rlgrad=["analysis.every=null", "analysis.buckets.every=1",
                                               "analysis.buckets.num_buckets=2"], rlgrad_hooks=[hook])
    t.train()
    assert hook.steps == [1, 2] and t.state.global_step == 2  # step 2 ran to its end, then training stopped
    assert hook.closed
    run = tmp_path / "out"
    assert sorted({json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()}) == [1, 2]
    tables = [json.loads(x) for x in (run / "tables.jsonl").read_text().splitlines()]
    assert [(x["step"], x["key"]) for x in tables] == [(1, "grad_norm/group_rv_table"), (1, "test/rows"),
                                                       (2, "grad_norm/group_rv_table"), (2, "test/rows")]
    assert tables[1]["columns"] == ["step", "rows"] and tables[1]["rows"] == [[1, 16]]
    # the bucket analysis's table is the one its CSV holds
    csv = (run / "analysis" / "step_1" / "group_rv_table.csv").read_text().splitlines()
    assert tables[0]["columns"] == csv[0].split(",") and len(tables[0]["rows"]) == len(csv) - 1 > 0


def test_reward_view_splits_trl_advantages():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(12, 3, generator=g)
    r[1, 0] = float("nan")  # one reward function returned None for one sample
    r[5] = float("nan")  # every function returned None: unscorable
    r[8:12, :] = 0.5  # a group without variance
    w = torch.tensor([0.5, 1.0, 2.0])
    for scale in ("group", "batch", "none"):
        v = trl_reward_view(r, w, ["a", "b", "c"], 4, scale_rewards=scale, aggregation="sum_then_normalize")
        R = torch.nansum(r * w, 1)
        R[5] = float("nan")
        grouped = R.view(-1, 4)
        mean = torch.nanmean(grouped, 1).repeat_interleave(4)
        a = R - mean
        if scale == "group":
            std = torch.tensor([float(x[~torch.isnan(x)].std()) for x in grouped]).repeat_interleave(4)
            a = a / (std + 1e-4)
        elif scale == "batch":
            a = a / (R[~torch.isnan(R)].std() + 1e-4)
        a = torch.nan_to_num(a)
        torch.testing.assert_close(sum(v.split.values()), a, rtol=1e-5, atol=1e-6)
        assert v.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4
        assert all(float(s[8:].abs().max()) == 0 for s in v.split.values())  # no variance: no share
    v = trl_reward_view(r, w, ["a", "b", "c"], 4, scale_rewards="group", aggregation="normalize_then_sum")
    grouped = r.view(-1, 4, 3)
    z = (grouped - torch.nanmean(grouped, 1, keepdim=True)) / (
        torch.stack([torch.tensor([float(col[~torch.isnan(col)].std()) for col in gr.T]) for gr in grouped])
        .unsqueeze(1) + 1e-4)
    R = torch.nansum(z.view(-1, 3) * w, 1)
    R[5] = float("nan")
    ok = ~torch.isnan(R)
    a = torch.nan_to_num((R - R[ok].mean()) / (R[ok].std() + 1e-4))
    torch.testing.assert_close(sum(v.split.values()), a, rtol=1e-5, atol=1e-6)


def trl_float32_advantages(r: torch.Tensor, w: torch.Tensor, G: int, aggregation: str, scale: str) -> torch.Tensor:
    """TRL 1.16's ``_generate_and_score_completions`` advantage, op for op in float32 (the oracle)."""
    from trl.trainer.utils import nanstd

    unscorable = torch.isnan(r).all(1)
    if aggregation == "sum_then_normalize":
        R = (r * w).nansum(1)
        R[unscorable] = float("nan")
        a = R - torch.nanmean(R.view(-1, G), 1).repeat_interleave(G)
        if scale == "group":
            a = a / (nanstd(R.view(-1, G), 1).repeat_interleave(G) + 1e-4)
        elif scale == "batch":
            a = a / (nanstd(R) + 1e-4)
    else:
        grouped = r.view(-1, G, r.shape[1])
        z = ((grouped - torch.nanmean(grouped, 1, keepdim=True)) / (nanstd(grouped, 1, keepdim=True) + 1e-4))
        R = (z.view(-1, r.shape[1]) * w).nansum(1)
        R[unscorable] = float("nan")
        a = (R - torch.nanmean(R)) / (nanstd(R) + 1e-4)
    return torch.nan_to_num(a, nan=0.0)


def test_reward_view_bounds_trl_float32_rounding_and_refuses_other_advantages():
    g = torch.Generator().manual_seed(0)
    w = torch.tensor([0.7, 0.3])
    noisy = 0
    for trial in range(200):
        r = torch.randint(0, 40, (12, 2), generator=g).float()  # 4 groups of 3, rewards up to the tens
        r[:3] = r[0]  # a group without variance: TRL's float32 advantage there is a rounding residue / 1e-4
        if trial % 4 == 0:
            r[4, 1] = float("nan")
            r[7] = float("nan")
        for aggregation, scale in (("sum_then_normalize", "group"), ("sum_then_normalize", "batch"),
                                   ("sum_then_normalize", "none"), ("normalize_then_sum", "group")):
            v = trl_reward_view(r, w, ["a", "b"], 3, scale_rewards=scale, aggregation=aggregation)
            trl_adv = trl_float32_advantages(r, w, 3, aggregation, scale)
            diff = (trl_adv.double() - v.advantage).abs()
            assert bool((diff <= v.tol).all()), (trial, aggregation, scale, diff.max())
            v.check(trl_adv, slice(0, 12))
            torch.testing.assert_close(sum(v.split.values()).double(), v.advantage, rtol=1e-6, atol=1e-6)
            if aggregation == "sum_then_normalize" and scale == "group":
                noisy += bool(diff[:3].max() > 1e-3)  # what the old fixed 1e-3 refused
                assert all(float(s[:3].abs().max()) == 0 for s in v.split.values())  # the residue is no one's
                # where rewards vary (std >= 0.5 here) the bound is float32-tight, not a blanket allowance ...
                varying = (v.reward_std >= 0.5) & ~torch.isnan(v.total)
                assert float(v.tol[varying].max()) < 1e-4
                # ... so a custom advantage 1e-3 away in such a group is refused
                i = int(varying.nonzero()[0])
                bad = trl_adv.clone()
                bad[i] += 1e-3
                with pytest.raises(UserError, match="a custom advantage"):
                    v.check(bad, slice(0, 12))
    assert noisy > 10  # the case is common at these rewards: ~1 in 6 flat groups of 3


def length_tens(prompts, completions, **kw):
    """TRL's test_train_multiple_reward_funcs_with_weights rewards (len(completion), len(set(completion)), weights
    0.7 / 0.3) moved into the tens. A subtraction prompt's completions all get 15 and 13: a group without variance
    whose weighted total (0.7 * 15 + 0.3 * 13 in float32) TRL's float32 group mean of 3 misses by an ulp."""
    return [15.0 if "-" in p else 10.0 + len(c) for p, c in zip(prompts, completions)]


def unique_tens(prompts, completions, **kw):
    return [13.0 if "-" in p else 10.0 + len(set(c)) for p, c in zip(prompts, completions)]


def test_weighted_rewards_in_the_tens_split_as_trl_defines_its_advantage(setup, tmp_path):
    # Groups of 3 as in TRL's test (a mean of 4 equal floats is exact: pairwise sums of equal terms do not round).
    t = make(setup, tmp_path, cls=Capturing, funcs=(length_tens, unique_tens), per_device_train_batch_size=12,
             num_generations=3, rlgrad=["analysis.every=null"])  # the split is checked at every generation
    t.train()  # (rlgrad used to refuse this batch as "a custom advantage?")
    out, rewards = t.captured, t.rlgrad.rewards
    # TRL's advantage in exact arithmetic, independently: (R - mean_g R) / (std_g R + 1e-4), R = 0.7 r1 + 0.3 r2
    R = (rewards.double() * t.reward_weights.double()).sum(1).view(-1, 3)
    exact = ((R - R.mean(1, keepdim=True)) / (R.std(1, keepdim=True) + 1e-4)).flatten()
    trl_adv = out["advantages"].double()
    flat = R.std(1) == 0
    assert flat.any() and (~flat).any()  # both kinds of group are in the batch
    # The premise: in a group without variance TRL's float32 advantage is rounding noise, not 0, and larger than
    # the 1e-3 rlgrad used to allow; elsewhere TRL's advantage is the exact one to float32 precision.
    assert float(trl_adv.view(-1, 3)[flat].abs().max()) > 1e-3
    assert torch.allclose(trl_adv.view(-1, 3)[~flat], exact.view(-1, 3)[~flat], rtol=1e-5, atol=1e-5)
    split = t.rlgrad.ctx.component_advantages(t.rlgrad.ctx.batch)
    assert set(split) == {"length_tens", "unique_tens"}
    torch.testing.assert_close(sum(split.values()).double(), exact, rtol=1e-6, atol=1e-6)
    for k, name in enumerate(split):  # each function's share: w_k (r_k - mean_g r_k) / (std_g R + 1e-4)
        r = rewards[:, k].double().view(-1, 3)
        share = t.reward_weights[k].double() * (r - r.mean(1, keepdim=True)) / (R.std(1, keepdim=True) + 1e-4)
        torch.testing.assert_close(split[name].double(), share.flatten(), rtol=1e-6, atol=1e-6)


def test_versions_and_settings_refused_in_one_line(setup, tmp_path):
    check_trl_version("1.16.0")
    for bad in ("1.15.0", "2.0.0"):
        with pytest.raises(UserError, match="supports TRL >=1.16,<2"):
            check_trl_version(bad)
    with pytest.raises(UserError, match="analysis.buckets.exit_after"):
        make(setup, tmp_path, rlgrad=["analysis.buckets.exit_after=true"])
    with pytest.raises(UserError, match="entropy bonus"):
        make(setup, tmp_path, loss_type="grpo", entropy_coef=0.01)
    with pytest.raises(UserError, match="analysis.buckets.every"):
        make(setup, tmp_path, rlgrad=["analysis.buckets.every=0"])
    # TRL's loss is its own (the report's Losses panel draws it, issue 48); a scalar rlgrad has no name for is dropped
    assert trl_metrics({"reward": 0.5, "rewards/fmt/mean": 0.25, "loss": 1.0, "num_tokens": 100.0}) == {
        "critic/score/mean": 0.5, "reward/fmt/mean": 0.25, "actor/loss": 1.0}
    from rlgrad.metrics import TRL_NAMES, match

    assert all(match(k) is not None for k in TRL_NAMES.values())  # every name it writes is in the catalogue


@pytest.mark.e2e
def test_example_under_torchrun_two_processes_then_report(setup, tmp_path):
    """examples/trl_grpo.py on 2 CPU processes: global metrics, one writer, and ``rlgrad report`` reads the run."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.helpers.processes import free_port

    root, _, _ = setup
    out = tmp_path / "trl2"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(REPO / "examples" / "trl_grpo.py"), "--model", str(root / "model"), "--output-dir", str(out),
           "--max-steps", "2", "--analyse-every", "1"]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    analysis = [x for x in rows if "grad_norm/all/sample_count" in x["data"]]
    assert [x["step"] for x in analysis] == [1, 2]  # one writer: each step once
    for x in analysis:  # both processes' 32 completions: the numbers are global
        assert x["data"]["grad_norm/all/sample_count"] == 64
        assert x["data"]["grad_norm/all/group_rv_count"] == 16
    assert len((out / "rollouts" / "step_2.jsonl").read_text().splitlines()) == 64  # both processes' completions
    # per-sample norms: each process its own rows; samples.jsonl (rank 0) holds both, joined with the rollouts
    assert all(x["data"]["noise_samples/all"] == 64 and "noise_trace/all/task" in x["data"] for x in analysis)
    samples = [json.loads(line) for line in (out / "analysis" / "step_2" / "samples.jsonl").read_text().splitlines()]
    rollouts = [json.loads(line) for line in (out / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    assert [(x["sample"], x["group"]) for x in samples] == [(x["index"], x["group_id"]) for x in rollouts]
    records = [json.loads(line) for line in (out / "reward_components.jsonl").read_text().splitlines()]
    assert [(x["step"], x["num_samples"]) for x in records] == [(1, 64), (2, 64)]
    assert set(records[0]["components"]) == {"correctness", "format"}
    res = run_cli(["report", str(out)])
    assert res.returncode == 0, res.stderr[-2000:]
    html = (out / "report.html").read_text()
    assert "grad_norm" in html or "Gradient" in html


def _assert_report_and_doctor_name_trl(run, names: list[str], keys: list[str]) -> None:
    """The report shows TRL's names; the doctor's view quotes TRL's metric names."""
    from rlgrad import rundata as D
    from rlgrad.doctor.findings import View

    assert main(["report", str(run), "--dpi", "20", "--max-steps", "1"]) == 0  # in process: the CLI's own path
    html = (run / "report.html").read_text()
    assert all(n in html for n in names), [n for n in names if n not in html]
    view = View(D.load_any(run))
    assert view.run.kind == "trl" and [view.label(k) for k in keys] == names
    assert [view.name(x) for x in ("critic/score/mean", "actor/grad_norm", "reward/len_score_2/mean")] == [
        "reward", "grad_norm", "rewards/len.score/mean"]
    assert main(["doctor", str(run), "--json"]) in (0, 1)


def _assert_trl_log_escaped_alike(trainer, tmp_path, names: list[str], keys: list[str], trl_logged: dict) -> None:
    """TRL's own log, read as a TRL output directory: the same keys, escaped together."""
    from rlgrad import rundata as D

    trl_dir = tmp_path / "trl_only"
    trl_dir.mkdir()
    trainer.state.save_to_json(str(trl_dir / "trainer_state.json"))
    plain = D.load_any(trl_dir)
    assert plain.kind == "trl" and plain.labels == dict(zip(keys, names))
    for s in (1, 2):
        for name, k in zip(names, keys):
            assert plain.rows[s][f"reward/{k}/mean"] == pytest.approx(trl_logged[s][f"rewards/{name}/mean"])


def test_a_reward_model_and_look_alike_names_pass_through(setup, tmp_path):
    """TRL names a reward model after its repo (dashes and dots) and a function after ``__name__``; rlgrad's metric
    keys escape them (``metrics.component_keys``), two names that escape alike get two keys, and the run keeps the
    original names for the report and the doctor, which quotes TRL's metric names."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from rlgrad.metrics import parse

    root, tok, data = setup
    rm = tmp_path / "tiny-Qwen2ForSequenceClassification-2.5"  # TRL's own test reward model's name
    with torch.random.fork_rng():
        torch.manual_seed(0)
        Qwen2ForSequenceClassification(Qwen2Config(
            vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, num_labels=1, pad_token_id=tok.pad_token_id)).save_pretrained(rm)
    tok.save_pretrained(rm)

    def dashed(prompts, completions, **kw):
        return shorter(prompts, completions)

    def dotted(prompts, completions, **kw):
        return digits(prompts, completions)

    dashed.__name__, dotted.__name__ = "len-score", "len.score"  # both escape to len_score
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, per_device_train_batch_size=16,
                      num_generations=4, max_completion_length=8, max_steps=2, logging_steps=1, report_to=[],
                      save_strategy="no", learning_rate=1e-3, disable_tqdm=True, seed=1, bf16=False,
                      reward_weights=[1.0, 0.7, 0.3])
    only_components = ["analysis.every=null", "analysis.components.every=1"]  # the instrument that reads the names
    t = GRPOTrainer(model=str(root / "model"), reward_funcs=[str(rm), dashed, dotted], args=args, train_dataset=data,
                    processing_class=tok, rlgrad=only_components)
    names = list(t.reward_func_names)
    assert names == [rm.name, "len-score", "len.score"]  # TRL's own names
    t.train()
    keys = ["tiny_Qwen2ForSequenceClassification_2_5", "len_score", "len_score_2"]  # the documented rule
    run = tmp_path / "out"
    steps: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        steps.setdefault(r["step"], {}).update(r["data"])
    assert sorted(steps) == [1, 2]
    trl_logged = {h["step"]: h for h in t.state.log_history if "reward" in h}
    for s in (1, 2):
        m = steps[s]
        assert all(m[f"grad_comp/{k}/norm"] >= 0 for k in keys)
        assert sum(m[f"grad_comp/{k}/norm"] > 0 for k in keys) >= 2, m  # the names reach live gradients
        sims = {k for k in m if k.startswith("grad_sim/")}
        assert sims <= {f"grad_sim/{a}__{b}" for i, a in enumerate(keys) for b in keys[i + 1:]} and sims
        for k in sims:  # each pair splits back into its two components
            a, b = parse("grad_sim/{pair}", k)["pair"].split("__")
            assert a in keys and b in keys and a != b
        for name, k in zip(names, keys):  # TRL's per-function reward means, under the escaped keys
            assert m[f"reward/{k}/mean"] == pytest.approx(trl_logged[s][f"rewards/{name}/mean"])
    assert json.loads((run / "run_source.json").read_text())["reward_names"] == dict(zip(keys, names))
    lines = [json.loads(x) for x in (run / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert all(list(x["components"]) == keys for x in lines)
    assert [x["total"] for x in lines] == pytest.approx(
        [sum(w * x["components"][k] for w, k in zip((1.0, 0.7, 0.3), keys)) for x in lines])
    _assert_report_and_doctor_name_trl(run, names, keys)
    _assert_trl_log_escaped_alike(t, tmp_path, names, keys, trl_logged)


@pytest.mark.parametrize("tqdm", [False, True])
def test_trls_console_prints_one_analysis_line_and_the_loggers_get_every_key(setup, tmp_path, capsys, tqdm):
    """transformers' console callback (PrinterCallback; ProgressCallback with a bar) prints TRL's own log dict and
    rlgrad's one-line summary, not rlgrad's hundred-odd keys; log_history and the other callbacks (what report_to's
    loggers are) still get every key."""
    from transformers import TrainerCallback

    from rlgrad.logging.sinks import analysis_summary

    seen: list[dict] = []

    class Logger(TrainerCallback):  # as a report_to logger sees the logs
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(dict(logs))

    trainer = make(setup, tmp_path, disable_tqdm=not tqdm)
    trainer.add_callback(Logger())
    capsys.readouterr()
    trainer.train()
    printed = "".join(capsys.readouterr())
    logged = trainer.state.log_history[0]
    ours = [k for k in logged if k.startswith(("grad_norm/", "grad_comp/", "actor/neuron/", "timing_s/"))]
    assert len(ours) > 50 and all(k in seen[0] for k in ours)  # the loggers get rlgrad's keys
    assert "'loss':" in printed and "'rewards/shorter/mean':" in printed  # TRL's own line as TRL prints it
    assert not any(k in printed for k in ours)
    line = analysis_summary(1, logged)
    assert line.startswith("step 1 analysis: ") and "groups" in line and printed.count(line) == 1


def always_one(prompts, completions, **kw):  # with always_zero: every group agrees (frac_reward_zero_std 1)
    return [1.0 for _ in completions]


def always_zero(prompts, completions, **kw):
    return [0.0 for _ in completions]


def test_the_live_doctor_halts_trl_after_the_step_with_a_checkpoint(setup, tmp_path):
    """doctor.halt_on=critical: every group agrees at step 1 (zero_variance_groups, critical), so TRL ends training
    after that step (TrainerControl.should_training_stop) and saves a checkpoint (should_save), as the live doctor
    in rlgrad's trainer does."""
    t = make(setup, tmp_path, steps=3, funcs=(always_one, always_zero),
             rlgrad=["analysis.every=null", "doctor.halt_on=critical"])
    t.train()
    assert t.state.global_step == 1 and "zero_variance_groups" in t.rlgrad.halted
    assert (tmp_path / "out" / "checkpoint-1" / "trainer_state.json").is_file()
    said = [json.loads(x) for x in (tmp_path / "out" / "doctor.jsonl").read_text().splitlines()]
    assert ("zero_variance_groups", "critical", 1) in [(r["finding"], r["severity"], r["step"]) for r in said]
    row = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["step"] == 1 and "timing_s/doctor" in row["data"] and row["data"]["critic/score/std"] < 1e-6
    assert "resume_from_checkpoint=True" in t.rlgrad.halted


def logged_steps(run: Path) -> dict[int, dict[str, float]]:
    """``run``'s metrics.jsonl by step: the numbers (no timings), every row of a step merged."""
    steps: dict[int, dict[str, float]] = {}
    for line in (run / "out" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["step"], {}).update({k: v for k, v in row["data"].items()
                                                  if not k.startswith("timing_s/") and not isinstance(v, str)})
    return steps


RIDE = {"beta": 0.0, "bf16": False, "steps": 2, "rlgrad": ("analysis.every=1", "analysis.buckets.num_buckets=2")}


@contextlib.contextmanager
def riding_unless_own(monkeypatch, name: str):
    """The reference run ``own`` never rides (the pass before the update); any other run as ``one_pass_update`` says."""
    from rlgrad.integrations import trl as rlgrad_trl

    with monkeypatch.context() as patch:
        if name == "own":
            patch.setattr(rlgrad_trl, "one_pass_update", lambda trainer: False)
        yield


@pytest.mark.parametrize("case, checkpointing", [("full", "off"), ("lora", "off"), ("padded", "off"),
                                                 ("full", "trl_default"), ("full", "reentrant"),
                                                 ("lora", "trl_default")])
def test_the_instruments_ride_on_trls_own_update_with_the_numbers_of_their_own_pass(setup, tmp_path, monkeypatch,
                                                                                    case, checkpointing):
    """beta=0, one accumulation step: the prompt-group pass has no forward or backward of its own but reads TRL's
    (``one_pass_update``; TRL's fused LM head shown to the hooks by ``TRLLoss.fused_head``), with the numbers of the
    pass before the update (a run where nothing rides), and TRL's training bitwise that of plain TRL. LoRA: the
    adapters' gradients, head frozen. padded: completions of many lengths (right-padded; at 8 tokens every
    completion of the tiny model is full), grpo's per-sequence means and a temperature of 0.7 (the head's stand-in
    divides by it). Activation checkpointing: TRL's default (transformers' non-reentrant checkpoint, whose layers are
    recomputed inside the backward: the hooks must not read them twice) and the reentrant one (the layers' first
    forward runs without grad: the hooks read the recompute)."""
    from rlgrad.analysis import groups

    settings = dict(RIDE)
    if case == "lora":
        peft = pytest.importorskip("peft", reason="the LoRA test needs peft: pip install 'rlgrad[lora]'")
        settings["peft_config"] = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                                                  lora_dropout=0.0, task_type="CAUSAL_LM")
    if case == "padded":
        settings.update(max_completion_length=48, loss_type="grpo", temperature=0.7)
    settings.update({"off": {"gradient_checkpointing": False},
                     "trl_default": {"gradient_checkpointing": True},
                     "reentrant": {"gradient_checkpointing": True,
                                   "gradient_checkpointing_kwargs": {"use_reentrant": True}}}[checkpointing])
    real, calls = groups.group_pass, []
    monkeypatch.setattr(groups, "group_pass", lambda *a, **k: calls.append(1) or real(*a, **k))
    with riding_unless_own(monkeypatch, "own"):
        make(setup, tmp_path / "own", **settings).train()
    assert calls  # the pass before the update
    calls.clear()
    riding = make(setup, tmp_path / "riding", cls=Capturing, **settings)
    riding.train()
    assert not calls  # nothing ran a pass of its own
    lengths = riding.captured["completion_mask"].sum(1)
    assert (case == "padded") == (int(lengths.min()) < int(lengths.max())), lengths
    plain = make(setup, tmp_path / "plain", cls=trl.GRPOTrainer, **{k: v for k, v in settings.items() if k != "rlgrad"})
    plain.train()
    a, b = plain.model.state_dict(), riding.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ours, theirs = logged_steps(tmp_path / "riding"), logged_steps(tmp_path / "own")
    assert sorted(ours) == sorted(theirs) == [1, 2]
    for step in (1, 2):
        want, got = theirs[step], ours[step]
        assert {"grad_norm/all/task", "grad_comp/shorter/norm", "grad_norm_sample/all/task",
                "noise_trace/all/task"} <= set(want)
        assert set(got) == set(want), set(got) ^ set(want)
        assert got["grad_norm/all/task"] > 0
        assert got == pytest.approx(want, rel=2e-4, abs=1e-9), step
    tables = (tmp_path / "riding" / "out" / "tables.jsonl").read_text()
    assert tables == (tmp_path / "own" / "out" / "tables.jsonl").read_text() and tables


def test_the_fused_head_stand_in_serves_only_a_plain_linear_head(setup):
    """``TRLLoss.fused_head`` runs the head as a plain Linear: a model whose logits TRL's kernel scales or soft-caps
    does not ride (its pass runs before the update)."""
    from transformers import AutoModelForCausalLM

    from rlgrad.integrations.trl_loss import plain_fused_head

    model = AutoModelForCausalLM.from_pretrained(setup[0] / "model")
    assert plain_fused_head(model)
    model.config.final_logit_softcapping = 30.0
    assert not plain_fused_head(model)


def test_under_fp16_loss_scaling_nothing_rides(setup, tmp_path, monkeypatch):
    """fp16 (``GRPOConfig(fp16=True)``, GPU only): accelerate's ``GradScaler`` makes TRL's backward that of the loss
    times its scale (65536 at first), which the instruments would read as it is: nothing rides on it
    (``one_pass_update``), the pass runs before the update. The scaler is put where accelerate keeps it, a CPU one
    (scale 1024), both runs alike."""
    from rlgrad.integrations.trl import one_pass_update

    runs = {}
    for name in ("own", "riding"):
        t = make(setup, tmp_path / name, **{**RIDE, "steps": 1})
        assert one_pass_update(t)
        t.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        assert not one_pass_update(t)
        with riding_unless_own(monkeypatch, name):
            t.train()
        runs[name] = logged_steps(tmp_path / name)[1]
    assert runs["own"]["grad_norm/all/task"] > 0
    assert runs["riding"] == pytest.approx(runs["own"], rel=2e-4, abs=1e-9)


class FailsOnce(GRPOTrainer):
    """Raises once at step 2, after TRL's forward (``_compute_loss``: an OOM in the backward, say) or before it
    (``_prepare_inputs``, after the generation and the hooks' before-update part) (test only)."""

    where = "_compute_loss"
    failed = False

    def _fail(self) -> None:
        if self.state.global_step + 1 == 2 and not self.failed:
            self.failed = True
            raise RuntimeError("failed once")

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        if self.where == "_compute_loss":
            self._fail()
        return loss

    def _prepare_inputs(self, generation_batch):
        out = super()._prepare_inputs(generation_batch)
        if self.where == "_prepare_inputs":
            self._fail()
        return out


@pytest.mark.parametrize("where", ["_compute_loss", "_prepare_inputs"])
def test_a_step_that_failed_inside_trl_is_measured_again_when_it_is_retried(setup, tmp_path, monkeypatch, where):
    """A step that raised inside TRL's training step after its pass was planned on the update, retried on the same
    trainer from the last checkpoint: the retried step rides on its own update with the numbers of its own batch
    (a run where nothing rides, failing alike), not on the plan the failed one
    left behind."""
    runs = {}
    for name in ("own", "riding"):
        t = make(setup, tmp_path / name, cls=FailsOnce, save_strategy="steps", save_steps=1, max_completion_length=48,
                 **RIDE)
        t.where = where
        with riding_unless_own(monkeypatch, name):
            with pytest.raises(RuntimeError, match="failed once"):
                t.train()
            t.train(resume_from_checkpoint=True)
        assert t.state.global_step == 2
        runs[name] = logged_steps(tmp_path / name)
    assert sorted(runs["riding"]) == sorted(runs["own"]) == [1, 2]
    for step in (1, 2):
        assert runs["riding"][step] == pytest.approx(runs["own"][step], rel=2e-4, abs=1e-9), step


def test_under_bf16_autocast_what_rides_reads_trls_own_bf16_backward(setup, tmp_path, monkeypatch):
    """TRL's default ``bf16=True`` runs its forward under bf16 autocast: what rides reads that backward, so
    ``grad_norm/all/task`` is the norm of the gradient TRL applies (its logged ``grad_norm``, ``actor/grad_norm``),
    where the pass before the update (a run where nothing rides) runs in fp32 and differs from it
    at bf16's precision (and the noise-scale estimates, differences of such norms, by up to a few percent).
    Printed: the record behind docs/integrations.md ("Riding on TRL's update")."""
    runs = {}
    for name in ("own", "riding"):
        with riding_unless_own(monkeypatch, name):
            make(setup, tmp_path / name, **{**RIDE, "bf16": True}).train()
        runs[name] = logged_steps(tmp_path / name)
    for step in (1, 2):
        own, riding = runs["own"][step], runs["riding"][step]
        trl_norm = riding["actor/grad_norm"]
        assert own["actor/grad_norm"] == trl_norm  # the same training (bitwise: test above)
        noise = max(abs(riding[k] - own[k]) / abs(own[k]) for k in own if k.startswith("noise_") and abs(own[k]) > 1e-6)
        print(f"bf16 step {step}: TRL grad_norm {trl_norm:.7g}; grad_norm/all/task riding "
              f"{riding['grad_norm/all/task']:.7g} (rel {abs(riding['grad_norm/all/task'] / trl_norm - 1):.1e}), "
              f"own pass {own['grad_norm/all/task']:.7g} (rel {abs(own['grad_norm/all/task'] / trl_norm - 1):.1e}); "
              f"noise_* riding vs own: max rel {noise:.1e}")
        assert riding["grad_norm/all/task"] == pytest.approx(trl_norm, rel=2e-4)
