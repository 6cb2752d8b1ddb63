"""The critic of PPO with a critic: its values in the batch alignment, its loss, its update.

    V_t   the value head's output at position t − 1 -- the state from which token t is generated --
          stored at column t, like every per-token tensor (see ``rlgrad.batch``)
    L_V = ½ · max((V − R)², (clip(V, V_old − c, V_old + c) − R)²), aggregated with loss_agg_mode

``R`` are the GAE returns and ``V_old`` the values that computed them (``algos/advantages.py``); the loss
math and ``CriticSettings`` live in ``algos/surrogates.py`` and ``algos/objective.py``. The update is the actor's loop
(``rlgrad.rl.actor.ppo_update``) with this loss plugged in, so epochs, mini/micro-batches, clipping
and non-finite steps behave exactly as for the actor.
"""

from __future__ import annotations

import torch

from rlgrad.algos.aggregation import Denominators, masked_mean
from rlgrad.algos.logprobs import forward_values
from rlgrad.algos.objective import CriticSettings
from rlgrad.algos.surrogates import value_loss
from rlgrad.batch import Batch
from rlgrad.rl.actor import MicroLoss, UpdateKeys, ppo_update

CRITIC_KEYS = UpdateKeys("critic/grad_norm", "critic/lr", "critic/nonfinite_grad_steps")


@torch.no_grad()
def compute_values(model, batch: Batch, *, micro_batch_size: int) -> torch.Tensor:
    """The critic's values for a whole batch (the "old" values of GAE), in micro-batches, without grad."""
    device = next(model.parameters()).device
    parts = [forward_values(model, batch.input_ids[s:s + micro_batch_size].to(device),
                            batch.attention_mask[s:s + micro_batch_size].to(device)).cpu()
             for s in range(0, len(batch), micro_batch_size)]
    return torch.cat(parts) * batch.response_mask


def critic_micro_loss(s: CriticSettings) -> MicroLoss:
    """The clipped value loss of one micro-batch for ``ppo_update``, its metrics as additive shares."""

    def loss(model, mb: Batch, den: Denominators) -> tuple[torch.Tensor, dict[str, float]]:
        device = next(model.parameters()).device
        mask = mb.response_mask.to(device)
        v = forward_values(model, mb.input_ids.to(device), mb.attention_mask.to(device))
        out = value_loss(v, mb.values.to(device), mb.returns.to(device), mask, cliprange_value=s.cliprange_value,
                         agg_mode=s.loss_agg_mode, horizon=s.horizon, num_tokens=den.num_tokens,
                         num_seqs=den.num_seqs)
        w = float(mask.sum()) / max(den.num_tokens, 1.0)  # token share: turns token means into mini-batch means
        stats = {"critic/vf_loss": float(out.loss.detach()), "critic/vf_clipfrac": float(out.clipfrac) * w,
                 "critic/vpred_mean": float(masked_mean(v.detach(), mask)) * w}
        return out.loss, stats

    return loss


def update_critic(model, optimizer, batch: Batch, s: CriticSettings, *, ppo_epochs: int, mini_batch_size: int,
                  micro_batch_size: int, max_grad_norm: float, shuffle: bool, seed: int, scheduler=None,
                  on_grads=None, before_grads=None) -> dict[str, float]:
    """Fit the critic to ``batch.returns``: critic/vf_loss, vf_clipfrac, vpred_mean, grad_norm, lr."""
    return ppo_update(model, optimizer, batch, critic_micro_loss(s), names=CRITIC_KEYS, ppo_epochs=ppo_epochs,
                      mini_batch_size=mini_batch_size, micro_batch_size=micro_batch_size,
                      max_grad_norm=max_grad_norm, shuffle=shuffle, seed=seed, scheduler=scheduler,
                      on_grads=on_grads, before_grads=before_grads)
