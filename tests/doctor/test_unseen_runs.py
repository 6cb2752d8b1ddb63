"""The wrong answers found on runs the doctor was not tuned on (issue 46), each rebuilt as a hand-made run: a
component "taking over" on one analysis step with a cosine near 0, a correctness weight of 0, dormant neurons read
on steps without a gradient, advice naming a setting the config refuses, rlgrad's setting names on TRL and verl
runs, and a reward gain within noise taken for progress."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlgrad import rundata as D
from rlgrad.config import load_config
from rlgrad.config.aliases import host_setting
from rlgrad.config.schema import flat_settings
from rlgrad.doctor import diagnose
from rlgrad.doctor.diagnose import spelled
from rlgrad.doctor.findings import View
from rlgrad.errors import UserError
from rlgrad.tasks import build_task
from tests.doctor.test_doctor import FIXTURES, healthy_series, run_of

ANALYSED = list(range(1, 37, 4))  # 9 analysis steps, as in the TRL run (examples/trl_grpo.py, 40 steps)


def found(run: D.RunData) -> dict:
    return {f.id: f for f in diagnose(run).findings}


def with_components(run: D.RunData, comp: str, rows: dict[int, tuple[float, float]], correct_varies=0.5):
    """``comp``'s share of the update and its cosine with correctness on the analysis steps (``rows``: step ->
    (share, cosine)); correctness takes the rest of the update and varies within some groups."""
    for s in ANALYSED:
        share, sim = rows.get(s, (0.2, 0.1))
        run.rows[s].update({f"grad_comp/{comp}/share": share, "grad_comp/correctness/share": 1 - share,
                            f"grad_sim/correctness__{comp}": sim,
                            "reward/correctness/frac_zero_std": correct_varies})
    return run


# ---------------------------------------------------------------- 1. one analysis step, a cosine near 0


def test_one_analysis_step_with_a_cosine_near_0_is_no_takeover():
    """The healthy TRL run: format made 65% of the update on 1 of its 9 analysis steps, with a cosine of -0.027 to
    correctness. One batch is not a pattern, and -0.027 is within the noise of a cosine (about ±1/√128 = ±0.09 for
    two unrelated advantages over the demo's 128 samples): neither component finding fires."""
    run = with_components(run_of(healthy_series()), "format", {17: (0.65, -0.027)})
    assert not {"component_takes_over", "component_dominates"} & set(found(run))
    # the same share on 3 of the 9 steps: format does make most of the update, but not against correctness
    run = with_components(run_of(healthy_series()), "format", {s: (0.65, -0.027) for s in (9, 17, 25)})
    got = found(run)
    assert "component_takes_over" not in got
    assert "above 0.5 on 3 of the 9 analysis steps where 'correctness' varied" in got["component_dominates"].evidence[0]
    # ... and with a cosine beyond noise it is a takeover, dated at its first step
    run = with_components(run_of(healthy_series()), "format", {s: (0.65, -0.3) for s in (9, 17, 25)})
    f = found(run)["component_takes_over"]
    assert f.step == 9 and "on 3 of the 9 analysis steps" in f.evidence[1] and "-0.3, -0.3, -0.3" in f.evidence[1]
    # 2 of the 9 steps: under a quarter of them (2.25), a run's chance
    run = with_components(run_of(healthy_series()), "format", {s: (0.65, -0.3) for s in (9, 17)})
    assert not {"component_takes_over", "component_dominates"} & set(found(run))


def test_a_component_finding_is_too_early_before_two_analysis_steps():
    run = run_of(healthy_series(3))
    run.rows[1] |= {"grad_comp/format/share": 0.9, "grad_comp/correctness/share": 0.1,
                    "grad_sim/correctness__format": -0.5}
    d = diagnose(run)
    assert d.too_early["component_takes_over"] == (1, 2) and d.too_early["component_dominates"] == (1, 2)


# ---------------------------------------------------------------- 2. a correctness weight of 0


def unpaid_run(**config) -> D.RunData:
    """The demo with reward.weights {correctness: 0, format: 1}: format is written on nearly every answer, so every
    advantage is 0 on most steps while correctness (weight 0) is right on about half the answers and varies."""
    s = healthy_series()
    s.update({"critic/advantages/max": [0.0] * 40, "critic/advantages/min": [0.0] * 40,
              "reward/correctness/mean": [0.48] * 40, "reward/format/mean": [1.0] * 40})
    run = run_of(s, config or {"reward": {"weights": {"correctness": 0.0, "format": 1.0}}})
    return with_components(run, "format", {s: (1.0, 0.0) for s in ANALYSED})


def test_a_correctness_weight_of_0_is_named_as_the_cause_and_format_is_never_lowered():
    got = found(unpaid_run())
    zero = got["zero_variance_groups"]
    assert "'correctness' has weight 0 (reward.weights.correctness)" in zero.explanation
    assert "always right or always wrong" not in zero.explanation and "rollout.n" not in zero.action
    assert zero.action == "Give 'correctness' a positive weight (reward.weights.correctness, now 0)."
    dom = got["component_dominates"]
    assert "'correctness' has weight 0" in dom.title
    assert "give 'correctness' a positive weight (reward.weights.correctness, now 0)" in dom.action.lower()
    for f in got.values():  # lowering format's weight would make the reward identically 0
        assert "Lower the weight of 'format'" not in f.action, (f.id, f.action)


def test_a_trl_run_with_reward_weights_0_1_is_not_blamed_on_the_group_size(tmp_path):
    """TRL with reward_weights=[0, 1]: the weights come from rlgrad's TRL integration's reward_components.jsonl."""
    (tmp_path / "reward_components.jsonl").write_text(json.dumps({
        "step": 1, "components": ["correct_answer", "fmt"], "weights": {"correct_answer": 0.0, "fmt": 1.0},
        "stats": {"correct_answer": {"mean": 0.48}, "fmt": {"mean": 1.0}}}) + "\n")
    s = healthy_series(20)
    s.update({"critic/score/frac_zero_std": [1.0] * 20, "critic/score/mean": [1.0] * 20,
              "reward/correct_answer/mean": [0.48] * 20, "reward/fmt/mean": [1.0] * 20})
    run = run_of(s)
    run.kind, run.run_dir, run.labels = "trl", tmp_path, {"correct_answer": "correct-answer"}
    zero = found(run)["zero_variance_groups"]
    assert "'correct-answer' has weight 0 (reward_weights (the entry of 'correct_answer'))" in zero.explanation
    assert "Sample more" not in zero.action and "num_generations" not in zero.action
    assert zero.action.startswith("Give 'correct-answer' a positive weight (reward_weights")


# ---------------------------------------------------------------- 3. dormant neurons on steps without a gradient


def test_dormant_neurons_on_a_step_without_a_gradient_are_left_out():
    """Every advantage 0 at step 21: the gradient is exactly 0 and every unit reads dormant (1.0). That step says
    nothing of the network; without it the dormant ratio holds (0.02 → 0.03)."""
    s = healthy_series()
    s["critic/advantages/max"] = [1.0] * 40
    s["critic/advantages/min"] = [-1.0] * 40
    s["critic/advantages/max"][20] = s["critic/advantages/min"][20] = 0.0  # step 21
    run = run_of(s)
    for step, ratio in ((1, 0.02), (11, 0.03), (21, 1.0)):
        run.rows[step]["actor/neuron/dormant_ratio"] = ratio
    assert "dormant_growing" not in found(run)
    for step in (31, 35):  # a real rise, on two steps with a gradient
        run.rows[step] |= {"actor/neuron/dormant_ratio": 0.3}
    f = found(run)["dormant_growing"]
    assert f.evidence[0] == ("actor/neuron/dormant_ratio 0.02 (step 1) → 0.3 (step 35); 1 step(s) without a task "
                             "gradient left out")
    run = run_of(healthy_series(20))  # TRL: every group without variance (frac_reward_zero_std 1)
    run.kind = "trl"
    for step, ratio, frac in ((1, 0.02, 0.5), (11, 1.0, 1.0)):
        run.rows[step] |= {"actor/neuron/dormant_ratio": ratio, "critic/score/frac_zero_std": frac}
    assert "dormant_growing" not in found(run)


# ---------------------------------------------------------------- 4. advice names a setting the config takes


def overlong_run() -> D.RunData:
    """DAPO's overlong penalty (a component of rlgrad's reward, not of the task's) outweighs correctness."""
    run = run_of(healthy_series(), {"reward": {"weights": {"correctness": 1.0, "format": 0.1}},
                                    "data": {"task": "arithmetic"}})
    return with_components(run, "overlong", {s: (0.9, -0.4) for s in ANALYSED})


def test_an_overlong_penalty_is_lowered_by_its_penalty_factor_not_reward_weights():
    got = found(overlong_run())
    for fid in ("component_takes_over", "component_dominates"):
        assert "reward.overlong_buffer.penalty_factor" in got[fid].action and "reward.weights" not in got[fid].action
    with pytest.raises(UserError, match="no reward component 'overlong'"):  # what the advice used to name
        build_task("arithmetic", weights={"overlong": 0.5})


SETTING = re.compile(r"(?<![\w/.])([a-z_]+(?:\.[a-z_0-9]+)+)(?:=([\w.+-]+))?")


def advised_settings(text: str, sections: set[str]) -> set[tuple[str, str]]:
    """(key, value written or '') of every dotted name in ``text`` that starts with a config section."""
    return {(k, v) for k, v in SETTING.findall(text) if k.split(".")[0] in sections}


def test_every_setting_the_advice_names_is_accepted_by_the_config_loader():
    """Every dotted setting any finding's advice names, on every recorded rlgrad run and on the hand-made runs
    above, loads: a leaf with the value the advice writes (else its default), a section as a prefix of settings,
    ``reward.weights.<c>`` for a component the task (the demo's arithmetic) has."""
    flat = flat_settings(load_config("demo"))
    sections = {k.split(".")[0] for k in flat}
    runs = [D.load_any(p) for p in sorted(FIXTURES.iterdir()) if p.is_dir() and (p / "config.yaml").exists()]
    runs += [overlong_run(), unpaid_run()]
    named = {kv for run in runs for f in diagnose(run).findings for kv in advised_settings(f.action, sections)}
    assert {"reward.overlong_buffer.penalty_factor", "reward.weights.correctness", "actor.entropy_coeff"} <= {
        k for k, _ in named}, named
    # "Lower the weight of 'c' (reward.weights)": c must be a component reward.weights takes
    named |= {(f"reward.weights.{c}", "") for run in runs for f in diagnose(run).findings
              for c in re.findall(r"weight of '([^']+)' \(reward\.weights\)", f.action)}
    for k, v in sorted(named):
        if k in flat:
            value = v or json.dumps(flat[k])
            load_config("demo", overrides=[f"{k}={value}"])
        elif k.startswith("reward.weights."):  # the config takes any name; the task refuses one it lacks
            build_task("arithmetic", weights={k.split(".")[2]: 0.5})
        else:
            assert any(f.startswith(k + ".") for f in flat), f"advice names '{k}', which is no setting"


# ---------------------------------------------------------------- 5. the host's own setting names


@pytest.mark.parametrize("host,names", [
    ("rlgrad", ("rollout.n", "reward.weights", "kl_loss_coef", "actor.use_kl_loss=false")),
    ("trl", ("num_generations", "reward_weights", "beta", "beta=0")),
    ("verl", ("actor_rollout_ref.rollout.n", "reward.weights", "kl_loss_coef",
              "actor_rollout_ref.actor.use_kl_loss=false")),
])
def test_advice_names_settings_as_the_runs_own_trainer_takes_them(host, names):
    n, weights, kl, no_kl = names
    s = healthy_series()
    s["critic/score/frac_zero_std"] = [0.9] * 40  # groups split into always right and always wrong: more samples
    s["reward/correctness/mean"] = [0.5] * 40
    run = with_components(run_of(s), "format", {s: (0.9, 0.3) for s in ANALYSED})
    run.kind = host
    for step in ANALYSED:
        run.rows[step] |= {"grad_norm/all/task": 0.1, "grad_norm/all/kl": 0.4}
    got = found(run)
    zero, reg = got["zero_variance_groups"].action, got["regularizer_dominates"].action
    assert f"Sample more per prompt ({n})" in zero
    # both defer to zero_variance_groups ("Act on ... first: ... lower the weight ...")
    assert f"lower the weight of 'format' ({weights})" in got["component_dominates"].action.lower()
    assert f"lower {kl} by about the ratio shown (or drop the kl loss: {no_kl})" in reg.lower()
    if host == "trl":
        assert "rollout.n" not in zero and "kl_loss_coef" not in reg and "use_kl_loss" not in reg


def test_host_setting_maps_keys_entries_and_settings_trl_lacks():
    assert host_setting("rollout.n", "trl") == "num_generations"
    assert host_setting("reward.weights.format", "trl") == "reward_weights (the entry of 'format')"
    assert host_setting("actor.optim.lr_warmup_steps", "trl") == "warmup_steps"
    assert host_setting("reward.overlong_buffer.penalty_factor", "trl") == (
        "reward.overlong_buffer.penalty_factor (rlgrad's setting; TRL has none)")
    assert host_setting("rollout.response_length", "verl") == "data.max_response_length"
    assert host_setting("actor.max_grad_norm", "verl") == "actor_rollout_ref.actor.grad_clip"
    assert host_setting("reward.overlong_buffer.len", "verl") == "reward_model.overlong_buffer.len"
    assert host_setting("analysis.neurons.actor.reset_every", "verl") == (
        "+actor_rollout_ref.rlgrad.analysis.neurons.actor.reset_every")
    assert host_setting("algorithm.norm_adv_by_std_in_grpo=false", "rlgrad") == (
        "algorithm.norm_adv_by_std_in_grpo=false")


def test_a_setting_in_a_sentence_is_the_hosts_short_name():
    run = run_of(healthy_series(3))
    short = {}
    for host in ("rlgrad", "trl", "verl"):
        run.kind = host
        short[host] = [View(run).setting(k, short=True) for k in ("actor.max_grad_norm", "actor.kl_loss_coef")]
    assert short == {"rlgrad": ["max_grad_norm", "kl_loss_coef"], "trl": ["max_grad_norm", "beta"],
                     "verl": ["grad_clip", "kl_loss_coef"]}
    run.kind = "trl"
    assert View(run).setting("actor.ppo_mini_batch_size", short=True) == (
        "actor.ppo_mini_batch_size (rlgrad's setting; TRL has none)")


def test_explain_says_the_update_size_is_the_rlgrad_loops_not_an_integration_to_add():
    """A run of rlgrad's TRL integration lacks actor/update_ratio: rlgrad's trainer loop logs it, not an instrument
    the integration could turn on."""
    run = run_of(healthy_series(5))
    run.kind = "trl"
    v = View(run)
    assert spelled(v, "actor/update_ratio") == ("actor/update_ratio (rlgrad train's own loop logs it; the trl run's "
                                                "trainer does not, with or without rlgrad's integration)")
    assert "rlgrad.integrations.trl" in spelled(v, "actor/neuron/dormant_ratio")
    assert "update_too_large" in diagnose(run).missing


# ---------------------------------------------------------------- 6. a reward gain within noise


def slow_run(rise: float) -> D.RunData:
    """lr 1e-5 on the demo: updates of 7e-5 of the weights' norm (under update_low 2e-4) for 60 steps, the reward
    0.5 ± 0.05 from step to step, rising by ``rise`` over the run."""
    s = healthy_series(60)
    s["actor/update_ratio"] = [7e-5] * 60
    s["critic/score/mean"] = [0.5 + rise * i / 59 + (0.05 if i % 2 else -0.05) for i in range(60)]
    return run_of(s, {"actor": {"optim": {"lr": 1e-5}}})


def test_a_reward_gain_within_noise_does_not_switch_lr_too_small_off():
    """The first 10 steps' mean 0.5 + 0.045·4.5/59 = 0.5034, the last 10's 0.5 + 0.045·54.5/59 = 0.5416: a rise of
    0.0381, 7.7% of the room to 1 (over the 5% that used to switch the finding off). The step-to-step |Δ| is
    0.1 ± 0.045/59, median 0.10076, a noise of 0.10076/0.954 = 0.1056, so the rise's standard error is
    0.1056·√(2/10) = 0.0472; 2 of them (0.094) exceed the rise: within noise, the finding stays."""
    f = found(slow_run(0.045))["lr_too_small"]
    assert "7.68% of its room to 1, within noise (a rise of 0.0381 against a standard error of 0.0472)" in \
        f.evidence[1], f.evidence
    assert "lr_too_small" not in found(slow_run(0.3))  # a real gain: 0.3 over the run, beyond noise


# ---------------------------------------------------------------- every threshold says where it came from


def test_every_threshold_says_where_it_came_from_in_the_generated_table():
    from dataclasses import fields

    from rlgrad.doctor.findings import THRESHOLD_SOURCES, THRESHOLDS_END, THRESHOLDS_START, Thresholds, thresholds_table

    assert list(THRESHOLD_SOURCES) == [f.name for f in fields(Thresholds)]
    table = thresholds_table()
    page = (Path(__file__).resolve().parents[2] / "docs" / "doctor.md").read_text()
    assert page.split(THRESHOLDS_START)[1].split(THRESHOLDS_END)[0] == "\n" + table + "\n"
    for name, source in THRESHOLD_SOURCES.items():
        assert f"| `{name}` | {getattr(Thresholds(), name):g} | {source} |" in table
    assert "issue 46" in THRESHOLD_SOURCES["sim_negative"] and "in-sample" in THRESHOLD_SOURCES["component_steps"]
