"""The RL math, by topic. Names follow verl's ``core_algos.py``; shapes follow :mod:`rlgrad.batch`.

    aggregation.py   masked reductions; verl's loss_agg_mode as a loss and as token weights; Denominators
    advantages.py    GRPO, RLOO, REINFORCE++(-baseline), GAE; compute_advantages
    kl.py            KL estimators (k1, abs, k2, k3/low_var_kl, and their straight-through "+" forms)
    logprobs.py      log-probs and entropies from logits; the policy's and a value model's forwards
    surrogates.py    the clipped surrogates: PPO / dual-clip / CISPO / GSPO policy loss, the value loss
    objective.py     the actor objective: LossSettings, ActorTerms / ActorObjective, and the LossFn every
                     instrument takes (ActorLoss, per_token_loss)
"""

from rlgrad.algos.advantages import compute_advantages, group_reward_std, grpo_advantages, rloo_advantages
from rlgrad.algos.aggregation import Aggregation, Denominators, agg_loss, agg_token_weights
from rlgrad.algos.kl import kl_penalty
from rlgrad.algos.logprobs import entropy_from_logits, forward_log_probs, logprobs_from_logits
from rlgrad.algos.objective import (
    ActorLoss,
    ActorObjective,
    ActorTerms,
    CriticSettings,
    FunctionLoss,
    LossFn,
    LossSettings,
    Terms,
    actor_objective,
    actor_terms,
    per_token_loss,
)
from rlgrad.algos.surrogates import policy_loss, value_loss

__all__ = [
    "ActorLoss", "ActorObjective", "ActorTerms", "Aggregation", "CriticSettings", "Denominators", "FunctionLoss",
    "LossFn", "LossSettings", "Terms", "actor_objective", "actor_terms", "agg_loss", "agg_token_weights",
    "compute_advantages", "entropy_from_logits", "forward_log_probs", "group_reward_std", "grpo_advantages",
    "kl_penalty", "logprobs_from_logits", "per_token_loss", "policy_loss", "rloo_advantages", "value_loss",
]

# The names the old modules rlgrad.loss and rlgrad.core had, where this release renamed them.
_RENAMED = {"PerTokenLoss": "FunctionLoss", "TokenLosses": "ActorTerms", "token_losses": "actor_terms",
            "LossTerms": "ActorObjective", "actor_loss_terms": "actor_objective"}


def _deprecated_alias(old: str):
    """A module ``__getattr__`` for ``old``: each name found in this package, with a DeprecationWarning."""
    import importlib
    import warnings

    def lookup(name: str):
        new = _RENAMED.get(name, name)
        # defining modules before the ones that import from them, so the warning names where a name lives
        for sub in ("aggregation", "advantages", "kl", "logprobs", "surrogates", "objective"):
            module = importlib.import_module(f"rlgrad.algos.{sub}")
            if hasattr(module, new):
                warnings.warn(f"{old}.{name} moved to rlgrad.algos.{sub}.{new}; {old} goes away in the next release",
                              DeprecationWarning, stacklevel=2)
                return getattr(module, new)
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    return lookup
