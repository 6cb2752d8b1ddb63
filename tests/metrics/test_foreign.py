"""rldoctor's and W&B's spellings in the one table of other tools' metric names (``rlgrad.metrics.foreign``): a log
under rldoctor's canonical fields reads as rlgrad's keys, and rlgrad's keys are quoted back in rldoctor's names."""

from rlgrad import rundata as D
from rlgrad.doctor import diagnose, render_text
from rlgrad.metrics import FOREIGN_NAMES, RLDOCTOR_NAMES, foreign_key, foreign_markdown, own_key


def test_rldoctors_fields_map_to_rlgrads_keys_and_back():
    # rldoctor 0.2.0's `rl-doctor fields`: the canonical names of what rlgrad logs (rollout/accuracy is not one of
    # them: rldoctor's suffix match takes it for a held-out score, eval_score is val/accuracy)
    assert FOREIGN_NAMES["rldoctor"] is RLDOCTOR_NAMES
    assert foreign_key("eval_score", "rldoctor") == "val/accuracy"
    assert foreign_key("zero_var_group_frac", "rldoctor") == "critic/score/frac_zero_std"
    assert foreign_key("response_len_clip_ratio", "rldoctor") == "response_length/clip_ratio"
    assert foreign_key("train/reward_mean", "rldoctor") == "critic/score/mean"  # W&B's train/ prefix
    assert own_key("actor/entropy", "rldoctor") == "entropy" and own_key("rollout/accuracy", "rldoctor") == \
        "rollout/accuracy"  # no rldoctor name: kept as rlgrad's
    assert foreign_key("pg_clipfrac_low", "rldoctor") is None  # the one-sided clip: not verl's dual-clip fraction
    assert "| `val/accuracy` | - | - | `eval_score` |" in foreign_markdown()


def test_a_csv_under_rldoctors_names_is_read_and_diagnosed(tmp_path):
    # 12 steps in rldoctor's spelling: every group of every step has one reward for all its samples, the reward 1
    rows = ["step,reward_mean,reward_std,zero_var_group_frac,entropy,grad_norm"]
    rows += [f"{s},1.0,0.0,1.0,0.5,0.0" for s in range(1, 13)]
    (tmp_path / "log.csv").write_text("\n".join(rows) + "\n")
    run = D.load_any(tmp_path / "log.csv")
    assert run.kind == "rldoctor"
    assert run.rows[3] == {"critic/score/mean": 1.0, "critic/score/std": 0.0, "critic/score/frac_zero_std": 1.0,
                           "actor/entropy": 0.5, "actor/grad_norm": 0.0}
    d = diagnose(run)
    top = d.findings[0]
    assert top.id == "zero_variance_groups" and top.severity == "critical" and top.step == 1
    assert "too easy" in top.explanation
    assert "(zero_var_group_frac;" in top.evidence[0]  # quoted in the log's own spelling
    text = render_text(d, explain=True)
    kl = next(x for x in text.splitlines() if x.strip().startswith("kl_blowup:"))
    assert "kl" in kl and "actor/kl_loss" not in kl  # --explain names what is missing as rldoctor spells it
