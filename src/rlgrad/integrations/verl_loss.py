"""verl's actor loss and update batch in rlgrad's terms: ``LossSettings`` and a ``Batch``.

verl's ``ppo_loss`` (``verl.workers.utils.losses``, verl 0.9) is, per response token, the policy loss of
``actor.policy_loss.loss_mode`` (``vanilla``: PPO-clip with the dual clip ``clip_ratio_c``; ``gspo``), minus
``entropy_coeff`` times the entropy, plus ``kl_loss_coef`` times the ``kl_loss_type`` estimate (with
``use_kl_loss``), each aggregated by ``loss_agg_mode`` over the global mini-batch. That is rlgrad's own actor
loss (``rlgrad.algos.ActorLoss``, the same equations as verl's ``core_algos``), so the instruments take verl's
settings into a ``LossSettings`` instead of a second copy of the math. A bucket's loss is the same loss over
the bucket's rows alone (its own token or sequence count as the normaliser).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlgrad.algos.advantages import group_reward_std
from rlgrad.algos.objective import LossSettings
from rlgrad.batch import Batch
from rlgrad.collectives import all_gather_cat, world_size
from rlgrad.config.algorithm import AGG_MODES, VERL_KL_TYPES
from rlgrad.errors import UserError

POLICY_LOSSES = {"vanilla": "ppo", "gspo": "gspo"}  # verl's loss_mode -> rlgrad's policy_loss
# The batch fields that hold each sample's reward, most raw first (verl's reward before the KL-in-reward penalty).
SCORE_FIELDS = ("token_level_scores", "rm_scores", "token_level_rewards")


def _get(cfg, name: str, default=None):
    return cfg.get(name, default) if hasattr(cfg, "get") else getattr(cfg, name, default)


def verl_loss_settings(actor, temperature: float = 1.0) -> LossSettings:
    """rlgrad's ``LossSettings`` for verl's ``ActorConfig`` (or its ``actor_rollout_ref.actor`` section);
    a one-line error for a setting the instruments cannot follow exactly."""
    policy = _get(actor, "policy_loss", None)
    mode = _get(policy, "loss_mode", "vanilla") if policy is not None else "vanilla"
    agg = _get(actor, "loss_agg_mode", "token-mean")
    why = None
    if mode not in POLICY_LOSSES:
        why = (f"actor.policy_loss.loss_mode={mode} (supported: {', '.join(POLICY_LOSSES)}; verl's cispo clips "
               "the weight on both sides, rlgrad's follows MiniMax-M1's one-sided clip)")
    elif agg not in AGG_MODES:
        why = f"actor.loss_agg_mode={agg} (supported: {', '.join(AGG_MODES)})"
    elif agg == "seq-mean-token-sum-norm" and _get(actor, "loss_scale_factor") is None:
        why = ("loss_agg_mode=seq-mean-token-sum-norm without actor.loss_scale_factor (verl then divides by each "
               "micro-batch's padded width)")
    elif _get(actor, "use_kl_loss", False) and _get(actor, "kl_loss_type", "low_var_kl") not in VERL_KL_TYPES:
        why = f"actor.kl_loss_type={_get(actor, 'kl_loss_type')} (supported: {', '.join(VERL_KL_TYPES)})"
    if why:
        raise UserError(f"rlgrad's instruments cannot follow verl's actor loss exactly with {why}")
    low = _get(actor, "clip_ratio_low", None)
    high = _get(actor, "clip_ratio_high", None)
    clip = float(_get(actor, "clip_ratio", 0.2))
    return LossSettings(policy_loss=POLICY_LOSSES[mode], clip_ratio_low=float(clip if low is None else low),
                        clip_ratio_high=float(clip if high is None else high),
                        clip_ratio_c=float(_get(actor, "clip_ratio_c", 3.0)), loss_agg_mode=agg,
                        horizon=int(_get(actor, "loss_scale_factor", None) or 1),
                        use_kl_loss=bool(_get(actor, "use_kl_loss", False)),
                        kl_loss_coef=float(_get(actor, "kl_loss_coef", 0.001)),
                        kl_loss_type=_get(actor, "kl_loss_type", "low_var_kl"),
                        entropy_coeff=float(_get(actor, "entropy_coeff", 0.0)), temperature=float(temperature))


def _padded(t: Tensor) -> Tensor:
    """A verl response-aligned field ``[B, R]`` (nested/jagged or right-padded) as a right-padded tensor."""
    return t.to_padded_tensor(0.0) if t.is_nested else t


def _uids(td) -> list[str]:
    uid = td.get("uid", None)
    if uid is None:
        raise UserError("verl's update batch has no 'uid' field: rlgrad's instruments need the prompt groups")
    data = uid.tolist() if hasattr(uid, "tolist") else list(uid)
    return [str(u) for u in data]


def batch_from_verl(td) -> Batch:
    """This rank's rows of the ``TensorDict`` verl's trainer passes to the actor update, as a ``Batch``.

    verl's model-engine format: ``input_ids`` nested (each row its prompt then its response, no padding),
    ``prompts`` / ``responses`` nested or padded (padded ones with ``attention_mask``), the response-aligned
    ``response_mask``, ``advantages``, ``old_log_probs``, ``ref_log_prob`` nested or right-padded, ``uid``
    the prompt group and a reward field (``SCORE_FIELDS``). rlgrad's columns: the prompt left-padded, then the
    response right-padded, positions from the attention mask (as verl's ``compute_position_id_with_mask``).
    Under data parallelism a group may be split over ranks (verl balances rows by length): group ids and
    reward std are computed over every rank's rows.
    """
    if td.get("rollout_is_weights", None) is not None:
        raise UserError("rlgrad's instruments cannot follow verl's rollout importance-sampling weights "
                        "(algorithm.rollout_correction); turn them off or run verl without rlgrad")
    pos = td.get("position_ids", None)
    if pos is not None and (pos.values() if pos.is_nested else pos[0]).dim() > 1:
        raise UserError("rlgrad's instruments need a text-only model (verl's batch has multi-axis position_ids)")
    ids = td["input_ids"]
    prompts, responses = td["prompts"], td["responses"]
    if prompts.is_nested:
        prompt_lens, response_lens = prompts.offsets().diff(), responses.offsets().diff()
    else:
        am = td["attention_mask"]
        prompt_lens, response_lens = am[:, :prompts.shape[1]].sum(1), am[:, prompts.shape[1]:].sum(1)
    rows = ids.unbind() if ids.is_nested else [r for r in ids]
    mask = _padded(td["response_mask"]).float()
    R = int(max(int(response_lens.max()), mask.shape[1]))
    P = int(prompt_lens.max())
    n = len(rows)
    input_ids = torch.zeros(n, P + R, dtype=torch.long)
    attention = torch.zeros(n, P + R, dtype=torch.long)
    for i, (row, p, r) in enumerate(zip(rows, prompt_lens.tolist(), response_lens.tolist())):
        if len(row) != p + r:
            raise UserError(f"verl's update batch row {i}: {len(row)} tokens, but prompt {p} + response {r}")
        input_ids[i, P - p:P + r] = row.cpu()
        attention[i, P - p:P + r] = 1

    def wide(x: Tensor | None) -> Tensor | None:
        if x is None:
            return None
        x = _padded(x).float().cpu()
        out = torch.zeros(n, P + R)
        out[:, P:P + x.shape[1]] = x
        return out

    response_mask = wide(mask)
    score_field = next((f for f in SCORE_FIELDS if td.get(f, None) is not None), None)
    if score_field is None:
        raise UserError(f"verl's update batch has none of {', '.join(SCORE_FIELDS)}: rlgrad's instruments need "
                        "each sample's reward")
    scores = _padded(td[score_field]).float().cpu().sum(-1)
    uids = _uids(td)
    if world_size() > 1:  # every rank's uids and scores: a group's rows may sit on several ranks
        import torch.distributed as dist

        everyone: list[list[str]] = [None] * world_size()  # type: ignore[list-item]
        dist.all_gather_object(everyone, uids)
        all_uids = [u for part in everyone for u in part]
        all_scores = all_gather_cat(scores)
    else:
        all_uids, all_scores = uids, scores
    index = {u: k for k, u in enumerate(sorted(set(all_uids)))}
    all_gids = torch.tensor([index[u] for u in all_uids], dtype=torch.long)
    std_of = dict(zip(all_gids.tolist(), group_reward_std(all_scores, all_gids).tolist()))
    group_ids = torch.tensor([index[u] for u in uids], dtype=torch.long)
    reward_std = torch.tensor([std_of[int(g)] for g in group_ids], dtype=torch.float32)
    old = td.get("old_log_probs", None)
    return Batch(input_ids=input_ids, attention_mask=attention, response_mask=response_mask, group_ids=group_ids,
                 scores=scores, reward_std=reward_std, old_log_probs=wide(old),
                 ref_log_probs=wide(td.get("ref_log_prob", None)),
                 advantages=wide(td["advantages"]) * response_mask)
