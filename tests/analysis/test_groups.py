"""The prompt-group pass the instruments due at one step share (``analysis/groups.py``): which instruments use it,
and that each instrument's numbers through it are those of its own pass (the oracles against plain autograd are in
test_buckets.py, test_components.py and test_per_sample.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlgrad.algos.objective import LossSettings
from rlgrad.analysis import hooks_from_config
from rlgrad.analysis.buckets import GradientAnalysisHook, analyse_buckets
from rlgrad.analysis.components import ComponentGeometryHook, analyse_components
from rlgrad.config.load import load_config
from rlgrad.hooks import StepContext
from tests.analysis.test_components import WEIGHTS, component_batch


def both_hooks(components, buckets, model, batch, settings, cfg, run_dir) -> tuple[dict, int]:
    """The component and bucket hooks' metrics at step 1, and how many forwards of the model they took."""
    forwards = []
    handle = model.register_forward_hook(lambda *a: forwards.append(1))
    try:
        ctx = StepContext(step=1, batch=batch, actor=model, optimizer=None, loss_settings=settings, config=cfg,
                          run_dir=run_dir, reward_weights=WEIGHTS)
        got = {**components.before_update(ctx).metrics, **buckets.before_update(ctx).metrics}
    finally:
        handle.remove()
    return got, len(forwards)

def test_buckets_and_components_due_at_one_step_share_one_forward_and_get_their_own_numbers(tmp_path):
    from rlgrad.config.model import ModelConfig, TinyModelConfig
    from rlgrad.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    tiny = TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           intermediate_size=48)
    model = build_tiny_model(ModelConfig(tiny=tiny), tok, seed=5)
    b = component_batch(model, tok, seed=1)
    s = LossSettings(use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01)
    cfg = load_config(overrides=["analysis.buckets.every=1", "analysis.components.every=1",
                                 "analysis.buckets.num_buckets=2"])
    components, buckets = hooks_from_config(cfg)
    assert isinstance(components, ComponentGeometryHook) and isinstance(buckets, GradientAnalysisHook)
    got, forwards = both_hooks(components, buckets, model, b, s, cfg, tmp_path)
    assert forwards == 1  # one pass for both
    kept = buckets.shared.kept[2]
    assert kept.rows == {} and kept.side is not None  # no per-sample norms due: no row norms formed
    alone = {**analyse_components(model, b, s, weights=WEIGHTS).metrics,
             **analyse_buckets(model, b, s, num_buckets=2).metrics}
    measured = [k for k in got if not k.startswith(("timing_s/", "actor/"))]
    assert set(measured) == set(alone)
    for k in measured:
        assert got[k] == pytest.approx(alone[k], rel=1e-4, abs=1e-9), k


@pytest.mark.parametrize("overrides, users", [
    ([], {"per_sample", "buckets", "components"}),
    (["analysis.buckets.env_groups=2"], {"per_sample", "components"}),  # a separate batch: its own pass
    (["analysis.buckets.dp_trim=true", "trainer.n_gpus_per_node=2"], {"per_sample", "components"}),
    (["analysis.method=reference"], {"per_sample"}),
])
def test_the_pass_serves_only_the_instruments_it_gives_exact_numbers_to(overrides, users):
    cfg = load_config(overrides=["analysis.every=1", *overrides])
    hook = next(h for h in hooks_from_config(cfg) if isinstance(h, GradientAnalysisHook))
    assert set(hook.shared.users) == users
    # a step where at least two of its users are due: one of them alone runs its own pass
    assert hook.shared.serves(1, "per_sample") == (len(users) > 1) and not hook.shared.serves(1, "neurons")
    assert hook.shared.serves(1, "buckets") == ("buckets" in users)


def test_the_groups_gram_formed_by_blocks_of_rows_equals_the_whole(monkeypatch):
    """A Linear with one use has its P group gradients formed a block of rows at a time (P copies of an LM head at
    once otherwise): the Gram adds over the blocks. Tied weights (the embedding and its LM head) stay whole."""
    import rlgrad.analysis.rows as rows
    from rlgrad.algos.objective import as_loss_fn
    from rlgrad.analysis.groups import group_pass
    from tests.helpers.batches import make_batch, tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()
    b = make_batch(model, tok)
    loss = as_loss_fn(LossSettings(entropy_coeff=0.01))
    whole = group_pass(model, b, loss)
    monkeypatch.setattr(rows, "BLOCK_ELEMENTS", 64)  # a few rows per block (at least one)
    folds = []
    real_fold = rows.RowNormReducer._fold
    monkeypatch.setattr(rows.RowNormReducer, "_fold",
                        lambda self, k, g, at=None: folds.append(k) or real_fold(self, k, g, at))
    blocked = group_pass(model, b, loss)
    assert len(folds) > 2 * len(set(folds))  # blocks: several folds per parameter
    for term, per_group in whole.grams.items():
        for g, k in per_group.items():
            torch.testing.assert_close(blocked.grams[term][g], k, rtol=1e-5, atol=1e-10)
        for g, v in whole.rows[term].items():
            torch.testing.assert_close(blocked.rows[term][g], v)


def test_the_pass_is_shared_where_a_tied_weight_times_the_groups_is_large_without_forming_it_dense(tmp_path,
                                                                                                     monkeypatch):
    """P groups x a tied LM head is never formed: the embedding's group gradients at the batch's tokens, the head's
    rows there added to them, its other rows by blocks. So the bucket analysis and the components share one pass
    even where P x the tied weight is large against the model (before, each ran its own), with the same numbers."""
    from rlgrad.analysis import rows
    from tests.helpers.batches import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()
    tied = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is tied
    b = component_batch(model, tok, seed=1)  # 4 groups
    assert 4 * tied.numel() > sum(p.numel() for p in model.parameters()) // 4  # large against the rest
    monkeypatch.setattr(rows, "BLOCK_ELEMENTS", 4 * 8 * tied.shape[1])  # the head's other rows 8 at a time
    folded = []
    real_fold = rows.RowNormReducer._fold
    monkeypatch.setattr(rows.RowNormReducer, "_fold", lambda self, k, g, at=None: folded.append(
        (self.names[k], g.shape)) or real_fold(self, k, g, at))
    s = LossSettings()
    cfg = load_config(overrides=["analysis.buckets.every=1", "analysis.components.every=1",
                                 "analysis.buckets.num_buckets=2"])
    components, buckets = hooks_from_config(cfg)
    got, forwards = both_hooks(components, buckets, model, b, s, cfg, tmp_path)
    assert forwards == 1 and buckets.shared.kept is not None  # one shared pass
    pieces = [shape for name, shape in folded if name == "model.embed_tokens.weight"]
    assert pieces and all(shape.numel() < 4 * tied.numel() for shape in pieces)  # never 4 groups x the whole
    alone = {**analyse_components(model, b, s, weights=WEIGHTS).metrics,
             **analyse_buckets(model, b, s, num_buckets=2).metrics}
    for k in alone:  # the pass's float32 Gram products, by blocks of 8 rows, against the own passes' float64 ones
        assert got[k] == pytest.approx(alone[k], rel=1e-5, abs=1e-12), k


def same_rewards(b, group: int) -> None:
    """Every reward component of ``group`` (4 rows) the same: its advantages 0, the batch's scores and advantages
    recomputed."""
    from rlgrad.algos.advantages import group_reward_std
    from rlgrad.algos.component_advantages import outcome_advantages

    for c in b.components:
        b.components[c][4 * group:4 * group + 4] = 0.5
    b.scores = sum(WEIGHTS[c] * v for c, v in b.components.items())
    b.reward_std = group_reward_std(b.scores, b.group_ids)
    b.advantages = outcome_advantages(b.scores, b.group_ids, "grpo", True)[:, None] * b.response_mask


@pytest.mark.parametrize("shuffle, mode, arranged, dead", [
    (False, "token-mean", True, False), (True, "token-mean", True, False), (True, "token-mean", False, False),
    (True, "token-mean", True, True), (True, "token-mean", False, True), (True, "token-sum", True, False),
    (True, "seq-mean-token-sum", True, True), (True, "seq-mean-token-mean", False, False),
    (True, "seq-mean-token-sum-norm", True, False)])
def test_the_pass_riding_on_the_update_gives_its_own_numbers_and_the_updates_gradient(tmp_path, monkeypatch, shuffle,
                                                                                       mode, arranged, dead):
    """``StepContext.one_pass_update`` with the task term alone: the instruments wait (``Deferred``), the prompt-group
    pass rides on the update's own forward and backward (no forward of their own), and after the update they give
    the numbers the pass before the update gives; the update's gradient, the sum of the group gradients the hooks
    formed (autograd formed none: no parameter's gradient was accumulated by it), is autograd's up to float32
    rounding. (Not the updated weights to that: AdamW's first step moves a weight whose gradient is zero but for
    rounding, a key projection's bias, by up to the learning rate, whichever rounding it gets.) Shuffled: the
    update's rows arrive out of group order: the update runs them by group (``UpdatePass.arrange``), so the reducer
    gathers nothing; not ``arranged`` (as TRL runs them), the reducer gathers them back. ``dead``: a group's rewards
    are all equal (its advantages 0); arranged, its rows come last and the reducer reads only the others' rows, its
    slices the other groups."""
    from rlgrad.analysis import groups as groups_module
    from rlgrad.analysis.rows import RowNormReducer
    from rlgrad.config.model import ModelConfig, TinyModelConfig
    from rlgrad.hooks import HookRunner
    from rlgrad.models import build_char_tokenizer, build_tiny_model
    from rlgrad.rl.actor import update_actor

    tok = build_char_tokenizer()
    tiny = TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           intermediate_size=48)
    b = component_batch(build_tiny_model(ModelConfig(tiny=tiny), tok, seed=5), tok, seed=1)
    if dead:
        same_rewards(b, 1)
    s = LossSettings(loss_agg_mode=mode, horizon=8)  # the task term alone
    cfg = load_config(overrides=["analysis.buckets.every=1", "analysis.components.every=1",
                                 "analysis.per_sample.every=1", "analysis.buckets.num_buckets=2"])
    if not arranged:
        monkeypatch.setattr(groups_module.UpdatePass, "arrange", lambda self, rows: torch.arange(len(rows)))
    reducers = []

    def recorded(*args, **kwargs) -> RowNormReducer:
        reducers.append(RowNormReducer(*args, **kwargs))
        return reducers[-1]

    monkeypatch.setattr(groups_module, "RowNormReducer", recorded)
    measured, forwards, grads, accumulated = {}, {}, {}, {}
    for one_pass in (False, True):
        model = build_tiny_model(ModelConfig(tiny=tiny), tok, seed=5)
        accumulated[one_pass] = []
        for name, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(lambda p, name=name, seen=accumulated[one_pass]: seen.append(name))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        runner = HookRunner(hooks_from_config(cfg))
        ctx = StepContext(step=1, batch=b, actor=model, optimizer=optimizer, loss_settings=s, config=cfg,
                          run_dir=tmp_path / str(one_pass), reward_weights=WEIGHTS, one_pass_update=one_pass)
        calls = []
        handle = model.register_forward_hook(lambda *a, calls=calls: calls.append(1))
        before = runner.before_update(ctx).metrics
        tap = runner.update_tap(ctx)
        assert (tap is not None) == one_pass and (not before) == one_pass  # riding: nothing measured before it
        update_actor(model, optimizer, b, s, ppo_epochs=1, mini_batch_size=len(b), micro_batch_size=len(b),
                     max_grad_norm=1.0, shuffle=shuffle, seed=0, tap=tap,
                     on_grads=lambda m, mini, one_pass=one_pass: grads.__setitem__(
                         one_pass, {n: p.grad.clone() for n, p in m.named_parameters()}))
        if tap is not None:
            assert tap.shared.kept[2].row_order.tolist() != list(range(len(b))) or not shuffle
        handle.remove()
        measured[one_pass] = {**before, **runner.after_update(ctx).metrics}
        forwards[one_pass] = len(calls)
    assert forwards == {False: 2, True: 1}  # the shared pass's forward and the update's; the update's alone
    assert reducers[-1].tiled and (reducers[-1].gather is None) == (arranged or not shuffle)
    assert (len(reducers[-1].weights), reducers[-1].read) == ((3, 12) if dead and arranged else (4, None))
    keys = [k for k in measured[False] if not k.startswith("timing_s/")]
    assert set(keys) == {k for k in measured[True] if not k.startswith("timing_s/")}
    assert any(k.startswith("grad_comp/") for k in keys) and any(k.startswith("grad_norm_sample/") for k in keys)
    for k in keys:
        # float32 sums in another order (shuffled rows, the loss over D then times D): up to 9e-5 measured; noise_inter
        # is a difference (noise_trace - noise_intra) x P/n, so its rounding is theirs (up to 3e-4 of it measured)
        terms = [measured[False][k.replace("noise_inter", t)] for t in ("noise_trace", "noise_intra")]
        scale = 2e-4 * sum(map(abs, terms)) if k.startswith("noise_inter/") else 0.0
        assert measured[True][k] == pytest.approx(measured[False][k], rel=2e-4, abs=max(1e-9, scale), nan_ok=True), k
    assert not accumulated[True] and len(accumulated[False]) == len(grads[False])
    for name, g in grads[False].items():  # up to 8e-7 of the parameter's largest gradient entry measured
        torch.testing.assert_close(grads[True][name], g, rtol=0, atol=2e-6 * float(g.abs().max()), msg=name)


def test_the_pass_does_not_ride_on_an_update_whose_loss_has_other_terms():
    from rlgrad.algos.objective import ActorLoss
    from rlgrad.analysis.groups import rides_on_update
    from tests.helpers.batches import tiny_model_and_tokenizer

    model, _ = tiny_model_and_tokenizer()

    def step(settings: LossSettings) -> SimpleNamespace:
        return SimpleNamespace(actor=model, actor_loss=lambda: ActorLoss(settings))

    assert rides_on_update(step(LossSettings()))
    assert not rides_on_update(step(LossSettings(entropy_coeff=0.01)))
    assert not rides_on_update(step(LossSettings(use_kl_loss=True)))


def test_what_waited_for_the_update_is_measured_before_it_when_a_later_hook_stops(tmp_path):
    """``analysis.buckets.exit_after``: the reward components (first in the hooks' order) wait to ride on a one-pass
    update, the bucket analysis stops the run, no update runs; the components are measured at once
    (``Hook.update_skipped``), with the numbers of a step that never rode."""
    from rlgrad.config.model import ModelConfig, TinyModelConfig
    from rlgrad.hooks import HookRunner
    from rlgrad.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    tiny = TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           intermediate_size=48)
    b = component_batch(build_tiny_model(ModelConfig(tiny=tiny), tok, seed=5), tok, seed=1)
    cfg = load_config(overrides=["analysis.buckets.every=1", "analysis.components.every=1",
                                 "analysis.per_sample.every=1", "analysis.buckets.num_buckets=2",
                                 "analysis.buckets.exit_after=true"])
    got = {}
    for one_pass in (False, True):
        runner = HookRunner(hooks_from_config(cfg))
        ctx = StepContext(step=1, batch=b, actor=build_tiny_model(ModelConfig(tiny=tiny), tok, seed=5),
                          optimizer=None, loss_settings=LossSettings(), config=cfg, run_dir=tmp_path / str(one_pass),
                          reward_weights=WEIGHTS, one_pass_update=one_pass)
        res = runner.before_update(ctx)
        assert res.stop and runner.update_tap(ctx) is None
        got[one_pass] = {k: v for k, v in res.metrics.items() if k.startswith(("grad_comp/", "grad_sim/"))}
        assert (tmp_path / str(one_pass) / "analysis" / "step_1" / "components.json").exists()
    assert got[False] and got[True] == pytest.approx(got[False], rel=1e-6)


def test_a_lone_instrument_takes_its_own_pass_where_nothing_can_ride():
    from rlgrad.analysis.groups import SharedPass
    from rlgrad.hooks import Schedule
    from tests.helpers.batches import tiny_model_and_tokenizer

    model, _ = tiny_model_and_tokenizer()
    shared = SharedPass({"buckets": (Schedule(1), None), "components": (Schedule(0), ["task"])})
    for settings, rides in ((LossSettings(), True), (LossSettings(entropy_coeff=0.01), False)):
        ctx = StepContext(step=1, batch=None, actor=model, optimizer=None, loss_settings=settings, config=None,
                          run_dir=None, one_pass_update=True)
        assert shared.rides(ctx) == rides and shared.serves(1, "buckets", shared.rides(ctx)) == rides


def test_a_side_of_one_weight_per_group_is_read_off_the_groups_gram():
    """``Side.from_groups``: weights one number per prompt group on the rows that carry a task gradient give that
    number (rows without one are free; a group with none gets 0); one weight off within a group, none."""
    from rlgrad.analysis.groups import Side

    inverse = torch.tensor([0, 0, 1, 1, 2, 2])
    weights = torch.tensor([[0.5, 0.5, -2.0, -2.0, 0.0, 7.0], [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]])
    carrying = torch.tensor([True, True, True, True, False, False])
    side = Side(weights, ["a", "b"], {"total": {"a": 1.0, "b": 1.0}}, carrying=carrying)
    assert torch.equal(side.from_groups(inverse, 3), torch.tensor([[0.5, -2.0, 0.0], [1.0, 1.0, 0.0]]).double())
    assert Side(weights, ["a", "b"], {}).from_groups(inverse, 3) is None  # carrying rows not known
    off = weights.clone()
    off[0, 1] = 0.5 * (1 + 1e-3)
    assert Side(off, ["a", "b"], {}, carrying=carrying).from_groups(inverse, 3) is None
    # the Grams: A K Aᵀ with A = [I; C] V, K the groups' Gram
    K = torch.tensor([[2.0, 0.5, 0.0], [0.5, 3.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    V = side.from_groups(inverse, 3)
    gram = side.grams_from_groups(V, {"layer_0": K}).gram["task"]["layer_0"]
    a, b = V[0], V[1]
    assert gram[0, 0] == pytest.approx(float(a @ K @ a)) and gram[0, 1] == pytest.approx(float(a @ K @ b))
    assert gram[2, 2] == pytest.approx(float((a + b) @ K @ (a + b)))


def test_a_side_whose_weights_add_up_to_the_updates_reduces_one_slice_less():
    """``Side.split``: components whose weights add up to one number on the carrying rows (shared_std: their
    advantages add up to the update's) are the groups' sum T and all but one of them; the mix rebuilds every slice's
    weights; the Grams come from the joint Gram of T and the basis slices. Weights that do not add up so, or carrying
    rows not known, leave every slice to the backward (None)."""
    from rlgrad.analysis.groups import Side

    inverse = torch.tensor([0, 0, 1, 1, 2, 2])
    carrying = torch.tensor([True, True, True, True, True, False])
    a = torch.tensor([0.2, 0.7, -1.5, 0.25, 0.1, 9.0])
    weights = torch.stack([a, 0.5 - a])  # each row's weights add up to 0.5 (1/D)
    side = Side(weights, ["a", "b"], {"total": {"a": 1.0, "b": 1.0}}, carrying=carrying)
    split = side.split(inverse, 3)
    assert torch.equal(split.basis, weights[:1])  # a is reduced, b is T/2 - a
    rebuilt = split.mix @ torch.stack([torch.ones(6), a]).double()
    torch.testing.assert_close(rebuilt[:, :5], weights.double()[:, :5])  # (the last row carries no gradient)
    three = torch.stack([a, 2 * a, 0.5 - 3 * a])  # the second a multiple of the first: still one basis slice
    assert len(Side(three, ["a", "b", "c"], {}, carrying=carrying).split(inverse, 3).basis) == 1
    assert Side(weights, ["a", "b"], {}).split(inverse, 3) is None  # carrying rows not known
    off = weights.clone()
    off[1, 2] += 1e-3
    assert Side(off, ["a", "b"], {}, carrying=carrying).split(inverse, 3) is None  # they no longer add up
    # one row off by 3x the tolerance among 40: within it in norm (the greedy choice), not row by row (the check)
    many = torch.rand(40, generator=torch.Generator().manual_seed(0))
    close = torch.stack([many, 0.5 - many])
    close[1, 7] += 3e-5 * float(close[:, 7].abs().max())
    assert Side(close, ["a", "b"], {}, carrying=torch.ones(40, dtype=torch.bool)).split(
        torch.arange(40) // 4, 10) is None
    # the Grams: A M J Mᵀ Aᵀ with M = mix, J the Gram of T and the basis slice
    J = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    gram = side.grams_from_groups(split.mix, {"layer_0": J}).gram["task"]["layer_0"]
    assert gram[0, 0] == pytest.approx(3.0) and gram[2, 2] == pytest.approx(0.25 * 4.0)
    assert gram[1, 1] == pytest.approx(0.25 * 4.0 - 2 * 0.5 * 1.0 + 3.0)


def test_a_basis_slice_is_its_part_on_the_groups_plus_the_rows_of_the_groups_where_it_varies():
    """``Side.basis_by_group``: on the carrying rows the basis weights are ``by_group[:, inverse] + rest``; ``rest``
    is 0 on the groups where a slice's weights are one number (within the tolerance) and on every row that carries
    no gradient, ``by_group`` 0 where they vary; ``SideSplit.by_group`` of a split without basis is empty."""
    from rlgrad.analysis.groups import GROUP_CONSTANT_RTOL, Side, SideSplit

    inverse = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3])
    carrying = torch.tensor([True, True, True, True, True, True, False, False])
    basis = torch.tensor([[0.3, 0.3 * (1 + GROUP_CONSTANT_RTOL / 4), 0.3, -1.0, 2.0, 0.7, 5.0, 9.0],
                          [0.1, 0.1, 0.1, 0.4, 0.4, -2.0, 3.0, 1.0]])
    side = Side(torch.zeros(2, 8), ["a", "b"], {}, carrying=carrying)
    by_group, rest = side.basis_by_group(basis, inverse, 4)
    torch.testing.assert_close(by_group[:, inverse][:, carrying] + rest.double()[:, carrying],
                               basis.double()[:, carrying], rtol=GROUP_CONSTANT_RTOL, atol=0)
    varies = torch.tensor([[False, True, False, False], [False, False, False, False]])  # group 1 of slice a
    assert torch.equal(rest[:, ~carrying], torch.zeros(2, 2))
    assert torch.equal(rest != 0, varies[:, inverse] & carrying)
    assert torch.equal(by_group == 0, varies | torch.tensor([False, False, False, True]))  # group 3: no carrying row
    assert SideSplit(torch.zeros(2, 4), basis[:0]).by_group(side, inverse, 4)[0].shape == (0, 4)


def instrumented_update(tmp_path, model, b, s: LossSettings, cfg, weights: dict, one_pass: bool) -> dict:
    """The metrics of the instruments of ``cfg`` around one update of ``b`` in one micro-batch (before it, and after
    it: riding on it where ``one_pass``)."""
    from rlgrad.hooks import HookRunner
    from rlgrad.rl.actor import update_actor

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    runner = HookRunner(hooks_from_config(cfg))
    ctx = StepContext(step=1, batch=b, actor=model, optimizer=optimizer, loss_settings=s, config=cfg,
                      run_dir=tmp_path, reward_weights=weights, one_pass_update=one_pass)
    got = dict(runner.before_update(ctx).metrics)
    tap = runner.update_tap(ctx)
    assert (tap is not None) == one_pass
    update_actor(model, optimizer, b, s, ppo_epochs=1, mini_batch_size=len(b), micro_batch_size=len(b),
                 max_grad_norm=1.0, shuffle=True, seed=0, tap=tap)
    got.update(runner.after_update(ctx).metrics)
    return got


@pytest.mark.parametrize("varying, basis", [("one", 0), ("two", 1), ("three", 2)])
@pytest.mark.parametrize("one_pass", [False, True])
def test_reward_components_measured_from_the_groups_match_plain_autograd(tmp_path, monkeypatch, one_pass, varying,
                                                                        basis):
    """One reward component varies (the others weigh 0): its advantage is the update's, so its weight on the task
    rows is one number everywhere and the shared pass (before the update, or riding on it) reduces no side slice
    on the backward. Two or three vary: their weights add up to the update's, so one of them is the groups' sum less
    the others (``Side.split``), one slice fewer reduced. Either way the components' numbers equal the reference
    engine's (a plain autograd backward per component)."""
    from rlgrad.algos.advantages import group_reward_std
    from rlgrad.algos.component_advantages import outcome_advantages
    from rlgrad.config.model import ModelConfig, TinyModelConfig
    from rlgrad.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    tiny = TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           intermediate_size=48)
    b = component_batch(build_tiny_model(ModelConfig(tiny=tiny), tok, seed=5), tok, seed=1)
    one = {"one": {"correctness": 0.9, "format": 0.0, "length": 0.0},
           "two": {"correctness": 0.9, "format": 0.1, "length": 0.0}, "three": WEIGHTS}[varying]
    b.components["correctness"][:4] = 1.0  # group 0 always right: no gradient there
    b.components["format"][:4] = 0.5
    b.components["length"][:4] = 0.5
    b.scores = sum(one[c] * v for c, v in b.components.items())
    b.reward_std = group_reward_std(b.scores, b.group_ids)
    b.advantages = outcome_advantages(b.scores, b.group_ids, "grpo", True)[:, None] * b.response_mask
    assert 0 < int((b.advantages.abs().sum(1) == 0).sum()) < len(b)  # some rows carry no gradient
    s = LossSettings(horizon=8)  # the task term alone
    cfg = load_config(overrides=["analysis.buckets.every=1", "analysis.components.every=1",
                                 "analysis.per_sample.every=1", "analysis.buckets.num_buckets=2"])
    model = build_tiny_model(ModelConfig(tiny=tiny), tok, seed=5)
    ref = analyse_components(model, b, s, weights=one, method="reference").metrics
    from rlgrad.analysis.rows import RowNormReducer

    attached = []
    real_basis, real_side = RowNormReducer.attach_basis, RowNormReducer.attach_side

    def attach_basis(self, weights, by_group):
        attached.append(len(weights))
        monkeypatch.setattr(RowNormReducer, "attach_side", real_side)  # (attach_basis makes its side with it)
        try:
            return real_basis(self, weights, by_group)
        finally:
            monkeypatch.setattr(RowNormReducer, "attach_side", no_side)

    def no_side(*args):
        pytest.fail("the side reduced on the backward")

    monkeypatch.setattr(RowNormReducer, "attach_side", no_side)
    monkeypatch.setattr(RowNormReducer, "attach_basis", attach_basis)
    got = instrumented_update(tmp_path, model, b, s, cfg, one, one_pass)
    assert attached == ([basis] if basis else [])
    measured = [k for k in ref if k.startswith(("grad_comp/", "grad_sim/"))]
    assert "grad_comp/correctness/norm" in measured and "grad_comp/total/norm" in measured
    for k in measured:
        assert got[k] == pytest.approx(ref[k], rel=1e-5, abs=1e-12), k


def test_a_riding_step_checks_the_model_and_splits_the_advantage_once(tmp_path, monkeypatch):
    """Issue 49, the work outside the backward: the task-term instruments planned at before_update and taken at
    after_update walk the model for the fast engine's check once for them all (``instrument.fast_unsupported_at``,
    also for ``groups.rides_on_update``) and split the advantage by component once (``ComponentGeometryHook._split``).
    (That their numbers are those of a step nothing rides on: the riding tests above.)"""
    from rlgrad.analysis import buckets, components, engine, groups, instrument, per_sample
    from rlgrad.config.model import ModelConfig, TinyModelConfig
    from rlgrad.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    tiny = TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           intermediate_size=48)
    model = build_tiny_model(ModelConfig(tiny=tiny), tok, seed=5)
    b = component_batch(model, tok, seed=1)
    cfg = load_config(overrides=["analysis.buckets.every=1", "analysis.components.every=1",
                                 "analysis.per_sample.every=1", "analysis.per_sample.terms=[task]",
                                 "analysis.buckets.num_buckets=2"])
    walks, splits = [], []
    for module in (instrument, groups, buckets, per_sample):
        monkeypatch.setattr(module, "fast_unsupported", lambda m: walks.append(1) or engine.fast_unsupported(m),
                            raising=False)
    real_split = components.split_advantages
    monkeypatch.setattr(components, "split_advantages", lambda *a, **k: splits.append(1) or real_split(*a, **k))
    got = instrumented_update(tmp_path, model, b, LossSettings(horizon=8), cfg, WEIGHTS, one_pass=True)
    assert {"grad_comp/correctness/norm", "grad_norm/all/task", "noise_scale/all/task"} <= set(got)
    assert len(walks) == 1 and len(splits) == 1


def test_what_the_pass_forms_from_the_forward_is_formed_once_and_not_kept_past_a_riding_backward(monkeypatch):
    """Memory (issue 49; bench/results/i49/memory_ride). A norm layer's x̂ formed in the forward stayed alive beside its
    input through the whole backward, every norm's at once (the riding step's extra peak); and the hooks and the ghost
    norms' Gram cache kept every Linear's input past the backward, as long as the update's graph (to its optimizer
    step). Now x̂ is formed at the norm's output gradient, once per pass however many terms' backwards share it (as
    the input Grams are), and on a riding update's one backward nothing formed or read survives its hook."""
    import weakref

    from rlgrad.algos.aggregation import Denominators
    from rlgrad.algos.objective import ActorLoss, actor_objective
    from rlgrad.analysis import engine, rows
    from rlgrad.analysis.groups import group_pass
    from tests.helpers.batches import make_batch, tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()
    b = make_batch(model, tok)
    norms = sum(isinstance(m, torch.nn.LayerNorm) or engine._is_rmsnorm(m) for m in model.modules())
    formed: list[weakref.ref] = []
    read: list[weakref.ref] = []
    grams: list[weakref.ref] = []

    def tracked(real, into):
        def fn(*args):
            out = real(*args)
            into.append(weakref.ref(out))
            return out
        return fn

    monkeypatch.setattr(engine, "_norm_input", tracked(engine._norm_input, formed))
    monkeypatch.setattr(rows.RowNormReducer, "_read", tracked(rows.RowNormReducer._read, read))
    monkeypatch.setattr(rows, "input_gram", tracked(rows.input_gram, grams))
    per_pass = {}
    for settings in (LossSettings(horizon=5), LossSettings(use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01,
                                                           horizon=5)):
        formed.clear()
        grams.clear()
        found = group_pass(model, b, ActorLoss(settings))
        per_pass[len(found.grams)] = (len(formed), len(grams))
    assert norms > 1 and per_pass[1] == per_pass[3] == (norms, per_pass[1][1]) and per_pass[1][1] > 1

    for kept in (formed, read, grams):
        kept.clear()
    s = LossSettings(horizon=5)  # the task term alone: what rides on an update's backward
    groups = torch.unique(b.group_ids)
    reducer = rows.RowNormReducer(model, (b.group_ids[None, :] == groups[:, None]).float(), leaf_embeddings=False)
    try:
        loss = actor_objective(model, b, s, Denominators.of(b)).total(s)
        assert not formed and len(read) > 1  # no x̂ formed in the forward
        loss.backward()
        assert len(formed) == norms and len(grams) == per_pass[1][1]
        # the graph (``loss``) still alive: nothing formed or read in the forward is left
        assert not reducer.x_grams and not [r for r in formed + read + grams if r() is not None]
        assert any(k.startswith("layer_") for k in reducer.gram) and reducer.row_sq
    finally:
        reducer.close()
        model.zero_grad(set_to_none=True)
