"""rlgrad.rl.filter: every strategy x filter type against hand-picked group stds."""

import math

import pytest
import torch

from rlgrad.rl.filter import group_metric, group_reward_std, rollout_filter


def make_groups(stds: dict[int, float], center: float = 5.0):
    """Each group id gets scores [c - d, c, c + d]: mean c, unbiased std exactly d."""
    ids, scores = [], []
    for gid, d in stds.items():
        ids += [gid] * 3
        scores += [center - d, center, center + d]
    return torch.tensor(ids), torch.tensor(scores)


# std per group; Σ = 7
#   largest ranking:  10(3) 40(2) 20(1) 50(1) 30(0)     (20 before 50: tie -> smaller id)
#   smallest ranking: 30(0) 20(1) 50(1) 40(2) 10(3)
STDS = {10: 3.0, 20: 1.0, 30: 0.0, 40: 2.0, 50: 1.0}
IDS, SCORES = make_groups(STDS)


def kept(**kw):
    return rollout_filter(IDS, SCORES, **kw).kept_groups


# --- group metrics ---------------------------------------------------------------------------------


def test_group_metric_by_hand():
    ids = torch.tensor([4, 9, 4, 9, 4, 1])  # non-contiguous, interleaved, one singleton
    scores = torch.tensor([2.0, 1.0, 5.0, 3.0, 8.0, 7.0])  # 4: {2,5,8}, 9: {1,3}, 1: {7}
    ent = torch.tensor([0.5, 1.0, 1.5, 2.0, 1.0, 4.0])  # 4: {.5,1.5,1}, 9: {1,2}, 1: {4}
    lengths = torch.tensor([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    gids, rv = group_metric("reward_variance", ids, scores)
    assert gids == [1, 4, 9]
    assert torch.allclose(rv, torch.tensor([0.0, 3.0, math.sqrt(2)], dtype=rv.dtype))  # singleton -> 0
    assert group_metric("reward", ids, scores)[1].tolist() == [7.0, 5.0, 2.0]
    assert group_metric("reward_sum", ids, scores)[1].tolist() == [7.0, 15.0, 4.0]
    assert group_metric("entropy", ids, scores, entropies=ent)[1].tolist() == [4.0, 1.0, 1.5]
    ev = group_metric("entropy_variance", ids, scores, entropies=ent)[1]
    assert torch.allclose(ev, torch.tensor([0.0, 0.5, math.sqrt(0.5)], dtype=ev.dtype))
    assert group_metric("length", ids, scores, lengths=lengths)[1].tolist() == [60.0, 30.0, 30.0]


def test_group_metric_missing_inputs_and_unknown_raise():
    with pytest.raises(ValueError, match="entropies"):
        group_metric("entropy", IDS, SCORES)
    with pytest.raises(ValueError, match="lengths"):
        group_metric("length", IDS, SCORES)
    with pytest.raises(ValueError, match="perplexity"):
        group_metric("perplexity", IDS, SCORES)


def test_group_reward_std_is_reexported():
    std = group_reward_std(torch.tensor([1.0, 3.0, 4.0]), torch.tensor([0, 0, 1]))
    assert torch.allclose(std, torch.tensor([math.sqrt(2), math.sqrt(2), 0.0]))


# --- top_k (value is a fraction of all groups: k = int(value * 5), at least 1) ----------------------


@pytest.mark.parametrize(
    "ftype,value,include_zero,expected",
    [
        ("largest", 0.4, True, [10, 40]),
        ("largest", 0.6, True, [10, 20, 40]),  # 20 beats 50 on the tie
        ("largest", 0.1, True, [10]),  # int(0.5) = 0 -> at least one
        ("largest", 1.0, True, [10, 20, 30, 40, 50]),
        ("smallest", 0.4, True, [20, 30]),
        ("smallest", 0.6, True, [20, 30, 50]),
        ("smallest", 0.4, False, [20, 50]),  # zero group dropped first; k still int(0.4 * 5) = 2
        ("largest", 1.0, False, [10, 20, 40, 50]),  # k = 5 capped at 4 candidates
    ],
)
def test_top_k(ftype, value, include_zero, expected):
    assert kept(strategy="top_k", value=value, filter_type=ftype, include_zero=include_zero) == expected


def test_top_k_round_off():
    ids, scores = make_groups({i: float(i + 1) for i in range(100)})
    assert (
        len(rollout_filter(ids, scores, strategy="top_k", value=0.29).kept_groups) == 29
    )  # 0.29*100 = 28.999...


@pytest.mark.parametrize(
    "ftype,value,expected",
    [
        ("largest", 2, [10, 40]),
        ("largest", 3, [10, 20, 40]),
        ("smallest", 3, [20, 30, 50]),
        ("largest", 0, [10]),
        ("smallest", 10, [10, 20, 30, 40, 50]),
    ],
)
def test_top_k_abs(ftype, value, expected):
    assert kept(strategy="top_k_abs", value=value, filter_type=ftype) == expected


# --- top_p -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ftype,value,include_zero,expected",
    [
        # largest: cumulative std [3, 5, 6, 7, 7], target value*7 - 0.01
        ("largest", 0.4, True, [10]),  # 2.79 -> reached by 3
        ("largest", 0.5, True, [10, 40]),  # 3.49 -> 5
        ("largest", 0.8, True, [10, 20, 40]),  # 5.59 -> 6
        ("largest", 0.5, False, [10, 40]),
        # smallest: ranked 30(0) 20(1) 50(1) 40(2) 10(3), cumulative [0, 1, 2, 4, 7]
        ("smallest", 0.1, True, [20, 30]),  # 0.69 -> 1; the zero group is passed over, not a stop
        ("smallest", 0.5, True, [20, 30, 40, 50]),  # 3.49 -> 4
        ("smallest", 0.5, False, [20, 40, 50]),  # cumulative [1, 2, 4], 3.49 -> 4
        ("largest", 1.0, True, [10, 20, 30, 40, 50]),  # value >= 1 keeps every candidate
        ("largest", 1.0, False, [10, 20, 40, 50]),
    ],
)
def test_top_p_linear(ftype, value, include_zero, expected):
    assert kept(strategy="top_p", value=value, filter_type=ftype, include_zero=include_zero) == expected


def test_top_p_linear_selection_eps():
    # value 0.72: target 5.04 - 0.01 = 5.03 > 5 needs three groups; with eps 0.05, 4.99 needs two
    assert kept(strategy="top_p", value=0.72) == [10, 20, 40]
    assert kept(strategy="top_p", value=0.72, selection_eps=0.05) == [10, 40]


@pytest.mark.parametrize(
    "ftype,value,expected",
    [
        # largest: softmax of [3, 2, 1, 1, 0], cumulative 0.5923 0.8102 0.8904 0.9705 1
        ("largest", 0.5, [10]),
        ("largest", 0.6, [10, 40]),
        ("largest", 0.85, [10, 20, 40]),
        ("largest", 0.9, [10, 20, 40, 50]),
        # smallest: softmax of -[0, 1, 1, 2, 3], cumulative 0.5206 0.7121 0.9036 0.9741 1
        ("smallest", 0.5, [30]),
        ("smallest", 0.6, [20, 30]),
        ("smallest", 0.9, [20, 30, 50]),
        ("smallest", 0.95, [20, 30, 40, 50]),
    ],
)
def test_top_p_softmax(ftype, value, expected):
    assert kept(strategy="top_p", value=value, filter_type=ftype, top_p_prob_mode="softmax") == expected


def test_top_p_softmax_excludes_zero_before_normalising():
    # without the zero group: softmax of [3, 2, 1, 1], first mass 20.09 / 32.91 = 0.610 >= 0.6 -> one group;
    # with it the first mass is 0.5923 < 0.6 -> two groups
    assert kept(strategy="top_p", value=0.6, top_p_prob_mode="softmax", include_zero=False) == [10]
    assert kept(strategy="top_p", value=0.6, top_p_prob_mode="softmax", include_zero=True) == [10, 40]


def test_top_p_linear_negative_metric_counts_as_zero_mass():
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    scores = torch.tensor([-1.0, -1.0, 2.0, 2.0, 1.0, 1.0])  # mean reward -1, 2, 1 -> mass 0, 2, 1
    r = rollout_filter(ids, scores, strategy="top_p", value=0.5, metric="reward")  # target 1.49
    assert r.kept_groups == [1]


# --- min_p -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ftype,value,include_zero,expected",
    [
        ("largest", 0.5, True, [10, 40]),  # m >= 1.5
        ("largest", 0.3, True, [10, 20, 40, 50]),  # m >= 0.9
        ("largest", 0.0, True, [10, 20, 30, 40, 50]),
        ("largest", 0.0, False, [10, 20, 40, 50]),
        ("smallest", 0.5, True, [30]),  # m <= 0 / 0.5
        ("smallest", 0.5, False, [20, 40, 50]),  # min 1 -> m <= 2
        ("smallest", 0.4, False, [20, 40, 50]),  # m <= 2.5
        ("smallest", 0.3, False, [10, 20, 40, 50]),  # m <= 3.33
    ],
)
def test_min_p(ftype, value, include_zero, expected):
    assert kept(strategy="min_p", value=value, filter_type=ftype, include_zero=include_zero) == expected


# --- ties, keep mask, metrics, edge cases ---------------------------------------------------------


def test_ties_broken_by_group_id():
    ids, scores = make_groups({9: 1.0, 4: 1.0, 7: 1.0})
    for ftype in ("largest", "smallest"):
        assert rollout_filter(ids, scores, strategy="top_k_abs", value=1, filter_type=ftype).kept_groups == [
            4
        ]
        assert rollout_filter(ids, scores, strategy="top_k_abs", value=2, filter_type=ftype).kept_groups == [
            4,
            7,
        ]
    # softmax of equal metrics: cumulative 1/3, 2/3, 1 -> 0.5 needs two
    r = rollout_filter(ids, scores, strategy="top_p", value=0.5, top_p_prob_mode="softmax")
    assert r.kept_groups == [4, 7]


def test_keep_mask_and_metrics():
    ids = torch.tensor([20, 10, 20, 30, 10, 30])
    scores = torch.tensor([0.0, 1.0, 1.0, 2.0, 1.0, 2.0])  # std: 10 -> 0, 20 -> 0.707, 30 -> 0
    r = rollout_filter(ids, scores, strategy="top_k_abs", value=1)
    assert r.kept_groups == [20]
    assert r.keep.tolist() == [True, False, True, False, False, False]
    assert r.keep.dtype == torch.bool
    assert r.metrics == {
        "rollout/filter_kept_ratio": 1 / 3,
        "rollout/filter_kept_count": 1.0,
        "rollout/filter_zero_count": 2.0,
    }


def test_zero_count_independent_of_include_zero():
    for include_zero in (True, False):
        r = rollout_filter(IDS, SCORES, strategy="top_k_abs", value=2, include_zero=include_zero)
        assert r.metrics["rollout/filter_zero_count"] == 1.0
        assert r.metrics["rollout/filter_kept_ratio"] == 0.4


def test_empty_result_when_every_group_is_zero_and_excluded():
    ids, scores = make_groups({1: 0.0, 2: 0.0})
    for strategy in ("top_k", "top_k_abs", "top_p", "min_p"):
        r = rollout_filter(ids, scores, strategy=strategy, value=0.5, include_zero=False)
        assert r.kept_groups == [] and not r.keep.any() and r.keep.shape == (6,)
        assert r.metrics["rollout/filter_kept_count"] == 0.0
        assert r.metrics["rollout/filter_kept_ratio"] == 0.0
        assert r.metrics["rollout/filter_zero_count"] == 2.0


def test_all_zero_metric_linear_top_p():
    ids, scores = make_groups({1: 0.0, 2: 0.0, 3: 0.0})
    # Σm = 0: no probabilities exist, nothing carries signal -> keep none (value < 1) ...
    assert rollout_filter(ids, scores, strategy="top_p", value=0.5).kept_groups == []
    # ... but value >= 1 is "no filtering", and softmax is uniform
    assert rollout_filter(ids, scores, strategy="top_p", value=1.0).kept_groups == [1, 2, 3]
    r = rollout_filter(ids, scores, strategy="top_p", value=0.5, top_p_prob_mode="softmax")
    assert r.kept_groups == [1, 2]  # cumulative 1/3, 2/3


def test_single_group():
    ids, scores = make_groups({3: 2.0})
    for strategy in ("top_k", "top_k_abs", "top_p", "min_p"):
        for mode in ("linear", "softmax"):
            r = rollout_filter(ids, scores, strategy=strategy, value=0.5, top_p_prob_mode=mode)
            assert r.kept_groups == [3] and r.keep.all()
            assert r.metrics["rollout/filter_kept_ratio"] == 1.0


def test_singleton_groups_have_zero_std():
    ids = torch.tensor([1, 2, 3])
    r = rollout_filter(ids, torch.tensor([0.0, 1.0, 5.0]), strategy="top_p", value=1.0, include_zero=False)
    assert r.kept_groups == [] and r.metrics["rollout/filter_zero_count"] == 3.0


@pytest.mark.parametrize(
    "kw,name",
    [
        (dict(strategy="top_q"), "top_q"),
        (dict(strategy="top_k", filter_type="biggest"), "biggest"),
        (dict(strategy="top_k", metric="foo"), "foo"),
        (dict(strategy="top_p", top_p_prob_mode="exp"), "exp"),
    ],
)
def test_unknown_names_raise(kw, name):
    with pytest.raises(ValueError, match=name):
        rollout_filter(IDS, SCORES, value=0.5, **kw)


def test_entropy_and_length_metrics_drive_the_filter():
    ids = torch.tensor([0, 0, 1, 1])
    scores = torch.zeros(4)
    r = rollout_filter(
        ids,
        scores,
        strategy="top_k_abs",
        value=1,
        metric="entropy",
        entropies=torch.tensor([1.0, 1.0, 2.0, 4.0]),
    )
    assert r.kept_groups == [1]
    r = rollout_filter(
        ids,
        scores,
        strategy="top_k_abs",
        value=1,
        metric="length",
        filter_type="smallest",
        lengths=torch.tensor([5.0, 7.0, 3.0, 4.0]),
    )
    assert r.kept_groups == [1]
    with pytest.raises(ValueError, match="entropies"):
        rollout_filter(ids, scores, strategy="top_k", value=0.5, metric="entropy_variance")


def test_softmax_top_p_equal_groups_keeps_the_exact_prefix():
    """12 tied groups (2 of 4 correct each), softmax top_p=0.5: each has probability 1/12, six reach 0.5 (the
    float cumulative sum stops at 0.49999999999999994 after six; RAGEN keeps six)."""
    g = torch.arange(48) // 4
    s = torch.tensor([1.0, 0.0, 1.0, 0.0] * 12)
    assert rollout_filter(g, s, strategy="top_p", value=0.5, top_p_prob_mode="softmax").kept_groups == list(range(6))
    # every tied count k of 1..11 groups out of 12: exactly k kept at value k/12
    for k in range(1, 12):
        r = rollout_filter(g, s, strategy="top_p", value=k / 12, top_p_prob_mode="softmax")
        assert r.kept_groups == list(range(k)), k


def test_group_std_does_not_depend_on_sample_order():
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    s = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])  # the same rewards in another order: [1,0,1] vs [0,1,1]
    _, m = group_metric("reward_variance", g, s)
    assert m[0].item() == m[1].item()
    # so ties go to the smaller group id, for every strategy
    r = rollout_filter(g, s, strategy="top_k_abs", value=1)
    assert r.kept_groups == [0]


def test_selection_eps_is_rlgrads_setting():
    from rlgrad.config.load import load_config

    assert load_config(None, None, ["rollout.rollout_filter_selection_eps=0.05"]).rollout.rollout_filter_selection_eps \
        == 0.05
    g = torch.arange(8) // 2
    s = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 0.9, 0.0, 0.1])  # stds 0.707, 0.707, 0.636, 0.0707
    # linear top_p=0.66 of the mass 2.12: the first two groups reach 1.414 >= 1.400 - eps only with eps >= 0.0
    assert rollout_filter(g, s, strategy="top_p", value=0.66, selection_eps=0.0).kept_groups == [0, 1]
    assert rollout_filter(g, s, strategy="top_p", value=0.70, selection_eps=0.0).kept_groups == [0, 1, 2]
    assert rollout_filter(g, s, strategy="top_p", value=0.70, selection_eps=0.1).kept_groups == [0, 1]
