"""Reward components: scorers, per-component advantages, the unit loss, component gradient geometry
against plain autograd, the background writer, tracking, export, and the instrument inside training runs."""

import copy
import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from rlgrad.algos.advantages import group_reward_std
from rlgrad.algos.aggregation import Denominators, agg_token_weights
from rlgrad.algos.component_advantages import component_advantages, outcome_advantages
from rlgrad.algos.objective import LossSettings, actor_objective, actor_terms
from rlgrad.algos.surrogates import policy_loss
from rlgrad.analysis.components import analyse_components
from rlgrad.analysis.writer import BackgroundWriter
from rlgrad.batch import Batch
from rlgrad.cli import main as cli_main
from rlgrad.config.load import load_config
from rlgrad.config.model import ModelConfig, TinyModelConfig
from rlgrad.logging.rewards import read_reward_components, to_seed_layout
from rlgrad.models import build_char_tokenizer, build_tiny_model
from rlgrad.recipes import make_trainer
from rlgrad.rl.rollout import compute_log_probs, generate
from rlgrad.runfiles import read_jsonl
from rlgrad.tasks import Example, build_task
from rlgrad.tasks.math import correctness_score, format_score, length_score

QUIET = dict(log=lambda *a: None)


# ----------------------------------------------------------------------------- scorers
@pytest.mark.parametrize("response,truth,expected", [
    (r"so \boxed{\frac{\sqrt{2}}{2}}", r"\frac{\sqrt2}{2}", 1.0),         # nested braces, \sqrt2 normalised
    (r"\boxed{\{1,2\}} is the set", r"\{1,2\}", 1.0),                      # escaped braces inside the box
    (r"\boxed{x^{2}+1} then \boxed{\left(1,2\right)}", "(1,2)", 1.0),      # last box, \left/\right dropped
    (r"\fbox{12}", "12", 1.0),
    (r"\boxed{3} and finally \fbox{4}", "3", 0.0),                         # \fbox is the last box
    (r"\boxed{5\text{ cm}}", "5", 1.0),                                     # units
    (r"\boxed{5 \mbox{meters}}", r"5\text{ m}", 1.0),                       # units on both sides
    (r"\boxed{30^\circ}", r"30^{\circ}", 1.0),
    (r"\boxed{\$1,000}", "1000", 1.0),
    (r"\boxed{\dfrac{3}{4}}", "3/4", 1.0),                                  # \frac forms
    (r"\boxed{\frac34}", r"\tfrac{3}{4}", 1.0),
    (r"\boxed{\frac{3}4}", r"\frac{3}{4}", 1.0),
    (r"\boxed{0.75}", r"\frac{3}{4}", 0.0),                                 # no numeric evaluation
    (r"\boxed{-3/4}", r"-\frac{3}{4}", 1.0),
    ("The answer is 42.", "42", 0.0),                                       # missing box
    (r"\boxed{42", "42", 0.0),                                              # unclosed box
    (r"\boxed{}", "", 0.0),                                                 # empty on both sides
])
def test_correctness_scorer(response, truth, expected):
    assert correctness_score(response, truth) == expected


@pytest.mark.parametrize("response,expected", [
    ("First we add. Second we carry. Third we check.", 0.75),
    ("FIRST, then Second", 0.5),                               # lower-cased
    ("firstly, secondary, thirdly", 0.0),                      # whole words only
    ("Step 1: add. Step 2: carry.", 0.5),                      # spaces removed: step1, step2
    ("step1 step1 step1", 0.25),                               # each marker counts once
    ("Step\t1", 0.0),                                          # only spaces are removed
    (r"so \boxed{4}", 0.4),
    (r"\fbox{4}", 0.0),                                        # the format rule names \boxed only
    (r"First, second, third, step 1, step 2, \boxed{1}", 1.0),  # 1.65 capped at 1
    (r"First \boxed{2}", 0.65),
])
def test_format_scorer(response, expected):
    assert format_score(response) == pytest.approx(expected)


def test_length_scorer_chars_and_tokens():
    assert length_score("x" * 200, 800) == pytest.approx(0.25)
    assert length_score("x" * 800, 800) == 1.0
    assert length_score("x" * 1000, 800) == pytest.approx(0.75)
    assert length_score("x" * 1600, 800) == 0.0 and length_score("x" * 5000, 800) == 0.0
    assert length_score("x" * 10, 800, "tokens", num_tokens=600) == pytest.approx(0.75)


def test_every_task_returns_correctness_and_format():
    ar = build_task("arithmetic", val_size=2)
    assert set(ar.score("82", Example("37+45=", "82")).components) >= {"correctness", "format"}
    cd = build_task("countdown", val_size=2)
    ex = cd.val_examples()[0]
    assert set(cd.score("1+2", ex).components) >= {"correctness", "format"}


# ----------------------------------------------------------------------------- advantages and the unit loss
def test_a_mistyped_weight_is_named_with_the_components():
    g = torch.tensor([0, 0, 1, 1])
    comps = {"correctness": torch.tensor([1.0, 0.0, 1.0, 0.0]), "format": torch.tensor([1.0, 1.0, 0.0, 0.5])}
    with pytest.raises(ValueError) as e:
        component_advantages(comps, {"correctness": 1.0, "formt": 0.5}, comps["correctness"], g,
                             mode="shared_std", estimator="grpo", norm_by_std=True)
    msg = str(e.value)
    assert "component(s) format" in msg and "unknown component(s) formt" in msg
    assert "(the components: correctness, format)" in msg


def test_component_advantages_hand_computed():
    g = torch.tensor([0, 0, 0, 1, 1, 2])  # group 2 is a singleton
    comps = {"correctness": torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
             "format": torch.tensor([1.0, 1.0, 0.0, 0.5, 1.0, 0.5])}
    w = {"correctness": 0.5, "format": 0.25}
    scores = 0.5 * comps["correctness"] + 0.25 * comps["format"]  # 0.75, 0.25, 0.5 | 0.125, 0.25 | 0.625
    a = component_advantages(comps, w, scores, g, mode="shared_std", estimator="grpo", norm_by_std=True)
    sd0 = 0.25  # std of (0.75, 0.25, 0.5), unbiased
    sd1 = math.sqrt(2) * 0.0625  # std of (0.125, 0.25)
    eps = 1e-6
    exp_c = [0.5 * (1 - 2 / 3) / (sd0 + eps), 0.5 * (0 - 2 / 3) / (sd0 + eps), 0.5 * (1 - 2 / 3) / (sd0 + eps),
             0.0, 0.0, 0.5 / (1 + eps)]
    exp_f = [0.25 * (1 - 2 / 3) / (sd0 + eps), 0.25 * (1 - 2 / 3) / (sd0 + eps), 0.25 * (0 - 2 / 3) / (sd0 + eps),
             0.25 * -0.25 / (sd1 + eps), 0.25 * 0.25 / (sd1 + eps), 0.125 / (1 + eps)]
    torch.testing.assert_close(a["correctness"], torch.tensor(exp_c))
    torch.testing.assert_close(a["format"], torch.tensor(exp_f))
    for est, norm in [("grpo", True), ("grpo", False), ("rloo", False)]:
        shared = component_advantages(comps, w, scores, g, mode="shared_std", estimator=est, norm_by_std=norm)
        torch.testing.assert_close(sum(shared.values()), outcome_advantages(scores, g, est, norm))
    own = component_advantages(comps, w, scores, g, mode="own_std", estimator="grpo", norm_by_std=True)
    # format in group 0 is (1, 1, 0): mean 2/3, std 1/sqrt(3); unweighted
    assert float(own["format"][2]) == pytest.approx((0 - 2 / 3) / (1 / math.sqrt(3) + 1e-6), rel=1e-6)
    # a group whose components vary but whose total is constant: A = 0, and so is every component's share
    c2 = {"correctness": torch.tensor([1.0, 0.0]), "format": torch.tensor([0.0, 1.0])}
    flat = component_advantages(c2, {"correctness": 0.5, "format": 0.5}, torch.tensor([0.5, 0.5]),
                                torch.tensor([0, 0]), mode="shared_std", estimator="grpo", norm_by_std=True)
    assert all(v.tolist() == [0.0, 0.0] for v in flat.values())
    rl = component_advantages(comps, w, scores, g, mode="own_std", estimator="rloo", norm_by_std=True)
    assert float(rl["correctness"][1]) == pytest.approx(0 - 1.0)  # leave-one-out mean of (1, 1)


@pytest.mark.parametrize("kind", ["ppo", "cispo", "gspo"])
def test_unit_loss_times_advantage_has_the_policy_loss_gradient(kind):
    # Ratios in every PPO region (below, inside, above the clip range, beyond the dual clip), A of each sign.
    log_ratio = torch.log(torch.tensor([0.5, 0.79, 0.81, 1.0, 1.1, 1.19, 1.3, 2.5, 3.5, 5.0]))
    ratios = log_ratio.repeat(3)
    adv = torch.tensor([1.5] * 10 + [-0.7] * 10 + [0.0] * 10)
    old = torch.randn(30, generator=torch.Generator().manual_seed(0))
    shape = (30, 1) if kind == "gspo" else (30,)  # gspo: one-token responses, so each sequence ratio is one of these
    old, adv = old.reshape(shape), adv.reshape(shape)
    logp = (old + ratios.reshape(shape)).clone().requires_grad_(True)
    kw = dict(kind=kind, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, agg_mode="token-mean", horizon=1)
    out = policy_loss(logp, old, adv, torch.ones(shape), **kw)
    (g_loss,) = torch.autograd.grad(out.loss_mat.sum(), logp, retain_graph=True)
    (g_unit,) = torch.autograd.grad((adv * out.unit_loss_mat).sum(), logp, retain_graph=True)
    torch.testing.assert_close(g_unit, g_loss, rtol=1e-6, atol=1e-7)
    if kind != "cispo":  # the unit loss keeps a gradient where the total advantage is 0 (inside the clip range)
        (g0,) = torch.autograd.grad(out.unit_loss_mat[20:].sum(), logp)
        assert (g0[20:] != 0).flatten().tolist() == [False] * 2 + [True] * 4 + [False] * 4  # 0.81 .. 1.19
    if kind == "gspo":  # no dual clip: a negative advantage keeps its gradient at ratio 5 (ppo's dual clip drops it)
        assert float(g_loss[19, 0]) != 0.0


# ----------------------------------------------------------------------------- geometry vs plain autograd
@pytest.fixture(scope="module")
def model_tok():
    tok = build_char_tokenizer()
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=48))
    return build_tiny_model(cfg, tok, seed=5), tok


WEIGHTS = {"correctness": 0.34, "format": 0.33, "length": 0.33}


def component_batch(model, tok, *, seed=0, noise=0.3, estimator="grpo", norm=True, groups=4, n=4) -> Batch:
    """A sampled batch with random correctness/format/length rewards and off-policy old log-probs."""
    torch.manual_seed(seed)
    prompts = ["1+2=", "13+4=", "7*8=", "99-5=", "3+3="][:groups]
    gen = generate(model, tok, prompts, n=n, max_new_tokens=5, do_sample=True)
    g = torch.arange(groups).repeat_interleave(n)
    gen_ = torch.Generator().manual_seed(seed)
    comps = {"correctness": (torch.rand(len(g), generator=gen_) < 0.5).float(),
             "format": torch.randint(0, 5, (len(g),), generator=gen_).float() / 4,
             "length": torch.rand(len(g), generator=gen_)}
    comps["format"][:n] = 0.5  # group 0: a component with no variance
    scores = sum(WEIGHTS[c] * v for c, v in comps.items())
    b = Batch(
        input_ids=gen.input_ids, attention_mask=gen.attention_mask, response_mask=gen.response_mask, group_ids=g,
        scores=scores, reward_std=group_reward_std(scores, g), components=comps)
    b.old_log_probs, _ = compute_log_probs(model, b.input_ids, b.attention_mask, b.response_mask,
                                           temperature=1.0, micro_batch_size=64)
    b.old_log_probs = b.old_log_probs + noise * torch.randn_like(b.old_log_probs) * b.response_mask
    b.ref_log_probs = b.old_log_probs + 0.1 * torch.randn_like(b.old_log_probs) * b.response_mask
    b.advantages = outcome_advantages(scores, g, estimator, norm)[:, None] * b.response_mask
    return b


def flat_grad(model, loss):
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double()
                      for p, g in zip(model.parameters(), grads)])


def engine_flat(rep, model, slice_name):
    k = rep.stats.slices.index(slice_name)
    grads = rep.stats.grads["task"]
    return torch.cat([grads[n][k].reshape(-1).double() for n, _ in model.named_parameters()])


SETTINGS = [
    LossSettings(loss_agg_mode="token-mean", horizon=5, use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01),
    LossSettings(loss_agg_mode="seq-mean-token-mean", horizon=5, policy_loss="cispo", clip_ratio_high=0.1),
    LossSettings(loss_agg_mode="seq-mean-token-sum-norm", horizon=5, clip_ratio_low=0.05, clip_ratio_high=0.05),
    # GSPO's clip is decided per sequence: the split still sums to the update's gradient (tight clip: some clipped)
    LossSettings(loss_agg_mode="seq-mean-token-mean", horizon=5, policy_loss="gspo", clip_ratio_low=0.02,
                 clip_ratio_high=0.02),
    LossSettings(loss_agg_mode="token-sum", horizon=5, policy_loss="gspo"),
]


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"{s.loss_agg_mode}-{s.policy_loss}")
@pytest.mark.parametrize("method", ["fast", "reference"])
def test_shared_std_components_sum_to_the_update_policy_gradient(model_tok, s, method):
    model, tok = model_tok
    b = component_batch(model, tok)
    rep = analyse_components(model, b, s, weights=WEIGHTS, mode="shared_std", method=method, keep_grads=True)
    # Oracle: plain autograd of the policy loss the update optimises (clipping active: ratios are off-policy).
    pg = actor_objective(model, b, s, Denominators.of(b)).task
    expect = flat_grad(model, pg)
    total = engine_flat(rep, model, "total")
    summed = sum(engine_flat(rep, model, c) for c in WEIGHTS)
    atol = max(1e-7, 1e-6 * float(expect.abs().max()))  # token-sum's gradient is not divided by the batch
    torch.testing.assert_close(total, expect, rtol=1e-4, atol=atol)
    torch.testing.assert_close(summed, expect, rtol=1e-4, atol=atol)
    assert rep.metrics["grad_comp/total/norm"] == pytest.approx(float(expect.norm()), rel=1e-4)
    shares = [rep.metrics[f"grad_comp/{c}/share"] for c in WEIGHTS]
    assert sum(shares) == pytest.approx(1.0, abs=1e-4)
    # the component advantages add up to the update's
    torch.testing.assert_close(sum(rep.advantages[c] for c in WEIGHTS), rep.advantages["total"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["shared_std", "own_std"])
def test_one_engine_pass_equals_one_backward_per_component(model_tok, mode):
    model, tok = model_tok
    s = SETTINGS[0]
    b = component_batch(model, tok, seed=1)
    rep = analyse_components(model, b, s, weights=WEIGHTS, mode=mode, method="fast", keep_grads=True)
    _, u = agg_token_weights(b.response_mask, s.loss_agg_mode, horizon=s.horizon)
    flat = {}
    for c in list(WEIGHTS) + ["total"]:
        a = rep.advantages[c]
        # A forward and a plain backward per component: Σ_i A_c,i/D Σ_t ω u (u: loss per unit advantage).
        t = actor_terms(model, b, s)
        omega, _ = agg_token_weights(t.mask, s.loss_agg_mode, horizon=s.horizon)
        flat[c] = flat_grad(model, ((a[:, None] / u.sum()) * omega * t.task_unit).sum())
        torch.testing.assert_close(engine_flat(rep, model, c), flat[c], rtol=1e-4, atol=1e-7)
        assert rep.metrics[f"grad_comp/{c}/norm"] == pytest.approx(float(flat[c].norm()), rel=1e-4)
    for a_, b_ in [("correctness", "format"), ("correctness", "length"), ("format", "length")]:
        cos = float(flat[a_] @ flat[b_] / (flat[a_].norm() * flat[b_].norm()))
        assert rep.metrics[f"grad_sim/{a_}__{b_}"] == pytest.approx(cos, abs=1e-5)
    for c in WEIGHTS:
        share = float(flat[c] @ flat["total"] / (flat["total"] @ flat["total"]))
        assert rep.metrics[f"grad_comp/{c}/share"] == pytest.approx(share, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"{s.loss_agg_mode}-{s.policy_loss}")
def test_components_on_the_shared_prompt_group_pass_equal_one_backward_per_component(model_tok, s):
    """analysis/groups.py: the components reduced on the task term's backward of the prompt-group pass (weights
    A_c,i / (A_i D) on the rows' task gradients) against a plain backward per component of the unit loss (clipped
    rows included: the batch's old log-probs are off-policy)."""
    from rlgrad.algos.objective import as_loss_fn
    from rlgrad.analysis.groups import group_pass

    model, tok = model_tok
    b = component_batch(model, tok, seed=1)
    calls = []

    def shared(side):
        calls.append(side)
        return group_pass(model, b, as_loss_fn(s), side).side

    rep = analyse_components(model, b, s, weights=WEIGHTS, method="fast", shared=shared)
    assert len(calls) == 1
    # the oracle: the reference engine, a forward and a plain autograd backward of the unit loss per component
    ref = analyse_components(model, b, s, weights=WEIGHTS, method="reference")
    assert set(rep.metrics) == set(ref.metrics)
    for k, v in ref.metrics.items():
        assert rep.metrics[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    # a row whose advantage is 0 but whose components' are not: its task gradient is 0, so no share (own pass)
    b.advantages[5] = 0.0
    again = analyse_components(model, b, s, weights=WEIGHTS, method="fast", shared=shared)
    assert len(calls) == 1
    alone = analyse_components(model, b, s, weights=WEIGHTS, method="fast")
    assert again.metrics == alone.metrics


def test_on_policy_components_equal_the_real_loss_with_component_advantages(model_tok):
    """On policy (ratio 1, no clip active) each component's gradient is the real policy loss's gradient with
    the component's advantage in place of the update's: an oracle that does not use the unit loss."""
    model, tok = model_tok
    s = SETTINGS[0]
    b = component_batch(model, tok, seed=2, noise=0.0, estimator="rloo")
    rep = analyse_components(model, b, s, weights=WEIGHTS, mode="shared_std", estimator="rloo", keep_grads=True)
    for c in WEIGHTS:
        bc = copy.copy(b)
        bc.advantages = rep.advantages[c][:, None] * b.response_mask
        expect = flat_grad(model, actor_objective(model, bc, s, Denominators.of(bc)).task)
        torch.testing.assert_close(engine_flat(rep, model, c), expect, rtol=1e-4, atol=1e-7)


def test_cosines_symmetric_self_one_and_layers_consistent(model_tok):
    model, tok = model_tok
    b = component_batch(model, tok, seed=3)
    # A duplicated component: its cosine with the original is 1.
    b.components = {**b.components, "format2": b.components["format"].clone()}
    w = {**WEIGHTS, "format": 0.2, "format2": 0.13}
    rep = analyse_components(model, b, SETTINGS[0], weights=w, mode="shared_std")
    assert rep.metrics["grad_sim/format__format2"] == pytest.approx(1.0, abs=1e-6)
    # symmetric: the same pair in the other order
    b.components = {k: b.components[k] for k in ["length", "format2", "format", "correctness"]}
    rev = analyse_components(model, b, SETTINGS[0], weights=w, mode="shared_std")
    for a_, c_ in [("correctness", "format"), ("correctness", "length"), ("format", "length")]:
        assert rev.metrics[f"grad_sim/{c_}__{a_}"] == pytest.approx(rep.metrics[f"grad_sim/{a_}__{c_}"], abs=1e-6)
    # per layer group: squared norms add up to the global one, and a layer's cosine is its own dot / norms
    glob, layers = rep.summary["global"], rep.summary["layers"]
    assert set(layers) == {"embed", "layer_0", "layer_1", "final_norm"}  # tied lm_head counts under embed
    for c in list(w) + ["total"]:
        assert sum(layers[g]["norm"][c] ** 2 for g in layers) == pytest.approx(glob["norm"][c] ** 2, rel=1e-6)
    dots = sum(layers[g]["cosine"]["correctness__length"]
               * layers[g]["norm"]["correctness"] * layers[g]["norm"]["length"] for g in layers)
    assert dots / (glob["norm"]["correctness"] * glob["norm"]["length"]) == pytest.approx(
        glob["cosine"]["correctness__length"], abs=1e-6)


def test_constant_component_has_zero_gradient_and_no_cosine(model_tok):
    model, tok = model_tok
    b = component_batch(model, tok, seed=4)
    b.components["format"] = torch.full_like(b.components["format"], 0.25)
    b.scores = sum(WEIGHTS[c] * v for c, v in b.components.items())
    b.advantages = outcome_advantages(b.scores, b.group_ids, "grpo", True)[:, None] * b.response_mask
    for method in ("fast", "reference"):
        rep = analyse_components(model, b, SETTINGS[0], weights=WEIGHTS, method=method)
        assert rep.metrics["grad_comp/format/norm"] == 0.0 and rep.metrics["grad_comp/format/share"] == 0.0
        assert "grad_sim/correctness__format" not in rep.metrics and "grad_sim/correctness__length" in rep.metrics
        assert rep.summary["global"]["cosine"]["correctness__format"] is None


def test_analysis_is_side_effect_free(model_tok):
    model, tok = model_tok
    b = component_batch(model, tok)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    rng = torch.get_rng_state()
    adv = b.advantages.clone()
    for method in ("fast", "reference"):
        analyse_components(model, b, SETTINGS[0], weights=WEIGHTS, mode="own_std", method=method)
    assert torch.equal(torch.get_rng_state(), rng) and torch.equal(b.advantages, adv)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) and torch.equal(p.grad, torch.full_like(p, 0.5)) and p.requires_grad
        p.grad = None


def test_token_varying_advantages_are_refused(model_tok):
    model, tok = model_tok
    b = component_batch(model, tok)
    b.advantages = b.advantages * torch.linspace(0.5, 1.5, b.advantages.shape[1])
    with pytest.raises(ValueError, match="constant along each response"):
        analyse_components(model, b, SETTINGS[0], weights=WEIGHTS)


# ----------------------------------------------------------------------------- background writer
def test_background_writer_survives_a_failed_write_and_reports_it(tmp_path):
    logged = []
    w = BackgroundWriter(log=logged.append)
    (tmp_path / "blocker").write_text("a file where a directory should be")
    w.submit(tmp_path / "blocker" / "x.npz", {"a/p": torch.ones(2)})
    w.submit(tmp_path / "ok.npz", {"a/p": torch.arange(3.0), "b/p": torch.zeros(2, 2)})
    failures = w.close()
    assert len(failures) == 1 and failures[0][0].endswith("x.npz")
    assert len(logged) == 1 and "x.npz" in logged[0]
    with np.load(tmp_path / "ok.npz") as z:
        assert np.array_equal(z["a/p"], np.arange(3.0, dtype=np.float32)) and z["b/p"].shape == (2, 2)
    assert w.written == [str(tmp_path / "ok.npz")]


# ----------------------------------------------------------------------------- tracking and export
def test_reader_keeps_last_line_per_step_and_skips_torn_lines(tmp_path):
    p = tmp_path / "reward_components.jsonl"
    p.write_text('{"step": 1, "v": 1}\n{"step": 2, "v": 1}\n{"step": 2, "v": 2}\n'
                 '{"step": 3, "v"\n{"step": 1, "v": 3}\n')
    assert [(r["step"], r["v"]) for r in read_reward_components(p)] == [(1, 3), (2, 2)]


SEED_STAT_KEYS = {"avg_correctness", "avg_format", "avg_length_reward", "avg_actual_length", "correct_count",
                  "format_valid_count", "total_samples"}
SEED_SAMPLE_KEYS = {"idx", "correctness", "format", "length_reward", "actual_length"}


def test_seed_layout_hand_made():
    row = {"step": 3, "timestamp": "t", "components": ["correctness", "format", "length"], "weights": WEIGHTS,
           "stats": {"correctness": {"mean": 0.5}, "format": {"mean": 0.2}, "length": {"mean": 0.7}},
           "total": {"mean": 0.4, "std": 0.1}, "num_correct": 1, "num_valid_format": 2, "mean_length": 12.5,
           "num_samples": 2, "samples": [
               {"group_id": 0, "components": {"correctness": 1.0, "format": 0.4, "length": 0.5},
                "total": 0.6, "length": 10},
               {"group_id": 0, "components": {"correctness": 0.0, "format": 0.0, "length": 0.9},
                "total": 0.3, "length": 15}]}
    out = to_seed_layout([row], {"created_at": "t"})
    step = out["steps"][0]
    assert set(step) == {"step", "timestamp", "num_samples", "statistics", "samples"}
    assert step["statistics"] == {"avg_correctness": 0.5, "avg_format": 0.2, "avg_length_reward": 0.7,
                                  "avg_actual_length": 12.5, "correct_count": 1, "format_valid_count": 2,
                                  "total_samples": 2}
    assert step["samples"][1] == {"idx": 1, "correctness": 0.0, "format": 0.0, "length_reward": 0.9,
                                  "actual_length": 15}


@pytest.fixture(scope="module")
def math_files():
    """The shipped tiny math data: verl-layout parquet for training, jsonl for validation."""
    from pathlib import Path
    data = Path(__file__).resolve().parents[1] / "data"
    return str(data / "math_verl.parquet"), str(data / "math_val.jsonl")


def _assert_component_files(run, rows: list[dict], comps: list[str]) -> None:
    """Steps 1 and 2: the component metrics, components.json and the saved gradients agree."""
    for step in (1, 2):
        d = rows[step]["data"]
        for c in comps:
            assert {f"reward/{c}/mean", f"reward/{c}/std", f"grad_comp/{c}/norm"} <= set(d)
        assert "grad_comp/total/norm" in d and d["grad_comp/save_failures"] == 0.0
        doc = json.loads((run / "analysis" / f"step_{step}" / "components.json").read_text())
        assert doc["step"] == step and doc["mode"] == "own_std" and doc["components"] == comps
        assert set(doc["global"]) == {"norm", "share", "cosine"}
        assert set(doc["global"]["cosine"]) == {"correctness__format", "correctness__length", "format__length"}
        assert doc["global"]["norm"]["total"] == pytest.approx(d["grad_comp/total/norm"])
        assert {"embed", "layer_0", "layer_1", "final_norm"} <= set(doc["layers"])
        with np.load(run / "analysis" / f"step_{step}" / "component_grads.npz") as z:
            names = {k.split("/", 1)[1] for k in z.files}
            assert {k.split("/", 1)[0] for k in z.files} == set(comps) | {"total"}
            tot = math.sqrt(sum(float((z[f"total/{n}"].astype(np.float64) ** 2).sum()) for n in names))
            assert tot == pytest.approx(d["grad_comp/total/norm"], rel=1e-5)


def _assert_export(run, tmp_path, r: dict, capsys) -> None:
    """``rlgrad export rewards``: rldynamic's layout, the default output, one-line errors."""
    assert cli_main(["export", "rewards", str(run), "--format", "json", "--output", str(tmp_path / "all.json")]) == 0
    out = json.loads((tmp_path / "all.json").read_text())
    assert set(out) == {"metadata", "steps"}
    assert {"created_at", "model", "dataset", "last_saved"} <= set(out["metadata"])
    assert [s["step"] for s in out["steps"]] == [1, 2]
    for s in out["steps"]:
        assert set(s) == {"step", "timestamp", "num_samples", "statistics", "samples"}
        assert set(s["statistics"]) == SEED_STAT_KEYS and all(set(x) == SEED_SAMPLE_KEYS for x in s["samples"])
    assert out["steps"][0]["statistics"]["avg_length_reward"] == pytest.approx(r["stats"]["length"]["mean"])
    assert out["steps"][0]["samples"][3]["actual_length"] == r["samples"][3]["length"]
    assert cli_main(["export", "rewards", str(run)]) == 0  # default output: RUN/all_rewards.json
    assert json.loads((run / "all_rewards.json").read_text())["steps"] == out["steps"]
    capsys.readouterr()
    empty = tmp_path / "empty"
    empty.mkdir()
    for bad in [tmp_path / "nope", empty]:
        assert cli_main(["export", "rewards", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(bad) in err[0]
    with pytest.raises(SystemExit) as e:  # argparse: one line, exit 2
        cli_main(["export", "rewards", str(run), "--format", "csv"])
    assert e.value.code == 2


def test_train_with_components_end_to_end_and_export(tiny, tmp_path, math_files, capsys):
    train, val = math_files
    common = [o for o in tiny if not o.startswith("trainer.default_local_dir")] + [
        "trainer.total_training_steps=2", "data.task=math", f"data.train_files=[{train}]", f"data.val_files=[{val}]",
        "reward.length_max=3", "trainer.gradient_analysis_mode=false", "trainer.test_freq=-1"]
    make_trainer(load_config(overrides=common + [f"trainer.default_local_dir={tmp_path / 'plain'}"]), **QUIET).fit()
    run = tmp_path / "comp"
    assert cli_main(["train", *common, f"trainer.default_local_dir={run}", "analysis.components_every=1",
                     "analysis.save_component_gradients=true", "analysis.components_mode=own_std"]) == 0
    # side-effect free: the same weights and metrics as a run without the instrument
    a = load_file(tmp_path / "plain" / "global_step_2" / "actor" / "model.safetensors")
    b = load_file(run / "global_step_2" / "actor" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = read_jsonl(run / "metrics.jsonl")
    plain = read_jsonl(tmp_path / "plain" / "metrics.jsonl")
    for x, y in zip(plain, rows):
        assert all(y["data"][k] == v for k, v in x["data"].items() if not k.startswith("timing_s/"))
    comps = ["correctness", "format", "length"]
    _assert_component_files(run, rows, comps)
    recs = read_reward_components(run / "reward_components.jsonl")
    assert [r["step"] for r in recs] == [1, 2]
    r = recs[0]
    assert r["components"] == comps and r["weights"] == {"correctness": 0.34, "format": 0.33, "length": 0.33}
    assert r["num_samples"] == len(r["samples"]) == 16
    totals = [s["total"] for s in r["samples"]]
    assert r["total"]["mean"] == pytest.approx(sum(totals) / 16)
    for c in comps:
        vals = [s["components"][c] for s in r["samples"]]
        assert r["stats"][c]["mean"] == pytest.approx(sum(vals) / 16) and r["stats"][c]["max"] == max(vals)
        assert rows[1]["data"][f"reward/{c}/mean"] == pytest.approx(r["stats"][c]["mean"])
        assert rows[1]["data"][f"reward/{c}/std"] == pytest.approx(float(np.std(vals)))
    assert r["num_valid_format"] == sum(s["components"]["format"] > 0 for s in r["samples"])
    assert r["num_correct"] == sum(s["components"]["correctness"] == 1.0 for s in r["samples"])
    assert r["mean_length"] == pytest.approx(sum(s["length"] for s in r["samples"]) / 16)
    for s in r["samples"]:  # the length reward is computed from the recorded length (chars, length_max 3)
        assert s["components"]["length"] == pytest.approx(max(0.0, 1 - abs(s["length"] / 3 - 1)), abs=1e-6)
        assert s["total"] == pytest.approx(sum(r["weights"][c] * s["components"][c] for c in comps), abs=1e-6)

    _assert_export(run, tmp_path, r, capsys)


def test_resume_keeps_reward_components_readable(tiny, tmp_path):
    run = tmp_path / "run"
    base = tiny + ["trainer.save_freq=1", "trainer.test_freq=-1", "trainer.gradient_analysis_mode=false",
                   "analysis.components_every=2"]
    make_trainer(load_config(overrides=base + ["trainer.total_training_steps=3"]), **QUIET).fit()
    first = read_reward_components(run / "reward_components.jsonl")
    # A crash after step 3 was logged but before its checkpoint completed, mid-way through a later append.
    (run / "global_step_3" / "COMPLETE").unlink()
    with open(run / "reward_components.jsonl", "a") as f:
        f.write('{"step": 4, "compo')
    make_trainer(load_config(overrides=base + ["trainer.total_training_steps=4"]), **QUIET).fit()
    lines = (run / "reward_components.jsonl").read_text().splitlines()
    assert len(lines) == 6  # steps 1, 2, 3, the torn fragment (ended, never rewritten), 3 again, 4
    recs = read_reward_components(run / "reward_components.jsonl")
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert recs[:3] == [{**a, "timestamp": b["timestamp"]} for a, b in zip(first, recs[:3])]  # resumed exactly
    assert (run / "analysis" / "step_3" / "components.json").exists()
    assert "grad_comp/total/norm" in read_jsonl(run / "metrics.jsonl")[3]["data"]


def test_config_cadence_and_bad_settings():
    from rlgrad.analysis import hooks_from_config
    from rlgrad.analysis.components import ComponentGeometryHook
    from rlgrad.errors import UserError

    hooks = hooks_from_config(load_config(overrides=["analysis.components_every=3"]))
    assert isinstance(hooks[0], ComponentGeometryHook)  # before the bucket analysis, which may stop the run
    assert [s for s in range(1, 11) if hooks[0].schedule.due(s)] == [1, 4, 7, 10]
    assert not any(isinstance(h, ComponentGeometryHook) for h in hooks_from_config(load_config()))
    with pytest.raises(UserError, match="components_every"):
        load_config(overrides=["analysis.components_every=-1"])
    with pytest.raises(UserError, match="components_mode"):
        load_config(overrides=["analysis.components_mode=shared"])
    with pytest.raises(UserError, match="one advantage per response"):  # GAE's advantage varies along a response
        hooks_from_config(load_config(overrides=["analysis.components_every=1", "algorithm.adv_estimator=gae"]))


def test_rlgrad_actor_loss_passed_as_a_loss_fn_gives_the_same_geometry(model_tok):
    """An ActorLoss is rlgrad's own loss: its unit loss is used, as for its LossSettings."""
    from rlgrad.algos.objective import ActorLoss

    model, tok = model_tok
    b = component_batch(model, tok)
    s = SETTINGS[0]
    a = analyse_components(model, b, s, weights=WEIGHTS).metrics
    assert analyse_components(model, b, ActorLoss(s), weights=WEIGHTS).metrics == a
    with pytest.raises(TypeError, match="per_token_loss"):
        analyse_components(model, b, lambda m, bb: {"policy": bb.response_mask}, weights=WEIGHTS)
