"""A run's saved config read back one way (rlgrad.config.saved): leniently for the readers, strictly for a resume."""

import pytest
import yaml

from rlgrad.config.load import load_config
from rlgrad.config.saved import config_tree, from_yaml_file, read_saved_config
from rlgrad.config.schema import to_yaml
from rlgrad.errors import UserError


def test_the_saved_tree_is_what_to_yaml_writes(tmp_path):
    cfg = load_config(overrides=["rollout.n=5", "reward.weights={format: 0.2}"])
    p = tmp_path / "config.yaml"
    p.write_text(to_yaml(cfg))
    saved = read_saved_config(p)
    assert saved.tree == config_tree(cfg) == yaml.safe_load(to_yaml(cfg))
    assert saved.text == to_yaml(cfg) and saved.get("rollout.n") == 5
    assert saved.settings == cfg == from_yaml_file(p)


def test_a_damaged_or_hand_edited_config_never_stops_a_reader(tmp_path):
    assert read_saved_config(tmp_path / "none.yaml").tree is None
    broken = tmp_path / "broken.yaml"
    broken.write_text("rollout: {n: [unclosed\n")
    saved = read_saved_config(broken)
    assert saved.tree is None and saved.text == "rollout: {n: [unclosed\n" and saved.get("rollout.n", "-") == "-"
    with pytest.raises(UserError, match="cannot read config"):
        from_yaml_file(broken)  # a resume compares with it: there it is an error
    edited = tmp_path / "edited.yaml"
    edited.write_text("rollout: {n: many, temperature: 0.5}\ntrainer: {gradient_analysis_every: 7}\n")
    saved = read_saved_config(edited)
    default = load_config(overrides=[])
    # the refused value stays at its default, the rest is read (an earlier key's name too)
    assert saved.settings.rollout.n == default.rollout.n and saved.settings.rollout.temperature == 0.5
    assert saved.settings.analysis.buckets.every == 7 == saved.get("analysis.buckets.every")
