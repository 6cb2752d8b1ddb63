"""The gradient engine (``analysis/engine.py``): side effects, layer groups, what the fast path covers and its
fallback to the reference.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from rlgrad.analysis.buckets import analyse_buckets
from rlgrad.analysis.engine import fast_gradients, layer_group
from tests.helpers.batches import SETTINGS, make_batch


def test_engine_is_side_effect_free(model_tok):
    model, tok = model_tok
    b = make_batch(model, tok)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    flags = [p.requires_grad for p in model.parameters()]
    rng = torch.get_rng_state()
    analyse_buckets(model, b, SETTINGS[0], method="fast")
    analyse_buckets(model, b, SETTINGS[0], method="reference")
    assert torch.equal(torch.get_rng_state(), rng)
    assert flags == [p.requires_grad for p in model.parameters()]
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) and torch.equal(p.grad, torch.ones_like(p))
        p.grad = None


def test_layer_groups():
    assert layer_group("model.layers.3.mlp.up_proj.weight") == "layer_3"
    assert layer_group("model.embed_tokens.weight") == "embed"
    assert layer_group("model.norm.weight") == "final_norm"
    assert layer_group("lm_head.weight") == "lm_head"


def test_fast_engine_refuses_uncovered_parameters(model_tok):
    model, tok = model_tok
    m = copy.deepcopy(model)
    m.extra = torch.nn.Parameter(torch.zeros(3))
    b = make_batch(model, tok)
    with pytest.raises(NotImplementedError, match="extra"):
        fast_gradients(m, b, lambda mm, bb: {}, torch.ones(1, len(b)), ["s"])


def test_a_model_the_fast_engine_cannot_cover_falls_back_to_the_reference(model_tok):
    model, tok = model_tok
    m = copy.deepcopy(model)
    m.extra = torch.nn.Parameter(torch.zeros(3))  # a parameter outside every module the hooks know
    b = make_batch(model, tok)
    with pytest.warns(UserWarning, match="does not cover parameter.*extra"):
        got = analyse_buckets(m, b, SETTINGS[0], num_buckets=2, method="fast")
    ref = analyse_buckets(m, b, SETTINGS[0], num_buckets=2, method="reference")
    assert got.metrics == ref.metrics


def test_a_frozen_input_embedding_still_runs_the_fast_engine(model_tok):
    """Its output is the leaf the backward stops at (LoRA: every base weight frozen); it gets no gradient itself."""
    model, tok = model_tok
    m = copy.deepcopy(model)
    m.get_input_embeddings().weight.requires_grad_(False)
    b = make_batch(model, tok)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        got = analyse_buckets(m, b, SETTINGS[0], num_buckets=2, method="fast", keep_grads=True)
    ref = analyse_buckets(m, b, SETTINGS[0], num_buckets=2, method="reference", keep_grads=True)
    trainable = sorted(n for n, p in m.named_parameters() if p.requires_grad)
    assert "model.embed_tokens.weight" not in trainable and sorted(got.stats.grads["task"]) == trainable
    for name, value in ref.metrics.items():
        assert got.metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-9), name
