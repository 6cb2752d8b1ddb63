"""The one batch type that flows rollout -> advantages -> analysis -> update.

Alignment convention (used everywhere in rlgrad):

* Tensors are ``[N, L]`` over the whole prompt+response sequence. Prompts are
  left-padded, responses right-padded, so every prompt ends at the same column.
* ``position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)``.
* ``response_mask[i, t] = 1`` where token ``t`` is a response token whose
  log-prob -- predicted from the logits at position ``t - 1`` -- enters the loss.
  Column 0 is therefore never a response token.
* Per-token tensors (``old_log_probs``, ``ref_log_probs``, ``advantages``,
  ``values``, ``returns``, ``token_rewards``) use the same alignment: entry ``[i, t]`` belongs to
  token ``t`` and is zero wherever ``response_mask`` is zero.

A row may hold several response spans: a multi-turn episode (``rlgrad.rl.episodes``) interleaves the
model's turns (mask 1) with the environment's text (mask 0).

Per-sample tensors are ``[N]``. ``group_ids`` are global prompt-group ids: the
``rollout.n`` samples of one prompt share a group id. ``global_index`` (optional) is each row's
position in the global order of a batch split over ranks: ``rl.actor.ppo_update`` sets it on the
mini-batch it hands to ``on_grads``, so an instrument that samples rows (the nullspace ratio) picks
the rows one process would pick, whatever the split.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from rlgrad.errors import UserError

_PER_TOKEN = ("attention_mask", "response_mask", "old_log_probs", "ref_log_probs", "advantages", "values",
              "returns", "token_rewards")
_PER_SAMPLE = ("group_ids", "scores", "reward_std", "global_index")
_INTEGER = ("input_ids", "group_ids", "global_index")  # integer dtypes only
_MASKS = ("attention_mask",)  # integer or bool


def _integral(t: torch.Tensor, allow_bool: bool) -> bool:
    if t.dtype == torch.bool:
        return allow_bool
    return not (t.dtype.is_floating_point or t.dtype.is_complex)


def check_batch(b: Batch) -> None:
    """Shapes and dtypes of ``b``'s tensors (the fields that are set), a one-line ``UserError`` naming the field:
    per-token fields ``[N, L]`` as ``input_ids``, per-sample fields and reward components ``[N]``, ids integer,
    ``attention_mask`` integer or bool. Shape comparisons only: no data is read."""
    if not isinstance(b.input_ids, torch.Tensor) or b.input_ids.dim() != 2:
        got = tuple(b.input_ids.shape) if isinstance(b.input_ids, torch.Tensor) else type(b.input_ids).__name__
        raise UserError(f"Batch.input_ids must be a [N, L] tensor, got {got}")
    n, shape = b.input_ids.shape[0], tuple(b.input_ids.shape)
    fields = [(name, getattr(b, name), shape) for name in _PER_TOKEN]
    fields += [(name, getattr(b, name), (n,)) for name in _PER_SAMPLE]
    fields += [(f"components['{k}']", t, (n,)) for k, t in b.components.items()]
    for name, t, want in fields:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise UserError(f"Batch.{name} must be a tensor of shape {list(want)}, got {type(t).__name__}")
        if tuple(t.shape) != want:
            what = "input_ids' shape" if len(want) == 2 else "one per row of input_ids"
            raise UserError(f"Batch.{name} must have shape {list(want)} ({what}), got {list(t.shape)}")
    for name in _INTEGER + _MASKS:
        t = getattr(b, name)
        if t is not None and not _integral(t, allow_bool=name in _MASKS):
            kind = "integer or bool" if name in _MASKS else "integer"
            raise UserError(f"Batch.{name} must be an {kind} tensor, got {t.dtype}")


def response_start(response_mask: torch.Tensor) -> int:
    """The first column of ``[N, L]`` holding a response token in any row; 1 if none.

    No row has a loss before it, so forwards run the LM head from the column before it on only
    (``logits_to_keep``); with left-padded prompts it is the column every prompt ends before."""
    cols = torch.nonzero(response_mask.any(0)).flatten()
    return max(int(cols[0]), 1) if len(cols) else 1


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class Batch:
    input_ids: torch.Tensor  # [N, L] long
    attention_mask: torch.Tensor  # [N, L] long
    response_mask: torch.Tensor  # [N, L] float
    group_ids: torch.Tensor  # [N] long
    scores: torch.Tensor  # [N] float, weighted total reward
    reward_std: torch.Tensor  # [N] float, unbiased std of the sample's group scores
    components: dict[str, torch.Tensor] = field(default_factory=dict)  # [N] per reward component
    old_log_probs: torch.Tensor | None = None  # [N, L]
    ref_log_probs: torch.Tensor | None = None  # [N, L]
    advantages: torch.Tensor | None = None  # [N, L]
    values: torch.Tensor | None = None  # [N, L]
    returns: torch.Tensor | None = None  # [N, L]
    # [N, L] per-token rewards when the task gives more than one per sequence (multi-turn agents with
    # agent.use_turn_scores: each turn's on its last token); None: the score on the last response token
    token_rewards: torch.Tensor | None = None
    global_index: torch.Tensor | None = None  # [N] long; None: the rows are in global order (ranks in order)

    def __post_init__(self) -> None:
        check_batch(self)

    def check(self) -> Batch:
        """``check_batch`` again (fields set after construction included); returns ``self``."""
        check_batch(self)
        return self

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def response_start(self) -> int:
        """The first column holding a response token (1 if none): no column before it carries a loss."""
        return response_start(self.response_mask)

    def select(self, index: torch.Tensor | list[int]) -> Batch:
        """Rows ``index`` of every per-sample and per-token tensor (a new Batch)."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.input_ids.device)
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                out[f.name] = v.index_select(0, index)
            elif isinstance(v, dict):
                out[f.name] = {k: t.index_select(0, index) for k, t in v.items()}
            else:
                out[f.name] = v
        return Batch(**out)

    @classmethod
    def cat(cls, batches: list[Batch]) -> Batch:
        """The rows of ``batches`` in order, in one Batch. Each is left-padded so that its first response column
        lands on the common one (prompts still end at the same column) and right-padded to the common width;
        padding is unattended and carries no loss. Optional fields are kept where every batch has them."""
        start = max(b.response_start() for b in batches)
        width = start + max(b.input_ids.shape[1] - b.response_start() for b in batches)

        def pad(t: torch.Tensor, b: Batch) -> torch.Tensor:
            if t.dim() < 2:
                return t
            left = start - b.response_start()
            return torch.nn.functional.pad(t, (left, width - left - t.shape[1]))

        out = {}
        for f in dataclasses.fields(cls):
            vals = [getattr(b, f.name) for b in batches]
            if all(isinstance(v, torch.Tensor) for v in vals):
                out[f.name] = torch.cat([pad(v, b) for v, b in zip(vals, batches)])
            elif all(isinstance(v, dict) for v in vals):
                out[f.name] = {k: torch.cat([v[k] for v in vals]) for k in vals[0]}
            else:
                out[f.name] = None if f.name != "components" else {}
        return cls(**out)

    def blank_rows(self, n: int = 1) -> Batch:
        """``n`` rows that carry no loss (response_mask 0, every position attended, group id -1).

        What a rank runs when it holds no sample of something but must still join the collectives of
        a forward/backward (FSDP2 all-gathers, DDP gradient reduction): its loss and gradient are
        exactly zero."""
        width = max(self.input_ids.shape[1], 2)
        zeros = torch.zeros(n, width)
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                out[f.name] = (zeros if v.dim() == 2 else zeros[:, 0]).to(v.dtype)
            elif isinstance(v, dict):
                out[f.name] = {k: zeros[:, 0].to(t.dtype) for k, t in v.items()}
            else:
                out[f.name] = v
        out["attention_mask"] = torch.ones(n, width, dtype=self.attention_mask.dtype)
        out["group_ids"] = torch.full((n,), -1, dtype=self.group_ids.dtype)
        out["global_index"] = None  # not a row of the global batch
        return Batch(**out)

    def to(self, device: torch.device | str) -> Batch:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                out[f.name] = v.to(device)
            elif isinstance(v, dict):
                out[f.name] = {k: t.to(device) for k, t in v.items()}
            else:
                out[f.name] = v
        return Batch(**out)
