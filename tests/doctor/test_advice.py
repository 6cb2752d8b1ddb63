"""The doctor's advice, checked by doing what it claims: clipping on every step under Adam and under SGD (a tiny
model trained both ways), an entropy term's advice by the sign of its coefficient, and the cause a collapse is
blamed on."""

from __future__ import annotations

import math
import re

import torch

from rlgrad import rundata as D
from rlgrad.doctor import diagnose
from tests.doctor.test_doctor import fixture, healthy_series, run_of

STEPS = 20


def train(optimizer: str, lr: float, clip: float | None) -> tuple[torch.Tensor, list[float]]:
    """A tiny classifier trained ``STEPS`` full-batch steps from one seed: (its total weight change, the gradient
    norm before clipping at each step, as trainers log it)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    opt = (torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0) if optimizer == "adamw"
           else torch.optim.SGD(model.parameters(), lr=lr))
    norms = []
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip else math.inf)))
        opt.step()
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach() - before, norms


def compare(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(cosine, ‖a‖/‖b‖) of two weight changes."""
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0)), float(a.norm() / b.norm())


def clip_finding(norms: list[float], config: dict):
    s = healthy_series(len(norms))
    s["actor/grad_norm"] = norms
    return next(f for f in diagnose(run_of(s, config)).findings if f.id == "clip_every_step")


CLIP = 1e-3


def test_clipping_every_step_under_adam_leaves_the_update_and_the_doctor_says_so():
    clipped, norms = train("adamw", 1e-2, CLIP)
    free, _ = train("adamw", 1e-2, None)
    assert min(norms) > 100 * CLIP  # every step clipped, by a factor below 0.01
    cos, ratio = compare(clipped, free)
    assert cos > 0.99 and 0.9 < ratio < 1.1, (cos, ratio)  # Adam: the same update, clip or not
    f = clip_finding(norms, {"actor": {"optim": {"lr": 1e-2, "optimizer": "AdamW"}, "max_grad_norm": CLIP}})
    assert f.severity == "info" and "unchanged up to ε" in f.explanation
    assert "effective learning rate" not in f.explanation and "do not raise the learning rate" in f.action


def test_clipping_every_step_under_sgd_scales_the_learning_rate_as_the_doctor_says():
    lr = 0.5
    clipped, norms = train("sgd", lr, CLIP)
    free, _ = train("sgd", lr, None)
    f = clip_finding(norms, {"optim": "sgd", "learning_rate": lr, "max_grad_norm": CLIP})
    assert f.severity == "warn"
    eff = float(re.search(r"effective learning rate of about lr × [0-9.e-]+ = ([0-9.e-]+)", f.explanation)[1])
    # the claim: the clipped run moves like an unclipped one at the effective learning rate ...
    at_eff, _ = train("sgd", eff, None)
    cos, ratio = compare(clipped, at_eff)
    assert cos > 0.99 and 0.8 < ratio < 1.25, (cos, ratio)
    # ... and far less than at its own learning rate
    assert compare(clipped, free)[1] < 0.05


def test_the_optimizer_comes_from_the_config_or_the_trainers_default():
    norms = [0.5] * 20
    trl = run_of({**healthy_series(20), "actor/grad_norm": norms})
    trl.kind, trl.settings = "trl", {"max_grad_norm": CLIP, "learning_rate": 1e-6}
    f = next(f for f in diagnose(trl).findings if f.id == "clip_every_step")
    assert "adamw_torch (TRL's default optim" in f.explanation and f.severity == "info"
    trl.settings["optim"] = "sgd"
    f = next(f for f in diagnose(trl).findings if f.id == "clip_every_step")
    assert "effective learning rate" in f.explanation and f.severity == "warn"
    unknown = clip_finding(norms, {"max_grad_norm": CLIP})  # no optimizer named, no trainer known: both cases
    assert "does not name" in unknown.explanation and "SGD" in unknown.explanation and "Adam" in unknown.explanation
    # a clip factor that varies a lot reweights Adam's steps: a warning
    jumpy = clip_finding([0.05, 5.0] * 10, {"actor": {"optim": {"lr": 1e-4}, "max_grad_norm": CLIP}})
    assert jumpy.severity == "warn" and "varies a lot" in jumpy.explanation


def test_the_recorded_adam_run_clipped_at_0_001_learns_like_the_healthy_one():
    """The fixture the finding is tested on: AdamW clipped on every step at 0.001 against the same demo unclipped."""
    clipped, healthy = D.load_any(fixture("tiny_grad_clip")), D.load_any(fixture("healthy"))
    acc = {n: D.series(r, "val/accuracy")[1] for n, r in (("clipped", clipped), ("healthy", healthy))}
    assert acc["clipped"][0] == acc["healthy"][0] and abs(acc["clipped"][-1] - acc["healthy"][-1]) < 0.05, acc
    f = next(f for f in diagnose(clipped).findings if f.id == "clip_every_step")
    assert f.severity == "info" and "AdamW" in f.explanation


def entropy_run(coef: float, entropy: list[float], update: float = 2e-3) -> D.RunData:
    """A run whose reward collapses at step 10 while the entropy term's gradient is twice the task's on every
    analysis step (every 4th), its entropy coefficient ``coef``."""
    n = len(entropy)
    s = healthy_series(n)
    s["critic/score/mean"] = [0.6] * 9 + [0.1] * (n - 9)
    s["actor/entropy"] = entropy
    s["actor/update_ratio"] = [update] * n
    run = run_of(s, {"actor": {"optim": {"lr": 1e-4}, "entropy_coeff": coef}})
    for step in range(1, n + 1, 4):
        run.rows[step] |= {"grad_norm/all/task": 0.5, "grad_norm/all/entropy": 1.0}
    return run


def finding(run: D.RunData, fid: str):
    return next(f for f in diagnose(run).findings if f.id == fid)


def test_an_entropy_penalty_is_told_to_move_toward_0_and_the_collapse_is_not_blamed_on_the_learning_rate():
    run = entropy_run(-0.5, [1.5 - 0.05 * i for i in range(24)])
    reg, collapse = finding(run, "regularizer_dominates"), finding(run, "reward_collapse")
    assert "toward determinism" in reg.explanation and "randomness" not in reg.explanation
    assert reg.action.startswith("Set actor.entropy_coeff to 0") and "Lower entropy_coeff" not in reg.action
    assert "entropy penalty (entropy_coeff -0.5) drove it" in collapse.explanation
    assert "learning rate is not the cause" in collapse.explanation
    assert "learning rate" not in collapse.action.split("If it persists after that:")[-1]
    assert "toward 0, do not lower it" in collapse.action
    assert collapse.cause == "regularizer_dominates"


def test_an_entropy_bonus_is_told_to_come_down_and_so_is_the_collapse_it_drives():
    run = entropy_run(0.5, [1.5 + 0.05 * i for i in range(24)])
    reg, collapse = finding(run, "regularizer_dominates"), finding(run, "reward_collapse")
    assert "toward randomness" in reg.explanation and reg.action.startswith("Lower entropy_coeff (toward 0)")
    assert "entropy bonus (entropy_coeff 0.5) drove it" in collapse.explanation
    assert "lower actor.entropy_coeff toward 0" in collapse.action.lower()


def test_a_collapse_blames_the_learning_rate_only_on_the_evidence():
    s = healthy_series(24)
    s["critic/score/mean"] = [0.6] * 9 + [0.1] * 15
    s["actor/update_ratio"] = [0.05] * 24  # each step moves the weights by 5% of their norm
    big = finding(run_of(s, {"actor": {"optim": {"lr": 3e-3}}}), "reward_collapse")
    assert "too large (the update size)" in big.explanation and "lower the learning rate (now 0.003)" in big.action
    assert big.cause == "update_too_large"
    s["actor/update_ratio"] = [1e-3] * 24  # a normal update size, no entropy term: not the learning rate
    normal = finding(run_of(s, {"actor": {"optim": {"lr": 1e-4}}}), "reward_collapse")
    assert "Neither the update size nor an entropy term" in normal.explanation
    assert "learning rate" not in normal.action.replace("before changing the learning rate", "")


def test_the_recorded_entropy_penalty_collapse_names_the_penalty_not_the_learning_rate():
    d = diagnose(D.load_any(fixture("entropy_penalty")))
    collapse = next(f for f in d.findings if f.id == "reward_collapse")
    assert "entropy penalty" in collapse.explanation and "Lower the learning rate" not in collapse.action


# ---------------------------------------------------------------- competing causes (issue 33, item 6)


def kl_run(update: float | None, config: dict) -> D.RunData:
    """A KL loss that grows 100-fold over 24 steps; the update size ``update`` (None: not logged)."""
    s = healthy_series(24)
    s["actor/kl_loss"] = [0.02 * 1.25 ** i for i in range(24)]
    if update is not None:
        s["actor/update_ratio"] = [update] * 24
    return run_of(s, config)


def test_a_kl_blowup_blames_the_learning_rate_only_at_a_large_update_size():
    cfg = {"actor": {"optim": {"lr": 3e-3}, "kl_loss_coef": 1.0, "kl_loss_type": "mse"}}
    large = finding(kl_run(0.03, cfg), "kl_blowup")
    assert "lower the learning rate (now 0.003) about 30-fold" in large.action.lower()
    assert large.cause == "update_too_large"  # which says the same: the update size ranks first
    assert "coefficient is not the cause" in large.explanation and "kl_loss_coef" not in large.action
    normal = finding(kl_run(5e-4, cfg), "kl_blowup")
    assert normal.action.startswith("Lower kl_loss_coef or use kl_loss_type=low_var_kl")
    assert "not the learning rate" in normal.explanation and "learning rate" not in normal.action
    cfg["actor"]["kl_loss_type"] = "low_var_kl"  # already the bounded estimator: not advised again
    assert "low_var_kl" not in finding(kl_run(5e-4, cfg), "kl_blowup").action
    unknown = finding(kl_run(None, cfg), "kl_blowup")  # no update size: both, and why it cannot tell
    assert "learning rate" in unknown.action and "kl_loss_coef" in unknown.action and "to tell which" in \
        unknown.explanation


def test_a_kl_term_dominating_under_too_large_steps_is_their_symptom_not_its_coefficients():
    run = kl_run(0.03, {"actor": {"optim": {"lr": 3e-3}, "kl_loss_coef": 0.5}})
    for step in (1, 11, 21):
        run.rows[step].update({"grad_norm/all/task": 0.1, "grad_norm/all/kl": 0.4})
    reg = finding(run, "regularizer_dominates")
    assert "ran away" in reg.title and "leave kl_loss_coef" in reg.action and "Lower the learning rate" in reg.action
    assert "Lower kl_loss_coef" not in reg.action
    for s in run.rows.values():  # a normal update size: the coefficient is to blame
        s["actor/update_ratio"] = 5e-4
    assert finding(run, "regularizer_dominates").action.startswith("Lower kl_loss_coef")


def entropy_collapse_run(coef: float | None, update: float) -> D.RunData:
    s = healthy_series(24)
    s["actor/entropy"] = [1.5 * 0.8 ** i for i in range(24)]
    s["actor/update_ratio"] = [update] * 24
    return run_of(s, {"actor": {"optim": {"lr": 1e-4}, **({"entropy_coeff": coef} if coef is not None else {})}})


def test_entropy_collapse_advice_by_the_cause_and_the_sign_of_the_coefficient():
    penalty = finding(entropy_collapse_run(-0.5, 5e-4), "entropy_collapse")
    assert "bring it toward 0, do not lower it" in penalty.action and "bonus (entropy_coeff > 0)" not in penalty.action
    large = finding(entropy_collapse_run(0.0, 0.03), "entropy_collapse")
    assert "lower the learning rate (now 0.0001)" in large.action.lower()
    bonus = finding(entropy_collapse_run(0.01, 5e-4), "entropy_collapse")
    assert "raise the entropy bonus a little (entropy_coeff, now 0.01)" in bonus.action
    assert "learning rate" not in bonus.action and "not the first suspect" in bonus.explanation
    unset = finding(entropy_collapse_run(None, 5e-4), "entropy_collapse")
    assert "add a small entropy bonus (entropy_coeff > 0)" in unset.action


def clipfrac_run(update: float, actor: dict) -> D.RunData:
    s = healthy_series(20)
    s["actor/pg_clipfrac"] = [0.6] * 20
    s["actor/update_ratio"] = [update] * 20
    return run_of(s, {"actor": {"optim": {"lr": 1e-4}, **actor}, "data": {"train_batch_size": 16}})


def test_a_saturated_clip_names_the_cause_the_run_supports():
    large = finding(clipfrac_run(0.03, {"ppo_epochs": 1}), "clipfrac_saturated")
    assert "lower the learning rate (now 0.0001)" in large.action.lower() and "old_log_probs" not in large.action
    many = finding(clipfrac_run(5e-4, {"ppo_epochs": 4, "ppo_mini_batch_size": 4}), "clipfrac_saturated")
    assert "16 optimizer steps" in many.explanation and many.action.startswith("Take fewer optimizer steps")
    one = finding(clipfrac_run(5e-4, {"ppo_epochs": 1}), "clipfrac_saturated")
    assert "old log-probs are probably not the sampling policy's" in one.explanation
    assert one.action.startswith("Check where old_log_probs come from")
    narrow = finding(clipfrac_run(5e-4, {"ppo_epochs": 4, "ppo_mini_batch_size": 4, "clip_ratio_low": 0.02,
                                         "clip_ratio_high": 0.28}), "clipfrac_saturated")
    assert "the clip range is narrow (±0.02" in narrow.explanation and narrow.action.startswith("Widen the clip range")
    # verl's symmetric actor.clip_ratio; a narrow range under one step a batch is not the cause (the ratio starts at 1)
    verl = finding(clipfrac_run(5e-4, {"ppo_epochs": 2, "clip_ratio": 0.05}), "clipfrac_saturated")
    assert verl.action.startswith("Widen the clip range")
    one_narrow = finding(clipfrac_run(5e-4, {"ppo_epochs": 1, "clip_ratio_low": 0.02}), "clipfrac_saturated")
    assert one_narrow.action.startswith("Check where old_log_probs come from")


def silent_correctness(run: D.RunData, steps) -> D.RunData:
    for s in steps:
        run.rows[s].update({"reward/correctness/frac_zero_std": 1.0})
    return run


def test_a_component_dominating_where_correctness_is_silent_is_not_blamed_on_its_weight():
    run = run_of(healthy_series(), {"reward": {"weights": {"correctness": 0.9, "format": 0.1}}})
    for s in (1, 11, 21):
        run.rows[s].update({"grad_comp/format/share": 0.9, "grad_comp/correctness/share": 0.1,
                            "grad_sim/correctness__format": -0.3, "reward/correctness/frac_zero_std": 0.5})
    assert finding(run, "component_dominates").severity == "warn"
    assert finding(run, "component_takes_over").severity == "warn"
    silent_correctness(run, (1, 11, 21))  # no group's correctness varied there: format was all there was
    f = finding(run, "component_dominates")
    assert f.severity == "info" and "weight is not the cause" in f.explanation
    assert "component_takes_over" not in [g.id for g in diagnose(run).findings]
    recorded = finding(D.load_any(fixture("weak_start")), "component_dominates")  # the weak model's steps 9 and 13
    assert recorded.severity == "info" and recorded.step == 9


def test_format_rising_while_correctness_has_no_signal_is_not_blamed_on_the_weight():
    s = healthy_series(20)
    s["reward/format/mean"] = [0.2 + 0.03 * i for i in range(20)]
    s["reward/correctness/mean"] = [0.0] * 20
    run = run_of(s)
    assert finding(run, "format_over_correct").severity == "warn"
    silent_correctness(run, range(1, 21))
    f = finding(run, "format_over_correct")
    assert f.severity == "info" and "Make the task easier" in f.action and "Lower the weight" not in f.action


def test_a_validation_dip_within_the_validation_sets_own_noise_is_not_a_fall():
    """healthy_seed3's validation (128 prompts) dips from 0.852 to 0.797 and recovers: twice the binomial std of
    0.852 over 128 prompts is 2·√(0.852·0.148/128) = 0.0628, more than the dip; over 10 000 prompts it is 0.007."""
    s = healthy_series(24)
    s["val/accuracy"] = [0.46] * 8 + [0.852] * 8 + [0.797] * 8
    assert "val_falls_train_rises" not in [f.id for f in diagnose(run_of(s, {"data": {"val_size": 128}})).findings]
    f = finding(run_of(s, {"data": {"val_size": 10000}}), "val_falls_train_rises")
    assert "down more than 0.05" in f.evidence[0]
    s["val/accuracy"] = [0.46] * 8 + [0.852] * 8 + [0.75] * 8  # 0.102 down: more than the noise of 128 prompts
    f = finding(run_of(s, {"data": {"val_size": 128}}), "val_falls_train_rises")
    assert "down more than 0.0628 (twice the chance variation over 128 validation prompts)" in f.evidence[0]


def test_two_noisy_early_steps_of_agreeing_groups_are_not_a_zero_variance_finding():
    """healthy_seed3's first steps: 4, 9, 13, 14 of 16 groups without variance. The median of the last steps
    (0.69 at step 4) stays under 75%; a run whose groups agree on most steps is found."""
    s = healthy_series(4)
    s["critic/score/frac_zero_std"] = [4 / 16, 9 / 16, 13 / 16, 14 / 16]
    assert "zero_variance_groups" not in [f.id for f in diagnose(run_of(s)).findings]
    s["critic/score/frac_zero_std"] = [4 / 16, 13 / 16, 13 / 16, 14 / 16]
    f = finding(run_of(s), "zero_variance_groups")
    assert f.severity == "warn" and "median of the last 4 steps" in f.evidence[0] and f.step == 2


def test_a_dominating_penalty_is_brought_toward_0_not_lowered():
    run = run_of(healthy_series(), {"reward": {"weights": {"correctness": 0.5, "format": -0.5}}})
    for s in (1, 11, 21):
        run.rows[s].update({"grad_comp/format/share": 0.9, "grad_comp/correctness/share": 0.1,
                            "grad_sim/correctness__format": -0.3})
    for fid in ("component_dominates", "component_takes_over"):
        f = finding(run, fid)
        assert "Bring the weight of 'format' toward 0 (reward.weights.format, now -0.5" in f.action
        assert "Lower the weight" not in f.action
    run.config = {"reward": {"weights": {"correctness": 0.5, "format": 0.5}}}
    assert finding(run, "component_dominates").action.startswith("Lower the weight of 'format' (reward.weights)")
