"""The instruments from a plain PyTorch loop with its own (non-rlgrad) loss: examples/custom_loop.py,
held to plain autograd."""

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from rlgrad.algos.objective import per_token_loss
from rlgrad.analysis import analyse_buckets, analyse_components

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_loop.py"


@pytest.fixture(scope="module")
def ex():
    spec = importlib.util.spec_from_file_location("custom_loop", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def model_batch(ex):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1))
    return model, ex.make_batch()


def _grad(model, loss):
    gs = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True, retain_graph=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).double()
                      for g, p in zip(gs, model.parameters())])


def test_the_example_runs(ex, capsys):
    ex.main(steps=2)
    out = capsys.readouterr().out
    assert "grad_norm/all/task" in out and "grad_sim/correctness__format" in out


@pytest.mark.parametrize("method", ["fast", "reference"])
def test_bucket_norms_of_a_foreign_loss_equal_autograd(ex, model_batch, method):
    model, batch = model_batch
    rep = analyse_buckets(model, batch, per_token_loss(ex.reinforce, "token-mean"), num_buckets=3, method=method)
    assert set(rep.buckets.names) == {"all", "bucket_1", "bucket_2", "bucket_3"}
    for name, rows in rep.buckets.rows.items():
        sub = batch.select(rows)
        loss = ex.reinforce(model, sub)["task"].sum() / sub.response_mask.sum()  # the loop's token-mean
        g = _grad(model, loss)
        assert rep.metrics[f"grad_norm/{name}/task"] == pytest.approx(float(g.norm()), rel=1e-4)
        assert rep.metrics[f"grad_norm/{name}/loss/task"] == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-8)
    assert "grad_norm/all/entropy" not in rep.metrics  # only the loop's own term


def test_component_geometry_of_a_foreign_loss_equals_autograd(ex, model_batch):
    model, batch = model_batch
    unit = per_token_loss(lambda m, b: -ex.token_logp(m, b) * b.response_mask, "token-mean")
    rep = analyse_components(model, batch, unit, weights={"correctness": 0.8, "format": 0.2})
    D = batch.response_mask.sum()
    per_row = (-ex.token_logp(model, batch) * batch.response_mask).sum(-1)  # Σ_t of the unit loss, per response
    grads = {c: _grad(model, (rep.advantages[c] * per_row).sum() / D) for c in ("correctness", "format")}
    total = _grad(model, ex.reinforce(model, batch)["task"].sum() / D)  # the loop's own update gradient
    for c, g in grads.items():
        assert rep.metrics[f"grad_comp/{c}/norm"] == pytest.approx(float(g.norm()), rel=1e-4)
        assert rep.metrics[f"grad_comp/{c}/share"] == pytest.approx(float(g @ total / (total @ total)), rel=1e-3)
    cos = float(grads["correctness"] @ grads["format"] / (grads["correctness"].norm() * grads["format"].norm()))
    assert rep.metrics["grad_sim/correctness__format"] == pytest.approx(cos, abs=1e-4)
    assert rep.metrics["grad_comp/total/norm"] == pytest.approx(float(total.norm()), rel=1e-4)
    assert math.isclose(sum(rep.metrics[f"grad_comp/{c}/share"] for c in grads), 1.0, rel_tol=1e-4)


def test_a_loss_without_its_aggregation_is_refused(model_batch):
    model, batch = model_batch
    with pytest.raises(TypeError, match="per_token_loss"):
        analyse_buckets(model, batch, lambda m, b: {"task": b.response_mask})
