"""rlgrad.core against values worked out by hand (written out below, not re-derived in code)."""

import math

import pytest
import torch

from rlgrad.algos.advantages import broadcast_to_tokens, group_reward_std, group_stats, grpo_advantages, rloo_advantages
from rlgrad.algos.aggregation import agg_loss, masked_mean, masked_sum
from rlgrad.algos.kl import kl_penalty
from rlgrad.algos.logprobs import entropy_from_logits, logprobs_from_logits
from rlgrad.algos.surrogates import policy_loss

AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def close(a, b, tol=1e-6):
    return torch.allclose(
        torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol
    )


# --- masked reductions ---------------------------------------------------------------------------


def test_masked_sum_and_mean():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 0, 1], [0, 0, 0]])
    assert masked_sum(x, m).item() == 4.0
    assert masked_mean(x, m).item() == 2.0
    assert masked_sum(x, m, dim=-1).tolist() == [4.0, 0.0]
    assert masked_mean(x, m, dim=-1).tolist() == [2.0, 0.0]  # empty row -> 0, not nan
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0


def test_masked_sum_ignores_garbage_outside_mask():
    x = torch.tensor([[1.0, float("nan"), float("inf")]])
    m = torch.tensor([[1.0, 0.0, 0.0]])
    assert masked_sum(x, m).item() == 1.0
    assert masked_mean(x, m).item() == 1.0


# --- agg_loss ------------------------------------------------------------------------------------

# row sums 5 (2 tokens), 21 (3 tokens), 0 (0 tokens); total 26 over 5 tokens, 3 rows
LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]])
MASK = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", 26 / 5),
        ("seq-mean-token-sum", 26 / 3),
        ("seq-mean-token-mean", (5 / 2 + 21 / 3 + 0 / 1) / 3),
        ("seq-mean-token-sum-norm", 26 / (3 * 4)),
    ],
)
def test_agg_loss_by_hand(mode, expected):
    assert close(agg_loss(LOSS, MASK, mode, horizon=4), expected)


def test_agg_loss_explicit_denominators():
    assert close(agg_loss(LOSS, MASK, "token-mean", horizon=4, num_tokens=10), 2.6)
    assert close(agg_loss(LOSS, MASK, "seq-mean-token-sum", horizon=4, num_seqs=2), 13.0)
    assert close(agg_loss(LOSS, MASK, "seq-mean-token-mean", horizon=4, num_seqs=torch.tensor(2.0)), 9.5 / 2)
    # Dr. GRPO divides by the response budget, not the tensor width (which includes the prompt)
    assert close(agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", horizon=13, num_seqs=2), 1.0)


def test_agg_loss_all_masked_is_zero_and_unknown_raises():
    zero = torch.zeros_like(MASK)
    for mode in AGG_MODES:
        assert agg_loss(LOSS, zero, mode, horizon=4).item() == 0.0
    with pytest.raises(ValueError, match="seq-sum"):
        agg_loss(LOSS, MASK, "seq-sum", horizon=4)


def _micro_batch_setup():
    g = torch.Generator().manual_seed(0)
    n, width = 7, 6
    log_probs = -torch.rand(n, width, generator=g) * 2
    old = log_probs + 0.3 * torch.randn(n, width, generator=g)
    adv = torch.randn(n, width, generator=g)
    lengths = torch.tensor([3, 5, 1, 0, 4, 2, 5])  # ragged, one empty row
    cols = torch.arange(width)
    mask = ((cols >= 1) & (cols < 1 + lengths[:, None])).float()
    return log_probs, old, adv, mask


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batches_with_global_denominators_sum_to_full_batch(mode):
    log_probs, old, adv, mask = _micro_batch_setup()
    kw = dict(
        kind="ppo", clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, agg_mode=mode, horizon=8
    )

    lp_full = log_probs.clone().requires_grad_()
    full = policy_loss(lp_full, old, adv, mask, **kw).loss
    full.backward()

    lp_micro = log_probs.clone().requires_grad_()
    total = torch.zeros(())
    num_tokens, num_seqs = mask.sum(), mask.shape[0]
    for rows in (torch.tensor([0, 1, 2]), torch.tensor([3, 4]), torch.tensor([5, 6])):
        out = policy_loss(
            lp_micro[rows], old[rows], adv[rows], mask[rows], num_tokens=num_tokens, num_seqs=num_seqs, **kw
        )
        out.loss.backward()
        total = total + out.loss.detach()

    assert torch.allclose(total, full.detach(), atol=1e-6)
    assert torch.allclose(lp_micro.grad, lp_full.grad, atol=1e-7)
    assert lp_full.grad.abs().sum() > 0


def test_micro_batches_without_global_denominators_differ():
    # The property above is not vacuous: local token-mean denominators give a different loss.
    log_probs, old, adv, mask = _micro_batch_setup()
    loss_mat = -adv * log_probs
    full = agg_loss(loss_mat, mask, "token-mean", horizon=8)
    local = sum(agg_loss(loss_mat[r], mask[r], "token-mean", horizon=8) for r in ([0, 1, 2], [3, 4], [5, 6]))
    assert not torch.allclose(local, full)


# --- group statistics and outcome advantages -----------------------------------------------------

# group 7: {1, 2, 6} mean 3, deviations -2,-1,3 -> Σd² = 14, unbiased var 7, std √7
# group 2: {3, 3, 3} mean 3, std 0;   group 5: {4} singleton
IDS = torch.tensor([7, 2, 7, 2, 7, 2, 5])
SCORES = torch.tensor([1.0, 3.0, 2.0, 3.0, 6.0, 3.0, 4.0])
S7 = math.sqrt(7.0)


def test_group_stats_by_hand():
    mean, std, size = group_stats(SCORES, IDS)
    assert mean.tolist() == [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 4.0]
    assert close(std, [S7, 0, S7, 0, S7, 0, 0])
    assert size.tolist() == [3, 3, 3, 3, 3, 3, 1]
    assert close(group_reward_std(SCORES, IDS), [S7, 0, S7, 0, S7, 0, 0])


def test_grpo_without_std_norm():
    adv = grpo_advantages(SCORES, IDS, norm_by_std=False)
    # singleton: verl uses mean 0, so A = score
    assert adv.tolist() == [-2.0, 0.0, -1.0, 0.0, 3.0, 0.0, 4.0]


def test_grpo_with_std_norm():
    adv = grpo_advantages(SCORES, IDS, norm_by_std=True, eps=1e-6)
    d = S7 + 1e-6
    # zero-variance group: 0 / (0 + eps) = 0; singleton: std 1 -> 4 / (1 + eps)
    assert close(adv, [-2 / d, 0, -1 / d, 0, 3 / d, 0, 4 / (1 + 1e-6)])
    assert adv[[1, 3, 5]].tolist() == [0.0, 0.0, 0.0]


def test_grpo_zero_variance_group_is_exactly_zero():
    # 0.1 is not representable; a naive Σs/n mean can be off by an ulp
    for value in (0.1, 0.7, 1 / 3, 123.456):
        scores = torch.full((5,), value)
        ids = torch.zeros(5, dtype=torch.long)
        for norm in (True, False):
            assert torch.equal(grpo_advantages(scores, ids, norm_by_std=norm), torch.zeros(5))
        assert torch.equal(rloo_advantages(scores, ids), torch.zeros(5))
        assert torch.equal(group_reward_std(scores, ids), torch.zeros(5))


def test_rloo_by_hand():
    # group 7: 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5; group 2: 0; singleton: A = score
    assert rloo_advantages(SCORES, IDS).tolist() == [-3.0, 0.0, -1.5, 0.0, 4.5, 0.0, 4.0]


def test_broadcast_to_tokens():
    mask = torch.tensor([[0, 1, 1], [0, 0, 1]])
    assert broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask).tolist() == [[0, 2, 2], [0, 0, -1]]


# --- KL ------------------------------------------------------------------------------------------

LOGP = torch.tensor([-1.0, -2.0])
REF = torch.tensor([-1.5, -1.0])  # logp - ref = [0.5, -1.0]; ref - logp = [-0.5, 1.0]
K3 = [math.exp(-0.5) + 0.5 - 1, math.e - 1 - 1]  # 0.1065306597, 0.7182818285


@pytest.mark.parametrize(
    "kind,expected",
    [
        ("kl", [0.5, -1.0]),
        ("k1", [0.5, -1.0]),
        ("abs", [0.5, 1.0]),
        ("mse", [0.125, 0.5]),
        ("k2", [0.125, 0.5]),
        ("low_var_kl", K3),
        ("low-var-kl", K3),
        ("k3", K3),
    ],
)
def test_kl_penalty_by_hand(kind, expected):
    assert close(kl_penalty(LOGP, REF, kind), expected)


def test_low_var_kl_clamps_to_ten_with_finite_gradient():
    logp = torch.tensor([-30.0, 0.0, -0.1], requires_grad=True)
    ref = torch.tensor([0.0, -30.0, -0.1])
    kl = kl_penalty(logp, ref, "low-var-kl")
    # exp(30) - 30 - 1 and exp(-30) + 30 - 1 both exceed 10; equal log-probs give 0
    assert kl.tolist() == [10.0, 10.0, 0.0]
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_kl_penalty_unknown_raises():
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(LOGP, REF, "k4")


# --- logits ---------------------------------------------------------------------------------------


def test_entropy_from_logits():
    # p = [1, 2, 3] / 6: H = -(1/6 ln 1/6 + 2/6 ln 2/6 + 3/6 ln 3/6) = 1.0114042647
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0]])) + 5.0  # shift must not matter
    assert close(entropy_from_logits(logits), [1.0114042647073518])
    x = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(1)) * 3
    p = torch.softmax(x, -1)
    assert torch.allclose(entropy_from_logits(x), -(p * p.log()).sum(-1), atol=1e-5)


def test_logprobs_from_logits():
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0]]))
    assert close(logprobs_from_logits(logits, torch.tensor([2])), [math.log(0.5)])
    x = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(2)) * 3
    y = torch.randint(0, 11, (2, 3), generator=torch.Generator().manual_seed(3))
    ref = torch.log_softmax(x, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(logprobs_from_logits(x, y), ref, atol=1e-6)
    low = logprobs_from_logits(x.bfloat16(), y)  # upcast path
    assert low.dtype == torch.float32 and low.shape == y.shape
    assert torch.allclose(low, ref, atol=0.1)


# --- policy losses --------------------------------------------------------------------------------

PPO = dict(
    kind="ppo", clip_ratio_low=0.2, clip_ratio_high=0.3, clip_ratio_c=3.0, agg_mode="token-mean", horizon=4
)


def _ppo(ratio, adv):
    logp = torch.log(torch.tensor(ratio)).requires_grad_()
    out = policy_loss(logp, torch.zeros(len(ratio)), torch.tensor(adv), torch.ones(len(ratio)), **PPO)
    return out, logp


def test_ppo_inside_clip():
    out, _ = _ppo([1.1], [2.0])  # pg1 = pg2 = -2.2
    assert close(out.loss, -2.2) and out.clipfrac.item() == 0 and out.clipfrac_lower.item() == 0


def test_ppo_clipped_high_positive_advantage():
    out, _ = _ppo([1.5], [1.0])  # pg1 = -1.5, pg2 = -1.3 -> max = -1.3
    assert close(out.loss, -1.3) and out.clipfrac.item() == 1 and out.clipfrac_lower.item() == 0


def test_ppo_clipped_low_negative_advantage():
    out, _ = _ppo([0.5], [-1.0])  # pg1 = 0.5, pg2 = 0.8 -> 0.8; dual bound 3 not active
    assert close(out.loss, 0.8) and out.clipfrac.item() == 1 and out.clipfrac_lower.item() == 0


def test_ppo_dual_clip():
    out, _ = _ppo([5.0], [-1.0])  # pg1 = 5, pg2 = 1.3 -> 5; pg3 = 3 -> min(5, 3) = 3
    assert close(out.loss, 3.0) and out.clipfrac.item() == 0 and out.clipfrac_lower.item() == 1


def test_ppo_mixed_batch_values_metrics_and_gradient():
    out, logp = _ppo([1.1, 1.5, 0.5, 5.0], [2.0, 1.0, -1.0, -1.0])
    assert close(out.loss, (-2.2 - 1.3 + 0.8 + 3.0) / 4)
    assert close(out.clipfrac, 0.5) and close(out.clipfrac_lower, 0.25)
    assert close(out.ppo_kl, -(math.log(1.1) + math.log(1.5) + math.log(0.5) + math.log(5.0)) / 4)
    assert not out.clipfrac.requires_grad and not out.ppo_kl.requires_grad
    out.loss.backward()
    # d/dlogp(-A r) = -A r on the unclipped token; clipped and dual-clipped tokens are constant
    assert close(logp.grad, [-2.0 * 1.1 / 4, 0, 0, 0])


def test_cispo_value_and_gradient():
    # ratio 1.1 (A=2, logp=-0.5), ratio 2.0 -> weight 1.3 (A=1, logp=-1), ratio 0.5 (A=-1, logp=-2),
    # plus one masked token
    logp = torch.tensor([-0.5, -1.0, -2.0, -0.7], requires_grad=True)
    old = logp.detach() - torch.log(torch.tensor([1.1, 2.0, 0.5, 9.0]))
    adv = torch.tensor([2.0, 1.0, -1.0, 5.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    kw = dict(PPO, kind="cispo")
    out = policy_loss(logp, old, adv, mask, **kw)
    # -w A logp: -1.1*2*(-0.5) = 1.1, -1.3*1*(-1) = 1.3, -0.5*(-1)*(-2) = -1.0
    assert close(out.loss, (1.1 + 1.3 - 1.0) / 3)
    assert close(out.clipfrac, 1 / 3) and out.clipfrac_lower.item() == 0
    out.loss.backward()
    # gradient is -clip(r) A / num_tokens; the stop-gradient weight contributes nothing
    assert close(logp.grad, [-1.1 * 2 / 3, -1.3 / 3, 0.5 / 3, 0.0])


def test_policy_loss_unknown_kind_raises():
    with pytest.raises(ValueError, match="unknown policy loss kind .sapo"):
        policy_loss(torch.zeros(1), torch.zeros(1), torch.ones(1), torch.ones(1), **dict(PPO, kind="sapo"))
