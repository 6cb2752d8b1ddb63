"""KL estimators between the policy and the reference, per token (verl's ``kl_penalty``), with the
straight-through ``+`` variants.
"""

from __future__ import annotations

import torch
from torch import Tensor


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate between the policy and the reference, from sampled-token log-probs.

    * ``kl`` / ``k1``:  logp − ref
    * ``abs``:          |logp − ref|
    * ``mse`` / ``k2``: ½ (logp − ref)²
    * ``low_var_kl`` / ``low-var-kl`` / ``k3``: with k = ref − logp, exp(k) − k − 1 clamped to [−10, 10].
      k is first clamped to [−20, 20] (as newer verl does): the value is unchanged (the result
      saturates at 10 long before) but exp never overflows, so the backward pass never sees inf·0.
    * any of these with ``+`` (``k1+``, ``abs+``, ``low_var_kl+``, ``k3+`` ...): straight-through, verl's
      ``kl_penalty``: the value of the named estimator with the gradient of k2, ½ (logp − ref)²,

          kl_t = sg(est_t) + k2_t − sg(k2_t)

      whose expected gradient is the gradient of KL(π‖π_ref) (k1's and k3's are not).
    """
    if kind.endswith("+"):
        value = kl_penalty(log_probs, ref_log_probs, kind[:-1]).detach()
        k2 = 0.5 * (log_probs - ref_log_probs).square()
        return value + k2 - k2.detach()
    delta = log_probs - ref_log_probs
    if kind in ("kl", "k1"):
        return delta
    if kind == "abs":
        return delta.abs()
    if kind in ("mse", "k2"):
        return 0.5 * delta.square()
    if kind in ("low_var_kl", "low-var-kl", "k3"):
        k = (-delta).clamp(-20.0, 20.0)
        return (torch.exp(k) - k - 1).clamp(-10.0, 10.0)
    raise ValueError(f"unknown kl_penalty kind {kind!r}; expected kl/k1, abs, mse/k2, low_var_kl/k3 (each "
                     "optionally with +)")
