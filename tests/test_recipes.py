"""The recipes' hints for a run with the instruments at every step (rlgrad.recipes.ride_hint, sample_hint)."""

import pytest

from rlgrad.config.load import load_config
from rlgrad.recipes import ride_hint, sample_hint


def test_a_run_analysed_every_step_in_several_micro_batches_is_told_how_to_ride_on_its_update():
    hint = ride_hint(load_config(overrides=["analysis.every=1"]))  # 16 prompts x 8 samples, micro-batches of 64
    assert hint is not None and "actor.ppo_micro_batch_size=128" in hint and "64" in hint


@pytest.mark.parametrize("overrides", [
    ["analysis.every=1", "actor.ppo_micro_batch_size=128"],  # one micro-batch: it rides already
    ["analysis.every=1", "actor.entropy_coeff=0.01"],  # an entropy term: nothing rides whatever the micro-batch
    ["analysis.every=1", "actor.use_kl_loss=true"],
    [],  # every 10th step: a pass of its own at those steps costs little
])
def test_no_hint_where_one_micro_batch_would_not_change_what_rides(overrides):
    assert ride_hint(load_config(overrides=overrides)) is None


def test_a_run_with_neuron_health_every_step_is_told_how_to_sample_less():
    hint = sample_hint(load_config(overrides=["analysis.every=1"]))
    assert hint is not None and "analysis.neurons.actor.nullspace_every=10" in hint and "critic" not in hint


@pytest.mark.parametrize("overrides", [
    ["analysis.every=1", "analysis.neurons.actor.nullspace_every=10"],  # the advice followed
    ["analysis.every=1", "analysis.neurons.actor.nullspace_samples=0"],  # no sample
    ["analysis.every=2"],  # not every step
    [],
])
def test_no_sample_hint_where_the_sample_does_not_run_every_step(overrides):
    assert sample_hint(load_config(overrides=overrides)) is None
