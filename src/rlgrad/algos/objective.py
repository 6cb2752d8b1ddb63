"""The actor objective the trainer optimises and the instruments measure.

    actor   L = L_task - entropy_coeff · H + kl_loss_coef · KL(π || π_ref)
    critic  L_V (algos.surrogates.value_loss)

Vocabulary. A *loss* is a ``LossFn``: ``(model, batch) -> Terms``, its *terms* (``{term: per-token loss [N, L]}``,
zero off the response tokens, each with its coefficient, not yet aggregated) and the ``Aggregation`` the
training loop applies. The actor's terms are ``task`` (the policy loss), ``entropy`` and ``kl``. ``ActorLoss``
is rlgrad's actor objective as a ``LossFn``; ``per_token_loss`` turns any function of a foreign training loop
into one (a ``FunctionLoss``), so every instrument runs on any objective. ``actor_terms`` are the per-token terms
of one forward (``ActorTerms``), ``actor_objective`` their aggregated values (``ActorObjective``), which the
update backwards. "Components" are reward components, never loss terms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from torch import Tensor, nn

from rlgrad.algos.aggregation import Aggregation, Denominators, agg_loss
from rlgrad.algos.kl import kl_penalty
from rlgrad.algos.logprobs import forward_log_probs, forward_values
from rlgrad.algos.surrogates import policy_loss, value_loss
from rlgrad.batch import Batch

if TYPE_CHECKING:
    from rlgrad.config.schema import RLGradConfig


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
        actor = cfg.actor
        return cls(policy_loss=actor.policy_loss, clip_ratio_low=actor.clip_ratio_low,
                   clip_ratio_high=actor.clip_ratio_high, clip_ratio_c=actor.clip_ratio_c,
                   loss_agg_mode=actor.loss_agg_mode, horizon=cfg.rollout.response_length,
                   use_kl_loss=actor.use_kl_loss, kl_loss_coef=actor.kl_loss_coef, kl_loss_type=actor.kl_loss_type,
                   entropy_coeff=actor.entropy_coeff, temperature=cfg.rollout.temperature)


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
        critic = cfg.critic
        return cls(cliprange_value=critic.cliprange_value,
                   loss_agg_mode=critic.loss_agg_mode or cfg.actor.loss_agg_mode, horizon=cfg.rollout.response_length)


@dataclass
class ActorTerms:
    """The actor loss's per-token terms for one forward (``[N, L]``, zero outside ``mask``), with the clip
    statistics of its policy loss."""

    mask: Tensor
    task: Tensor  # per-token policy loss (PPO-clip or CISPO)
    entropy: Tensor  # per-token entropy H (detached when entropy_coeff == 0)
    kl: Tensor | None  # per-token KL estimate (use_kl_loss only)
    clipfrac: Tensor
    clipfrac_lower: Tensor
    ppo_kl: Tensor
    # Per-token policy loss per unit of advantage: A·∇task_unit = ∇task token by token (algos.surrogates).
    task_unit: Tensor | None = None

    def quantities(self) -> dict[str, Tensor | None]:
        """The loss's quantities by the names ``LossSettings.coefficients`` gives them."""
        return {"policy": self.task, "entropy": self.entropy, "kl": self.kl}

    def weighted(self, s: LossSettings) -> dict[str, Tensor]:
        """The terms with their coefficients, as the instruments name them: ``task`` (the policy loss itself),
        ``entropy`` (−entropy_coeff·H), ``kl`` (kl_loss_coef·KL). A term with a zero coefficient (or KL off)
        is absent: it does not move the policy."""
        raw = self.quantities()
        return {("task" if q == "policy" else q): raw[q] if q == "policy" else c * raw[q]
                for q, c in s.coefficients().items() if c != 0 and raw[q] is not None}


def actor_terms(model: nn.Module, mb: Batch, s: LossSettings) -> ActorTerms:
    """Forward ``mb`` and return the actor loss's per-token terms (differentiable)."""
    device = next(model.parameters()).device
    mask = mb.response_mask.to(device)
    # The LM head runs on the response columns only; with entropy_coeff 0 the entropy is still logged
    # (actor/entropy) but carries no graph.
    logp, ent = forward_log_probs(model, mb.input_ids.to(device), mb.attention_mask.to(device),
                                  temperature=s.temperature, with_entropy=True, entropy_grad=s.entropy_coeff != 0,
                                  start=mb.response_start())
    surrogate = policy_loss(logp, mb.old_log_probs.to(device), mb.advantages.to(device), mask, kind=s.policy_loss,
                            clip_ratio_low=s.clip_ratio_low, clip_ratio_high=s.clip_ratio_high,
                            clip_ratio_c=s.clip_ratio_c, agg_mode=s.loss_agg_mode, horizon=s.horizon)
    kl = kl_penalty(logp, mb.ref_log_probs.to(device), s.kl_loss_type) * mask if s.use_kl_loss else None
    return ActorTerms(mask=mask, task=surrogate.loss_mat * mask, entropy=ent * mask, kl=kl, clipfrac=surrogate.clipfrac,
                      clipfrac_lower=surrogate.clipfrac_lower, ppo_kl=surrogate.ppo_kl,
                      task_unit=surrogate.unit_loss_mat * mask)


@dataclass
class ActorObjective:
    """The actor loss's terms aggregated over one micro-batch: what the update backwards (``total``)."""

    task: Tensor
    entropy: Tensor  # aggregated entropy (the bonus is -entropy_coeff * this; detached when 0)
    kl: Tensor | None
    clipfrac: Tensor
    clipfrac_lower: Tensor
    ppo_kl: Tensor
    terms: ActorTerms | None = None  # the per-token terms they aggregate

    def total(self, s: LossSettings) -> Tensor:
        raw = {"policy": self.task, "entropy": self.entropy, "kl": self.kl}
        loss = self.task
        for q, c in s.coefficients().items():
            if q != "policy" and c != 0 and raw[q] is not None:
                loss = loss + c * raw[q]
        return loss


def actor_objective(model: nn.Module, mb: Batch, s: LossSettings, den: Denominators) -> ActorObjective:
    """Forward ``mb`` and return each term of the actor loss aggregated against ``den`` (differentiable)."""
    terms = actor_terms(model, mb, s)

    def agg(x: Tensor) -> Tensor:
        return agg_loss(x, terms.mask, s.loss_agg_mode, horizon=s.horizon, num_tokens=den.num_tokens,
                        num_seqs=den.num_seqs)

    kl = agg(terms.kl) if terms.kl is not None else None
    return ActorObjective(task=agg(terms.task), entropy=agg(terms.entropy), kl=kl, clipfrac=terms.clipfrac,
                          clipfrac_lower=terms.clipfrac_lower, ppo_kl=terms.ppo_kl, terms=terms)


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
class FunctionLoss:
    """A plain function of a training loop as a ``LossFn`` (see ``per_token_loss``)."""

    fn: Callable[[nn.Module, Batch], dict[str, Tensor]]
    agg: Aggregation = field(default_factory=Aggregation)

    def __call__(self, model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        return self.fn(model, batch)


def per_token_loss(fn: Callable[[nn.Module, Batch], dict[str, Tensor] | Tensor], loss_agg_mode: str = "token-mean",
                   horizon: int = 1) -> FunctionLoss:
    """Wrap ``fn(model, batch) -> {term: [N, L]}`` (or one ``[N, L]`` tensor, the term ``task``) as a ``LossFn``
    aggregated like verl's ``loss_agg_mode`` (TRL's ``loss_type="grpo"`` is ``seq-mean-token-mean``,
    ``"dapo"``/``"bnpo"`` ``token-mean``, ``"dr_grpo"`` ``seq-mean-token-sum-norm`` with ``horizon`` =
    ``max_completion_length``)."""
    def terms(model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        out = fn(model, batch)
        return {"task": out} if isinstance(out, Tensor) else out

    return FunctionLoss(terms, Aggregation(loss_agg_mode, horizon))


class ActorLoss:
    """rlgrad's actor objective as a ``LossFn``: terms ``task`` (policy loss), ``entropy`` (``-entropy_coeff·H``)
    and ``kl`` (``kl_loss_coef·KL``), a term with a zero coefficient left out; ``logged``: ``policy``,
    ``entropy`` and ``kl`` (the raw quantities), whose ``total`` is the loss, as RAGEN reports them."""

    def __init__(self, settings: LossSettings | None = None):
        self.settings = settings or LossSettings()
        self.agg = self.settings.agg

    def __call__(self, model: nn.Module, batch: Batch) -> Terms:
        return self.of(actor_terms(model, batch, self.settings))

    def of(self, terms: ActorTerms) -> Terms:
        """What this loss returns for a forward's per-token terms (the update's own: ``groups.UpdatePass``)."""
        s = self.settings
        out = Terms(terms.weighted(s))
        out.logged = {q: v.detach() for q, v in terms.quantities().items() if v is not None}
        out.total = s.coefficients()
        return out

    def task_alone(self) -> bool:
        """Whether the loss is the policy term alone (no entropy bonus, no KL loss): its backward is that term's."""
        return all(c == 0 for q, c in self.settings.coefficients().items() if q != "policy")

    def unit(self) -> FunctionLoss:
        """The policy loss per unit of advantage (``ActorTerms.task_unit``), term ``task``: what the
        reward-component geometry splits by component advantages."""
        s = self.settings
        return FunctionLoss(lambda model, batch: {"task": actor_terms(model, batch, s).task_unit}, self.agg)


def as_loss_fn(loss: LossFn | LossSettings | None) -> LossFn:
    """An instrument's ``loss`` argument as a ``LossFn``: None or a ``LossSettings`` mean rlgrad's actor loss."""
    if loss is None or isinstance(loss, LossSettings):
        return ActorLoss(loss)
    if not isinstance(getattr(loss, "agg", None), Aggregation):
        raise TypeError("a loss function for the instruments needs its aggregation: wrap it with "
                        "rlgrad.algos.per_token_loss(fn, loss_agg_mode)")
    return loss


def as_unit_loss(loss: LossFn | LossSettings | None) -> LossFn:
    """The policy loss per unit of advantage for the reward-component geometry: a loss with a ``unit()`` method
    (rlgrad's ``ActorLoss``, also for None or a ``LossSettings``; the TRL integration's loss) gives its own; any
    other ``LossFn`` is taken to be one already."""
    loss = as_loss_fn(loss)
    unit = getattr(loss, "unit", None)
    return unit() if callable(unit) else loss


def critic_loss_fn(s: CriticSettings) -> FunctionLoss:
    """The clipped value loss per token, term ``value``, as a ``LossFn`` (the critic's neuron health)."""

    def fn(model: nn.Module, b: Batch) -> dict[str, Tensor]:
        device = next(model.parameters()).device
        mask = b.response_mask.to(device)
        v = forward_values(model, b.input_ids.to(device), b.attention_mask.to(device))
        out = value_loss(v, b.values.to(device), b.returns.to(device), mask, cliprange_value=s.cliprange_value,
                         agg_mode=s.loss_agg_mode, horizon=s.horizon)
        return {"value": out.loss_mat * mask}

    return FunctionLoss(fn, s.agg)
