"""The bucket analysis (``analysis/buckets.py``): bucketing by reward variance, and each bucket's gradient
against plain autograd.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from rlgrad.algos.advantages import group_reward_std
from rlgrad.algos.aggregation import Denominators
from rlgrad.algos.objective import actor_objective, as_loss_fn
from rlgrad.analysis.buckets import analyse_buckets, make_buckets
from rlgrad.analysis.groups import group_pass
from tests.helpers.batches import SETTINGS, make_batch


# ----------------------------------------------------------------------------- buckets
def _groups(stds):
    """A batch of groups of 3 samples {-d, 0, d}, whose unbiased std is d."""
    scores, gids = [], []
    for g, sd in enumerate(stds):
        scores += [-sd, 0.0, sd]
        gids += [g, g, g]
    s = torch.tensor(scores)
    g = torch.tensor(gids)
    return g, group_reward_std(s, g)


def test_quantile_buckets_sorted_with_remainder_to_last():
    g, rs = _groups([0.5, 0.1, 0.3, 0.3, 0.0, 0.9, 0.2])  # 7 groups, 3 buckets -> 2, 2, 3 groups
    b = make_buckets(g, rs, mode="quantile", num_buckets=3)
    assert b.names == ["all", "bucket_1", "bucket_2", "bucket_3"]
    members = {n: sorted({int(x) for x in g[b.rows[n]]}) for n in b.names}
    assert members["bucket_1"] == [1, 4]  # stds 0.0 (g4), 0.1 (g1)
    assert members["bucket_2"] == [2, 6]  # 0.2 (g6), 0.3 (g2; tie with g3 broken by id)
    assert members["bucket_3"] == [0, 3, 5]
    assert [row[1] for row in b.groups] == [4, 1, 6, 2, 3, 0, 5]
    # every sample in exactly one real bucket, none duplicated
    real = torch.cat([b.rows[n] for n in b.names if n != "all"])
    assert sorted(real.tolist()) == list(range(len(g)))
    assert torch.equal(b.rows["all"], torch.arange(len(g)))


def test_fewer_groups_than_buckets_and_all_zero():
    g, rs = _groups([0.0, 0.0])
    with pytest.warns(UserWarning, match="num_buckets=6 is more than the 2 bucket"):
        b = make_buckets(g, rs, mode="quantile", num_buckets=6)
    assert b.names == ["all", "bucket_1", "bucket_2"]
    assert [sorted({int(x) for x in g[b.rows[n]]}) for n in ("bucket_1", "bucket_2")] == [[0], [1]]


def test_quantile_nonzero_puts_zero_variance_groups_in_bucket_1_and_keeps_ties_together():
    # group stds: four at 0, three tied at 0.3, then two distinct
    g, rs = _groups([0.0, 0.0, 0.0, 0.0, 0.3, 0.3, 0.3, 0.5, 0.9])
    b = make_buckets(g, rs, mode="quantile_nonzero", num_buckets=4)
    members = {n: sorted({int(x) for x in g[b.rows[n]]}) for n in b.names if n != "all"}
    # quantile would give buckets 1 and 2 identical zero-variance groups and split the tie at 0.3 in two
    assert members == {"bucket_1": [0, 1, 2, 3], "bucket_2": [4, 5, 6], "bucket_3": [7], "bucket_4": [8]}
    plain = make_buckets(g, rs, mode="quantile", num_buckets=4)
    assert {int(x) for x in g[plain.rows["bucket_2"]]} <= {2, 3, 4}
    # no zero-variance group: bucket_1 is absent (the name keeps its meaning), the rest still in quantiles
    g, rs = _groups([0.1, 0.2, 0.3, 0.4])
    b = make_buckets(g, rs, mode="quantile_nonzero", num_buckets=3)
    assert b.names == ["all", "bucket_2", "bucket_3"]
    assert sorted(torch.cat([b.rows["bucket_2"], b.rows["bucket_3"]]).tolist()) == list(range(len(g)))


@pytest.mark.parametrize("mode, most", [("quantile", 6), ("quantile_nonzero", 7)])
def test_more_buckets_than_groups_are_clamped_with_a_warning(mode, most):
    g, rs = _groups([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])  # 6 groups
    with pytest.warns(UserWarning, match=rf"num_buckets=10 is more than the {most} bucket.*using {most}"):
        b = make_buckets(g, rs, mode=mode, num_buckets=10)
    assert b.names == make_buckets(g, rs, mode=mode, num_buckets=most).names  # the same buckets as asking for it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_buckets(g, rs, mode=mode, num_buckets=most)  # as many as the groups fill: no warning
        make_buckets(g, rs, mode="fixed_rv", num_buckets=10)  # fixed edges: num_buckets plays no part


def test_fixed_rv_buckets_skip_empty():
    g, rs = _groups([0.5, 1.0, 2.5, 7.0, 0.99])
    b = make_buckets(g, rs, mode="fixed_rv")
    assert b.names == ["all", "bucket_1", "bucket_2", "bucket_3", "bucket_6"]
    assert sorted({int(x) for x in g[b.rows["bucket_1"]]}) == [0, 4]
    assert sorted({int(x) for x in g[b.rows["bucket_2"]]}) == [1]  # [1, 2) includes 1.0
    assert b.bucket_ids(len(g)).tolist() == [1] * 3 + [2] * 3 + [3] * 3 + [6] * 3 + [1] * 3


# ----------------------------------------------------------------------------- the engine




@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"{s.loss_agg_mode}-{s.policy_loss}")
def test_bucket_norms_equal_plain_autograd_per_bucket(model_tok, s):
    model, tok = model_tok
    b = make_batch(model, tok)
    fast = analyse_buckets(model, b, s, num_buckets=3, method="fast")
    ref = analyse_buckets(model, b, s, num_buckets=3, method="reference")
    # the buckets from the per-sample norms' prompt-group pass (analysis/groups.py): the same oracle holds
    shared = analyse_buckets(model, b, s, num_buckets=3, groups=group_pass(model, b, as_loss_fn(s)))
    comps = ["task"] + (["entropy"] if s.entropy_coeff else []) + (["kl"] if s.use_kl_loss else [])
    assert sorted(fast.stats.gram) == sorted(comps) == sorted(shared.stats.gram)
    params = [p for p in model.parameters()]
    for name in fast.buckets.names:
        sub = b.select(fast.buckets.rows[name])
        # Independent oracle: autograd of the bucket's own aggregated loss, component by component.
        for comp in comps:
            terms = actor_objective(model, sub, s, Denominators.of(sub))
            loss = {"task": terms.task, "entropy": -s.entropy_coeff * terms.entropy,
                    "kl": s.kl_loss_coef * (terms.kl if terms.kl is not None else 0)}[comp]
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            expect = torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None))
            got = fast.metrics[f"grad_norm/{name}/{comp}"]
            assert got == pytest.approx(float(expect), rel=1e-4, abs=1e-9), (name, comp)
            assert ref.metrics[f"grad_norm/{name}/{comp}"] == pytest.approx(got, rel=1e-4, abs=1e-9)
            assert shared.metrics[f"grad_norm/{name}/{comp}"] == pytest.approx(float(expect), rel=1e-4, abs=1e-9)
        for rep in (fast, shared):
            assert rep.metrics[f"grad_norm/{name}/loss/policy"] == pytest.approx(float(terms.task.detach()), rel=1e-5)
        for g_name in fast.layers[name]["task"]:
            for rep in (ref, shared):
                assert rep.layers[name]["task"][g_name] == pytest.approx(fast.layers[name]["task"][g_name],
                                                                         rel=1e-4, abs=1e-9)
    assert set(shared.metrics) == set(fast.metrics)


def test_bucket_gradients_sum_to_full_gradient_for_every_parameter(model_tok):
    model, tok = model_tok
    s = SETTINGS[0]
    b = make_batch(model, tok)
    rep = analyse_buckets(model, b, s, num_buckets=3, method="fast", keep_grads=True)
    m = copy.deepcopy(model)
    actor_objective(m, b, s, Denominators.of(b)).task.backward()
    grads = rep.stats.grads["task"]
    names = [n for n, _ in m.named_parameters()]
    assert set(grads) == set(names)  # every parameter kind covered: linear w/b, embeddings (tied), norms
    kinds = {n.split(".")[-2] if "norm" in n else n.split(".")[-1] for n in names}
    assert {"weight", "bias"} <= kinds
    real = [n for n in rep.buckets.names if n != "all"]
    from rlgrad.algos.aggregation import agg_token_weights
    _, u = agg_token_weights(b.response_mask, s.loss_agg_mode, horizon=s.horizon)
    for n, p in m.named_parameters():
        k_all = rep.stats.slices.index("all")
        torch.testing.assert_close(grads[n][k_all], p.grad, rtol=1e-4, atol=1e-7)
        # the buckets' unnormalised gradients add up to the full batch's
        total = sum(grads[n][rep.stats.slices.index(r)] * float(u[rep.buckets.rows[r]].sum()) for r in real)
        torch.testing.assert_close(total / float(u.sum()), p.grad, rtol=1e-4, atol=1e-7)


def test_zero_variance_bucket_has_exactly_zero_task_gradient(model_tok):
    model, tok = model_tok
    b = make_batch(model, tok, zero_group=True)
    rep = analyse_buckets(model, b, SETTINGS[0], num_buckets=5, method="fast")
    assert rep.metrics["grad_norm/bucket_1/reward_std_max"] == 0.0
    assert rep.metrics["grad_norm/bucket_1/task"] == 0.0
    assert rep.metrics["grad_norm/bucket_1/entropy"] > 0.0


def test_loss_values_total_is_rlgrad_loss_of_the_logged_values_exactly(model_tok):
    """loss/total = policy - entropy_coeff·entropy + kl_loss_coef·kl from the logged values, as RAGEN reports."""
    model, tok = model_tok
    s = SETTINGS[0]
    m = analyse_buckets(model, make_batch(model, tok), s, num_buckets=2).metrics
    for b in ("all", "bucket_1", "bucket_2"):
        p, e, k = (m[f"grad_norm/{b}/loss/{x}"] for x in ("policy", "entropy", "kl"))
        assert m[f"grad_norm/{b}/loss/total"] == p - s.entropy_coeff * e + s.kl_loss_coef * k


def test_a_term_no_metric_key_can_hold_fails_before_the_backward(model_tok):
    from rlgrad.algos.objective import per_token_loss

    model, tok = model_tok
    calls = []

    def bad(m, b):
        calls.append(1)
        return {"kl-penalty": b.response_mask * 0.0}

    with pytest.raises(ValueError, match="kl-penalty"):
        analyse_buckets(model, make_batch(model, tok), per_token_loss(bad), num_buckets=2)
    assert len(calls) == 1  # the forward ran once; no gradient was computed for it


def test_the_bucket_norms_are_the_grams_norms_bit_for_bit(model_tok):
    """Every bucket's norm and its layer groups' (read off each Gram's diagonal at once, ``_slice_norms``) are exactly
    ``GradStats.norm`` of that bucket, the norms' definition, with and without the prompt-group pass."""
    model, tok = model_tok
    b = make_batch(model, tok)
    s = SETTINGS[0]
    for groups in (None, group_pass(model, b, as_loss_fn(s))):
        rep = analyse_buckets(model, b, s, num_buckets=3, groups=groups)
        assert len(rep.buckets.names) > 2 and set(rep.stats.gram) == {"task", "entropy", "kl"}
        for bucket in rep.buckets.names:
            for term, per_group in rep.layers[bucket].items():
                assert rep.metrics[f"grad_norm/{bucket}/{term}"] == rep.stats.norm(term, bucket)
                assert per_group == {g: rep.stats.norm(term, bucket, g) for g in rep.stats.gram[term]}
                assert list(per_group) == sorted(rep.stats.gram[term])
