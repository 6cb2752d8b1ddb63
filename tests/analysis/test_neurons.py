"""Neuron health: structure, GraMa / activation scores, zero-gradient and nullspace ratios, ReDo-style reset."""

import copy
import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from rlgrad.algos.aggregation import Denominators
from rlgrad.algos.objective import ActorLoss, LossSettings, actor_objective, per_token_loss
from rlgrad.analysis import hooks_from_config
from rlgrad.analysis.neuron_base import find_neurons
from rlgrad.analysis.neurons import NeuronHealthHook, gradient_stats, measure, nullspace_ratio, sample_rows
from rlgrad.analysis.redo import reset_dormant, select_reset
from rlgrad.batch import Batch
from rlgrad.cli import main
from rlgrad.config.analysis import NeuronHealthConfig
from rlgrad.config.load import load_config
from rlgrad.config.model import ModelConfig, TinyModelConfig
from rlgrad.errors import UserError
from rlgrad.hooks import StepContext
from rlgrad.models import build_char_tokenizer, build_tiny_model
from rlgrad.runfiles import read_jsonl

S = LossSettings(loss_agg_mode="token-mean", entropy_coeff=0.01, horizon=5)


# ----------------------------------------------------------------------------- models and batches
class MLPLM(nn.Module):
    """Embedding -> plain MLP (two neuron layers of nn.Linear pairs) -> output head; causal-LM call signature."""

    def __init__(self, vocab: int, d: int = 16, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.embed = nn.Embedding(vocab, d)
            self.mlp = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 24), nn.ReLU(), nn.Linear(24, d))
            self.head = nn.Linear(d, vocab)
            nn.init.constant_(self.mlp[0].bias, 0.2)  # ReLU units alive on every token unless planted dead
            nn.init.constant_(self.mlp[2].bias, 1.0)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, **kw):
        return SimpleNamespace(logits=self.head(self.mlp(self.embed(input_ids))))


def qwen(tok, kv_heads: int = 2, seed: int = 3):
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=kv_heads, intermediate_size=48))
    return build_tiny_model(cfg, tok, seed=seed)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def make_batch(vocab: int, n: int = 12, prompt: int = 4, response: int = 5, seed: int = 0) -> Batch:
    """Random sequences with random nonzero advantages: every row has its own, nonzero gradient."""
    g = torch.Generator().manual_seed(seed)
    L = prompt + response
    ids = torch.randint(3, vocab, (n, L), generator=g)
    att = torch.ones(n, L, dtype=torch.long)
    resp = torch.zeros(n, L)
    resp[:, prompt:] = 1.0
    gids = torch.arange(n) // 4
    scores = torch.rand(n, generator=g)
    b = Batch(
        input_ids=ids, attention_mask=att, response_mask=resp, group_ids=gids, scores=scores, reward_std=torch.ones(n))
    b.old_log_probs = (-3.0 + 0.1 * torch.randn(n, L, generator=g)) * resp
    b.advantages = (torch.randn(n, 1, generator=g) + 0.1 * torch.randn(n, L, generator=g)) * resp
    return b


def backward(model, b: Batch, s: LossSettings = S) -> None:
    model.zero_grad(set_to_none=True)
    actor_objective(model, b, s, Denominators.of(b)).total(s).backward()


def plant_qwen(model) -> dict[str, set[int]]:
    """Dead MLP units (gate and up rows zeroed) and one dead head (its q/k/v rows and o_proj columns zeroed)."""
    layers = model.model.layers
    planted = {"model.layers.0.mlp": {3, 7}, "model.layers.1.mlp": {5}, "model.layers.1.self_attn": {1}}
    with torch.no_grad():
        for li, units in ((0, [3, 7]), (1, [5])):
            layers[li].mlp.gate_proj.weight[units] = 0
            layers[li].mlp.up_proj.weight[units] = 0
        att = layers[1].self_attn
        hd = att.head_dim
        for lin in (att.q_proj, att.k_proj, att.v_proj):
            lin.weight[hd:2 * hd] = 0
            lin.bias[hd:2 * hd] = 0
        att.o_proj.weight[:, hd:2 * hd] = 0
    return planted


def flagged(rep, which: str) -> dict[str, set[int]]:
    out = {}
    for s in rep.layers:
        if which == "grad":
            v = s.score <= rep.tau
        elif which == "act":
            v = s.act_score <= rep.tau
        else:
            v = s.grad_sum == 0
        idx = set(torch.nonzero(v).flatten().tolist())
        if idx:
            out[s.layer.name] = idx
    return out


# ----------------------------------------------------------------------------- structure
def test_structure_mlp_qwen_and_gqa(tok):
    m = MLPLM(len(tok))
    layers = find_neurons(m)
    assert [(la.name, la.kind, la.n, la.width) for la in layers] == [("mlp.0", "mlp", 32, 1), ("mlp.2", "mlp", 24, 1)]
    assert [n for n, _ in layers[0].incoming] == ["mlp.0.weight", "mlp.0.bias"]
    assert [n for n, _ in layers[0].outgoing] == ["mlp.2.weight"] and layers[0].act_module is m.mlp[2]
    assert [n for n, _ in layers[1].outgoing] == ["mlp.4.weight"]  # mlp.4's rows feed the head: not neurons
    mha = {la.name: la for la in find_neurons(qwen(tok, kv_heads=2))}
    att = mha["model.layers.0.self_attn"]
    assert (att.kind, att.n, att.width) == ("attn", 2, 16)
    assert [n.split(".")[-2] for n, _ in att.incoming] == ["q_proj", "q_proj", "k_proj", "k_proj", "v_proj", "v_proj"]
    assert [n for n, _ in att.outgoing] == ["model.layers.0.self_attn.o_proj.weight"]
    mlp = mha["model.layers.1.mlp"]
    assert (mlp.n, [n.split(".")[-2] for n, _ in mlp.incoming]) == (48, ["gate_proj", "up_proj"])
    assert [n for n, _ in mlp.outgoing] == ["model.layers.1.mlp.down_proj.weight"]
    gqa = {la.name: la for la in find_neurons(qwen(tok, kv_heads=1))}
    assert [n.split(".")[-2] for n, _ in gqa["model.layers.0.self_attn"].incoming] == ["q_proj", "q_proj"]
    # embeddings, norms, o_proj/down_proj rows, lm_head: never incoming weights of a neuron
    names = {n for la in mha.values() for n, _ in la.incoming}
    assert not any(k in n for n in names for k in ("embed", "norm", "lm_head", "o_proj", "down_proj"))


# ----------------------------------------------------------------------------- scores by hand
def test_grama_scores_and_zero_ratios_by_hand():
    net = nn.Sequential(nn.Linear(2, 3, bias=False), nn.ReLU(), nn.Linear(3, 2))
    net[0].weight.grad = torch.tensor([[1.0, 1.0], [0.0, 0.0], [4.0, 0.0]])
    net[2].weight.grad = torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    net[2].bias.grad = torch.tensor([0.0, 3.0])
    layers = find_neurons(net)
    assert [la.name for la in layers] == ["0"]
    stats, zero, numel = gradient_stats(net, layers)
    # a = mean |g| of each row = [1, 0, 2]; mean 1 -> s = [1, 0, 2]
    assert stats[0].grad_sum.tolist() == [2.0, 0.0, 4.0] and stats[0].grad_count.tolist() == [2.0, 2.0, 2.0]
    assert stats[0].score.tolist() == [1.0, 0.0, 2.0]
    assert (zero, numel) == (3 + 5 + 1, 14.0)
    for tau, ratio in ((0.1, 1 / 3), (1.0, 2 / 3), (2.0, 1.0)):
        rep = measure(net, None, NeuronHealthConfig(tau=tau), role="critic", seed=0, step=1)
        m = rep.metrics()
        assert m["critic/neuron/dormant_ratio"] == pytest.approx(ratio)
        assert m["critic/neuron/zero_grad_ratio"] == pytest.approx(1 / 3)
        assert m["critic/param/zero_grad_ratio"] == pytest.approx(9 / 14)
        assert "critic/neuron/nullspace_ratio" not in m and "critic/neuron/act_dormant_ratio" not in m


def test_gradient_stats_count_a_missing_gradient_as_zeros_and_skip_it_in_the_sums():
    """A parameter without ``.grad`` (never reached by the backward): its elements all count as zero gradients, its
    rows add nothing to their neurons' sums but still to their element counts; a frozen one counts nowhere."""
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))
    net[0].weight.grad = torch.tensor([[1.0, -1.0], [0.0, 0.5], [4.0, 0.0]])  # net[0].bias.grad: None
    net[2].weight.grad = torch.ones(2, 3)
    net[2].bias.requires_grad_(False)
    stats, zero, numel = gradient_stats(net, find_neurons(net))
    assert stats[0].grad_sum.tolist() == [2.0, 0.5, 4.0] and stats[0].grad_count.tolist() == [3.0, 3.0, 3.0]
    assert (zero, numel) == (2 + 3, 15.0)


def test_head_score_averages_its_rows_and_biases(tok):
    for kv in (2, 1):
        model = qwen(tok, kv_heads=kv)
        backward(model, make_batch(len(tok)))
        rep = measure(model, None, NeuronHealthConfig(), role="actor", seed=0, step=1)
        s = next(s for s in rep.layers if s.layer.name == "model.layers.1.self_attn")
        att = model.model.layers[1].self_attn
        hd = att.head_dim
        projs = (att.q_proj, att.k_proj, att.v_proj) if kv == 2 else (att.q_proj,)
        a = [sum(float(p.weight.grad[h * hd:(h + 1) * hd].abs().sum() + p.bias.grad[h * hd:(h + 1) * hd].abs().sum())
                 for p in projs) / (len(projs) * hd * 33) for h in range(2)]
        expect = torch.tensor(a) / (sum(a) / 2)
        torch.testing.assert_close(s.score, expect.double(), rtol=1e-6, atol=0)


# ----------------------------------------------------------------------------- planted dead neurons
def test_planted_dead_neurons_found_by_both_scores_mlp(tok):
    m = MLPLM(len(tok))
    with torch.no_grad():
        m.mlp[0].weight[[4, 9]] = 0
        m.mlp[0].bias[[4, 9]] = 0
        m.mlp[2].weight[17] = 0
        m.mlp[2].bias[17] = 0
    b = make_batch(len(tok))
    backward(m, b)
    rep = measure(m, b, NeuronHealthConfig(), role="actor", seed=0, step=1, loss_fn=ActorLoss(S))
    planted = {"mlp.0": {4, 9}, "mlp.2": {17}}
    assert flagged(rep, "grad") == planted
    assert flagged(rep, "act") == planted
    assert flagged(rep, "zero") == planted
    # Oracle for the activation sums: the hidden units by hand, response tokens only.
    with torch.no_grad():
        h1 = torch.relu(m.mlp[0](m.embed(b.input_ids)))
        h2 = torch.relu(m.mlp[2](h1))
    for s, h in zip(rep.layers, (h1, h2)):
        torch.testing.assert_close(s.act_sum, (h * b.response_mask[..., None]).sum((0, 1)).double(),
                                   rtol=1e-5, atol=1e-6)
        assert float(s.act_count[0]) == float(b.response_mask.sum())  # every row sampled (12 <= 32)
    met = rep.metrics()
    assert met["actor/neuron/dormant_ratio"] == pytest.approx(3 / 56)
    assert met["actor/neuron/act_dormant_ratio"] == pytest.approx(3 / 56)
    assert met["actor/neuron/zero_grad_ratio"] == pytest.approx(3 / 56)


def test_planted_dead_neurons_found_by_both_scores_qwen(tok):
    model = qwen(tok)
    planted = plant_qwen(model)
    b = make_batch(len(tok))
    backward(model, b)
    rep = measure(model, b, NeuronHealthConfig(), role="actor", seed=0, step=1, loss_fn=ActorLoss(S))
    assert flagged(rep, "grad") == planted
    assert flagged(rep, "act") == planted
    assert flagged(rep, "zero") == planted
    j = rep.to_json()
    assert j["layers"]["model.layers.0.mlp"] == {"kind": "mlp", "neurons": 48, "dormant": 2, "dormant_ratio": 2 / 48,
                                                 "act_dormant": 2, "zero_grad": 2, "reset": 0}
    assert j["global"]["dormant_ratio"] == pytest.approx(4 / 100) and j["global"]["reset_count"] == 0
    # activations are measured on response tokens only: prompt tokens do not count
    b2 = make_batch(len(tok))
    b2.response_mask[:, :] = 0
    b2.response_mask[:, -1] = 1
    rep2 = measure(model, b2, NeuronHealthConfig(nullspace_samples=3), role="actor", seed=0, step=1,
                   loss_fn=ActorLoss(S))
    assert float(rep2.layers[0].act_count[0]) == 3 * 16  # 3 sequences x 1 response token x head_dim channels


# ----------------------------------------------------------------------------- nullspace
def test_nullspace_counts_duplicates_and_gram_equals_plain_autograd(tok):
    model = qwen(tok, kv_heads=1)
    b = make_batch(len(tok), n=6)
    dup = torch.tensor([0, 1, 2, 0, 0, 1])  # rows 3, 4 repeat row 0; row 5 repeats row 1: rank 3
    b = b.select(dup)
    backward(model, b)
    rep = measure(model, b, NeuronHealthConfig(nullspace_samples=32), role="actor", seed=0, step=1,
                  loss_fn=ActorLoss(S))
    assert rep.sample_rows.tolist() == list(range(6))
    assert rep.nullspace_ratio == pytest.approx(3 / 6)
    assert rep.metrics()["actor/neuron/nullspace_ratio"] == pytest.approx(0.5)
    # Oracle: plain autograd of each sequence's own weighted loss, G Gᵀ.
    fn = ActorLoss(S)
    params = [p for p in model.parameters()]
    G = []
    for i in range(6):
        loss = sum(v.sum() for v in fn(model, b.select([i])).values())
        G.append(torch.cat([g.reshape(-1).double() for g in torch.autograd.grad(loss, params)]))
    G = torch.stack(G)
    torch.testing.assert_close(rep.gram, G @ G.t(), rtol=1e-4, atol=1e-10)
    # distinct sequences: no null direction
    assert measure(model, make_batch(len(tok), n=6), NeuronHealthConfig(), role="actor", seed=0, step=1,
                   loss_fn=fn).nullspace_ratio == 0.0


def test_nullspace_ratio_of_a_non_finite_gram_is_nan_not_a_crash():
    """A step whose gradient is not finite (a reward whose sum overflows: tests/doctor's reward_overflow) gave
    eigvalsh a non-finite matrix, which raised LinAlgError and killed the run before the trainer could skip the
    update. Such a step has no spectrum: NaN, and the doctor's nonfinite_steps reads it."""
    K = torch.eye(3, dtype=torch.float64)
    assert nullspace_ratio(K) == 0.0
    K[0, 1] = K[1, 0] = float("inf")
    assert math.isnan(nullspace_ratio(K))
    K[0, 1] = K[1, 0] = float("nan")
    assert math.isnan(nullspace_ratio(K))


def test_engine_per_row_path_equals_reference(tok):
    from rlgrad.analysis.engine import fast_gradients, reference_gradients
    model = qwen(tok, kv_heads=1)
    b = make_batch(len(tok), n=4)
    w = torch.diag(torch.tensor([0.5, 2.0, -1.0, 1.0]))  # one slice per row, in order: the batched reduction
    fn = ActorLoss(S)
    fast = fast_gradients(model, b, fn, w, list("abcd"), keep_grads=True)
    ref = reference_gradients(model, b, fn, w, list("abcd"), keep_grads=True)
    for term in ref.grads:
        for name, g in ref.grads[term].items():
            torch.testing.assert_close(fast.grads[term][name], g, rtol=1e-4, atol=1e-7)
        for grp, k in ref.gram[term].items():
            torch.testing.assert_close(fast.gram[term][grp], k, rtol=1e-4, atol=1e-10)


def _assert_engines_agree(fast, ref):
    for term in ref.grads:
        for name, g in ref.grads[term].items():
            torch.testing.assert_close(fast.grads[term][name], g, rtol=1e-4, atol=1e-7)
        for grp, k in ref.gram[term].items():
            torch.testing.assert_close(fast.gram[term][grp], k, rtol=1e-4, atol=1e-10)


def test_engine_partial_placement_equals_reference(tok):
    """Slices of at most one row, rows in at most one slice, out of order, a slice with no row and a row in
    no slice (what a rank holding part of a nullspace sample passes): placed per-row gradients."""
    from rlgrad.analysis.engine import _SliceReducer, fast_gradients, reference_gradients
    model = qwen(tok, kv_heads=1)
    b = make_batch(len(tok), n=4)
    w = torch.zeros(5, 4)
    w[0, 2], w[1, 0], w[3, 3] = 1.0, -0.5, 2.0  # slice 2 empty, row 1 in none
    probe = _SliceReducer(model, w)
    probe.close()
    assert probe.place is not None
    fn = ActorLoss(S)
    fast = fast_gradients(model, b, fn, w, list("abcde"), keep_grads=True)
    ref = reference_gradients(model, b, fn, w, list("abcde"), keep_grads=True)
    _assert_engines_agree(fast, ref)
    assert float(fast.total_gram("task")[2, 2]) == 0.0


def test_engine_overlapping_slices_combine_per_row_gradients_in_chunks(tok, monkeypatch):
    """Overlapping slices with arbitrary row weights (reward components) and a derived slice, with the
    per-row chunk forced down to one row: the same gradients and Grams as plain autograd per slice."""
    from rlgrad.analysis import engine
    model = qwen(tok, kv_heads=1)
    b = make_batch(len(tok), n=6)
    w = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    w[1, 4] = 0.0
    probe = engine._SliceReducer(model, w)
    probe.close()
    assert probe.combine
    fn = ActorLoss(S)
    derived = {"sum": {"a": 1.0, "b": 1.0, "c": 1.0}}
    ref = engine.reference_gradients(model, b, fn, w, list("abc"), derived, keep_grads=True)
    for chunk in (1, engine.ROW_CHUNK_ELEMENTS):
        monkeypatch.setattr(engine, "ROW_CHUNK_ELEMENTS", chunk)
        _assert_engines_agree(engine.fast_gradients(model, b, fn, w, list("abc"), derived, keep_grads=True), ref)


def test_engine_edge_cases_no_slices_and_unknown_derived_slice(tok):
    from rlgrad.analysis.engine import fast_gradients
    model = qwen(tok, kv_heads=1)
    b = make_batch(len(tok), n=3)
    fn = ActorLoss(S)
    assert fast_gradients(model, b, fn, torch.zeros(0, 3), []).gram == {}
    with pytest.raises(ValueError, match="unknown slice"):
        fast_gradients(model, b, fn, torch.ones(1, 3), ["a"], {"sum": {"a": 1.0, "typo": 1.0}})


def test_nullspace_ratio_math_and_sampling():
    v = torch.tensor([[1.0, 0, 0], [2.0, 0, 0], [0, 1.0, 0], [0, 0, 0]], dtype=torch.float64)  # dup direction, zero row
    assert nullspace_ratio(v @ v.t()) == pytest.approx(2 / 4)
    assert nullspace_ratio(torch.eye(5, dtype=torch.float64) * torch.arange(1, 6)) == 0.0  # scale is normalised away
    # Two nearly parallel gradients (angle eps): λ_min ≈ eps²/2 against λ_max ≈ 2, threshold (1e-5)² · λ_max
    for eps, null in ((1e-4, 0.0), (1e-6, 0.5)):
        g = torch.tensor([[1.0, 0.0], [1.0, eps]], dtype=torch.float64)
        assert nullspace_ratio(g @ g.t()) == null, eps
    a, b = sample_rows(100, 32, seed=7), sample_rows(100, 32, seed=7)
    assert torch.equal(a, b) and len(a) == 32 and len(set(a.tolist())) == 32 and torch.equal(a, a.sort().values)
    assert not torch.equal(a, sample_rows(100, 32, seed=8))
    assert sample_rows(5, 32, seed=7).tolist() == [0, 1, 2, 3, 4]


# ----------------------------------------------------------------------------- reset
def test_select_reset_modes():
    s = torch.tensor([0.0, 0.05, 0.5, 1.0, 2.0, 0.08, 1.1, 1.2, 1.3, 1.4])
    assert select_reset(s, 0.1, "threshold", 0.2).tolist() == [0, 1, 5]
    assert select_reset(s, 0.1, "percentage", 0.2).tolist() == [0, 1]
    assert select_reset(s, 0.1, "hybrid", 0.2).tolist() == [0, 1]
    assert select_reset(s, 0.1, "hybrid", 0.5).tolist() == [0, 1, 5]
    assert select_reset(s, 0.1, "percentage", 0.5).tolist() == [0, 1, 2, 3, 5]
    assert select_reset(s, 0.1, "percentage", 0.05).tolist() == []  # floor(0.5) = 0


def test_reset_draws_from_the_survivors_rms_by_hand():
    from rlgrad.analysis.neuron_base import seed_of as _seed
    net = nn.Sequential(nn.Linear(3, 4, bias=False), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[2.0, -2, 2], [-2, 2, 2], [0, 0, 0], [0, 0, 0]]))  # survivors' RMS: 2
    net[0].weight.grad = torch.tensor([[1.0, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0]])
    net[2].weight.grad = torch.ones(2, 4)
    rep = measure(net, None, NeuronHealthConfig(), role="actor", seed=4, step=9)
    assert reset_dormant(rep, None, NeuronHealthConfig(), seed=4, step=9) == {"0": 2}
    draw = torch.randn(2, 3, generator=torch.Generator().manual_seed(_seed(4, 9, "actor", "0.weight")))
    torch.testing.assert_close(net[0].weight[2:].detach(), 2.0 * draw)
    assert net[0].weight[:2].tolist() == [[2.0, -2, 2], [-2, 2, 2]]
    assert net[2].weight[:, 2:].tolist() == [[0.0, 0.0], [0.0, 0.0]] and bool((net[2].weight[:, :2] != 0).all())


def _neuron_hook(cfg) -> NeuronHealthHook:
    """The neuron-health hook ``hooks_from_config`` builds for ``cfg``."""
    return next(h for h in hooks_from_config(cfg) if isinstance(h, NeuronHealthHook))


def _ctx(cfg, model, opt, b, tmp_path, step=1, **kw):
    return StepContext(step=step, batch=b, actor=model, optimizer=opt, loss_settings=S, config=cfg, run_dir=tmp_path,
                       **kw)


def _trained(tok, steps=2):
    """A tiny Qwen2 with AdamW moments everywhere, then planted dead neurons (their moments still nonzero)."""
    model = qwen(tok)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    b = make_batch(len(tok))
    for _ in range(steps):
        backward(model, b)
        opt.step()
    planted = plant_qwen(model)
    backward(model, b)
    return model, opt, b, planted


def _planted_rows(model) -> dict[str, tuple[int, list[int]]]:
    """Parameter name -> (dim, indices) of the rows / columns ``plant_qwen`` killed."""
    hd = model.model.layers[1].self_attn.head_dim
    rows = {}  # parameter name -> (dim, changed indices)
    for layer, units in (("model.layers.0.mlp", [3, 7]), ("model.layers.1.mlp", [5])):
        rows[f"{layer}.gate_proj.weight"] = rows[f"{layer}.up_proj.weight"] = (0, units)
        rows[f"{layer}.down_proj.weight"] = (1, units)
    head = list(range(hd, 2 * hd))
    for pr in ("q_proj", "k_proj", "v_proj"):
        for kind in ("weight", "bias"):
            rows[f"model.layers.1.self_attn.{pr}.{kind}"] = (0, head)
    rows["model.layers.1.self_attn.o_proj.weight"] = (1, head)
    return rows


def _assert_only_planted_changed(model, opt, w0: dict, st0: dict, rows: dict, outgoing: str) -> None:
    """Against the weights ``w0`` and optimizer state ``st0`` before the reset: only ``rows`` changed, to fresh
    incoming weights, zero incoming biases, zero (or small) outgoing weights, and zero moments."""
    for n, p in model.named_parameters():
        dim, idx = rows.get(n, (0, []))
        other = torch.ones(p.shape[dim], dtype=torch.bool)
        other[idx] = False
        sel = (lambda t, m: t[m]) if dim == 0 else (lambda t, m: t[:, m])
        assert torch.equal(sel(p.detach(), other), sel(w0[n], other)), n
        assert opt.state[p]["step"] == st0[n]["step"]  # the step count is kept
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(sel(opt.state[p][k], other), sel(st0[n][k], other)), (n, k)
            if idx:
                moved = ~other
                assert bool((sel(st0[n][k], moved) != 0).any()), (n, k)  # the test is not vacuous
                assert bool((sel(opt.state[p][k], moved) == 0).all()), (n, k)
        if idx and n.endswith("weight") and "o_proj" not in n and "down_proj" not in n:
            new = sel(p.detach(), ~other)
            assert bool((new != 0).all())
            rms_new = float(new.pow(2).mean().sqrt())
            rms_old = float(sel(w0[n], other).pow(2).mean().sqrt())
            assert 0.5 * rms_old < rms_new < 2 * rms_old, n  # N(0, RMS of the surviving rows)
        if idx and n.endswith("bias"):
            assert bool((sel(p.detach(), ~other) == 0).all())
        if idx and ("o_proj" in n or "down_proj" in n):
            new = sel(p.detach(), ~other)
            assert bool((new == 0).all()) if outgoing == "zero" else 0 < float(new.abs().max()) < 0.1 * float(
                w0[n].abs().max())


@pytest.mark.parametrize("outgoing", ["zero", "small"])
def test_reset_revives_planted_neurons_and_zeroes_exactly_their_moments(tok, tmp_path, outgoing):
    model, opt, b, planted = _trained(tok)
    cfg = load_config(overrides=["actor.redo_metric_freq=1", "actor.redo_reset_freq=1",
                                 f"actor.redo_reset_outgoing={outgoing}"])
    hook = _neuron_hook(cfg)
    ctx = _ctx(cfg, model, opt, b, tmp_path)
    met = hook.on_grads(ctx, model, b)
    assert met["actor/neuron/dormant_ratio"] == pytest.approx(4 / 100)
    assert hook.on_grads(ctx, model, b) is None  # a second mini-batch of the same step is not measured again
    opt.step()
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    st0 = {n: {k: v.clone() for k, v in opt.state[p].items()} for n, p in model.named_parameters()}
    rng = torch.get_rng_state()
    out = hook.after_update(ctx)
    assert torch.equal(torch.get_rng_state(), rng)
    assert out == {"actor/neuron/reset_count": 4.0}
    doc = json.loads((tmp_path / "analysis" / "step_1" / "neurons.json").read_text())
    assert doc["step"] == 1 and doc["actor"]["global"]["reset_count"] == 4 and doc["actor"]["tau"] == 0.1
    assert ({k: v["reset"] for k, v in doc["actor"]["layers"].items() if v["reset"]}
            == {k: len(v) for k, v in planted.items()})

    # Exactly the planted rows / columns changed, in weights and in the optimizer moments.
    _assert_only_planted_changed(model, opt, w0, st0, _planted_rows(model), outgoing)

    # The planted neurons receive gradient again (through the outgoing weights: at once if small, else after a step).
    def incoming_grad_zero():
        rep = measure(model, None, NeuronHealthConfig(), role="actor", seed=0, step=2)
        return flagged(rep, "zero")

    backward(model, b)
    if outgoing == "zero":
        assert incoming_grad_zero() == planted
        assert float(model.model.layers[0].mlp.down_proj.weight.grad[:, [3, 7]].abs().min(0).values.max()) > 0
        opt.step()
        backward(model, b)
    assert incoming_grad_zero() == {}


def test_reset_is_deterministic_and_leaves_global_rng_alone(tok):
    model, opt, b, planted = _trained(tok, steps=1)
    rc = NeuronHealthConfig(tau=0.1)
    copies = [copy.deepcopy((model, opt)) for _ in range(3)]
    rng = torch.get_rng_state()
    results = []
    for (m, o), step in zip(copies, (5, 5, 6)):
        backward(m, b)
        rep = measure(m, b, rc, role="actor", seed=1, step=step, loss_fn=ActorLoss(S))
        counts = reset_dormant(rep, o, rc, seed=1, step=step)
        assert sum(counts.values()) == 4
        results.append(m.model.layers[0].mlp.gate_proj.weight.detach().clone())
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(results[0], results[1])  # same (seed, step): identical fresh weights
    assert not torch.equal(results[0][[3, 7]], results[2][[3, 7]])  # another step draws others
    assert torch.equal(results[0][[0, 1, 2]], results[2][[0, 1, 2]])


def test_no_reset_on_a_step_without_gradient(tok):
    model = qwen(tok)
    plant_qwen(model)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    before = copy.deepcopy(model.state_dict())
    rep = measure(model, None, NeuronHealthConfig(), role="actor", seed=0, step=1)
    assert rep.metrics()["actor/neuron/zero_grad_ratio"] == 1.0
    assert reset_dormant(rep, None, NeuronHealthConfig(), seed=0, step=1) == {}
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


# ----------------------------------------------------------------------------- the critic role
class ValueModel(nn.Module):
    """A stand-in critic: a Qwen2 trunk and a scalar value head."""

    def __init__(self, tok):
        super().__init__()
        self.trunk = qwen(tok, kv_heads=1, seed=5).model
        self.value_head = nn.Linear(32, 1)

    def forward(self, input_ids, attention_mask):
        h = self.trunk(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.value_head(h).squeeze(-1)


def test_critic_role(tok, tmp_path):
    critic = ValueModel(tok)
    assert {la.name for la in find_neurons(critic)} == {f"trunk.layers.{i}.{k}" for i in (0, 1)
                                                         for k in ("mlp", "self_attn")}
    with torch.no_grad():
        critic.trunk.layers[0].mlp.gate_proj.weight[11] = 0
        critic.trunk.layers[0].mlp.up_proj.weight[11] = 0
    b = make_batch(len(tok))
    b.returns = torch.randn(b.response_mask.shape, generator=torch.Generator().manual_seed(1)) * b.response_mask

    def value_loss(model, mb):  # per-token 0.5 (V - R)² on the response tokens (token-mean)
        v = model(mb.input_ids, mb.attention_mask)
        return {"vf": 0.5 * (v - mb.returns) ** 2 * mb.response_mask}

    opt = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    critic.zero_grad()
    (sum(value_loss(critic, b).values()).sum() / b.response_mask.sum()).backward()
    opt.step()
    cfg = load_config(overrides=["critic.redo_metric_freq=1", "critic.redo_reset_freq=1", "critic.redo_tau=0.05"])
    hook = _neuron_hook(cfg)
    ctx = StepContext(step=1, batch=b, actor=None, optimizer=None, loss_settings=None, config=cfg, run_dir=tmp_path,
                      critic=critic, critic_optimizer=opt, critic_loss=per_token_loss(value_loss))
    met = hook.on_grads(ctx, critic, b, role="critic")
    assert met["critic/neuron/dormant_ratio"] == pytest.approx(1 / 100)
    assert met["critic/neuron/act_dormant_ratio"] == pytest.approx(1 / 100)
    assert met["critic/neuron/nullspace_ratio"] == 0.0
    assert not any(k.startswith("actor/") for k in met)
    out = hook.after_update(ctx)
    assert out == {"critic/neuron/reset_count": 1.0}
    assert torch.equal(opt.state[critic.trunk.layers[0].mlp.up_proj.weight]["exp_avg"][11], torch.zeros(32))
    assert bool((critic.trunk.layers[0].mlp.up_proj.weight[11] != 0).all())
    doc = json.loads((tmp_path / "analysis" / "step_1" / "neurons.json").read_text())
    assert set(doc) == {"step", "critic"} and doc["critic"]["layers"]["trunk.layers.0.mlp"]["reset"] == 1


# ----------------------------------------------------------------------------- config and end to end
def test_config_keys_aliases_and_bad_values():
    cfg = load_config(overrides=["actor_rollout_ref.actor.redo_metric_freq=5", "actor_rollout_ref.actor.redo_tau=0.2",
                                 "critic.redo_reset_freq=7", "critic.redo_mode=hybrid"])
    actor, critic = cfg.analysis.neurons.actor, cfg.analysis.neurons.critic
    assert (actor.metric_every, actor.tau, actor.mode) == (5, 0.2, "threshold")
    assert (critic.reset_every, critic.mode, critic.nullspace_samples) == (7, "hybrid", 32)
    assert any(isinstance(h, NeuronHealthHook) for h in hooks_from_config(cfg))
    assert not any(isinstance(h, NeuronHealthHook) for h in hooks_from_config(load_config()))
    for bad, culprit in (("actor.redo_metric_freq=-1", "actor.redo_metric_freq"),
                         ("critic.redo_max_reset_frac=1.5", "critic.redo_max_reset_frac"),
                         ("actor.redo_mode=random", "actor.redo_mode"),
                         ("critic.redo_tau=-0.1", "critic.redo_tau")):
        with pytest.raises(UserError, match=culprit):
            load_config(overrides=[bad])


def test_metrics_alone_leave_the_training_trajectory_bitwise_unchanged(model_cache, tmp_path):
    from rlgrad.recipes import make_trainer
    from tests.conftest import tiny_overrides

    finals = []
    for name, extra in (("plain", []), ("measured", ["actor.redo_metric_freq=1", "actor.redo_nullspace_samples=8"])):
        cfg = load_config(overrides=tiny_overrides(model_cache, tmp_path / name) + extra + [
            "trainer.total_training_steps=2", "trainer.gradient_analysis_mode=false", "trainer.val_before_train=false",
            "actor.entropy_coeff=0.01", "actor.ppo_mini_batch_size=2"])  # 2 mini-batches per step
        tr = make_trainer(cfg, log=lambda *a: None)
        tr.fit()
        finals.append(({n: p.detach().clone() for n, p in tr.actor.named_parameters()}, torch.get_rng_state()))
    assert all(torch.equal(finals[0][0][n], finals[1][0][n]) for n in finals[0][0])
    assert torch.equal(finals[0][1], finals[1][1])
    rows = {r["step"]: r["data"] for r in read_jsonl(tmp_path / "measured" / "metrics.jsonl")}
    assert "actor/neuron/nullspace_ratio" in rows[2] and "actor/neuron/nullspace_ratio" not in read_jsonl(
        tmp_path / "plain" / "metrics.jsonl")[-1]["data"]


def test_train_cli_writes_neuron_metrics(tiny, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path)  # in process (cli.main): the command's launch is test_critic's and test_tasks'
    res = main(["train", *tiny, "trainer.total_training_steps=2", "trainer.gradient_analysis_mode=false",
                "trainer.val_before_train=false", "actor.redo_metric_freq=1", "actor.redo_reset_freq=2",
                "actor.redo_mode=percentage", "actor.redo_max_reset_frac=0.1",
                "actor.entropy_coeff=0.01"])  # a nonzero gradient even if every reward ties
    assert res == 0, capsys.readouterr().err[-3000:]
    rows = {r["step"]: r["data"] for r in read_jsonl(run / "metrics.jsonl")}
    for step in (1, 2):
        for k in ("dormant_ratio", "act_dormant_ratio", "zero_grad_ratio", "nullspace_ratio"):
            assert 0.0 <= rows[step][f"actor/neuron/{k}"] <= 1.0
        assert 0.0 <= rows[step]["actor/param/zero_grad_ratio"] <= 1.0
        doc = json.loads((run / "analysis" / f"step_{step}" / "neurons.json").read_text())
        assert doc["step"] == step and set(doc["actor"]["global"]) == {
            "dormant_ratio", "act_dormant_ratio", "zero_grad_ratio", "param_zero_grad_ratio", "nullspace_ratio",
            "reset_count"}
        assert len(doc["actor"]["layers"]) == 4  # 2 blocks x (mlp, self_attn)
    assert "actor/neuron/reset_count" not in rows[1]
    # percentage mode: floor(0.1 x 64) = 6 units per MLP, floor(0.1 x 2) = 0 heads
    assert rows[2]["actor/neuron/reset_count"] == 12.0
    doc = json.loads((run / "analysis" / "step_2" / "neurons.json").read_text())
    assert {k: v["reset"] for k, v in doc["actor"]["layers"].items()} == {
        "model.layers.0.self_attn": 0, "model.layers.0.mlp": 6, "model.layers.1.self_attn": 0, "model.layers.1.mlp": 6}


def test_train_cli_critic_neuron_health(tiny, tmp_path, capsys, monkeypatch):
    """PPO with a critic: the critic's neuron health comes from its own gradient and value loss."""
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path)  # in process (cli.main), as above
    res = main(["train", *tiny, "trainer.total_training_steps=2", "trainer.gradient_analysis_mode=false",
                "trainer.val_before_train=false", "algorithm.adv_estimator=gae", "critic.redo_metric_freq=1",
                "critic.redo_reset_freq=2", "critic.redo_mode=percentage", "critic.redo_max_reset_frac=0.1",
                "reward.weights.correctness=0.0", "reward.weights.format=0.0"])  # every score 0, by construction
    assert res == 0, capsys.readouterr().err[-3000:]
    rows = {r["step"]: r["data"] for r in read_jsonl(run / "metrics.jsonl")}
    for step in (1, 2):
        for k in ("dormant_ratio", "act_dormant_ratio", "zero_grad_ratio", "nullspace_ratio"):
            assert 0.0 <= rows[step][f"critic/neuron/{k}"] <= 1.0
        assert not any(k.startswith("actor/neuron/") for k in rows[step])
        doc = json.loads((run / "analysis" / f"step_{step}" / "neurons.json").read_text())
        assert set(doc) == {"step", "critic"} and len(doc["critic"]["layers"]) == 4
    # Every reward weight is 0, so returns = values = 0 and the critic's gradient is exactly zero:
    # every neuron reads as zero-gradient, and the reset is skipped (a zero gradient says nothing about
    # which neurons are dead).
    assert rows[2]["critic/grad_norm"] == 0.0 and rows[2]["critic/neuron/zero_grad_ratio"] == 1.0
    assert rows[2]["critic/neuron/reset_count"] == 0.0


@pytest.mark.parametrize("metric_every, nullspace_every, sampled_at", [(2, 5, [2, 8]), (2, 6, [2, 8]),
                                                                      (1, 10, [1]), (10, 10, [10, 20]), (20, 10, [20])])
def test_the_sample_runs_at_metric_steps_nullspace_every_steps_apart_and_the_gradient_scores_at_each(
        tok, tmp_path, metric_every, nullspace_every, sampled_at):
    """The sample (nullspace ratio, activation scores) at the metric steps at least ``nullspace_every`` steps apart,
    rounded up to a multiple of the cadence: with metrics every 2 steps and 5 (or 6) apart, at steps 2 and 8; with
    metrics every step (``analysis.every=1``) and the default 10, at step 1 of the first 10; at a cadence of 10 or
    more, at each metric step. The gradient scores at every metric step, equal to those of ``nullspace_every=1``."""
    model, opt, b, _ = _trained(tok)
    base = [f"analysis.neurons.actor.metric_every={metric_every}"]
    every = _neuron_hook(load_config(overrides=base + ["analysis.neurons.actor.nullspace_every=1"]))
    cfg = load_config(overrides=base + [f"analysis.neurons.actor.nullspace_every={nullspace_every}"])
    third = _neuron_hook(cfg)
    sampled = []
    for step in range(1, max(9, sampled_at[-1] + 1)):
        got = third.on_grads(_ctx(cfg, model, opt, b, tmp_path, step=step), model, b)
        if step % metric_every:
            assert got is None
            continue
        want = every.on_grads(_ctx(cfg, model, opt, b, tmp_path, step=step), model, b)
        assert "actor/neuron/nullspace_ratio" in want and "actor/neuron/act_dormant_ratio" in want
        if "actor/neuron/nullspace_ratio" in got:
            sampled.append(step)
        plain = {k: v for k, v in want.items() if not k.startswith("timing_s/")}
        if step not in sampled_at:
            plain = {k: v for k, v in plain.items() if "nullspace" not in k and "act_dormant" not in k}
        assert {k: v for k, v in got.items() if not k.startswith("timing_s/")} == plain
    assert sampled == sampled_at


def test_the_trainers_sample_runs_before_the_backward_with_no_gradient_held_and_the_same_numbers(
        model_cache, tmp_path, monkeypatch):
    """rlgrad's trainer takes the sequence sample at ``before_grads`` (the first mini-batch, before its forward):
    no parameter holds a gradient during the sample's passes, so the update's gradient, one fp32 model copy, is not
    alive under them. The Gram, the nullspace ratio, the activation scores and the rest of the report are bitwise
    those of the sample taken at ``on_grads`` (``before_grads`` switched off), over two mini-batches a step."""
    import rlgrad.analysis.neurons as neurons_mod
    from rlgrad.recipes import make_trainer
    from tests.conftest import tiny_overrides

    real_pass, real_ratio = neurons_mod.sample_pass, neurons_mod.nullspace_ratio
    runs: dict[str, dict] = {}
    for name in ("before_grads", "on_grads"):
        seen = runs[name] = {"held": [], "grams": []}

        def recording_pass(model, *a, seen=seen, **k):
            seen["held"].append(any(p.grad is not None for p in model.parameters()))
            return real_pass(model, *a, **k)

        def recording_ratio(K, seen=seen):
            seen["grams"].append(K.clone())
            return real_ratio(K)

        monkeypatch.setattr(neurons_mod, "sample_pass", recording_pass)
        monkeypatch.setattr(neurons_mod, "nullspace_ratio", recording_ratio)
        if name == "on_grads":  # the loop without the hook point (as TRL and verl call it): at the gradient
            monkeypatch.setattr(NeuronHealthHook, "before_grads", lambda *a, **k: None)
        cfg = load_config(overrides=tiny_overrides(model_cache, tmp_path / name) + [
            "trainer.total_training_steps=2", "trainer.gradient_analysis_mode=false", "trainer.val_before_train=false",
            "actor.entropy_coeff=0.01", "actor.ppo_mini_batch_size=2", "actor.redo_metric_freq=1",
            "actor.redo_nullspace_samples=6", "analysis.neurons.actor.nullspace_every=1"])
        make_trainer(cfg, log=lambda *a: None).fit()
        seen["rows"] = [{k: v for k, v in r["data"].items() if "neuron" in k and not k.startswith("timing_s/")}
                        for r in read_jsonl(tmp_path / name / "metrics.jsonl")]
        seen["docs"] = [json.loads((tmp_path / name / "analysis" / f"step_{s}" / "neurons.json").read_text())
                        for s in (1, 2)]
    first, second = runs["before_grads"], runs["on_grads"]
    assert first["held"] == [False, False] and second["held"] == [True, True]  # one sample a step
    assert len(first["grams"]) == 2 and all(torch.equal(a, b) for a, b in zip(first["grams"], second["grams"]))
    assert first["rows"] == second["rows"] and first["docs"] == second["docs"]
    assert all("actor/neuron/nullspace_ratio" in r and "actor/neuron/act_dormant_ratio" in r for r in first["rows"])
