"""Batch checks its tensors' shapes and dtypes on construction: one UserError naming the field."""

import pytest
import torch

from rlgrad.analysis.buckets import analyse_buckets
from rlgrad.batch import Batch, check_batch
from rlgrad.errors import UserError

N, L = 6, 5


def _fields(**over):
    f = dict(input_ids=torch.ones(N, L, dtype=torch.long), attention_mask=torch.ones(N, L, dtype=torch.long),
             response_mask=torch.zeros(N, L), group_ids=torch.arange(N) // 2, scores=torch.rand(N),
             reward_std=torch.rand(N))
    f.update(over)
    return f


def test_a_well_formed_batch_and_its_derivatives_pass():
    b = Batch(**_fields(attention_mask=torch.ones(N, L, dtype=torch.bool), advantages=torch.zeros(N, L),
                        components={"acc": torch.zeros(N)}, global_index=torch.arange(N)))
    assert len(b.select([0, 2])) == 2 and len(Batch.cat([b, b])) == 2 * N and len(b.blank_rows(2)) == 2
    b.old_log_probs = torch.zeros(N, L)  # set after construction, as the trainers do
    assert b.check() is b


@pytest.mark.parametrize("name, value, want, got", [
    ("group_ids", torch.arange(N - 1), f"[{N}]", f"[{N - 1}]"),
    ("scores", torch.rand(N, 1), f"[{N}]", f"[{N}, 1]"),
    ("response_mask", torch.zeros(N, L + 1), f"[{N}, {L}]", f"[{N}, {L + 1}]"),
    ("attention_mask", torch.ones(N + 1, L), f"[{N}, {L}]", f"[{N + 1}, {L}]"),
    ("advantages", torch.zeros(N, L - 1), f"[{N}, {L}]", f"[{N}, {L - 1}]"),
    ("token_rewards", torch.zeros(N), f"[{N}, {L}]", f"[{N}]"),
    ("global_index", torch.arange(N + 2), f"[{N}]", f"[{N + 2}]"),
])
def test_a_wrong_shape_names_the_field_and_both_shapes(name, value, want, got):
    with pytest.raises(UserError) as e:
        Batch(**_fields(**{name: value}))
    msg = str(e.value)
    assert f"Batch.{name}" in msg and want in msg and got in msg and "\n" not in msg


def test_a_component_of_the_wrong_length_is_named():
    with pytest.raises(UserError, match=r"components\['fmt'\] must have shape \[6\]"):
        Batch(**_fields(components={"fmt": torch.zeros(N + 1)}))


@pytest.mark.parametrize("name, value", [("input_ids", torch.ones(N, L)), ("group_ids", torch.zeros(N)),
                                         ("attention_mask", torch.ones(N, L)),
                                         ("input_ids", torch.ones(N, L, dtype=torch.bool))])
def test_ids_and_masks_must_be_integers(name, value):
    with pytest.raises(UserError, match=rf"Batch\.{name} must be an .*tensor, got torch\."):
        Batch(**_fields(**{name: value}))


def test_input_ids_must_be_two_dimensional():
    with pytest.raises(UserError, match=r"input_ids must be a \[N, L\] tensor, got \(6,\)"):
        Batch(**_fields(input_ids=torch.ones(N, dtype=torch.long)))


def test_a_field_set_later_is_checked_by_the_instruments():
    b = Batch(**_fields())
    b.old_log_probs = torch.zeros(N, L + 3)
    with pytest.raises(UserError, match=r"Batch\.old_log_probs must have shape \[6, 5\].*got \[6, 8\]"):
        check_batch(b)
    with pytest.raises(UserError, match=r"old_log_probs"):
        analyse_buckets(torch.nn.Linear(1, 1), b)
