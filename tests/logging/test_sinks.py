"""The console sink's figures are the run files' figures."""

import csv
import re

from rlgrad.config.load import load_config
from rlgrad.recipes import make_trainer
from rlgrad.runfiles import read_jsonl

REWARD = """import zlib


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(zlib.crc32(solution_str.encode()) % 3 == 0)
"""


def test_console_zero_variance_share_is_the_group_tables(tiny, tmp_path, capsys):
    """The analysis line's "Z of G groups have zero reward variance" counts the rows of
    analysis/step_N/group_rv_table.csv whose reward_std is 0. fixed_rv puts every group of a binary reward (std
    below 1) in bucket_1, so a bucket holds zero- and nonzero-variance groups at once: counting whole buckets
    (the console's former rule) would say 0% wherever one group of the batch learns. The reward (a hash of the
    response) gives groups of both kinds even to the barely trained tiny model."""
    (tmp_path / "reward.py").write_text(REWARD)
    overrides = tiny + [f"custom_reward_function.path={tmp_path / 'reward.py'}", "trainer.total_training_steps=3",
                        "trainer.val_before_train=false", "analysis.every=1",
                        "analysis.buckets.bucket_mode=fixed_rv", "data.train_batch_size=8",
                        "trainer.logger=[console,jsonl]"]
    make_trainer(load_config(overrides=overrides), log=lambda *a: None).fit()
    said = {int(m[1]): (int(m[2]), int(m[3])) for m in re.finditer(
        r"^step (\d+) analysis: (\d+) of (\d+) groups \(\d+%\) have zero reward variance", capsys.readouterr().err,
        re.M)}
    assert sorted(said) == [1, 2, 3]
    rows = {r["step"]: r["data"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")}
    mixed = 0
    for step, (zero, groups) in said.items():
        with open(tmp_path / "run" / "analysis" / f"step_{step}" / "group_rv_table.csv") as f:
            table = list(csv.DictReader(f))
        assert (zero, groups) == (sum(float(r["reward_std"]) == 0 for r in table), len(table))
        assert (rows[step]["grad_norm/all/group_rv_zero_count"], rows[step]["grad_norm/all/group_rv_count"]) == (
            zero, groups)
        mixed += 0 < zero < groups and rows[step]["grad_norm/bucket_1/reward_std_max"] > 0
    assert mixed, "no step had a bucket mixing zero- and nonzero-variance groups: the test would not catch the bug"
