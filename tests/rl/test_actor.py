"""The actor update: micro-batch accumulation, loss terms, non-finite steps, rollout alignment."""

import copy

import pytest
import torch

from rlgrad.algos.aggregation import Denominators
from rlgrad.algos.objective import LossSettings, actor_objective
from rlgrad.batch import Batch, position_ids_from_mask
from rlgrad.config.algorithm import OptimConfig
from rlgrad.config.model import ModelConfig, TinyModelConfig
from rlgrad.errors import UserError
from rlgrad.models import build_char_tokenizer, build_tiny_model
from rlgrad.rl.actor import build_optimizer, update_actor, update_size
from rlgrad.rl.rollout import compute_log_probs, generate
from tests.helpers import batches


@pytest.fixture(scope="module")
def model_and_tok():
    tok = build_char_tokenizer()
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=64))
    torch.manual_seed(0)
    return build_tiny_model(cfg, tok, seed=0), tok


def make_batch(model, tok, n_prompts=3, n=4, seed=0) -> Batch:
    return batches.make_batch(model, tok, n_prompts=n_prompts, n=n, seed=seed, zero_group=False, old_noise=0.05)


def test_rollout_alignment(model_and_tok):
    model, tok = model_and_tok
    gen = generate(model, tok, ["1+2=", "13+45="], n=2, max_new_tokens=6, do_sample=False)
    logits = model(input_ids=gen.input_ids, attention_mask=gen.attention_mask,
                   position_ids=position_ids_from_mask(gen.attention_mask)).logits
    rm = gen.response_mask.bool()
    # Greedy: every response token is the argmax of the logits one position earlier.
    assert torch.equal(logits.argmax(-1)[:, :-1][rm[:, 1:]], gen.input_ids[:, 1:][rm[:, 1:]])
    assert not rm[:, 0].any()
    # Response mask = attention over the response part; nothing after the first EOS.
    eos = tok.eos_token_id
    for row, m in zip(gen.input_ids, rm):
        toks = row[m].tolist()
        assert eos not in toks[:-1]
        assert len(toks) == 6 or toks[-1] == eos
    # Prompt tokens are left-padded: the first prompt (shorter) starts with padding.
    assert gen.attention_mask[0, 0] == 0 and gen.input_ids[0, 0] == tok.pad_token_id
    assert gen.responses[0] == tok.decode(gen.input_ids[0][rm[0]], skip_special_tokens=True)


def test_log_probs_match_manual(model_and_tok):
    model, tok = model_and_tok
    b = make_batch(model, tok)
    lp, ent = compute_log_probs(model, b.input_ids, b.attention_mask, b.response_mask, temperature=0.7,
                                micro_batch_size=5, with_entropy=True)
    with torch.no_grad():
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                       position_ids=position_ids_from_mask(b.attention_mask)).logits / 0.7
    logsm = torch.log_softmax(logits, -1)
    i, t = torch.nonzero(b.response_mask, as_tuple=True)
    expect = logsm[i, t - 1, b.input_ids[i, t]]
    torch.testing.assert_close(lp[i, t], expect, rtol=1e-5, atol=1e-5)
    p = logsm.exp()
    torch.testing.assert_close(ent[i, t], -(p * logsm).sum(-1)[i, t - 1], rtol=1e-5, atol=1e-5)
    assert (lp[b.response_mask == 0] == 0).all()


def _grads_after(model, batch, settings, micro, mini):
    captured = {}

    def on_grads(m, mb):
        captured.update({n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None})

    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=0.0)
    update_actor(m, opt, batch, settings, ppo_epochs=1, mini_batch_size=mini, micro_batch_size=micro,
                 max_grad_norm=1e9, shuffle=False, seed=0, on_grads=on_grads)
    return captured


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("kind", ["ppo", "cispo", "gspo"])
def test_micro_batches_equal_full_batch_gradient(model_and_tok, mode, kind):
    model, tok = model_and_tok
    b = make_batch(model, tok)
    s = LossSettings(policy_loss=kind, loss_agg_mode=mode, horizon=5, use_kl_loss=True, kl_loss_coef=0.1,
                     entropy_coeff=0.01, clip_ratio_low=0.02, clip_ratio_high=0.02)
    full = _grads_after(model, b, s, micro=len(b), mini=len(b))
    split = _grads_after(model, b, s, micro=5, mini=len(b))  # 12 samples -> micro-batches of 5, 5, 2
    # Independent oracle: plain autograd on the whole batch's total loss.
    m = copy.deepcopy(model)
    actor_objective(m, b, s, Denominators.of(b)).total(s).backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(full[n], p.grad, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(split[n], p.grad, rtol=1e-4, atol=1e-7)


def test_loss_terms_compose(model_and_tok):
    model, tok = model_and_tok
    b = make_batch(model, tok)
    s = LossSettings(use_kl_loss=True, kl_loss_coef=0.5, entropy_coeff=0.2, kl_loss_type="k1")
    terms = actor_objective(model, b, s, Denominators.of(b))
    assert torch.isclose(terms.total(s), terms.task - 0.2 * terms.entropy + 0.5 * terms.kl)
    # k1 KL with token-mean is the masked mean of (logp - ref).
    lp, _ = compute_log_probs(model, b.input_ids, b.attention_mask, b.response_mask, temperature=1.0,
                              micro_batch_size=64)
    expect = ((lp - b.ref_log_probs) * b.response_mask).sum() / b.response_mask.sum()
    assert torch.isclose(terms.kl, expect, rtol=1e-5, atol=1e-6)


def test_nonfinite_gradient_skips_step(model_and_tok):
    model, tok = model_and_tok
    b = make_batch(model, tok)
    b.advantages = b.advantages.clone()
    b.advantages[0, b.response_mask[0].bool()] = float("nan")
    m = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    out = update_actor(m, opt, b, LossSettings(), ppo_epochs=1, mini_batch_size=len(b), micro_batch_size=4,
                       max_grad_norm=1.0, shuffle=True, seed=0)
    assert out["actor/nonfinite_grad_steps"] == 1.0
    for n, p in m.named_parameters():
        assert torch.equal(p, before[n])


def test_update_moves_weights_and_reports(model_and_tok):
    model, tok = model_and_tok
    b = make_batch(model, tok)
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    out = update_actor(m, opt, b, LossSettings(), ppo_epochs=2, mini_batch_size=4, micro_batch_size=2,
                       max_grad_norm=1.0, shuffle=True, seed=0)
    assert out["actor/grad_norm"] > 0 and out["actor/lr"] == 1e-3
    assert opt.state[next(iter(m.parameters()))]["step"] == 6  # 2 epochs x 3 mini-batches
    assert any(not torch.equal(p, q) for p, q in zip(m.parameters(), model.parameters()))


def test_update_size_is_the_weight_change_relative_to_the_weights():
    """actor/update_ratio = ‖θ_after − θ_before‖ / ‖θ_before‖, in total and per layer group, by hand; a frozen
    parameter is not counted, and the update itself is whatever ran inside."""
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.embed_tokens = torch.nn.Embedding(2, 2)
    model.model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 1, bias=False)])
    model.model.norm = torch.nn.LayerNorm(2, elementwise_affine=False)  # no parameters
    frozen = torch.nn.Linear(1, 1, bias=False)
    model.model.layers.append(frozen)
    frozen.requires_grad_(False)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.tensor([[3.0, 0.0], [0.0, 4.0]]))  # norm 5
        model.model.layers[0].weight.copy_(torch.tensor([[0.0, 2.0]]))  # norm 2
        frozen.weight.fill_(7.0)
    metrics: dict[str, float] = {}
    with update_size(model, metrics):
        with torch.no_grad():
            model.model.embed_tokens.weight[0, 0] += 0.3  # |Δ| 0.3 on a norm of 5
            model.model.layers[0].weight[0, 1] -= 0.4  # |Δ| 0.4 on a norm of 2
    assert metrics["actor/update_ratio/embed"] == pytest.approx(0.3 / 5)
    assert metrics["actor/update_ratio/layer_0"] == pytest.approx(0.4 / 2)
    assert metrics["actor/update_ratio"] == pytest.approx(0.5 / 29 ** 0.5)  # sqrt(0.09 + 0.16) / sqrt(25 + 4)
    assert "actor/update_ratio/layer_1" not in metrics  # frozen
    assert set(metrics) == {"actor/update_ratio", "actor/update_ratio/embed", "actor/update_ratio/layer_0"}


def test_float16_parameters_are_refused_before_an_update_turns_them_nan():
    """Pure float16 AdamW (no fp32 master weights): the update is NaN where a second moment underflows; rlgrad
    says so and names the setting instead of failing to sample a step later. bfloat16 trains."""
    model = torch.nn.Linear(4, 4)
    grad = torch.full((4, 4), 1e-4)  # g² = 1e-8 underflows to 0 in float16: the second moment stays 0
    half = copy.deepcopy(model).half()
    opt = torch.optim.AdamW(half.parameters(), lr=1e-3, eps=1e-8)  # what the check prevents, done by hand
    half.weight.grad, half.bias.grad = grad.half(), torch.zeros(4, dtype=torch.float16)
    opt.step()
    assert not torch.isfinite(half.weight).all()
    with pytest.raises(UserError, match="model.dtype=float16.*bfloat16"):
        build_optimizer(copy.deepcopy(model).half(), OptimConfig())
    build_optimizer(copy.deepcopy(model).bfloat16(), OptimConfig())
