"""The critic of PPO with a critic: its values in the batch alignment, its loss, its update.

    V_t   the value head's output at position t − 1 -- the state from which token t is generated --
          stored at column t, like every per-token tensor (see ``rlgrad.batch``)
    L_V = ½ · max((V − R)², (clip(V, V_old − c, V_old + c) − R)²), aggregated with loss_agg_mode

``R`` are the GAE returns and ``V_old`` the values that computed them (``rlgrad.rl.core``). The
update is the actor's loop (``rlgrad.rl.actor.ppo_update``) with this loss plugged in, so epochs,
mini/micro-batches, clipping and non-finite steps behave exactly as for the actor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlgrad.batch import Batch, position_ids_from_mask
from rlgrad.rl.actor import Denominators, MicroLoss, ppo_update
from rlgrad.rl.core import masked_mean, value_loss


@dataclass(frozen=True)
class CriticSettings:
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    horizon: int = 8  # response-length budget, for seq-mean-token-sum-norm

    @classmethod
    def from_config(cls, cfg) -> CriticSettings:
        c = cfg.critic
        return cls(cliprange_value=c.cliprange_value, loss_agg_mode=c.loss_agg_mode or cfg.actor.loss_agg_mode,
                   horizon=cfg.rollout.response_length)


def forward_values(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[N, L]`` values (float32, differentiable): column t holds the head's output at position t − 1."""
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask), use_cache=False).logits[..., 0].float()
    return torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], 1)


@torch.no_grad()
def compute_values(model, batch: Batch, *, micro_batch_size: int) -> torch.Tensor:
    """The critic's values for a whole batch (the "old" values of GAE), in micro-batches, without grad."""
    device = next(model.parameters()).device
    parts = [forward_values(model, batch.input_ids[s:s + micro_batch_size].to(device),
                            batch.attention_mask[s:s + micro_batch_size].to(device)).cpu()
             for s in range(0, len(batch), micro_batch_size)]
    return torch.cat(parts) * batch.response_mask


def critic_token_loss(s: CriticSettings):
    """The value loss per token with its aggregation weights, for the gradient engine (``analysis.engine.LossFn``)."""
    from rlgrad.rl.core import agg_token_weights

    def fn(model, b: Batch) -> dict[str, torch.Tensor]:
        device = next(model.parameters()).device
        mask = b.response_mask.to(device)
        v = forward_values(model, b.input_ids.to(device), b.attention_mask.to(device))
        out = value_loss(v, b.values.to(device), b.returns.to(device), mask, cliprange_value=s.cliprange_value,
                         agg_mode=s.loss_agg_mode, horizon=s.horizon)
        w, _ = agg_token_weights(mask, s.loss_agg_mode, horizon=s.horizon)
        return {"value": out.loss_mat * w.to(out.loss_mat.dtype)}

    return fn


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
                  on_grads=None) -> dict[str, float]:
    """Fit the critic to ``batch.returns``: critic/vf_loss, vf_clipfrac, vpred_mean, grad_norm, lr."""
    return ppo_update(model, optimizer, batch, critic_micro_loss(s), prefix="critic", ppo_epochs=ppo_epochs,
                      mini_batch_size=mini_batch_size, micro_batch_size=micro_batch_size,
                      max_grad_norm=max_grad_norm, shuffle=shuffle, seed=seed, scheduler=scheduler,
                      on_grads=on_grads)
