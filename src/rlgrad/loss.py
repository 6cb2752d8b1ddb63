"""The loss math the trainer optimises and the instruments measure: one module both import.

    actor   L = L_task(pg) - entropy_coeff · H + kl_loss_coef · KL(π || π_ref)
    critic  L_V = ½ · max((V − R)², (clip(V, V_old ± c) − R)²)

Each per-token term is aggregated with verl's ``loss_agg_mode`` (``Aggregation``) against the
denominators of the batch being optimised (``Denominators``), so micro-batch losses sum exactly to
the mini-batch loss.

What an instrument needs from a loss is a ``LossFn``: ``(model, batch) -> {term: per-token loss}``
(``[N, L]``, zero off the response tokens, not yet aggregated) that carries its ``Aggregation``.
``ActorLoss`` is rlgrad's actor objective in that form; ``per_token_loss`` turns any function of a
foreign training loop into one, so every instrument runs on any objective.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor, nn

from rlgrad.batch import Batch, position_ids_from_mask
from rlgrad.collectives import all_reduce_sum
from rlgrad.core import (
    agg_loss,
    agg_token_weights,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
    policy_loss,
    value_loss,
)

if TYPE_CHECKING:
    from rlgrad.config import RLGradConfig


# ---------------------------------------------------------------------------------------------- forwards
def forward_log_probs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, *, temperature: float = 1.0,
                      with_entropy: bool = False, entropy_grad: bool = True, start: int = 1,
                      mask_positions: bool = True) -> tuple[Tensor, Tensor | None]:
    """Per-token log-prob of ``input_ids[:, t]`` under the logits at ``t - 1``, for columns ``t >= start``.

    Columns before ``start`` (at least column 0) are 0; with ``start`` = the first response column,
    the LM head runs on the response positions only (``logits_to_keep``, as TRL does). Logits are
    divided by the rollout temperature, as verl does, so that old log-probs describe the
    distribution the samples were drawn from. ``entropy_grad=False``: the entropies are detached
    (computed outside the graph, which is cheaper). Positions count the attended tokens
    (``position_ids_from_mask``, as generation numbers them); ``mask_positions=False`` leaves them to the model
    (0, 1, ... over every column, left padding included), as TRL's training forward does.
    """
    L = input_ids.shape[1]
    start = min(max(start, 1), L)
    kwargs = {"logits_to_keep": L - start + 1} if start > 1 and _accepts_logits_to_keep(model) else {}
    if mask_positions:
        kwargs["position_ids"] = position_ids_from_mask(attention_mask)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs).logits
    logits = logits[:, -(L - start + 1):-1].float()  # the logits at positions start-1 .. L-2
    if temperature != 1.0:
        logits = logits / temperature
    zero = torch.zeros_like(input_ids[:, :start], dtype=logits.dtype)
    lse = torch.logsumexp(logits, dim=-1)  # shared by the log-probs and the entropies
    logp = torch.cat([zero, logprobs_from_logits(logits, input_ids[:, start:], lse)], 1)
    ent = None
    if with_entropy:
        ent = entropy_from_logits(logits, lse) if entropy_grad else entropy_from_logits(logits.detach(), lse.detach())
        ent = torch.cat([zero, ent], 1)
    return logp, ent


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def forward_values(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """``[N, L]`` values (float32, differentiable): column t holds the head's output at position t − 1,
    the state from which token t is generated (the batch alignment, see ``rlgrad.batch``)."""
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask), use_cache=False).logits[..., 0].float()
    return torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], 1)


# ---------------------------------------------------------------------------------------------- aggregation
@dataclass(frozen=True)
class Aggregation:
    """How per-token losses become one number: verl's ``loss_agg_mode`` (``horizon``: the constant of
    ``seq-mean-token-sum-norm``, the response-length budget)."""

    mode: str = "token-mean"
    horizon: int = 1

    def weights(self, mask: Tensor) -> tuple[Tensor, Tensor]:
        """``(ω [N, L], u [N])``: a row subset R's loss is ``Σ_{i∈R,t} ω·ℓ / Σ_{i∈R} u``
        (``core.agg_token_weights``)."""
        return agg_token_weights(mask, self.mode, horizon=self.horizon)


@dataclass
class Denominators:
    """Response tokens and sequences of the whole batch an optimizer step (or a probe) covers."""

    num_tokens: float
    num_seqs: float

    @classmethod
    def of(cls, batch: Batch) -> Denominators:
        return cls(float(batch.response_mask.sum()), float(len(batch)))

    @classmethod
    def global_of(cls, batch: Batch) -> Denominators:
        """Totals over every rank's part of the batch (``of`` in one process): local losses then sum to the
        global loss over ranks."""
        t = all_reduce_sum(torch.tensor([float(batch.response_mask.sum()), float(len(batch))], dtype=torch.float64))
        return cls(float(t[0]), float(t[1]))


# ---------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class LossSettings:
    """The actor objective (``actor.*`` settings, plus the rollout temperature and response budget)."""

    policy_loss: str = "ppo"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    horizon: int = 8  # response-length budget, for seq-mean-token-sum-norm
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    entropy_coeff: float = 0.0
    temperature: float = 1.0

    @property
    def agg(self) -> Aggregation:
        return Aggregation(self.loss_agg_mode, self.horizon)

    def coefficients(self) -> dict[str, float]:
        """``L = Σ coefficient · quantity`` over ``policy`` (the PPO / CISPO loss), ``entropy`` (H) and ``kl``
        (with use_kl_loss): the one place the actor loss's formula is written."""
        out = {"policy": 1.0, "entropy": -self.entropy_coeff}
        if self.use_kl_loss:
            out["kl"] = self.kl_loss_coef
        return out

    @classmethod
    def from_config(cls, cfg: RLGradConfig) -> LossSettings:
        a = cfg.actor
        return cls(policy_loss=a.policy_loss, clip_ratio_low=a.clip_ratio_low, clip_ratio_high=a.clip_ratio_high,
                   clip_ratio_c=a.clip_ratio_c, loss_agg_mode=a.loss_agg_mode, horizon=cfg.rollout.response_length,
                   use_kl_loss=a.use_kl_loss, kl_loss_coef=a.kl_loss_coef, kl_loss_type=a.kl_loss_type,
                   entropy_coeff=a.entropy_coeff, temperature=cfg.rollout.temperature)


@dataclass(frozen=True)
class CriticSettings:
    """The critic's value loss (``critic.*``); ``loss_agg_mode`` defaults to the actor's."""

    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    horizon: int = 8  # response-length budget, for seq-mean-token-sum-norm

    @property
    def agg(self) -> Aggregation:
        return Aggregation(self.loss_agg_mode, self.horizon)

    @classmethod
    def from_config(cls, cfg: RLGradConfig) -> CriticSettings:
        c = cfg.critic
        return cls(cliprange_value=c.cliprange_value, loss_agg_mode=c.loss_agg_mode or cfg.actor.loss_agg_mode,
                   horizon=cfg.rollout.response_length)


# ---------------------------------------------------------------------------------------------- the actor loss
TERM_OF = {"policy": "task", "entropy": "entropy", "kl": "kl"}  # the actor loss's quantities -> its term names


@dataclass
class TokenLosses:
    """Per-token terms of the actor loss for one forward (``[N, L]``, zero outside ``mask``)."""

    mask: Tensor
    pg: Tensor  # per-token policy loss (PPO-clip or CISPO)
    entropy: Tensor  # per-token entropy H (detached when entropy_coeff == 0)
    kl: Tensor | None  # per-token KL estimate (use_kl_loss only)
    clipfrac: Tensor
    clipfrac_lower: Tensor
    ppo_kl: Tensor
    # Per-token policy loss per unit of advantage: A·∇pg_unit = ∇pg token by token (core.policy_loss).
    pg_unit: Tensor | None = None

    def components(self, s: LossSettings) -> dict[str, Tensor]:
        """The loss's terms with their coefficients, as the analyses name them: task, entropy, kl.

        A term with a zero coefficient (or KL off) is absent: it does not move the policy.
        """
        raw = {"policy": self.pg, "entropy": self.entropy, "kl": self.kl}
        return {TERM_OF[q]: self.pg if q == "policy" else c * raw[q]
                for q, c in s.coefficients().items() if c != 0 and raw[q] is not None}


def token_losses(model: nn.Module, mb: Batch, s: LossSettings) -> TokenLosses:
    """Forward ``mb`` and return the per-token loss terms (differentiable)."""
    device = next(model.parameters()).device
    mask = mb.response_mask.to(device)
    # The LM head runs on the response columns only; with entropy_coeff 0 the entropy is still logged
    # (actor/entropy) but carries no graph.
    logp, ent = forward_log_probs(model, mb.input_ids.to(device), mb.attention_mask.to(device),
                                  temperature=s.temperature, with_entropy=True, entropy_grad=s.entropy_coeff != 0,
                                  start=mb.response_start())
    pg = policy_loss(logp, mb.old_log_probs.to(device), mb.advantages.to(device), mask, kind=s.policy_loss,
                     clip_ratio_low=s.clip_ratio_low, clip_ratio_high=s.clip_ratio_high,
                     clip_ratio_c=s.clip_ratio_c, agg_mode=s.loss_agg_mode, horizon=s.horizon)
    kl = kl_penalty(logp, mb.ref_log_probs.to(device), s.kl_loss_type) * mask if s.use_kl_loss else None
    return TokenLosses(mask, pg.loss_mat * mask, ent * mask, kl, pg.clipfrac, pg.clipfrac_lower, pg.ppo_kl,
                       pg.unit_loss_mat * mask)


@dataclass
class LossTerms:
    """Each aggregated term of the actor loss for one micro-batch (what the update backwards)."""

    pg: Tensor
    entropy: Tensor  # aggregated entropy (the bonus is -entropy_coeff * this; detached when 0)
    kl: Tensor | None
    clipfrac: Tensor
    clipfrac_lower: Tensor
    ppo_kl: Tensor

    def total(self, s: LossSettings) -> Tensor:
        raw = {"policy": self.pg, "entropy": self.entropy, "kl": self.kl}
        loss = self.pg
        for q, c in s.coefficients().items():
            if q != "policy" and c != 0 and raw[q] is not None:
                loss = loss + c * raw[q]
        return loss


def actor_loss_terms(model: nn.Module, mb: Batch, s: LossSettings, den: Denominators) -> LossTerms:
    """Forward ``mb`` and return each aggregated loss term (differentiable)."""
    t = token_losses(model, mb, s)

    def agg(x: Tensor) -> Tensor:
        return agg_loss(x, t.mask, s.loss_agg_mode, horizon=s.horizon, num_tokens=den.num_tokens,
                        num_seqs=den.num_seqs)

    kl = agg(t.kl) if t.kl is not None else None
    return LossTerms(agg(t.pg), agg(t.entropy), kl, t.clipfrac, t.clipfrac_lower, t.ppo_kl)


# ---------------------------------------------------------------------------------------------- LossFn
class Terms(dict):
    """``{term: per-token loss [N, L]}`` as a ``LossFn`` returns it (a plain dict works too).

    ``logged``, when set, holds the per-token quantities an instrument reports as loss values instead of
    the terms themselves, and ``total`` the coefficients that make the loss of them (rlgrad's actor loss:
    the policy loss, the raw entropy and KL, ``LossSettings.coefficients``). A plain dict reports its terms
    and their sum."""

    logged: dict[str, Tensor] | None = None
    total: dict[str, float] | None = None


class LossFn(Protocol):
    """A per-token loss as every instrument takes it.

    ``fn(model, batch)`` runs the forward and returns ``{term: per-token loss [N, L]}``, zero off the
    response tokens, with each term's coefficient applied and NOT yet aggregated; ``agg`` says how the
    training loop aggregates it. The gradient of each term is measured separately.
    """

    agg: Aggregation

    def __call__(self, model: nn.Module, batch: Batch) -> dict[str, Tensor]: ...


@dataclass(frozen=True)
class PerTokenLoss:
    """A plain function of a training loop as a ``LossFn`` (see ``per_token_loss``)."""

    fn: Callable[[nn.Module, Batch], dict[str, Tensor]]
    agg: Aggregation = field(default_factory=Aggregation)

    def __call__(self, model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        return self.fn(model, batch)


def per_token_loss(fn: Callable[[nn.Module, Batch], dict[str, Tensor] | Tensor], loss_agg_mode: str = "token-mean",
                   horizon: int = 1) -> PerTokenLoss:
    """Wrap ``fn(model, batch) -> {term: [N, L]}`` (or one ``[N, L]`` tensor, the term ``task``) as a ``LossFn``
    aggregated like verl's ``loss_agg_mode`` (TRL's ``loss_type="grpo"`` is ``seq-mean-token-mean``,
    ``"dapo"``/``"bnpo"`` ``token-mean``, ``"dr_grpo"`` ``seq-mean-token-sum-norm`` with ``horizon`` =
    ``max_completion_length``)."""
    def terms(model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        out = fn(model, batch)
        return {"task": out} if isinstance(out, Tensor) else out

    return PerTokenLoss(terms, Aggregation(loss_agg_mode, horizon))


class ActorLoss:
    """rlgrad's actor objective as a ``LossFn``: terms ``task`` (policy loss), ``entropy`` (``-entropy_coeff·H``)
    and ``kl`` (``kl_loss_coef·KL``), a term with a zero coefficient left out; ``logged``: ``policy``,
    ``entropy`` and ``kl`` (the raw quantities), whose ``total`` is the loss, as RAGEN reports them."""

    def __init__(self, settings: LossSettings | None = None):
        self.settings = settings or LossSettings()
        self.agg = self.settings.agg

    def __call__(self, model: nn.Module, batch: Batch) -> Terms:
        s = self.settings
        t = token_losses(model, batch, s)
        out = Terms(t.components(s))
        out.logged = {"policy": t.pg.detach(), "entropy": t.entropy.detach()}
        if t.kl is not None:
            out.logged["kl"] = t.kl.detach()
        out.total = s.coefficients()
        return out

    def unit(self) -> PerTokenLoss:
        """The policy loss per unit of advantage (``TokenLosses.pg_unit``), term ``policy``: what the
        reward-component geometry splits by component advantages."""
        s = self.settings
        return PerTokenLoss(lambda model, batch: {"policy": token_losses(model, batch, s).pg_unit}, self.agg)


def as_loss_fn(loss: LossFn | LossSettings | None) -> LossFn:
    """An instrument's ``loss`` argument as a ``LossFn``: None or a ``LossSettings`` mean rlgrad's actor loss."""
    if loss is None or isinstance(loss, LossSettings):
        return ActorLoss(loss)
    if not isinstance(getattr(loss, "agg", None), Aggregation):
        raise TypeError("a loss function for the instruments needs its aggregation: wrap it with "
                        "rlgrad.loss.per_token_loss(fn, loss_agg_mode)")
    return loss


def as_unit_loss(loss: LossFn | LossSettings | None) -> LossFn:
    """The policy loss per unit of advantage for the reward-component geometry: a loss with a ``unit()`` method
    (rlgrad's ``ActorLoss``, also for None or a ``LossSettings``; the TRL integration's loss) gives its own; any
    other ``LossFn`` is taken to be one already."""
    loss = as_loss_fn(loss)
    unit = getattr(loss, "unit", None)
    return unit() if callable(unit) else loss


def critic_loss_fn(s: CriticSettings) -> PerTokenLoss:
    """The clipped value loss per token, term ``value``, as a ``LossFn`` (the critic's neuron health)."""

    def fn(model: nn.Module, b: Batch) -> dict[str, Tensor]:
        device = next(model.parameters()).device
        mask = b.response_mask.to(device)
        v = forward_values(model, b.input_ids.to(device), b.attention_mask.to(device))
        out = value_loss(v, b.values.to(device), b.returns.to(device), mask, cliprange_value=s.cliprange_value,
                         agg_mode=s.loss_agg_mode, horizon=s.horizon)
        return {"value": out.loss_mat * mask}

    return PerTokenLoss(fn, s.agg)
