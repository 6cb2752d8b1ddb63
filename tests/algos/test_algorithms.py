"""GSPO, token-sum, the straight-through KL estimators, REINFORCE++(-baseline), the KL in the reward, DAPO's
overlong shaping and dynamic sampling: hand-computed values and plain-autograd oracles
(``tests/integrations/test_verl.py`` compares them with verl's own functions)."""

from __future__ import annotations

import math

import pytest
import torch

from rlgrad.algos.advantages import (
    compute_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
)
from rlgrad.algos.aggregation import agg_loss, agg_token_weights, denominator
from rlgrad.algos.component_advantages import component_advantages
from rlgrad.algos.kl import kl_penalty
from rlgrad.algos.surrogates import policy_loss
from rlgrad.batch import Batch
from rlgrad.rl.shaping import (
    KLController,
    dynamic_sampling,
    filter_metric,
    groups_with_signal,
    kl_in_reward,
    overlong_penalty,
)

CLIP = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, horizon=4)


def grads(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.autograd.grad(loss, x, retain_graph=True)[0]


# ---- aggregation ------------------------------------------------------------------------------

def test_token_sum_is_the_plain_masked_sum_and_has_no_denominator():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, float("nan")]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    assert float(agg_loss(loss, mask, "token-sum", horizon=3)) == 2 + 3 + 4 + 5
    omega, u = agg_token_weights(mask, "token-sum", horizon=3)
    assert torch.equal(omega, mask.float()) and torch.equal(u, torch.zeros(2))
    assert denominator(float(u.sum())) == 1.0 and denominator(7.0) == 7.0


# ---- KL -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("base", ["k1", "kl", "abs", "low_var_kl", "k3"])
def test_straight_through_kl_has_the_estimators_value_and_k2s_gradient(base):
    logp = torch.tensor([-1.0, -0.3, -2.5, -0.7], requires_grad=True)
    ref = torch.tensor([-1.4, -0.3, -1.0, -0.1])
    plus = kl_penalty(logp, ref, base + "+")
    assert torch.allclose(plus, kl_penalty(logp, ref, base))
    # k2 = ½ (logp − ref)²: its gradient is logp − ref, by hand
    assert torch.allclose(grads(plus.sum(), logp), (logp - ref).detach())
    assert not torch.allclose(grads(kl_penalty(logp, ref, base).sum(), logp), (logp - ref).detach())


def test_every_kl_type_with_plus_is_accepted_as_verl_accepts_it():
    from rlgrad.config.algorithm import KL_TYPES

    plain = [k for k in KL_TYPES if not k.endswith("+")]
    assert sorted(k for k in KL_TYPES if k.endswith("+")) == sorted(k + "+" for k in plain)
    logp, ref = torch.tensor([-1.0, -2.0], requires_grad=True), torch.tensor([-1.5, -1.0])
    k2plus = kl_penalty(logp, ref, "k2+")  # k2's value and k2's gradient: k2 itself
    assert torch.allclose(k2plus, kl_penalty(logp, ref, "k2"))
    assert torch.allclose(grads(k2plus.sum(), logp), (logp - ref).detach())


# ---- GSPO -----------------------------------------------------------------------------------------

def gspo_sequence_loss(logp, old, adv, mask, low, high):
    """The GSPO paper's objective written at sequence level (an independent formulation): per response
    s_i = exp(mean_t (logp − old)), loss_i = max(−A_i s_i, −A_i clip(s_i)), mean over responses."""
    n = mask.sum(-1)
    s = torch.exp(((logp - old) * mask).sum(-1) / n)
    a = adv[:, 1]
    return torch.maximum(-a * s, -a * s.clamp(1 - low, 1 + high)).mean()


def test_gspo_value_and_gradient_equal_the_sequence_level_objective():
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 0, 0], [0, 1, 1, 1, 1], [0, 1, 0, 0, 0]], dtype=torch.float32)
    old = -torch.rand(4, 5, generator=g) * 2
    # sequence ratios inside the clip, above it and below it
    logp = (old + torch.tensor([[0.0, 0.05, -0.02, 0.04, 0.0], [0, 0.6, 0.5, 0, 0], [0, -0.5, -0.4, -0.6, -0.3],
                                [0, 0.1, 0, 0, 0]])).requires_grad_(True)
    adv = torch.tensor([1.5, 0.7, -0.9, -1.2])[:, None].expand(4, 5) * mask
    out = policy_loss(logp, old, adv, mask, kind="gspo", agg_mode="seq-mean-token-mean", **CLIP)
    ref = gspo_sequence_loss(logp, old, adv, mask, 0.2, 0.28)
    assert torch.allclose(out.loss, ref, atol=1e-6)
    assert torch.allclose(grads(out.loss, logp), grads(ref, logp), atol=1e-6)
    # the clip is decided per sequence: row 1 (A > 0, s = e^0.55 > 1.28) and row 2 (A < 0, s < 0.8) are clipped
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1)).detach()
    assert float(s[1]) > 1.28 and float(s[2]) < 0.8
    assert torch.allclose(out.clipfrac, torch.tensor((2 + 4) / 10))
    assert float(out.clipfrac_lower) == 0.0


def test_gspo_unit_loss_gives_each_advantages_gradient_under_the_updates_clip():
    g = torch.Generator().manual_seed(1)
    mask = (torch.rand(6, 7, generator=g) < 0.8).float()
    mask[:, 0] = 0
    old = -torch.rand(6, 7, generator=g) * 2
    logp = (old + 0.4 * torch.randn(6, 7, generator=g)).requires_grad_(True)
    adv = torch.randn(6, generator=g)[:, None].expand(6, 7) * mask
    out = policy_loss(logp, old, adv, mask, kind="gspo", agg_mode="token-mean", **CLIP)
    want = grads((out.loss_mat * mask).sum(), logp)
    got = grads((adv * out.unit_loss_mat * mask).sum(), logp)
    assert torch.allclose(want, got, atol=1e-6)


# ---- REINFORCE++ ----------------------------------------------------------------------------------

def test_reinforce_plus_plus_returns_by_hand_and_whitened_over_the_batch():
    # row 0: response at columns 1-3 with a masked gap at 2 (an environment turn); row 1: columns 1-2
    mask = torch.tensor([[0, 1, 0, 1], [0, 1, 1, 0]], dtype=torch.float32)
    rewards = torch.tensor([[0, 0.5, 0, 2.0], [0, 0, 1.0, 0]])
    adv, ret = reinforce_plus_plus_advantages(rewards, mask, gamma=0.5)
    # G at col 3 = 2; col 2 is masked (carries G); col 1 = 0.5 + 0.5 * 2 = 1.5. Row 1: col 2 = 1, col 1 = 0.5.
    assert torch.allclose(ret, torch.tensor([[0, 1.5, 0, 2.0], [0, 0.5, 1.0, 0]]))
    vals = torch.tensor([1.5, 2.0, 0.5, 1.0])
    mu, sd = vals.mean(), vals.std()  # Bessel, as verl's masked_whiten
    want = torch.zeros(2, 4)
    want[mask.bool()] = (torch.tensor([1.5, 2.0, 0.5, 1.0]) - mu) / torch.sqrt(sd ** 2 + 1e-8)
    assert torch.allclose(adv, want, atol=1e-6)


def test_reinforce_plus_plus_baseline_by_hand():
    mask = torch.tensor([[0, 1, 1], [0, 1, 0], [0, 1, 1], [0, 1, 1]], dtype=torch.float32)
    scores = torch.tensor([1.0, 0.0, 3.0, 5.0])
    groups = torch.tensor([0, 0, 1, 7])  # groups 1 and 7 are singletons: mean 0
    adv = reinforce_plus_plus_baseline_advantages(scores, groups, mask)
    centred = torch.tensor([0.5, -0.5, 3.0, 5.0])
    tok = centred.repeat_interleave(mask.sum(-1).long())  # 0.5, 0.5, -0.5, 3, 3, 5, 5
    z = (tok - tok.mean()) / torch.sqrt(tok.var() + 1e-8)
    want = torch.zeros(4, 3)
    want[mask.bool()] = z
    assert torch.allclose(adv, want, atol=1e-6)
    # the trainer's dispatch: outcome estimators baseline the summed token rewards
    tr = torch.zeros(4, 3)
    tr[:, 1] = scores
    a2, ret = compute_advantages("reinforce_plus_plus_baseline", torch.zeros(4), groups, mask, token_rewards=tr)
    assert ret is None and torch.allclose(a2, adv)


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo", "rloo"])
def test_component_split_sums_to_the_trainers_advantage(estimator):
    g = torch.Generator().manual_seed(3)
    n = 12
    mask = (torch.rand(n, 6, generator=g) < 0.7).float()
    mask[:, 1] = 1
    mask[:, 0] = 0
    comps = {"correctness": (torch.rand(n, generator=g) < 0.5).float(), "format": torch.rand(n, generator=g)}
    w = {"correctness": 0.7, "format": 0.3}
    scores = w["correctness"] * comps["correctness"] + w["format"] * comps["format"]
    groups = torch.arange(n) // 4
    adv, _ = compute_advantages(estimator, scores, groups, mask)
    split = component_advantages(comps, w, scores, groups, mode="shared_std", estimator=estimator, norm_by_std=True,
                                 response_mask=mask)
    total = sum(split.values())
    assert torch.allclose(total[:, None] * mask, adv, atol=1e-5)
    assert not torch.allclose(split["format"], torch.zeros(n))


# ---- the KL in the reward and its controller --------------------------------------------------------------

def test_kl_in_reward_subtracts_beta_kl_per_token():
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.float32)
    old = torch.tensor([[0, -1.0, -2.0], [0, -0.5, 0]])
    ref = torch.tensor([[0, -1.5, -1.0], [0, -0.5, 0]])
    rewards, kl = kl_in_reward(torch.tensor([1.0, 0.0]), None, old, ref, mask, "kl", beta=0.1)
    # k1 = old − ref: 0.5, −1.0 | 0; the score sits on the last response token
    assert torch.allclose(rewards, torch.tensor([[0, -0.05, 1.0 + 0.1], [0, 0.0, 0]]))
    assert torch.allclose(kl, torch.tensor([-0.25, 0.0]))


def test_adaptive_controller_by_hand_and_fixed_stays():
    c = KLController("adaptive", 0.2, target_kl=0.1, horizon=100)
    c.update(0.5, n_steps=10)  # error clipped to 0.2: beta * (1 + 0.2 * 10/100)
    assert math.isclose(c.value, 0.2 * 1.02)
    c.update(0.09, n_steps=50)  # error −0.1
    assert math.isclose(c.value, 0.2 * 1.02 * (1 - 0.1 * 0.5))
    f = KLController("fixed", 0.2)
    f.update(5.0, 1000)
    assert f.value == 0.2
    c2 = KLController("adaptive", 1.0)
    c2.load_state_dict(c.state_dict())
    assert c2.value == c.value


# ---- DAPO -----------------------------------------------------------------------------------------------

def test_overlong_penalty_by_hand():
    lengths = torch.tensor([10, 12, 14, 16])
    # budget 16, buffer 4: no penalty up to 12 tokens, then −(len − 12)/4 · 0.5
    assert torch.allclose(overlong_penalty(lengths, 16, 4, 0.5), torch.tensor([0.0, 0.0, -0.25, -0.5]))


def test_groups_with_signal():
    groups = torch.tensor([0, 0, 1, 1, 2])
    values = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0])
    assert groups_with_signal(groups, values).tolist() == [False, False, True, True, True]


def batch_of(groups: list[int], scores: list[float], width: int, start: int) -> Batch:
    n = len(groups)
    ids = torch.arange(n * width).reshape(n, width) + 1
    att = torch.ones(n, width, dtype=torch.long)
    att[:, 0] = 0
    resp = torch.zeros(n, width)
    resp[:, start:] = 1
    return Batch(
        input_ids=ids, attention_mask=att, response_mask=resp, group_ids=torch.tensor(groups),
        scores=torch.tensor(scores), reward_std=torch.zeros(n), components={"c": torch.tensor(scores)},
        old_log_probs=resp * -1.0)


def test_filter_metrics_are_verls():
    """acc: correctness; score: the reward function's score (before DAPO's overlong penalty); seq_reward and
    seq_final_reward: with it. A group whose scores tie but whose penalties differ has a seq_reward signal only."""
    b = batch_of([0, 0, 1, 1], [1.0, 0.5, 1.0, 1.0], 4, 2)
    b.components = {"correctness": torch.tensor([1.0, 1.0, 1.0, 1.0]), "overlong": torch.tensor([0.0, -0.5, 0.0, 0.0])}
    info = {"correct": torch.tensor([1.0, 1.0, 1.0, 0.0])}
    assert filter_metric(b, info, "acc").tolist() == [1.0, 1.0, 1.0, 0.0]
    assert filter_metric(b, info, "score").tolist() == [1.0, 1.0, 1.0, 1.0]
    assert filter_metric(b, info, "seq_reward").tolist() == filter_metric(b, info, "seq_final_reward").tolist() == [
        1.0, 0.5, 1.0, 1.0]
    assert groups_with_signal(b.group_ids, filter_metric(b, info, "seq_reward")).tolist() == [True, True, False, False]
    assert groups_with_signal(b.group_ids, filter_metric(b, info, "score")).tolist() == [False] * 4
    from rlgrad.config.load import load_config
    from rlgrad.errors import UserError

    with pytest.raises(UserError, match="seq_final_reward with algorithm.use_kl_in_reward"):
        load_config(overrides=["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_final_reward",
                               "algorithm.use_kl_in_reward=true"])
    assert load_config(overrides=["algorithm.filter_groups.metric=seq_reward"]).algorithm.filter_groups.metric == (
        "seq_reward")


def test_batch_cat_aligns_the_first_response_column():
    a, b = batch_of([0, 0], [1.0, 0.0], 5, 3), batch_of([1], [2.0], 4, 1)
    c = Batch.cat([a, b])
    assert c.input_ids.shape == (3, 3 + 3) and c.response_start() == 3
    assert torch.equal(c.input_ids[:2, :5], a.input_ids) and torch.equal(c.input_ids[2, 2:], b.input_ids[0])
    assert c.attention_mask[2, :2].sum() == 0 and c.response_mask[2, 3:].tolist() == [1, 1, 1]
    assert c.group_ids.tolist() == [0, 0, 1] and c.components["c"].tolist() == [1.0, 0.0, 2.0]
    assert c.advantages is None and torch.equal(c.old_log_probs[2, 3:], b.old_log_probs[0, 1:])


def test_dynamic_sampling_rounds_until_enough_groups_carry_a_signal():
    rounds = [  # (group ids, correctness): round 0 has one group with a signal, round 1 two more
        ([0, 0, 1, 1], [1, 1, 0, 1]),
        ([2, 2, 3, 3], [0, 1, 1, 0]),
        ([4, 4, 5, 5], [0, 1, 0, 1]),
    ]
    calls = []

    def sample(r):
        calls.append(r)
        gids, acc = rounds[r]
        b = batch_of(gids, [float(x) for x in acc], 4 + r, 2)
        return b, {"correct": torch.tensor(acc, dtype=torch.float32), "responses": [f"r{r}"] * 4}

    m = {}
    batch, info, chosen = dynamic_sampling(sample, 2, 5, "acc", m)
    assert calls == [0, 1] and m["train/num_gen_batches"] == 2 and m["train/num_gen_samples"] == 8
    assert m["train/num_signal_groups"] == 3
    assert batch.group_ids[chosen].tolist() == [1, 1, 2, 2]  # the first two groups with a signal
    assert info["responses"] == ["r0"] * 4 + ["r1"] * 4 and len(info["correct"]) == 8
    # a bound that runs out: the step goes on with what was found
    calls.clear()
    batch, _, chosen = dynamic_sampling(sample, 5, 3, "acc", m)
    assert calls == [0, 1, 2] and m["train/num_signal_groups"] == 5
    assert sorted(set(batch.group_ids[chosen].tolist())) == [1, 2, 3, 4, 5]
