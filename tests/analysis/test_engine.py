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


def slice_weights(b, kind: str) -> torch.Tensor:
    """Slice weights of every shape the engine reduces differently: buckets (scaled), one row per slice, overlapping."""
    g = torch.Generator().manual_seed(0)
    scaled_buckets = (b.group_ids[None, :] == torch.arange(3)[:, None]).float() * torch.tensor([[1.0], [0.5], [2.0]])
    return {"disjoint": scaled_buckets,
            "one_row_each": torch.eye(len(b))[[3, 0, 7, 12]],
            "overlapping": torch.rand(3, len(b), generator=g)}[kind]


def assert_grams_close(fast, ref) -> None:
    for term in ref.gram:
        for grp, k in ref.gram[term].items():
            torch.testing.assert_close(fast.gram[term][grp], k, rtol=1e-5, atol=1e-9 * float(k.abs().max()) + 1e-12)


@pytest.mark.parametrize("write_tokens", [-1000, 1000])
def test_overlapping_slices_from_the_rows_gradients_or_by_slice_equal_the_reference(model_tok, monkeypatch,
                                                                                    write_tokens):
    """Overlapping slices (reward components) from each Linear's per-row gradients combined, or from one product per
    slice (``combine_is_cheaper``: short rows): either way the reference's Grams; the path is the one chosen."""
    from rlgrad.algos.objective import ActorLoss
    from rlgrad.analysis import engine

    model, tok = model_tok
    b = make_batch(model, tok)
    weights = slice_weights(b, "overlapping")
    slices = [f"s{i}" for i in range(len(weights))]
    monkeypatch.setattr(engine, "COMBINE_WRITE_TOKENS", write_tokens)
    combined = []
    real = engine._SliceReducer._combined_rows
    monkeypatch.setattr(engine._SliceReducer, "_combined_rows", lambda self, *a: combined.append(1) or real(self, *a))
    fast = engine.slice_gradients("fast", model, b, ActorLoss(SETTINGS[0]), weights, slices)
    ref = engine.slice_gradients("reference", model, b, ActorLoss(SETTINGS[0]), weights, slices)
    assert bool(combined) == (write_tokens < 0)
    assert_grams_close(fast, ref)


def test_overlapping_slices_are_combined_from_long_rows_only():
    """The choice at the two measured shapes: 9-token rows by slice, 92-token rows combined (2 slices)."""
    from rlgrad.analysis.engine import combine_is_cheaper

    assert not combine_is_cheaper(9, 2) and combine_is_cheaper(92, 2)
    assert combine_is_cheaper(9, 8)  # many slices: S products cost more than the rows' gradients


@pytest.mark.parametrize("kind", ["disjoint", "one_row_each", "overlapping"])
def test_large_parameters_streamed_by_blocks_of_rows_equal_the_reference(model_tok, monkeypatch, kind):
    """Streaming forms an untied parameter's slice gradients a block of rows at a time (the LM head, the embedding,
    the MLP projections here, in blocks of a few rows that do not divide them): the Gram per layer group is the
    reference's, for every way the engine reduces a module (buckets, one row per slice, overlapping slices)."""
    from rlgrad.algos.objective import ActorLoss
    from rlgrad.analysis import engine

    model, tok = model_tok
    m = copy.deepcopy(model)
    m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone() * 1.1)  # untied: one use each
    b = make_batch(model, tok)
    weights = slice_weights(b, kind)
    slices = [f"s{i}" for i in range(len(weights))]
    monkeypatch.setattr(engine, "BLOCK_ELEMENTS", 5 * len(weights) * m.config.hidden_size)  # 5 rows of hidden
    loss = ActorLoss(SETTINGS[0])
    blocks = []
    real = engine._SliceReducer._blocks
    monkeypatch.setattr(engine._SliceReducer, "_blocks", lambda self, p: blocks.append(real(self, p)) or blocks[-1])
    fast = engine.slice_gradients("fast", m, b, loss, weights, slices, {"sum": {s: 1.0 for s in slices}})
    ref = engine.slice_gradients("reference", m, b, loss, weights, slices, {"sum": {s: 1.0 for s in slices}})
    assert max(len(x) for x in blocks) > 1  # some parameter was split
    assert_grams_close(fast, ref)


@pytest.mark.parametrize("kind", ["disjoint", "one_row_each", "overlapping"])
def test_a_tied_embedding_is_streamed_without_its_dense_slice_gradients(model_tok, monkeypatch, kind):
    """The tied input/output embedding while streaming: the embedding's slice gradients only at the batch's token ids,
    the LM head's rows there added to them, its other rows by blocks. The Gram is the reference's, and no flushed
    piece of the tied weight holds all its rows (the dense per-slice vocabulary x hidden gradient the neuron sample
    of a large vocabulary ran out of memory on)."""
    from rlgrad.algos.objective import ActorLoss
    from rlgrad.analysis import engine

    model, tok = model_tok
    m = copy.deepcopy(model)
    assert m.lm_head.weight is m.model.embed_tokens.weight  # tied
    b = make_batch(model, tok)
    weights = slice_weights(b, kind)
    slices = [f"s{i}" for i in range(len(weights))]
    monkeypatch.setattr(engine, "BLOCK_ELEMENTS", 5 * len(weights) * m.config.hidden_size)  # 5 rows of hidden
    loss = ActorLoss(SETTINGS[0])
    ref = engine.slice_gradients("reference", m, b, loss, weights, slices, {"sum": {s: 1.0 for s in slices}})
    flushed = []
    real = engine._gram
    monkeypatch.setattr(engine, "_gram", lambda grads, *a, **k: flushed.extend(
        (n, tuple(t.shape)) for n, t in grads.items()) or real(grads, *a, **k))
    fast = engine.slice_gradients("fast", m, b, loss, weights, slices, {"sum": {s: 1.0 for s in slices}})
    vocab = m.lm_head.weight.shape[0]
    tied = [shape for name, shape in flushed if name == "model.embed_tokens.weight"]
    present = len(torch.unique(b.input_ids))
    assert tied and max(shape[1] for shape in tied) < vocab and any(shape[1] == present for shape in tied)
    assert_grams_close(fast, ref)


def test_activation_checkpointing_recomputes_are_not_watched_twice(model_tok, monkeypatch):
    """Under activation checkpointing a layer's forward runs again inside the backward. Without reentry (transformers'
    default) the gradient flows through the first forward's outputs: the recompute is not watched, so each Linear
    counts one call and streams by blocks as without checkpointing, and the Gram is that of the model without it.
    (Reentrant checkpointing refuses ``autograd.grad``, which the engine's own pass takes; riding on an update's
    ``backward`` under it is tested in tests/integrations/test_trl.py.)"""
    from rlgrad.algos.objective import ActorLoss
    from rlgrad.analysis import engine

    model, tok = model_tok
    m = copy.deepcopy(model)
    m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone() * 1.1)  # untied
    b = make_batch(model, tok)
    weights = (b.group_ids[None, :] == torch.arange(3)[:, None]).float()
    slices = ["s0", "s1", "s2"]
    loss = ActorLoss(SETTINGS[0])
    monkeypatch.setattr(engine, "BLOCK_ELEMENTS", 5 * len(weights) * m.config.hidden_size)
    plain = engine.slice_gradients("fast", m, b, loss, weights, slices)
    m.train()
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    recomputed = []
    real_forward = m.model.layers[0].mlp.up_proj.forward
    monkeypatch.setattr(m.model.layers[0].mlp.up_proj, "forward",
                        lambda x: recomputed.append(torch.is_grad_enabled()) or real_forward(x))
    blocks = {}
    real = engine._SliceReducer._blocks
    monkeypatch.setattr(engine._SliceReducer, "_blocks", lambda self, p: blocks.setdefault(
        self.names[self.alias.get(id(p), id(p))], real(self, p)))
    checkpointed = engine.slice_gradients("fast", m, b, loss, weights, slices)
    assert len(recomputed) > 1  # the layer ran again in the backward: the checkpoint is on
    assert len(blocks["model.layers.0.mlp.up_proj.weight"]) > 1  # one call counted: streamed by blocks
    assert_grams_close(checkpointed, plain)


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


def test_the_entropy_softmax_is_not_kept_through_the_other_terms_backwards(model_tok, monkeypatch):
    """Memory (issue 49; bench/results/i49/memory_all): one backward per term kept the entropy's ``[N, T, V]`` softmax,
    saved by its graph for its own backward, alive through the task and KL terms' backwards (+192 MB on a Llama of
    SmolLM2's shapes). The engine's forward saves none now (the entropy's backward forms it again), and every number
    is bitwise the one with it saved."""
    from contextlib import nullcontext

    from rlgrad.algos.objective import ActorLoss, LossSettings
    from rlgrad.analysis import engine
    from rlgrad.analysis.groups import group_pass

    model, tok = model_tok
    b = make_batch(model, tok)
    vocab = model.get_output_embeddings().out_features
    assert vocab != b.input_ids.shape[1]  # (an attention softmax's last dimension is the batch's length)
    s = LossSettings(use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, horizon=5)

    def pass_and_saved_softmax():
        saved = []

        def pack(t):
            if t.dim() == 3 and t.shape[-1] == vocab and "Softmax" in type(t.grad_fn).__name__:
                saved.append(t.shape)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            return group_pass(model, b, ActorLoss(s)), saved

    found, saved = pass_and_saved_softmax()
    assert not saved and set(found.grams) == {"task", "entropy", "kl"}
    monkeypatch.setattr(engine, "softmax_recomputed", nullcontext)  # as before: the softmax saved
    kept, saved = pass_and_saved_softmax()
    assert saved  # (the check sees a saved softmax where there is one)
    for term, grams in kept.grams.items():
        for g, k in grams.items():
            assert torch.equal(found.grams[term][g], k) and torch.equal(found.rows[term][g], kept.rows[term][g]), g
