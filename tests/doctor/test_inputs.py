"""The doctor reads other trainers' logs under their own names (``rlgrad.metrics.FOREIGN_NAMES``) and names what it
lacks in them; a TRL run with no learning signal is never called healthy."""

from __future__ import annotations

import json

import pytest

from rlgrad import rundata as D
from rlgrad.doctor import diagnose, render_text
from rlgrad.doctor.command import doctor_command
from rlgrad.errors import UserError
from rlgrad.metrics import FOREIGN_NAMES, TRL_NAMES, foreign_key, match, own_key

# What TRL 1.16's GRPOTrainer logs at a step of a run whose every reward is 0 (rewards/<f>/std and reward_std
# included), as trainer_state.json's log_history holds it.
ZERO = {"reward": 0.0, "reward_std": 0.0, "rewards/correct/mean": 0.0, "rewards/correct/std": 0.0, "grad_norm": 0.0,
        "learning_rate": 1e-6, "loss": 0.0, "entropy": 2.1, "completions/mean_length": 8.0,
        "completions/clipped_ratio": 0.1, "clip_ratio/region_mean": 0.0, "clip_ratio/low_mean": 0.0,
        "clip_ratio/high_mean": 0.0, "policy_loss": 0.0, "num_tokens": 100.0, "step_time": 0.5}


def trl_state(tmp_path, with_fraction: bool):
    rows = [{**ZERO, "step": s, **({"frac_reward_zero_std": 1.0} if with_fraction else {})} for s in range(1, 7)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": rows}))
    return tmp_path


@pytest.mark.parametrize("with_fraction", [True, False])
def test_a_trl_run_where_every_reward_is_0_gets_zero_variance_groups_not_healthy(tmp_path, with_fraction):
    """TRL 1.16 logs frac_reward_zero_std; without it (an older TRL) reward_std = 0 says the same."""
    d = diagnose(D.load_any(trl_state(tmp_path, with_fraction)))
    ids = [f.id for f in d.findings]
    assert ids[0] == "zero_variance_groups" and d.findings[0].severity == "critical" and "healthy" not in ids
    assert "too hard" in d.findings[0].explanation
    assert doctor_command(str(tmp_path)) == 1  # the exit status of rlgrad doctor


def test_an_rlgrad_trl_run_with_zero_rewards_and_zero_bucket_gradients_is_critical(tmp_path):
    """The run of issue 33: rlgrad's TRL integration's files (run_source.json, TRL's scalars under rlgrad's names,
    the bucket analysis) where rewards, grad_norm and every bucket's task gradient are 0 at steps 1, 3, 5."""
    lines = []
    for s in range(1, 6):
        data = {"critic/score/mean": 0.0, "actor/grad_norm": 0.0, "actor/lr": 1e-6}
        if s % 2:
            data |= {"grad_norm/all/task": 0.0, "grad_norm/bucket_1/task": 0.0, "grad_norm/bucket_2/task": 0.0}
        lines.append(json.dumps({"step": s, "data": data}))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "run_source.json").write_text(json.dumps({"trainer": "trl", "reward_names": {}}))
    d = diagnose(D.load_any(tmp_path))
    f = d.findings[0]
    assert f.id == "zero_variance_groups" and f.severity == "critical" and "healthy" not in [g.id for g in d.findings]
    assert "task gradient 0 in every bucket" in f.evidence[0] and "on 3 of 3 steps" in f.evidence[0]


def test_every_trl_name_maps_to_a_catalogued_key_and_back():
    for source, table in FOREIGN_NAMES.items():
        for theirs, ours in table.items():
            assert match(ours) is not None, (source, ours)
            assert foreign_key(theirs, source) == ours and foreign_key(f"train/{theirs}", source) == ours
            assert foreign_key(own_key(ours, source), source) == ours  # the name quoted back reads as the same key
    assert foreign_key("rewards/my-rm.v2/std", "trl") == "reward/my_rm_v2/std"
    assert own_key("reward/my_rm_v2/std", "trl", {"my_rm_v2": "my-rm.v2"}) == "rewards/my-rm.v2/std"
    assert TRL_NAMES["frac_reward_zero_std"] == "critic/score/frac_zero_std"
    assert own_key("actor/pg_clipfrac", "trl") == "clip_ratio/region_mean"


def test_verls_log_of_an_rlgrad_launch_reads_the_instruments_metrics(tmp_path):
    """verl's trainer logs the metrics of rlgrad's actor worker ``actor/``-prefixed (verl's ``rename_dict``): read
    from verl's file logger they are rlgrad's keys again, so the gradient-level signatures run on it; verl's own
    ``actor/`` metrics (catalogued as they are) keep their names."""
    assert foreign_key("actor/grad_norm/all/task", "verl") == "grad_norm/all/task"
    assert foreign_key("actor/critic/score/mean", "verl") == "critic/score/mean"
    for own in ("actor/entropy", "actor/grad_norm", "actor/loss/policy", "actor/neuron/dormant_ratio", "actor/kl_coef"):
        assert foreign_key(own, "verl") == own
    lines = []
    for s in range(1, 6):
        data = {"critic/score/mean": 0.0, "actor/critic/score/mean": 0.0, "actor/grad_norm": 0.0, "actor/lr": 1e-6}
        if s % 2:
            data |= {"actor/grad_norm/all/task": 0.0, "actor/grad_norm/bucket_1/task": 0.0,
                     "actor/grad_norm/bucket_2/task": 0.0}
        lines.append(json.dumps({"step": s, "data": data}))
    (tmp_path / "launch.jsonl").write_text("\n".join(lines) + "\n")
    run = D.load_any(tmp_path / "launch.jsonl")
    assert run.kind == "verl" and run.rows[3]["grad_norm/bucket_2/task"] == 0.0
    f = diagnose(run).findings[0]
    assert (f.id, f.severity) == ("zero_variance_groups", "critical")
    assert "task gradient 0 in every bucket" in f.evidence[0] and "on 3 of 3 steps" in f.evidence[0]


def test_explain_names_the_missing_metrics_in_the_sources_own_spelling(tmp_path):
    state = {"log_history": [{"step": s, "reward": 0.5, "grad_norm": 0.1} for s in range(1, 11)]}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    text = render_text(diagnose(D.load_any(tmp_path)), explain=True)
    line = next(x for x in text.splitlines() if x.strip().startswith("zero_variance_groups:"))
    assert "frac_reward_zero_std" in line and "reward_std" in line and "critic/score/frac_zero_std" not in line
    entropy = next(x for x in text.splitlines() if x.strip().startswith("entropy_collapse:"))
    assert "needs entropy" in entropy and "actor/entropy" not in entropy
    # a metric TRL does not log is rlgrad's: named as rlgrad's instruments log it
    reg = next(x for x in text.splitlines() if x.strip().startswith("regularizer_dominates:"))
    assert "grad_norm/all/task (rlgrad's instruments" in reg


def test_a_csv_log_with_a_step_column(tmp_path):
    lines = ["step,actor/kl_loss,critic/score/mean,actor/grad_norm"]
    lines += [f"{s},{0.001 if s <= 20 else 2.0},0.5,{'nan' if s == 30 else 0.3}" for s in range(1, 41)]
    (tmp_path / "log.csv").write_text("\n".join(lines) + "\n")
    run = D.load_any(tmp_path / "log.csv")
    assert run.kind == "rlgrad" and run.rows[25]["actor/kl_loss"] == 2.0 and run.nonfinite[30] == ["actor/grad_norm"]
    ids = {f.id: f.severity for f in diagnose(run).findings}
    assert ids["kl_blowup"] == "critical" and ids["nonfinite_steps"] == "critical"
    (tmp_path / "bad.csv").write_text("iteration,reward\n1,0.5\n")
    with pytest.raises(UserError, match="no 'step' column"):
        D.load_any(tmp_path / "bad.csv")


def test_tensorboard_event_files_read_through_tensorboards_reader(tmp_path):
    """A TRL run logged to TensorBoard (report_to=tensorboard: ``train/<name>``), groups all agreeing."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "runs" / "Nov26"))
    for s in range(1, 11):
        for k, v in {"reward": 1.0, "frac_reward_zero_std": 1.0, "reward_std": 0.0, "grad_norm": 0.0,
                     "learning_rate": 1e-6, "entropy": 2.0}.items():
            writer.add_scalar(f"train/{k}", v, s)
    writer.close()
    run = D.load_any(tmp_path)
    assert run.kind == "trl" and run.rows[3]["critic/score/frac_zero_std"] == 1.0
    assert run.rows[3]["actor/lr"] == pytest.approx(1e-6)  # TensorBoard stores float32
    f = diagnose(run).findings[0]
    assert (f.id, f.severity) == ("zero_variance_groups", "critical") and "frac_reward_zero_std" in f.evidence[0]
