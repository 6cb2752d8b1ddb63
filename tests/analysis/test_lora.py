"""The engine and every instrument on a PEFT LoRA model: gradients with respect to the adapters alone, held to
plain autograd of the adapter parameters (float32, relative error <= 1e-5)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from rlgrad.algos.aggregation import Denominators
from rlgrad.algos.objective import ActorLoss, actor_objective
from rlgrad.analysis.buckets import analyse_buckets
from rlgrad.analysis.components import TERM, analyse_components
from rlgrad.analysis.engine import fast_unsupported
from rlgrad.analysis.neuron_base import find_neurons
from rlgrad.analysis.neurons import NeuronHealthHook, measure
from rlgrad.config.analysis import NeuronHealthConfig, NeuronsConfig
from rlgrad.config.schedule import Schedule
from rlgrad.errors import UserError
from tests.analysis.test_components import WEIGHTS, component_batch
from tests.helpers.batches import SETTINGS, make_batch
from tests.helpers.lora import adapter_grads, lora_model, relative_error

TOL = 1e-5


@pytest.fixture(scope="module")
def lora(model_tok):
    model, tok = model_tok
    return lora_model(model), tok


def _slice(stats, term: str, name: str) -> dict[str, torch.Tensor]:
    k = stats.slices.index(name)
    return {n: g[k] for n, g in stats.grads[term].items()}


def test_bucket_gradients_are_those_of_the_adapters(lora):
    """(The reference engine is plain autograd over the trainable parameters: the frozen-embedding engine test and
    the verl, TRL and trainer tests cover it; the fast engine's hooks are what LoRA could break.)"""
    model, tok = lora
    assert fast_unsupported(model) is None  # a frozen input embedding still gives the hooks their leaf
    s = SETTINGS[0]
    b = make_batch(model, tok)
    rep = analyse_buckets(model, b, s, num_buckets=3, method="fast", keep_grads=True)
    # every gradient is an adapter's, grouped by the decoder layer it adapts: no embedding, norm or head group
    assert all(".lora_A." in n or ".lora_B." in n for n in rep.stats.grads["task"])
    assert sorted(rep.stats.gram["task"]) == ["layer_0", "layer_1"]
    for name in rep.buckets.names:
        sub = b.select(rep.buckets.rows[name])
        for term in ("task", "entropy", "kl"):
            obj = actor_objective(model, sub, s, Denominators.of(sub))
            loss = {"task": obj.task, "entropy": -s.entropy_coeff * obj.entropy, "kl": s.kl_loss_coef * obj.kl}[term]
            want = adapter_grads(model, loss)
            assert relative_error(_slice(rep.stats, term, name), want) <= TOL, (name, term)
            norm = sum(float(g.double().pow(2).sum()) for g in want.values()) ** 0.5
            assert rep.metrics[f"grad_norm/{name}/{term}"] == pytest.approx(norm, rel=TOL, abs=1e-12)


def test_frozen_base_weights_are_untouched_and_get_no_gradient(lora):
    model, tok = lora
    b = make_batch(model, tok, seed=1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    analyse_buckets(model, b, SETTINGS[1], num_buckets=2, method="fast")
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) and p.requires_grad == flags[n] and p.grad is None


def test_component_gradients_are_those_of_the_adapters(lora):
    model, tok = lora
    s = SETTINGS[0]
    b = component_batch(model, tok, seed=2, noise=0.0, estimator="rloo")  # on policy: no clip is active
    rep = analyse_components(model, b, s, weights=WEIGHTS, mode="shared_std", estimator="rloo", method="fast",
                             keep_grads=True)
    # the components add up to the update's policy gradient, and each is the policy loss with its own advantage
    total = adapter_grads(model, actor_objective(model, b, s, Denominators.of(b)).task)
    assert relative_error(_slice(rep.stats, TERM, "total"), total) <= TOL
    for c in WEIGHTS:
        bc = copy.copy(b)
        bc.advantages = rep.advantages[c][:, None] * b.response_mask
        want = adapter_grads(model, actor_objective(model, bc, s, Denominators.of(bc)).task)
        assert relative_error(_slice(rep.stats, TERM, c), want) <= TOL, c


def test_neurons_of_a_lora_model_are_scored_on_their_adapter_rows(lora, model_tok):
    model, tok = lora  # adapters on q_proj, v_proj, gate_proj, down_proj: up_proj is frozen
    # GQA heads read q_proj alone (adapted): scored; every MLP's up_proj rows are frozen: not scored
    assert [la.name for la in find_neurons(model)] == [f"base_model.model.model.layers.{i}.self_attn" for i in (0, 1)]
    model = lora_model(model_tok[0], targets=("q_proj", "gate_proj", "up_proj"))
    layers = {la.name: la for la in find_neurons(model)}
    prefix = "base_model.model.model.layers.0"
    assert sorted(layers) == [f"base_model.model.model.layers.{i}.{m}" for i in (0, 1) for m in ("mlp", "self_attn")]
    mlp = layers[f"{prefix}.mlp"]
    assert [n for n, _ in mlp.incoming] == [f"{prefix}.mlp.gate_proj.lora_B.default.weight",
                                            f"{prefix}.mlp.up_proj.lora_B.default.weight"]
    assert mlp.outgoing == []  # down_proj has no adapter: nothing of it is trainable
    b = make_batch(model, tok, seed=3)
    model.zero_grad(set_to_none=True)
    actor_objective(model, b, SETTINGS[0], Denominators.of(b)).total(SETTINGS[0]).backward()
    rep = measure(model, b, NeuronHealthConfig(nullspace_samples=6), role="actor", seed=0, step=1,
                  loss_fn=ActorLoss(SETTINGS[0]))
    # GraMa by hand: mean |gradient| over the neuron's lora_B rows (r entries in each of gate_proj's and up_proj's)
    stats = {st.layer.name: st for st in rep.layers}[f"{prefix}.mlp"]
    gate, up = (dict(model.named_parameters())[n].grad for n, _ in mlp.incoming)
    a = (gate.abs().sum(1) + up.abs().sum(1)).double() / (2 * gate.shape[1])
    torch.testing.assert_close(stats.grad_sum / stats.grad_count, a)
    # the nullspace Gram: plain autograd of each sampled sequence's own loss (token-mean: ω = 1) over the adapters
    fn = ActorLoss(SETTINGS[0])
    rows = [torch.cat([g.reshape(-1).double() for g in adapter_grads(
        model, sum(v.sum() for v in fn(model, b.select([int(i)])).values())).values()]) for i in rep.sample_rows]
    G = torch.stack(rows)
    assert float((rep.gram - G @ G.t()).norm() / (G @ G.t()).norm()) <= TOL
    model.zero_grad(set_to_none=True)


def test_a_neuron_reset_on_a_lora_model_is_refused(lora):
    model, tok = lora
    hook = NeuronHealthHook(NeuronsConfig(), {}, {"actor": Schedule(1, 1)}, seed=0, method="fast")
    with pytest.raises(UserError, match="reset_every.*LoRA"):
        hook.on_grads(SimpleNamespace(step=1), model, make_batch(model, tok))
