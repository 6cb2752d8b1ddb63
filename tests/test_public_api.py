"""The declared public API (``rlgrad.__all__``) and the old import paths kept for one release."""

import importlib
import warnings

import pytest

import rlgrad


def test_every_public_name_is_the_object_its_module_defines():
    assert rlgrad.__all__ == sorted(rlgrad._WHERE)
    for name in rlgrad.__all__:
        module, attr = rlgrad._WHERE[name]
        assert getattr(rlgrad, name) is getattr(importlib.import_module(module), attr), name
    with pytest.raises(AttributeError, match="no_such_name"):
        rlgrad.no_such_name  # noqa: B018


@pytest.mark.parametrize(("old", "name", "new"), [
    ("rlgrad.loss", "per_token_loss", "rlgrad.algos.objective.per_token_loss"),
    ("rlgrad.loss", "ActorLoss", "rlgrad.algos.objective.ActorLoss"),
    ("rlgrad.loss", "PerTokenLoss", "rlgrad.algos.objective.FunctionLoss"),
    ("rlgrad.loss", "actor_loss_terms", "rlgrad.algos.objective.actor_objective"),
    ("rlgrad.core", "grpo_advantages", "rlgrad.algos.advantages.grpo_advantages"),
    ("rlgrad.core", "agg_loss", "rlgrad.algos.aggregation.agg_loss"),
])
def test_old_paths_still_import_with_a_deprecation_warning(old, name, new):
    module = importlib.import_module(old)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        value = getattr(module, name)
    new_module, new_name = new.rsplit(".", 1)
    assert value is getattr(importlib.import_module(new_module), new_name)
    assert [w.category for w in seen] == [DeprecationWarning]
    assert new in str(seen[0].message)
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_the_config_package_keeps_the_old_flat_names():
    from rlgrad.config import RLGradConfig, load_config, per_response_advantage, resolve_alias

    cfg = load_config(overrides=["rollout.n=4"])
    assert isinstance(cfg, RLGradConfig) and cfg.rollout.n == 4
    assert per_response_advantage(cfg.algorithm) is None
    assert resolve_alias("actor_rollout_ref.rollout.n") == "rollout.n"
