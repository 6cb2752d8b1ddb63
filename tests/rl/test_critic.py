"""PPO with a critic: GAE and the value loss by hand, the value model, the critic update, trainer runs."""

import copy

import pytest
import torch
from safetensors.torch import load_file

from rlgrad.algos.advantages import explained_variance, gae_advantages, masked_whiten, outcome_token_rewards
from rlgrad.algos.aggregation import agg_loss
from rlgrad.algos.logprobs import forward_values
from rlgrad.algos.objective import CriticSettings
from rlgrad.algos.surrogates import value_loss
from rlgrad.batch import Batch, position_ids_from_mask
from rlgrad.config.load import load_config
from rlgrad.config.model import ModelConfig, TinyModelConfig
from rlgrad.errors import UserError
from rlgrad.hooks import Hook
from rlgrad.models import build_char_tokenizer, build_tiny_model, load_value_model
from rlgrad.recipes import make_trainer
from rlgrad.rl.critic import compute_values, update_critic
from rlgrad.rl.rollout import generate
from rlgrad.runfiles import read_jsonl
from tests.conftest import run_cli

QUIET = dict(log=lambda *a: None)

# --- GAE by hand ---------------------------------------------------------------------------------

# Two rows over [prompt, prompt, r, r, r]: row 0 has 3 response tokens (columns 2-4), row 1 has 2
# (columns 2-3; column 4 is padding holding a garbage value that must not leak).
MASK = torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0, 0.0]])
VALUES = torch.tensor([[7.0, 7.0, 0.5, 0.2, -0.1], [7.0, 7.0, 0.3, 0.4, 9.0]])
SCORES = torch.tensor([1.0, -1.0])


def test_outcome_reward_sits_on_the_last_response_token():
    r = outcome_token_rewards(SCORES, MASK)
    assert r.tolist() == [[0, 0, 0, 0, 1.0], [0, 0, 0, -1.0, 0]]
    empty = outcome_token_rewards(torch.tensor([3.0]), torch.zeros(1, 4))
    assert empty.tolist() == [[0, 0, 0, 0]]


def test_gae_by_hand():
    # gamma 0.9, lam 0.8 (gamma*lam = 0.72); delta_t = r_t + 0.9 V_{t+1} - V_t, A_t = delta_t + 0.72 A_{t+1}
    # row 0: t4: d = 1 + 0 + 0.1 = 1.1,          A = 1.1
    #        t3: d = 0.9*(-0.1) - 0.2 = -0.29,   A = -0.29 + 0.72*1.1   = 0.502
    #        t2: d = 0.9*0.2 - 0.5 = -0.32,      A = -0.32 + 0.72*0.502 = 0.04144
    # row 1: t3: d = -1 + 0 - 0.4 = -1.4,         A = -1.4
    #        t2: d = 0.9*0.4 - 0.3 = 0.06,        A = 0.06 + 0.72*(-1.4) = -0.948
    # returns R = A + V (before whitening)
    adv, ret = gae_advantages(outcome_token_rewards(SCORES, MASK), VALUES, MASK, gamma=0.9, lam=0.8)
    raw = torch.tensor([0.04144, 0.502, 1.1, -0.948, -1.4], dtype=torch.float64)
    torch.testing.assert_close(ret[MASK.bool()].double(), torch.tensor([0.54144, 0.702, 1.0, -0.648, -1.0],
                                                                         dtype=torch.float64), atol=1e-6, rtol=0)
    # whitened over the 5 response tokens with the unbiased variance (verl's masked_whiten)
    white = (raw - raw.mean()) / torch.sqrt(raw.var(unbiased=True) + 1e-8)
    torch.testing.assert_close(adv[MASK.bool()].double(), white, atol=1e-6, rtol=0)
    assert (adv[MASK == 0] == 0).all() and (ret[MASK == 0] == 0).all()


def test_gae_with_gamma_lam_one_is_return_minus_value():
    adv, ret = gae_advantages(outcome_token_rewards(SCORES, MASK), VALUES, MASK, gamma=1.0, lam=1.0)
    # Monte-Carlo: every token's return is its sequence's score.
    torch.testing.assert_close(ret, torch.tensor([[0, 0, 1.0, 1.0, 1.0], [0, 0, -1.0, -1.0, 0]]), atol=1e-6, rtol=0)
    raw = torch.tensor([0.5, 0.8, 1.1, -1.3, -1.4])  # score - V
    torch.testing.assert_close(adv[MASK.bool()], (raw - raw.mean()) / raw.std(), atol=1e-5, rtol=0)


def test_masked_whiten_single_token_and_explained_variance():
    assert masked_whiten(torch.tensor([[3.0, 5.0]]), torch.tensor([[0.0, 1.0]])).tolist() == [[0.0, 0.0]]
    r = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert float(explained_variance(r, r, m)) == pytest.approx(1.0, abs=1e-4)
    # V = 0: Var[R - V] = Var[R] -> 1 - 1/(1 + 1e-5)
    assert float(explained_variance(r, torch.zeros_like(r), m)) == pytest.approx(1e-5, abs=1e-6)


# --- value loss by hand --------------------------------------------------------------------------


def test_value_clipping_by_hand():
    # c = 0.2, V_old = 0.5 -> V clipped into [0.3, 0.7]
    # t0: V 1.0 R 2: (1-2)^2 = 1, (0.7-2)^2 = 1.69 -> 1.69 (clipped term wins), loss 0.845
    # t1: V 0.0 R 0: 0, (0.3-0)^2 = 0.09 -> 0.09 (clipped wins), loss 0.045
    # t2: V 2.0 R 0: 4, 0.49 -> 4 (unclipped), loss 2.0
    # t3: V 0.6 R 1: inside the range, both 0.16 -> 0.08, not counted as clipped
    # t4: masked out (garbage)
    v = torch.tensor([[1.0, 0.0, 2.0, 0.6, 50.0]], requires_grad=True)
    old = torch.full((1, 5), 0.5)
    ret = torch.tensor([[2.0, 0.0, 0.0, 1.0, -50.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    out = value_loss(v, old, ret, m, cliprange_value=0.2, agg_mode="token-mean", horizon=5)
    assert float(out.loss.detach()) == pytest.approx((0.845 + 0.045 + 2.0 + 0.08) / 4, abs=1e-6)
    assert float(out.clipfrac) == pytest.approx(0.5)
    out.loss.backward()
    # d/dV: clipped tokens have no gradient (the clip saturates); t2: (V-R)/4 = 0.5; t3: (0.6-1)/4 = -0.1
    torch.testing.assert_close(v.grad, torch.tensor([[0.0, 0.0, 0.5, -0.1, 0.0]]), atol=1e-6, rtol=0)
    out = value_loss(v.detach(), old, ret, m, cliprange_value=0.2, agg_mode="seq-mean-token-sum", horizon=5)
    assert float(out.loss) == pytest.approx(0.845 + 0.045 + 2.0 + 0.08, abs=1e-6)


# --- the value model -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A saved tiny causal LM (the "actor checkpoint") and its tokenizer."""
    tok = build_char_tokenizer()
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=64))
    model = build_tiny_model(cfg, tok, seed=0)
    d = tmp_path_factory.mktemp("tiny_lm")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, model, tok


def test_value_model_from_a_causal_lm(tiny_dir, tmp_path):
    d, lm, tok = tiny_dir
    rng = torch.get_rng_state()
    critic = load_value_model(d)
    assert torch.equal(rng, torch.get_rng_state())  # loading draws nothing from the run's RNG stream
    base, cb = lm.state_dict(), critic.state_dict()
    shared = [k for k in cb if not k.startswith("score.")]
    assert shared and all(torch.equal(cb[k], base[k]) for k in shared)  # every base weight is the actor's
    assert set(cb) - set(shared) == {"score.weight", "score.bias"}
    assert critic.score.weight.shape == (1, 32) and not critic.score.weight.any() and not critic.score.bias.any()
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    att = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    assert critic(input_ids=ids, attention_mask=att).logits.shape == (2, 4, 1)
    # A saved critic keeps its (trained) head.
    with torch.no_grad():
        critic.score.weight.fill_(0.25)
        critic.score.bias.fill_(-1.0)
    critic.save_pretrained(tmp_path / "critic")
    again = load_value_model(tmp_path / "critic")
    assert torch.equal(again.score.weight, critic.score.weight) and torch.equal(again.score.bias, critic.score.bias)
    # Column t holds the head's output at position t - 1 (the state that generates token t).
    with torch.no_grad():
        out = critic(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att)).logits[..., 0]
        v = forward_values(critic, ids, att)
    assert v[:, 0].eq(0).all() and torch.equal(v[:, 1:], out[:, :-1])


def test_value_model_bad_path_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="critic.model.path"):
        load_value_model(tmp_path / "nope")


def _critic_batch(critic, lm, tok, seed=0):
    torch.manual_seed(seed)
    gen = generate(lm, tok, ["1+2=", "13+4=", "7*8="], n=4, max_new_tokens=5, do_sample=True)
    g = torch.arange(3).repeat_interleave(4)
    scores = torch.rand(len(g))
    b = Batch(
        input_ids=gen.input_ids, attention_mask=gen.attention_mask, response_mask=gen.response_mask, group_ids=g,
        scores=scores, reward_std=torch.zeros(len(g)))
    # Old values off the current ones (so some tokens clip) and returns from GAE.
    b.values = ((compute_values(critic, b, micro_batch_size=64) + 0.3 * torch.randn(b.response_mask.shape))
                * b.response_mask)
    b.advantages, b.returns = gae_advantages(outcome_token_rewards(scores, b.response_mask), b.values,
                                             b.response_mask, gamma=0.95, lam=0.9)
    return b


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_critic_micro_batches_equal_full_batch_gradient(tiny_dir, mode):
    d, lm, tok = tiny_dir
    critic = load_value_model(d)
    with torch.no_grad():  # a non-zero head, so the base model gets gradient too
        critic.score.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    b = _critic_batch(critic, lm, tok)
    s = CriticSettings(cliprange_value=0.1, loss_agg_mode=mode, horizon=5)

    def grads(micro):
        got = {}
        m = copy.deepcopy(critic)
        opt = torch.optim.AdamW(m.parameters(), lr=0.0)
        out = update_critic(m, opt, b, s, ppo_epochs=1, mini_batch_size=len(b), micro_batch_size=micro,
                            max_grad_norm=1e9, shuffle=False, seed=0,
                            on_grads=lambda model, mini: got.update(
                                {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
        return got, out

    split, out = grads(5)  # 12 samples -> micro-batches of 5, 5, 2
    # Oracle: plain autograd on the whole batch, the loss written out without the update loop.
    m = copy.deepcopy(critic)
    logits = m(input_ids=b.input_ids, attention_mask=b.attention_mask,
               position_ids=position_ids_from_mask(b.attention_mask)).logits[..., 0]
    v = torch.cat([torch.zeros_like(logits[:, :1]), logits[:, :-1]], 1)
    v_clip = torch.clamp(v, b.values - 0.1, b.values + 0.1)
    per_token = 0.5 * torch.maximum((v - b.returns) ** 2, (v_clip - b.returns) ** 2)
    loss = agg_loss(per_token, b.response_mask, mode, horizon=5)
    loss.backward()
    assert out["critic/vf_loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    clipped = ((v_clip - b.returns) ** 2 > (v - b.returns) ** 2) & b.response_mask.bool()
    assert 0 < out["critic/vf_clipfrac"] == pytest.approx(float(clipped.sum() / b.response_mask.sum()), rel=1e-5)
    for n, p in m.named_parameters():
        assert p.grad is not None and n in split, n
        torch.testing.assert_close(split[n], p.grad, rtol=1e-4, atol=1e-7)
    assert split["model.layers.0.mlp.up_proj.weight"].abs().sum() > 0


# --- trainer -------------------------------------------------------------------------------------

GAE = ["algorithm.adv_estimator=gae", "algorithm.gamma=0.95", "algorithm.lam=0.9", "critic.optim.lr=1e-2",
       "critic.ppo_micro_batch_size=5", "trainer.gradient_analysis_mode=false",
       # enough warm start that some responses earn the format reward: the critic gets a signal
       "model.warmstart_steps=100", "reward.weights={format: 1.0}"]


def _without_dir(tiny):
    return [o for o in tiny if not o.startswith("trainer.default_local_dir")] + GAE


def test_critic_starts_from_the_actor(tiny):
    t = make_trainer(load_config(overrides=tiny + GAE), **QUIET)
    actor, critic = t.actor.state_dict(), t.critic.state_dict()
    base = [k for k in critic if k.startswith("model.")]
    assert len(base) == len([k for k in actor if k.startswith("model.")])
    assert all(torch.equal(critic[k], actor[k]) for k in base)
    assert not critic["score.weight"].any()


def test_train_gae_cli_metrics_checkpoint_and_warmup(tiny, tmp_path):
    run = tmp_path / "run"
    res = run_cli(["train", *tiny, *GAE, "trainer.gradient_analysis_mode=true", "trainer.total_training_steps=3",
                   "trainer.save_freq=1", "trainer.critic_warmup=1"])
    assert res.returncode == 0, res.stderr[-2000:]
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows[1:]:
        d = r["data"]
        for k in ["critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm",
                  "critic/vf_explained_var", "critic/values/mean", "critic/values/max", "critic/values/min",
                  "critic/returns/mean", "critic/returns/max", "critic/returns/min", "critic/score/mean",
                  "critic/advantages/mean", "timing_s/values", "timing_s/update_critic"]:
            assert k in d, (r["step"], k)
    assert "grad_norm/all/task" in rows[1]["data"]  # the bucket analysis runs on a gae batch too
    assert rows[1]["data"]["critic/values/max"] == 0.0  # zero head: the first values are 0
    assert rows[1]["data"]["critic/grad_norm"] > 0 and rows[2]["data"]["critic/values/max"] != 0.0
    assert "actor/pg_loss" not in rows[1]["data"] and "actor/pg_loss" in rows[2]["data"]  # warm-up step 1
    from transformers import AutoModelForTokenClassification
    c3 = AutoModelForTokenClassification.from_pretrained(run / "global_step_3" / "critic")
    assert c3.score.weight.shape == (1, 32) and c3.score.weight.any()
    # During the warm-up the actor does not move; afterwards it does. The critic moves from step 1.
    a1, a2 = (load_file(run / f"global_step_{s}" / "actor" / "model.safetensors") for s in (1, 2))
    t0 = make_trainer(load_config(overrides=[o for o in tiny if not o.startswith("trainer.default_local_dir")] + GAE
                             + [f"trainer.default_local_dir={tmp_path / 'fresh'}"]), **QUIET)
    a0 = t0.actor.state_dict()
    assert all(torch.equal(a1[k], a0[k]) for k in a1)
    assert any(not torch.equal(a2[k], a1[k]) for k in a2)
    c0 = t0.critic.state_dict()
    c1 = load_file(run / "global_step_1" / "critic" / "model.safetensors")
    assert any(not torch.equal(c1[k], c0[k]) for k in c1)


class Order(Hook):
    def __init__(self):
        self.events = []

    def before_update(self, ctx):
        assert ctx.critic is not None and ctx.critic_optimizer is not None
        self.events.append((ctx.step, "before_update"))

    def on_grads(self, ctx, model, minibatch, role="actor"):
        assert model is (ctx.critic if role == "critic" else ctx.actor)
        self.events.append((ctx.step, role))


def test_gae_resume_is_bitwise_equal_to_uninterrupted(tiny, tmp_path):
    base = _without_dir(tiny) + ["trainer.save_freq=1", "trainer.critic_warmup=1", "critic.ppo_epochs=2",
                                 "critic.optim.lr_warmup_steps=3"]
    order = Order()
    make_trainer(load_config(overrides=base + ["trainer.total_training_steps=3",
                                               f"trainer.default_local_dir={tmp_path / 'a'}"]),
            hooks=[order], **QUIET).fit()
    # The critic (two epochs, one mini-batch each) updates before the hook point; the actor after it.
    assert order.events == [(1, "critic"), (1, "critic"), (1, "before_update"),
                            (2, "critic"), (2, "critic"), (2, "before_update"), (2, "actor"),
                            (3, "critic"), (3, "critic"), (3, "before_update"), (3, "actor")]
    b = base + [f"trainer.default_local_dir={tmp_path / 'b'}"]
    make_trainer(load_config(overrides=b + ["trainer.total_training_steps=2"]), **QUIET).fit()
    t = make_trainer(load_config(overrides=b + ["trainer.total_training_steps=3"]), **QUIET)
    assert t.step == 2 and t.critic_optimizer.state  # the critic's Adam moments came back
    t.fit()
    for role in ("actor", "critic"):
        x = load_file(tmp_path / "a" / "global_step_3" / role / "model.safetensors")
        y = load_file(tmp_path / "b" / "global_step_3" / role / "model.safetensors")
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), (role, k)
    ra, rb = read_jsonl(tmp_path / "a" / "metrics.jsonl"), read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in ra] == [r["step"] for r in rb] == [0, 1, 2, 3]
    for x, y in zip(ra, rb):
        for k, v in x["data"].items():
            if not k.startswith("timing_s/"):
                assert y["data"][k] == v, (x["step"], k)
    assert ra[3]["data"]["critic/lr"] == pytest.approx(1e-2)  # the critic's own warm-up schedule, resumed


def test_gae_resume_needs_a_critic_checkpoint(tiny, tmp_path):
    make_trainer(load_config(overrides=tiny + ["trainer.total_training_steps=1",
                                               "trainer.gradient_analysis_mode=false"]),
            **QUIET).fit()
    with pytest.raises(UserError, match="has no critic/"):
        make_trainer(load_config(overrides=tiny + GAE + ["trainer.total_training_steps=2"]), **QUIET)


def test_critic_keys_unused_without_gae_and_checked_with_it(tmp_path):
    bad = ["critic.model.path=/nonexistent/critic", "critic.ppo_mini_batch_size=3"]
    cfg = load_config(overrides=bad)  # grpo: the critic is not built, its path and batch split are not looked at
    assert cfg.critic.model.path == "/nonexistent/critic"
    with pytest.raises(UserError, match="critic.ppo_mini_batch_size"):
        load_config(overrides=bad + ["algorithm.adv_estimator=gae"])
    with pytest.raises(UserError, match="critic.model.path"):
        load_config(overrides=bad[:1] + ["algorithm.adv_estimator=gae"])
    with pytest.raises(UserError, match="critic.ppo_epochs"):  # a value no field accepts is refused always
        load_config(overrides=["critic.ppo_epochs=0"])
    with pytest.raises(UserError, match="critic.ppo_mini_batch_size"):
        load_config(overrides=["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=3"])
    cfg = load_config(overrides=["critic.ppo_micro_batch_size_per_gpu=2", "critic.grad_clip=0.5"])
    assert cfg.critic.ppo_micro_batch_size == 2 and cfg.critic.max_grad_norm == 0.5
    assert load_config(preset="ppo_critic").algorithm.adv_estimator == "gae"


def test_bad_critic_path_exits_2_with_one_line(tmp_path, capsys, monkeypatch):
    from rlgrad.cli import main

    monkeypatch.chdir(tmp_path)  # in process (cli.main); test_train_gae_cli_metrics_checkpoint_and_warmup launches it
    code = main(["train", f"trainer.default_local_dir={tmp_path / 'run'}", "algorithm.adv_estimator=gae",
                 "critic.model.path=/nonexistent/critic"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlgrad: error:") and "/nonexistent/critic" in lines[0]
    assert not (tmp_path / "run").exists()
