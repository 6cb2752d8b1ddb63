"""The native decode engine (rlgrad.rl.decode) against transformers' generate, and rollout log-probs."""

import copy

import pytest
import torch

from rlgrad.batch import position_ids_from_mask
from rlgrad.config.load import load_config
from rlgrad.config.model import ModelConfig, TinyModelConfig
from rlgrad.errors import UserError
from rlgrad.models import build_char_tokenizer, build_tiny_model
from rlgrad.rl.decode import decode, draw, filtered_probs, unsupported_reason
from rlgrad.rl.rollout import compute_log_probs, encode_prompts, generate, resolve_engine

PROMPTS = ["1+2=", "13+45=", "7*8=", "100-37="]  # different lengths: left padding


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def spread(model):
    """Larger random weights than the HF init, so that greedy outputs vary instead of repeating one token."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
    return model


def qwen2(tok):
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=2, intermediate_size=96))
    return spread(build_tiny_model(cfg, tok, seed=0))


def llama(tok):  # no q/k/v bias, explicit head_dim, linear-scaled RoPE
    from transformers import LlamaConfig, LlamaForCausalLM

    return spread(LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=128, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=None,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})))


def mistral(tok, sliding_window=None):
    from transformers import MistralConfig, MistralForCausalLM

    return spread(MistralForCausalLM(MistralConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=None, sliding_window=sliding_window)))


ARCHS = {"qwen2": qwen2, "llama": llama, "mistral": mistral}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def model(request, tok):
    return ARCHS[request.param](tok).eval()


def both(model, tok, **kw):
    """generate() with each engine from the same RNG state."""
    out = {}
    for engine in ("hf", "native"):
        torch.manual_seed(1)
        out[engine] = generate(model, tok, PROMPTS, engine=engine, **kw)
    return out["hf"], out["native"]


def assert_same(a, b):
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.attention_mask, b.attention_mask)
    assert torch.equal(a.response_mask, b.response_mask)
    assert a.responses == b.responses
    assert torch.equal(a.truncated, b.truncated)
    torch.testing.assert_close(a.log_probs, b.log_probs, rtol=0, atol=1e-5)


def test_greedy_matches_hf_generate(model, tok):
    hf, native = both(model, tok, n=2, max_new_tokens=12, do_sample=False)
    assert hf.attention_mask[:, 0].eq(0).any()  # some prompts really are left-padded
    assert_same(hf, native)


def test_sampling_distribution_is_generates():
    # generate's own warpers (temperature, then top-k, then top-p) give the distribution filtered_probs gives.
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    scores[0, :10] = scores[0, 10]  # ties at the k-th score
    for t, k, p in [(0.7, 20, 0.9), (1.0, 0, 0.5), (1.3, 5, 1.0), (1.0, 0, 1.0)]:
        warpers = LogitsProcessorList(([TemperatureLogitsWarper(t)] if t != 1.0 else [])
                                      + ([TopKLogitsWarper(k)] if k else []) + ([TopPLogitsWarper(p)] if p < 1 else []))
        ref = warpers(None, scores.clone()).softmax(-1)
        torch.testing.assert_close(filtered_probs(scores, temperature=t, top_k=k, top_p=p), ref, rtol=0, atol=1e-7)


def test_draw_follows_the_distribution(monkeypatch):
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0], [0.1, 0.1, 0.1, 0.1, 0.6]])
    torch.manual_seed(0)
    n = 20000
    draws = torch.stack([draw(probs) for _ in range(n)])  # [n, 3]
    for row in range(3):
        freq = torch.bincount(draws[:, row], minlength=5).double() / n
        # within 5 standard errors of each probability; a probability-0 token never drawn
        se = (probs[row].double() * (1 - probs[row].double()) / n).sqrt()
        assert ((freq - probs[row]).abs() <= 5 * se + 1e-12).all(), (row, freq)
    # The largest u lands below the total: never on a trailing 0-weight token.
    top = torch.tensor([[0.75, 2.25, 0.0]])  # weights need not sum to 1 (as for multinomial)
    with monkeypatch.context() as m:
        m.setattr(torch, "rand", lambda *a, **k: torch.full((1, 1), 1 - 2 ** -53, dtype=torch.float64))
        assert draw(top).item() == 1
    # Per-prompt generators: a block's draws depend only on its own generator.
    g = [torch.Generator().manual_seed(s) for s in (1, 2)]
    a = draw(probs[[2, 2, 2, 2]], g)
    b = draw(probs[[2, 2]], [torch.Generator().manual_seed(2)])
    assert torch.equal(a[2:], b)


def test_sampling_reproducible_and_generate_shaped(model, tok):
    # Sampling differs from generate's draws (inversion, not multinomial) but not in what it returns.
    hf, native = both(model, tok, n=3, max_new_tokens=10, do_sample=True, temperature=0.7, top_p=0.9, top_k=20)
    assert hf.input_ids.shape == native.input_ids.shape
    torch.testing.assert_close(hf.input_ids[:, :-10], native.input_ids[:, :-10], rtol=0, atol=0)  # same prompts
    _, again = both(model, tok, n=3, max_new_tokens=10, do_sample=True, temperature=0.7, top_p=0.9, top_k=20)
    assert_same(native, again)


def test_step_logits_match_full_forward(model, tok):
    ids, att = encode_prompts(tok, PROMPTS, 64)
    steps = []
    tokens, _ = decode(model, ids, att, n=2, max_new_tokens=10, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, do_sample=True, on_logits=lambda t, x: steps.append(x.clone()))
    full_ids = torch.cat([ids.repeat_interleave(2, 0), tokens], 1)
    is_eos = tokens == tok.eos_token_id
    alive = (is_eos.long().cumsum(-1) - is_eos.long()) == 0  # up to and including the first EOS
    full_att = torch.cat([att.repeat_interleave(2, 0), alive.long()], 1)
    with torch.no_grad():
        ref = model(input_ids=full_ids, attention_mask=full_att, position_ids=position_ids_from_mask(full_att)).logits
    P = ids.shape[1]
    for t, logits in enumerate(steps):
        rows = alive[:, t]
        torch.testing.assert_close(logits[rows], ref[rows, P - 1 + t], rtol=0, atol=1e-5)


def test_top_k_1_is_greedy(tok):
    m = qwen2(tok).eval()
    greedy = generate(m, tok, PROMPTS, n=2, max_new_tokens=10, do_sample=False, engine="native")
    torch.manual_seed(3)
    top1 = generate(m, tok, PROMPTS, n=2, max_new_tokens=10, do_sample=True, temperature=0.7, top_k=1,
                    engine="native")
    assert torch.equal(greedy.input_ids, top1.input_ids)


def test_eos_pads_rows_and_stops(tok):
    m = qwen2(tok).eval()
    ids, att = encode_prompts(tok, PROMPTS, 64)
    kw = dict(n=1, max_new_tokens=10, pad_token_id=tok.pad_token_id, do_sample=False)
    free, _ = decode(m, ids, att, eos_token_id=-1, **kw)  # an EOS that never comes
    rows = free.tolist()

    def emitted_by(t: int) -> int:
        return sum(t in row for row in rows)

    # a token that some greedy rows emit mid-way and others never (the most such rows), chosen from the outputs:
    # which one depends on the random weights, and so on the vocabulary's size
    eos = max(sorted({t for row in rows for t in row[1:] if emitted_by(t) < len(rows)}),
              key=lambda t: (emitted_by(t), -min(row.index(t) for row in rows if t in row)))
    first = [row.index(eos) if eos in row else None for row in rows]
    assert None in first and any(j is not None and j > 0 for j in first)
    tokens, lp = decode(m, ids, att, eos_token_id=eos, **kw)
    assert tokens.shape[1] == 10
    for i, j in enumerate(first):
        stop = 10 if j is None else j + 1
        assert torch.equal(tokens[i, :stop], free[i, :stop])
        assert (tokens[i, stop:] == tok.pad_token_id).all() and (lp[i, stop:] == 0).all()
        assert (lp[i, :stop] <= 0).all() and lp[i, :stop].sum() < 0
    # Once every row has emitted EOS, decoding stops.
    ended = [i for i, j in enumerate(first) if j is not None]
    tokens, _ = decode(m, ids[ended], att[ended], eos_token_id=eos, **kw)
    assert tokens.shape[1] == max(first[i] for i in ended) + 1

    # Through generate(): the masks end at the first EOS, with either engine.
    t2 = copy.deepcopy(tok)
    t2.eos_token = tok.convert_ids_to_tokens(eos)
    hf, native = both(m, t2, n=1, max_new_tokens=10, do_sample=False)
    assert_same(hf, native)
    resp = native.input_ids[:, ids.shape[1]:]
    rm = native.response_mask[:, ids.shape[1]:]
    for i, j in enumerate(first):
        n_valid = 10 if j is None else j + 1
        assert rm[i].sum() == n_valid == native.response_lengths[i] and rm[i, :n_valid].all()
        assert bool(native.truncated[i]) == (j is None)
        assert (resp[i, n_valid:] == tok.pad_token_id).all()
    assert (native.log_probs[native.response_mask == 0] == 0).all()


@pytest.mark.parametrize("engine", ["hf", "native"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_log_probs_equal_recompute(model, tok, engine, temperature):
    # verl's old log-prob: raw logits / T at the sampled token (not the top-k / top-p processed scores).
    torch.manual_seed(0)
    g = generate(model, tok, PROMPTS, n=3, max_new_tokens=8, do_sample=True, temperature=temperature, top_p=0.8,
                 top_k=10, engine=engine)
    lp, _ = compute_log_probs(model, g.input_ids, g.attention_mask, g.response_mask, temperature=temperature,
                              micro_batch_size=5)
    torch.testing.assert_close(g.log_probs, lp, rtol=0, atol=1e-5)
    assert (g.log_probs[g.response_mask == 0] == 0).all() and g.log_probs.sum() < 0


def test_auto_engine_falls_back_to_hf(tok):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=64,
                                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)).eval()
    assert "model_type 'gpt2'" in unsupported_reason(gpt2)
    assert resolve_engine(gpt2, "auto") == "hf"
    with pytest.raises(UserError, match="rollout.engine=native"):
        generate(gpt2, tok, PROMPTS, n=1, max_new_tokens=4, do_sample=False, engine="native")
    auto = generate(gpt2, tok, PROMPTS, n=1, max_new_tokens=4, do_sample=False, engine="auto")
    hf = generate(gpt2, tok, PROMPTS, n=1, max_new_tokens=4, do_sample=False, engine="hf")
    assert torch.equal(auto.input_ids, hf.input_ids)

    # Supported architectures with an option decode() lacks fall back too.
    assert resolve_engine(mistral(tok, sliding_window=4), "auto", max_len=20) == "hf"
    assert resolve_engine(mistral(tok, sliding_window=64), "auto", max_len=20) == "native"
    q = qwen2(tok)
    assert resolve_engine(q, "auto") == "native"
    q.generation_config.repetition_penalty = 1.1
    assert resolve_engine(q, "auto") == "hf"


def test_trainer_takes_old_log_probs_from_the_rollout(tiny):
    from rlgrad.recipes import make_trainer

    tr = make_trainer(load_config(overrides=tiny + ["rollout.temperature=0.8", "rollout.top_p=0.9"]),
                      log=lambda *a: None)
    assert tr.cfg.rollout.engine == "auto" and not tr.cfg.rollout.recompute_log_probs
    examples = tr.task.train_examples(3, tr.data_rng)
    batch, _ = tr.rollout(examples, n=4, do_sample=True)
    expect, _ = compute_log_probs(tr.actor, batch.input_ids, batch.attention_mask, batch.response_mask,
                                  temperature=0.8, micro_batch_size=64)
    torch.testing.assert_close(batch.old_log_probs, expect, rtol=0, atol=1e-5)
    kept = batch.select([2, 5, 11])
    assert torch.equal(kept.old_log_probs, batch.old_log_probs[[2, 5, 11]])
    metrics = {}
    prepared = tr.prepare(kept, metrics)
    assert torch.equal(prepared.old_log_probs, batch.old_log_probs[[2, 5, 11]])  # reused, not recomputed
    assert "timing_s/old_log_prob" in metrics

    tr.cfg.rollout.recompute_log_probs = True
    again = tr.prepare(batch.select([2, 5, 11]), {})
    torch.testing.assert_close(again.old_log_probs, expect[[2, 5, 11]], rtol=0, atol=1e-6)
