"""The catalogue's groups: every key in one, each group naming its writer, the setting that turns it on, what it is
measured on and its run files; the instruments declared once, each with its timing key among its group's keys."""

import pytest

from rlgrad.metrics import (
    CATALOGUE,
    DATA,
    EVERY_STEP,
    GROUPS,
    INSTRUMENTS,
    TRAINER,
    Group,
    declared,
    match,
    setting_of,
)


def test_every_key_is_in_a_group_that_says_its_setting_data_and_writer():
    assert [m for g in GROUPS.values() for m in g.metrics] == list(CATALOGUE)
    assert all(m.group in GROUPS and m in GROUPS[m.group].metrics for m in CATALOGUE)
    for m in CATALOGUE:
        assert declared(m, "setting") and declared(m, "data") in DATA and declared(m, "writer"), m.template
    # an instrument's keys are only logged when it runs: its groups name a setting that turns it on
    for group in GROUPS.values():
        assert (group.instrument is None) == (group.writer == TRAINER), group.id
        if group.instrument is not None:
            assert group.setting != EVERY_STEP and group.writer in group.setting and group.files, group.id
    with pytest.raises(ValueError, match="needs a setting"):
        Group("g", "title", "note", setting="", data="analysis", metrics=())
    with pytest.raises(ValueError, match="needs a setting"):
        Group("g", "title", "note", setting="x=1", data="nope", metrics=())


def test_each_instrument_is_declared_once_with_its_timing_key_in_its_own_group():
    assert [i.section for i in INSTRUMENTS] == ["analysis.buckets", "analysis.per_sample", "analysis.components",
                                                "analysis.neurons"]
    assert {g.instrument for g in GROUPS.values() if g.instrument} == set(INSTRUMENTS)
    for instrument in INSTRUMENTS:
        timing = next(m for m in CATALOGUE if m.template == instrument.timing)
        assert GROUPS[timing.group].instrument is instrument and declared(timing, "data") == "wall_clock"
        assert timing.template.startswith("timing_s/") and instrument.every.startswith(instrument.section + ".")


def test_the_setting_that_logs_a_key_comes_from_its_group():
    per_sample = "analysis.per_sample.every=N or analysis.every=N"
    assert setting_of("noise_trace/all/task") == setting_of("noise_trace/{bucket}/{term}") == per_sample
    assert setting_of("timing_s/analysis/per_sample") == per_sample
    assert setting_of("critic/neuron/dormant_ratio") == (
        "analysis.neurons.critic.metric_every=N or analysis.every=N (adv_estimator=gae)")
    assert setting_of("actor/neuron/reset_count") == "analysis.neurons.actor.reset_every=N"
    assert setting_of("{role}/neuron/dormant_ratio") == "analysis.neurons.{role}.metric_every=N or analysis.every=N"
    assert setting_of("actor/kl_loss") == "actor.use_kl_loss=true"  # a key that differs from its group (actor)
    assert setting_of("actor/entropy") == EVERY_STEP and setting_of("val/env/success") == setting_of("val/accuracy")
    assert setting_of("no/such") is None
    assert match("val/env/success").group == "agent"  # its own data and setting, in its group
