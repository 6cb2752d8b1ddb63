"""Multi-turn episodes (rlgrad.rl.episodes): the answer parser, the row layout (the model's tokens trained, the
environment's never), exact sampling log-probs, turn scores, windows, chat templates, and the bucket analysis on
episode batches against the reference engine and plain autograd."""

import random

import pytest
import torch

from rlgrad.algos.advantages import grpo_advantages
from rlgrad.algos.aggregation import Denominators
from rlgrad.algos.objective import LossSettings, actor_objective
from rlgrad.analysis import analyse_buckets
from rlgrad.config.agent import AgentConfig
from rlgrad.config.model import ModelConfig, TinyModelConfig
from rlgrad.envs import parse_answer
from rlgrad.errors import UserError
from rlgrad.models import build_char_tokenizer, build_tiny_model
from rlgrad.rl.episodes import Episode, EpisodeRunner, Turn, episode_metrics
from rlgrad.rl.rollout import compute_log_probs


class Corridor:
    """A user's own environment, as small as one gets: walk Right from 0 to ``length``; -0.1 a step, +1 at the end."""

    instruction = "Walk Right to the end."
    actions = ("Left", "Right")

    def __init__(self, length: int = 3):
        self.length, self.pos, self.steps = length, 0, 0

    def reset(self, seed: int) -> str:
        self.pos, self.steps = seed % 2, 0  # two starts, so seeds matter
        return self.render()

    def render(self) -> str:
        return "".join("P" if i == self.pos else "_" for i in range(self.length + 1))

    def step(self, action: str):
        old = self.pos
        self.pos = max(0, self.pos - 1) if action == "Left" else min(self.length, self.pos + 1)
        self.steps += 1
        done = self.pos == self.length
        return self.render(), -0.1 + (1.0 if done else 0.0), done, {
            "success": done, "action_is_valid": True, "action_is_effective": self.pos != old}


@pytest.fixture(scope="module")
def model_tok():
    tok = build_char_tokenizer()
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=48, max_position_embeddings=512))
    return build_tiny_model(cfg, tok, seed=3), tok


def runner(tok, chat=False, stop=None, **agent) -> EpisodeRunner:
    a = AgentConfig(**{"max_turn": 3, "enable_think": False, "max_actions_per_traj": 6, **agent})
    return EpisodeRunner(Corridor, a, tok, chat=chat, system_prompt=None, stop_ids=stop or [tok.eos_token_id],
                         weights={"env": 1.0, "format": 1.0}, max_context_length=400)


GEN = dict(max_new_tokens=12, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, engine="native")


# ----------------------------------------------------------------------------- reading an answer
@pytest.mark.parametrize("text, think, words, ok", [
    ("<answer>Right || Up</answer>", False, ["Right", "Up"], True),
    ("I think so. <answer> right ||UP </answer> trailing", False, ["Right", "Up"], True),  # extra text, case
    ("<answer>Right || Jump || Left</answer>", False, ["Right", "Left"], False),  # unknown word: dropped, penalised
    ("<answer>Right || Right || Right || Right</answer>", False, ["Right"] * 3, True),  # past the limit: dropped
    ("<answer></answer>", False, [], False),  # no word
    ("Right || Up", False, [], False),  # no answer block
    ("<answer>Right</answer>", True, [], False),  # thinking on: the think block is part of the format
    ("<think>go</think>\n<answer>Down</answer>", True, ["Down"], True),
])
def test_parse_answer(text, think, words, ok):
    a = parse_answer(text, ("Up", "Down", "Left", "Right"), enable_think=think, action_sep="||", max_actions=3)
    assert (a.actions, a.well_formed) == (words, ok)


def test_a_turn_plays_its_actions_until_done_and_charges_the_format_penalty(model_tok):
    _, tok = model_tok
    r = runner(tok, max_actions_per_traj=2)
    ep = Episode(Corridor(), 0, Corridor().reset(0))
    ep.env.reset(0)
    t = Turn("s", "o", response="<answer>Right || Jump || Right || Right</answer>")
    r.play(ep, t, turn=1)
    # two actions allowed per episode: Right, Right (Jump dropped and penalised); not at the end yet (pos 2 of 3)
    assert t.actions == ["Right", "Right"] and t.penalty == pytest.approx(-0.1)
    assert t.reward == pytest.approx(-0.2) and (t.words, t.valid, t.effective) == (4, 3, 2)
    assert ep.done and ep.end == "actions_spent" and not ep.success
    ep2 = Episode(Corridor(), 1, Corridor().reset(1))
    ep2.env.reset(1)  # starts at 1: two steps reach the end
    t2 = Turn("s", "o", response="<answer>Right || Right || Left</answer>")
    runner(tok).play(ep2, t2, turn=1)
    assert t2.actions == ["Right", "Right"] and ep2.success and ep2.end == "success"
    assert t2.reward == pytest.approx(-0.1 + 0.9) and t2.penalty == 0.0


# ----------------------------------------------------------------------------- rows
def test_rows_train_exactly_the_models_tokens_with_their_sampling_log_probs(model_tok):
    model, tok = model_tok
    r = runner(tok)
    torch.manual_seed(0)
    eps = r.run(model, [0, 0, 1, 1], GEN)
    batch, info = r.to_batch(eps, torch.tensor([0, 0, 1, 1]))
    assert max(len(ep.turns) for ep in eps) > 1  # the random model rarely finishes: several turns happened
    for i, ep in enumerate(eps):
        att = batch.attention_mask[i].bool()
        row, m = batch.input_ids[i][att], batch.response_mask[i][att]
        assert row[m.bool()].tolist() == [x for t in ep.turns for x in t.ids]  # the model's tokens, in order
        env_text = tok.decode(row[~m.bool()].tolist())
        for k, t in enumerate(ep.turns, 1):
            assert f"Turn {k}:\nState:\n{t.observation}\n" in env_text
        assert env_text.startswith(Corridor.instruction)
    # the row is the context every turn was sampled in: a fresh forward gives the sampling log-probs
    fresh, _ = compute_log_probs(model, batch.input_ids, batch.attention_mask, batch.response_mask,
                                 temperature=1.0, micro_batch_size=8)
    assert torch.allclose(fresh, batch.old_log_probs, atol=2e-5)
    # episodes of a group start from the group's seed
    assert [ep.observation != "" for ep in eps] and eps[0].turns[0].observation == eps[1].turns[0].observation
    assert eps[0].turns[0].observation != eps[2].turns[0].observation
    assert info["num_turns"].tolist() == [len(ep.turns) for ep in eps]


def test_scores_components_and_turn_scores(model_tok):
    _, tok = model_tok
    r = runner(tok, use_turn_scores=True)
    ep = Episode(Corridor(), 0, "P___")
    for k, (ids, reward, penalty) in enumerate([([5, 6], -0.2, 0.0), ([7], 0.0, -0.1), ([8, 9, 10], 0.8, 0.0)]):
        ep.turns.append(Turn(f"Turn {k + 1}:\n", "P___", ids=ids, log_probs=[-1.0] * len(ids), reward=reward,
                             penalty=penalty))
    batch, _ = r.to_batch([ep], torch.tensor([0]))
    assert batch.components["env"].item() == pytest.approx(0.6)
    assert batch.components["format"].item() == pytest.approx(-0.1)
    assert batch.scores.item() == pytest.approx(0.5)
    m = batch.response_mask[0].bool()
    assert batch.input_ids[0][m].tolist() == [5, 6, 7, 8, 9, 10]
    got = batch.token_rewards[0][m].tolist()
    assert got == pytest.approx([0.0, -0.2, -0.1, 0.0, 0.0, 0.8])  # each turn's reward on its last token
    assert float(batch.token_rewards[0][~m].abs().sum()) == 0.0


def test_a_window_shows_the_last_turns_and_leaves_the_old_log_probs_to_be_recomputed(model_tok):
    model, tok = model_tok
    for mode, k, shown in (("state", -1, 1), ("last_k", 2, 2), ("auto", 2, 2)):
        r = runner(tok, context_window_mode=mode, max_context_window=k)
        torch.manual_seed(1)
        eps = r.run(model, [0, 1], GEN)
        batch, _ = r.to_batch(eps, torch.tensor([0, 0]))
        assert batch.old_log_probs is None
        for i, ep in enumerate(eps):
            row = batch.input_ids[i][batch.attention_mask[i].bool()]
            m = batch.response_mask[i][batch.attention_mask[i].bool()].bool()
            kept = ep.turns[-shown:]
            assert row[m].tolist() == [x for t in kept for x in t.ids]
            text = tok.decode(row[~m].tolist())
            assert text.startswith(Corridor.instruction) and text.count("Turn ") == len(kept)


def test_a_context_that_would_not_fit_ends_the_episode(model_tok):
    model, tok = model_tok
    r = runner(tok, max_turn=5)
    first = len(r.ids(r.format.opening(Corridor.instruction, "Turn 1:\nState:\nP___\nYou have 6 actions left.\n",
                                       r.tag)))
    r.max_context = first + 12  # room for the first turn only (a turn adds up to 12 tokens and its state)
    torch.manual_seed(0)
    eps = r.run(model, [0, 0, 0], GEN)
    assert [len(ep.turns) for ep in eps if ep.end == "context_full"] == [1, 1, 1]
    r.max_context = first - 1
    with pytest.raises(UserError, match="data.max_prompt_length"):
        r.run(model, [0], GEN)


# ----------------------------------------------------------------------------- chat templates
def test_with_a_chat_template_the_row_is_the_templates_own_conversation():
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tiny = TinyModelConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                           intermediate_size=48)
    model = build_tiny_model(ModelConfig(tiny=tiny), tok, seed=0)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    r = runner(tok, chat=True, stop=[tok.eos_token_id, end])
    torch.manual_seed(2)
    sampled = r.run(model, [0, 1], dict(GEN, max_new_tokens=6))
    # and by hand, every way a turn can end: the template's end of turn, EOS, cut at the length limit
    made = Episode(Corridor(), 0, "P___")
    for k, tail in enumerate(([end], [tok.eos_token_id], [])):
        ids = tok("Right</answer>", add_special_tokens=False)["input_ids"] + tail
        made.turns.append(Turn(f"Turn {k + 1}:\nState:\nP___\nYou have 6 actions left.\n", "P___", ids=ids,
                               log_probs=[0.0] * len(ids), reward=-0.1, cut=not tail))
    eps = sampled + [made, Episode(Corridor(), 0, "P___", turns=made.turns[:2])]
    batch, _ = r.to_batch(eps, torch.tensor([0, 0, 1, 1]))
    for i, ep in enumerate(eps):
        row = batch.input_ids[i][batch.attention_mask[i].bool()].tolist()
        messages = []
        for k, t in enumerate(ep.turns):
            before = "" if k == 0 else f"Reward:\n{round(ep.turns[k - 1].reward + ep.turns[k - 1].penalty, 4):g}\n"
            messages.append({"role": "user", "content": (Corridor.instruction + "\n" if k == 0 else "") + before
                             + t.shown})
            body = tok.decode(t.ids, skip_special_tokens=False)
            messages.append({"role": "assistant", "content": "<answer>" + body.removesuffix("<|im_end|>")})
        expect = tok.apply_chat_template(messages, tokenize=False)
        text = tok.decode(row, skip_special_tokens=False)
        # the template closes the last turn with "<|im_end|>\n"; the row ends where the model stopped
        closing = "\n" if ep.turns[-1].ids[-1] == end else "<|im_end|>\n"
        assert text + closing == expect


# ----------------------------------------------------------------------------- the instruments on episodes
def episode_batch(model, tok, seed=0):
    r = runner(tok)
    torch.manual_seed(seed)
    eps = r.run(model, [0] * 4 + [1] * 4 + [2] * 4, GEN)
    b, _ = r.to_batch(eps, torch.arange(3).repeat_interleave(4))
    b.scores = b.scores + torch.linspace(0, 1, len(b))  # spread, so every group carries a task gradient
    b.advantages = grpo_advantages(b.scores, b.group_ids, norm_by_std=True)[:, None] * b.response_mask
    b.ref_log_probs = b.old_log_probs + 0.05 * torch.randn_like(b.old_log_probs) * b.response_mask
    return b


def test_bucket_analysis_on_episodes_equals_the_reference_engine_and_plain_autograd(model_tok):
    model, tok = model_tok
    b = episode_batch(model, tok)
    s = LossSettings(loss_agg_mode="token-mean", use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, horizon=12)
    fast = analyse_buckets(model, b, s, num_buckets=2, method="fast")
    ref = analyse_buckets(model, b, s, num_buckets=2, method="reference")
    params = list(model.parameters())
    for name in fast.buckets.names:
        for comp in ("task", "entropy", "kl"):
            assert ref.metrics[f"grad_norm/{name}/{comp}"] == pytest.approx(fast.metrics[f"grad_norm/{name}/{comp}"],
                                                                             rel=1e-4, abs=1e-9)
    # plain autograd of the policy loss over the model's tokens only (ratio 1 at the sampling policy)
    m = b.response_mask.bool()
    sub = b
    terms = actor_objective(model, sub, s, Denominators.of(sub))
    g_loss = torch.autograd.grad(terms.task, params, allow_unused=True)
    out = model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                position_ids=(b.attention_mask.cumsum(-1) - 1).clamp(min=0)).logits[:, :-1].float()
    lp = torch.log_softmax(out, -1).gather(-1, b.input_ids[:, 1:, None])[..., 0]
    plain = -(b.advantages[:, 1:] * lp)[m[:, 1:]].sum() / m.sum()
    g_plain = torch.autograd.grad(plain, params, allow_unused=True)
    for a, c in zip(g_loss, g_plain):
        if a is not None:
            assert torch.allclose(a, c, atol=1e-6, rtol=1e-4)
    assert fast.metrics["grad_norm/all/task"] == pytest.approx(
        float(torch.sqrt(sum((g.double() ** 2).sum() for g in g_plain if g is not None))), rel=1e-4)


def test_environment_tokens_receive_no_gradient(model_tok):
    model, tok = model_tok
    b = episode_batch(model, tok, seed=3)
    s = LossSettings(loss_agg_mode="token-mean", entropy_coeff=0.01, horizon=12)
    params = list(model.parameters())
    base = torch.autograd.grad(actor_objective(model, b, s, Denominators.of(b)).total(s), params, allow_unused=True)
    # whatever the environment's positions hold (advantages, old log-probs), the gradient does not change
    noisy = b.select(torch.arange(len(b)))
    env = (noisy.attention_mask.bool() & ~noisy.response_mask.bool()).float()
    noisy.advantages = noisy.advantages + 5.0 * env * torch.randn_like(env)
    noisy.old_log_probs = noisy.old_log_probs - 3.0 * env
    again = torch.autograd.grad(actor_objective(model, noisy, s, Denominators.of(noisy)).total(s), params,
                                allow_unused=True)
    for a, c in zip(base, again):
        if a is not None:
            assert torch.equal(a, c)
    # and a token of the environment moved to the model's side does change it (the check can fail)
    flipped = b.select(torch.arange(len(b)))
    col = int(torch.nonzero(env[0])[-1])
    flipped.response_mask[0, col] = 1.0
    flipped.advantages[0, col] = 1.0
    moved = torch.autograd.grad(actor_objective(model, flipped, s, Denominators.of(flipped)).total(s), params,
                                allow_unused=True)
    assert any(not torch.equal(a, c) for a, c in zip(base, moved) if a is not None)


def test_episode_metrics():
    counts = {"success": torch.tensor([1.0, 0.0, 0.0, 1.0]), "num_turns": torch.tensor([1.0, 3.0, 2.0, 2.0]),
              "num_actions": torch.tensor([2.0, 6.0, 0.0, 4.0]), "words": torch.tensor([2.0, 8.0, 1.0, 4.0]),
              "valid_words": torch.tensor([2.0, 6.0, 0.0, 4.0]), "effective": torch.tensor([2.0, 3.0, 0.0, 4.0]),
              "episode_reward": torch.tensor([0.8, -0.9, -0.3, 0.7])}
    m = episode_metrics(counts, "train")
    assert m["env/success"] == 0.5 and m["env/num_turns"] == 2.0 and m["env/num_actions"] == 3.0
    assert m["env/action_is_valid"] == pytest.approx(12 / 15) and m["env/action_is_effective"] == pytest.approx(9 / 12)
    assert m["env/episode_reward"] == pytest.approx(0.075)
    assert set(episode_metrics(counts, "val")) == {"val/" + k for k in m}
    none = {k: torch.zeros(2) for k in counts}
    assert "env/action_is_valid" not in episode_metrics(none, "train")  # undefined, not 0
    random.seed(0)
