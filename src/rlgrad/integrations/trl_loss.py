"""TRL's GRPO loss, batch and reward split in rlgrad's terms: a ``LossFn``, a ``Batch``, component advantages.

What TRL's ``GRPOTrainer._compute_loss`` computes per token, split into the terms the instruments measure
(TRL 1.16; ``A`` the sequence advantage, ``r = exp(log π − log π_old)`` the token ratio, or the sequence
ratio ``exp(mean_t(log π − log π_old))`` with ``importance_sampling_level="sequence"``)::

    task     grpo, bnpo, dr_grpo, dapo, luspo:  −min(min(r, δ) A, clip(r, 1−ε_low, 1+ε_high) A)
             cispo:  −sg(min(r, ε_high)) A log π          sapo:  −σ(τ (r − 1)) (4 / τ) A,  τ by the sign of A
             vespo:  −φ(w) A log π  (TRL's gamma weights, no gradient through φ)
             (× TRL's off-policy sequence mask when off_policy_mask_threshold is set)
    kl       β (exp(ref − log π) − (ref − log π) − 1)  (× r with use_bias_correction_kl)
    entropy  −entropy_coef · H

aggregated as TRL does for its ``loss_type`` (``AGGREGATION``): ``grpo``/``sapo`` average each sequence's
token mean, ``bnpo``/``dapo``/``cispo``/``vespo`` average over tokens, ``dr_grpo`` divides the token sum by
``max_completion_length`` per sequence, ``luspo`` averages the token sums. For the whole batch an optimizer
step covers, that is TRL's accumulated gradient (its division by the accumulation steps and, for dapo /
cispo / vespo, by the global token count make the micro-batches add up to it) except for ``bnpo``, which TRL
normalises per micro-batch: with one micro-batch per step on one process they agree. A bucket's loss is
the same loss over the bucket's rows alone.

Log-probs come from the model's own forward with the LM head on the completion positions
(``logits_to_keep``), logits divided by TRL's temperature, and the model's default positions (TRL passes
no ``position_ids``), which is what TRL's fused LM head computes without materialising the logits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rlgrad.algos.aggregation import Aggregation
from rlgrad.algos.logprobs import forward_log_probs, log_probs_of_output
from rlgrad.algos.objective import FunctionLoss, Terms
from rlgrad.analysis.groups import lm_head
from rlgrad.batch import Batch
from rlgrad.errors import UserError

AGGREGATION = {"grpo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean", "bnpo": "token-mean",
               "dapo": "token-mean", "cispo": "token-mean", "vespo": "token-mean",
               "dr_grpo": "seq-mean-token-sum-norm", "luspo": "seq-mean-token-sum"}
CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # TRL's PPO-style two-sided clip family
EPS = 1e-4  # TRL's epsilon in the advantage's std division


@dataclass(frozen=True)
class TRLLossSettings:
    """The settings of TRL's GRPO loss that the per-token terms depend on (read from a ``GRPOTrainer``)."""

    loss_type: str = "dapo"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    delta: float | None = None
    beta: float = 0.0
    bias_correction_kl: bool = False
    importance_sampling_level: str = "token"
    temperature: float = 1.0
    max_completion_length: int = 256
    entropy_coef: float = 0.0
    off_policy_mask_threshold: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo: tuple[float, float, float, float] = (2.0, 3.0, 3.0, 2.0)  # k_pos, lambda_pos, k_neg, lambda_neg

    @classmethod
    def of(cls, trainer) -> TRLLossSettings:
        """``trainer``'s settings; a one-line error for a setting the instruments cannot follow exactly."""
        a = trainer.args
        s = cls(loss_type=trainer.loss_type, epsilon_low=float(trainer.epsilon_low),
                epsilon_high=float(trainer.epsilon_high), delta=getattr(a, "delta", None), beta=float(trainer.beta),
                bias_correction_kl=bool(getattr(a, "use_bias_correction_kl", False)),
                importance_sampling_level=trainer.importance_sampling_level, temperature=float(trainer.temperature),
                max_completion_length=int(trainer.max_completion_length),
                entropy_coef=float(getattr(trainer, "entropy_coef", 0.0) or 0.0),
                off_policy_mask_threshold=getattr(trainer, "off_policy_mask_threshold", None),
                sapo_temperature_pos=float(getattr(a, "sapo_temperature_pos", 1.0)),
                sapo_temperature_neg=float(getattr(a, "sapo_temperature_neg", 1.05)),
                vespo=tuple(float(getattr(a, f"vespo_{k}", d)) for k, d in
                            (("k_pos", 2.0), ("lambda_pos", 3.0), ("k_neg", 3.0), ("lambda_neg", 2.0))))
        if s.loss_type not in AGGREGATION:
            raise UserError(f"rlgrad's instruments do not know TRL's loss_type '{s.loss_type}' (supported: "
                            f"{', '.join(AGGREGATION)})")
        why = None
        if getattr(trainer, "use_adaptive_entropy", False):
            why = "use_adaptive_entropy (the entropy coefficient changes inside the step)"
        elif s.entropy_coef and AGGREGATION[s.loss_type] != "token-mean":
            why = (f"an entropy bonus (entropy_coef) with loss_type='{s.loss_type}': TRL averages the bonus over "
                   "tokens and the policy loss per sequence, two aggregations in one loss")
        elif getattr(trainer, "top_entropy_quantile", 1.0) < 1.0:
            why = "top_entropy_quantile < 1 (its token mask is a quantile over each micro-batch)"
        elif getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_importance_sampling_correction", False):
            why = "vLLM importance-sampling correction"
        if why:
            raise UserError(f"rlgrad's instruments cannot follow TRL's loss exactly with {why}; turn it off or "
                            "run TRL without rlgrad")
        return s

    @property
    def agg(self) -> Aggregation:
        return Aggregation(AGGREGATION[self.loss_type], horizon=self.max_completion_length)


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    return x * mask if x.shape == mask.shape else x.expand_as(mask) * mask


class TRLLoss:
    """TRL's GRPO loss as a ``LossFn`` over a ``Batch`` made by ``batch_from_trl``: terms ``task``, ``kl``
    (β ≠ 0) and ``entropy`` (entropy_coef ≠ 0); ``logged`` ``policy``, ``kl``, ``entropy`` (raw), whose
    ``total`` is TRL's loss; ``unit()`` the policy loss per unit of advantage (reward-function geometry)."""

    def __init__(self, settings: TRLLossSettings):
        self.settings = settings
        self.agg = settings.agg

    def _parts(self, model: nn.Module, b: Batch) -> dict[str, Tensor]:
        s = self.settings
        device = next(model.parameters()).device
        logp, ent = forward_log_probs(model, b.input_ids.to(device), b.attention_mask.to(device),
                                      temperature=s.temperature, with_entropy=True, entropy_grad=s.entropy_coef != 0,
                                      start=b.response_start(), mask_positions=False)
        return self._per_token(logp, ent, b)

    def _per_token(self, logp: Tensor, ent: Tensor, b: Batch) -> dict[str, Tensor]:
        """The per-token parts (``unit``, ``policy``, ``entropy``, ``kl``) from the forward's log-probs."""
        s = self.settings
        device = logp.device
        mask = b.response_mask.to(device)
        old = logp.detach() if b.old_log_probs is None else b.old_log_probs.to(device)
        adv = b.advantages.to(device)
        adv = adv.gather(1, torch.full_like(adv[:, :1], b.response_start(), dtype=torch.long))  # [N, 1]: per sequence
        log_ratio = (logp - old) * mask
        if s.importance_sampling_level == "sequence":
            log_w = log_ratio.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
        else:
            log_w = log_ratio
        r = torch.exp(log_w)
        if s.loss_type == "cispo":
            unit = -torch.clamp(r, max=s.epsilon_high).detach() * logp
        elif s.loss_type in CLIPPED:
            r1 = torch.clamp(r, max=s.delta) if s.delta is not None else r
            r2 = torch.clamp(r, 1 - s.epsilon_low, 1 + s.epsilon_high)
            # −min(r1 A, r2 A) = A · unit: the smaller ratio for A ≥ 0, the larger for A < 0 (ties split the
            # gradient evenly, as torch.min does)
            unit = -torch.where(adv >= 0, torch.minimum(r1, r2), torch.maximum(r1, r2))
        elif s.loss_type == "sapo":
            tau = torch.where(adv > 0, s.sapo_temperature_pos, s.sapo_temperature_neg)
            unit = -torch.sigmoid(tau * (r - 1)) * 4 / tau
        else:  # vespo
            from trl import GRPOTrainer

            k_pos, l_pos, k_neg, l_neg = s.vespo
            phi = GRPOTrainer.get_gamma_weights(adv, log_ratio, mask, None, k_pos=k_pos, lambda_pos=l_pos,
                                                k_neg=k_neg, lambda_neg=l_neg)
            unit = -phi * logp
        if s.off_policy_mask_threshold is not None:
            from trl import GRPOTrainer

            unit = unit * GRPOTrainer.get_off_policy_mask(adv, logp, old, mask, s.off_policy_mask_threshold)
        unit = _masked(unit, mask)
        out = {"unit": unit, "policy": unit * adv, "entropy": ent * mask}
        if s.beta != 0.0:
            ref = b.ref_log_probs.to(device)
            d = ref - logp
            kl = torch.exp(d) - d - 1
            if s.bias_correction_kl:
                kl = kl * r
            out["kl"] = _masked(kl, mask)
        return out

    def __call__(self, model: nn.Module, batch: Batch) -> Terms:
        return self.of(self._parts(model, batch))

    def of(self, p: dict[str, Tensor]) -> Terms:
        """What this loss returns for a forward's per-token parts (``fused_head``: those of TRL's own forward)."""
        s = self.settings
        terms = Terms({"task": p["policy"]})
        if "kl" in p:
            terms["kl"] = s.beta * p["kl"]
        if s.entropy_coef:
            terms["entropy"] = -s.entropy_coef * p["entropy"]
        terms.logged = {"policy": p["policy"].detach(), "entropy": p["entropy"].detach()}
        terms.total = {"policy": 1.0, "entropy": -s.entropy_coef}
        if "kl" in p:
            terms.logged["kl"] = p["kl"].detach()
            terms.total["kl"] = s.beta
        return terms

    def unit(self) -> FunctionLoss:
        return FunctionLoss(lambda model, batch: {"task": self._parts(model, batch)["unit"]}, self.agg)

    def task_alone(self) -> bool:
        """Whether TRL's loss is the policy term alone (β = 0, no entropy bonus): its backward is that term's."""
        return self.settings.beta == 0.0 and not self.settings.entropy_coef

    @contextmanager
    def fused_head(self, model: nn.Module, batch: Batch, seen: Callable[[dict[str, Tensor]], None]
                   ) -> Iterator[None]:
        """While open, TRL's training forward of ``model`` on ``batch``'s rows (TRL's fused LM head:
        ``trl.trainer.utils.add_fused_lm_head``, which scores the tokens in tiles without calling the LM head as a
        module or keeping the logits) shows the LM head to the module hooks as if it had run: from the backbone's
        output h (detached) the head runs once on the completion positions, ``z = head(h)``, whose forward hooks
        see it (``seen`` gets the per-token parts read from z, without a graph), and in the backward, when the
        gradient g of TRL's per-token log-probs arrives, ``∂L/∂z = g (onehot(y) − softmax(z/T)) / T`` goes back
        through that head call alone (``autograd.grad`` to its weight, discarded), so its backward hooks see the
        head's output gradient. TRL's own gradients are untouched. Costs one head forward and weight backward."""
        model = _unwrapped(model)
        head, backbone = model.get_output_embeddings(), model.base_model
        s, start, L = self.settings, batch.response_start(), batch.input_ids.shape[1]
        held: dict[str, Tensor] = {}

        def keep_hidden(module: nn.Module, args: tuple, out) -> None:
            held["h"] = out.last_hidden_state.detach()

        def read(module: nn.Module, args: tuple, out) -> None:
            with torch.enable_grad():
                z = head(held.pop("h")[:, start - 1:])  # positions start-1 .. L-1, as logits_to_keep does
            with torch.no_grad():
                logp, ent = log_probs_of_output(z.detach(), batch.input_ids.to(z.device), temperature=s.temperature,
                                                with_entropy=True, entropy_grad=False, start=start)
                seen(self._per_token(logp, ent, batch))
            if out.log_probs.requires_grad and head.weight.requires_grad:  # (a frozen head: LoRA)
                out.log_probs.register_hook(lambda g: back(z, g))

        def back(z: Tensor, g: Tensor) -> None:
            with torch.no_grad():
                # log_probs[:, j] scores column j + 1: the head's position start-1+i scores column start+i
                upstream = torch.zeros(z.shape[:2], dtype=torch.float32, device=z.device)
                upstream[:, :-1] = g[:, start - 1:L - 1].float()
                ids = batch.input_ids[:, start:].to(z.device)[..., None]
                dz = torch.softmax(z.detach().float() / s.temperature, dim=-1).neg_()
                dz[:, :-1].scatter_add_(-1, ids, torch.ones(ids.shape, dtype=dz.dtype, device=dz.device))
                dz.mul_((upstream / s.temperature)[..., None])
            torch.autograd.grad(z, head.weight, grad_outputs=dz.to(z.dtype))

        handles = [backbone.register_forward_hook(keep_hidden), model.register_forward_hook(read)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def _unwrapped(model: nn.Module) -> nn.Module:
    """A PEFT model's wrapped model (TRL adds its fused head to it, before PEFT wraps it); any other model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def plain_fused_head(model: nn.Module) -> bool:
    """Whether ``TRLLoss.fused_head`` can stand in for TRL's fused LM head on ``model`` (a PEFT model: the model it
    wraps): a text model whose head is an ``nn.Linear`` applied to its ``base_model``'s output as it is (no logit
    scale or soft-capping, which TRL's kernel would apply and the stand-in does not)."""
    model = _unwrapped(model)
    config = getattr(model, "config", None)
    head = lm_head(model)
    if config is None or not isinstance(head, nn.Linear) or getattr(model, "base_model", model) is model:
        return False
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    scaled = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")
    return text is config and all(getattr(text, k, None) is None for k in scaled)


# ---- TRL's generation output -> Batch ---------------------------------------------------------------------

def batch_from_trl(out: dict, *, group_ids: Tensor, scores: Tensor, reward_std: Tensor,
                   components: dict[str, Tensor]) -> Batch:
    """This process's rows of TRL's ``_generate_and_score_completions`` output as a ``Batch``.

    Columns: the left-padded prompt, then the right-padded completion; ``response_mask`` is TRL's loss mask
    (completion mask, times the tool mask in multi-turn runs). ``group_ids``, ``scores`` (weighted total
    reward), ``reward_std`` (its unbiased group std) and ``components`` (each reward function's reward) are
    ``[n]``, from the gathered rewards (``trl_reward_view``)."""
    prompt_ids, prompt_mask = out["prompt_ids"], out["prompt_mask"]
    completion_ids, completion_mask = out["completion_ids"], out["completion_mask"]
    loss_mask = completion_mask * out["tool_mask"] if out.get("tool_mask") is not None else completion_mask
    n, P = prompt_ids.shape

    def wide(x: Tensor | None) -> Tensor | None:
        return None if x is None else torch.cat([x.new_zeros(n, P), x], 1).float().cpu()

    adv = out["advantages"]
    if adv.dim() != 1:
        raise UserError("rlgrad's instruments need one advantage per completion (TRL's GRPO advantages), got "
                        f"advantages of shape {tuple(adv.shape)}")
    adv = adv[:, None].expand_as(completion_mask)
    response_mask = wide(loss_mask.float())
    return Batch(input_ids=torch.cat([prompt_ids, completion_ids], 1).cpu(),
                 attention_mask=torch.cat([prompt_mask, completion_mask], 1).long().cpu(),
                 response_mask=response_mask, group_ids=group_ids.cpu(), scores=scores.float().cpu(),
                 reward_std=reward_std.float().cpu(), components={k: v.float().cpu() for k, v in components.items()},
                 old_log_probs=wide(out.get("old_per_token_logps")), ref_log_probs=wide(out.get("ref_per_token_logps")),
                 advantages=wide(adv.float()) * response_mask)


@dataclass
class RewardView:
    """TRL's gathered rewards of one generation batch (every process's rows, in order), read once."""

    total: Tensor  # [N] weighted total (NaN: every reward function returned None)
    group_ids: Tensor  # [N]
    reward_std: Tensor  # [N] unbiased std of the group's totals
    components: dict[str, Tensor]  # reward function name -> [N] (None -> 0)
    split: dict[str, Tensor]  # reward function name -> [N] its share of TRL's advantage
    advantage: Tensor  # [N] float64: TRL's advantage in exact arithmetic, the shares' sum
    tol: Tensor  # [N] float64: how far TRL's advantage, computed in its dtype, may round away from ``advantage``

    def check(self, advantages: Tensor, rows: slice) -> None:
        """Refuse ``advantages`` (TRL's, for ``rows``) unless they are TRL's reward advantage up to its rounding."""
        diff = (advantages.double().cpu() - self.advantage[rows]).abs()
        excess = diff - self.tol[rows]
        if not bool((excess <= 0).all()):
            i = int(excess.argmax())
            raise UserError("TRL's advantages are not its reward functions' normalised rewards (a custom advantage?): "
                            f"{float(advantages[i]):.6g} where its rewards give {float(self.advantage[rows][i]):.6g} "
                            f"+- {float(self.tol[rows][i]):.2g} (rounding); rlgrad's reward-function geometry cannot "
                            "split them")


def _group_mean(x: Tensor, valid: Tensor, g: Tensor, num_groups: int) -> Tensor:
    """Per-sample mean of ``x`` over the valid samples of its group."""
    s = torch.zeros(num_groups, dtype=x.dtype).index_add_(0, g, torch.where(valid, x, 0.0))
    c = torch.zeros(num_groups, dtype=x.dtype).index_add_(0, g, valid.to(x.dtype))
    return (s / c.clamp(min=1))[g]


def _group_std(x: Tensor, valid: Tensor, g: Tensor, num_groups: int) -> Tensor:
    """Per-sample unbiased std of ``x`` over the valid samples of its group (TRL's ``nanstd``)."""
    m = _group_mean(x, valid, g, num_groups)
    ss = torch.zeros(num_groups, dtype=x.dtype).index_add_(0, g, torch.where(valid, (x - m) ** 2, 0.0))
    c = torch.zeros(num_groups, dtype=x.dtype).index_add_(0, g, valid.to(x.dtype))
    return (ss / (c - 1).clamp(min=1)).sqrt()[g]


def _group_max(x: Tensor, valid: Tensor, g: Tensor, num_groups: int) -> Tensor:
    """Per-sample max of ``x`` (>= 0) over the valid samples of its group (0 for none)."""
    return torch.zeros(num_groups, dtype=x.dtype).scatter_reduce_(0, g, torch.where(valid, x, 0.0), "amax")[g]


def _normalised_rounding(x: Tensor, err: Tensor, valid: Tensor, g: Tensor, num_groups: int, std_g: Tensor | None,
                         adv: Tensor, u: float) -> Tensor:
    """A first-order bound on how far ``(x − mean_g x) / (std x + EPS)``, computed as TRL does in a dtype of unit
    roundoff ``u`` from values within ``err`` of ``x``, lies from its exact value ``adv``; ``std_g`` the groups of
    the std (None: no division, ``scale_rewards="none"``). Per sample, with n, M, ē a group's size, max |x| + err
    and mean err: a float sum of n terms is within (n−1)·u·Σ|terms| whatever the summation order, so the mean is
    within ē + (n+1)·u·M and x − mean within e_dev = err + ē + (n+3)·u·M; the std moves by at most the deviations'
    error norm, √(n/(n−1))·(rms err + ē + (n+3)·u·M), plus (n+6)·u of its own rounding (squares, sum, divisions,
    sqrt); the quotient is then within (e_dev + |A|·e_den) / (den − e_den) + u·|A|. A group without variance has
    A = 0, but TRL's float32 mean of equal totals may miss them by an ulp, which its ``/ (0 + 1e-4)`` scales to
    about u·|R|·1e4: 0.01 at rewards in the tens, which this bound lets through."""
    M = _group_max(x.abs() + err, valid, g, num_groups)
    n = torch.zeros(num_groups, dtype=x.dtype).index_add_(0, g, valid.to(x.dtype))[g]
    e_dev = err + _group_mean(err, valid, g, num_groups) + (n + 3) * u * M
    if std_g is None:
        return e_dev + u * adv.abs()
    G = int(std_g.max()) + 1 if len(std_g) else 0
    Ms = _group_max(x.abs() + err, valid, std_g, G)
    ns = torch.zeros(G, dtype=x.dtype).index_add_(0, std_g, valid.to(x.dtype))[std_g]
    rms = _group_mean(err**2, valid, std_g, G).sqrt()
    std = _group_std(x, valid, std_g, G)
    e_std = ((ns / (ns - 1).clamp(min=1)).sqrt() * (rms + _group_mean(err, valid, std_g, G) + (ns + 3) * u * Ms)
             + (ns + 6) * u * std)
    den = std + EPS
    e_den = e_std + 2 * u * den  # and EPS's own float rounding, and the sum's
    tol = (e_dev + adv.abs() * e_den) / torch.clamp(den - e_den, min=(1 - u) * EPS) + u * adv.abs()
    # one valid sample: TRL's std is NaN, its advantage 0 after nan_to_num, as is ours (x − mean = 0)
    return torch.where(ns > 1, tol, 0.0)


def trl_reward_view(rewards_per_func: Tensor, weights: Tensor, names: list[str], num_generations: int, *,
                    scale_rewards: str, aggregation: str) -> RewardView:
    """Totals, groups and each reward function's share of the advantage, as TRL forms the advantage.

    ``sum_then_normalize``: A = (R − mean_g R) / (std + 1e-4) with R = Σ_k w_k r_k and std the group's, the
    batch's or none (``scale_rewards``); reward function k's share is w_k (r_k − mean_g r_k) / (std + 1e-4).
    ``normalize_then_sum``: z_k = (r_k − mean_g r_k) / (std_g r_k + 1e-4), R = Σ_k w_k z_k, A = (R − mean R) /
    (std R + 1e-4) over the batch; k's share is w_k (z_k − mean z_k) / (std R + 1e-4). Both are linear in the
    rewards with TRL's normalisers held fixed, so the shares add up to A. A None reward counts 0 in the sums
    (TRL's ``nansum``); a sample whose every reward is None has A = 0 and shares 0.

    This is A in exact arithmetic (float64 here, from TRL's own float32 rewards and weights). TRL computes it in
    the rewards' dtype (float32), and ``tol`` bounds the difference (``_normalised_rounding``): about
    (n+K)·u·|R| / std where a group's rewards vary (1e-5 at rewards in the tens and a std of 1; u = 2^-24), and
    about (2n+K+4)·u·|R|·1e4 where they do not (0.1 at rewards in the tens), because TRL divides a rounding
    residue by std + 1e-4 = 1e-4 (A = ±0.0094 for rewards 15 and 13 weighted 0.7 / 0.3 in groups of 3). That
    residue is no reward function's: the shares of such a group are 0.
    """
    u = torch.finfo(torch.promote_types(rewards_per_func.dtype, weights.dtype)).eps / 2  # TRL's unit roundoff
    r = rewards_per_func.double().cpu()
    w = weights.double().cpu()
    N = r.shape[0]
    g = torch.arange(N) // num_generations
    G = int(g.max()) + 1 if N else 0
    scorable = ~torch.isnan(r).all(1)
    rz = torch.nan_to_num(r, nan=0.0)
    total = (rz * w).sum(1)
    std_total = _group_std(total, scorable, g, G)
    if aggregation == "sum_then_normalize":
        if scale_rewards == "batch":
            valid = total[scorable]
            den = (valid.std() if valid.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)) + EPS
        else:
            den = std_total + EPS if scale_rewards == "group" else torch.ones_like(total)
        split = {k: w[j] * (rz[:, j] - _group_mean(rz[:, j], scorable, g, G)) / den for j, k in enumerate(names)}
        A = torch.where(scorable, sum(split.values()), 0.0)
        # TRL's float R = nansum(w * r) is within γ_K Σ_k |w_k r_k| <= (K+1)·u·Σ_k |w_k r_k| of this R
        err = (len(names) + 1) * u * (rz * w).abs().sum(1)
        std_g = {"group": g, "batch": torch.zeros_like(g), "none": None}[scale_rewards]
        tol = _normalised_rounding(total, err, scorable, g, G, std_g, A, u)
    elif aggregation == "normalize_then_sum":
        zs, z_tol = [], []
        for j in range(len(names)):
            ok = ~torch.isnan(r[:, j])
            zj = torch.where(ok, (rz[:, j] - _group_mean(rz[:, j], ok, g, G)) / (_group_std(rz[:, j], ok, g, G) + EPS),
                             0.0)
            zs.append(zj)
            z_tol.append(torch.where(ok, _normalised_rounding(rz[:, j], torch.zeros_like(zj), ok, g, G, g, zj, u), 0.0))
        z, z_tol = torch.stack(zs, 1), torch.stack(z_tol, 1)
        R = (z * w).sum(1)
        valid = R[scorable]
        den = (valid.std() if valid.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)) + EPS
        split = {k: w[j] * (z[:, j] - z[scorable, j].mean()) / den for j, k in enumerate(names)}
        A = torch.where(scorable, sum(split.values()), 0.0)
        # TRL's z_k are within z_tol of these; its R = nansum(w * z) adds (K+1)·u·Σ_k |w_k z_k|
        err = (z_tol * w.abs()).sum(1) + (len(names) + 1) * u * ((z.abs() + z_tol) * w.abs()).sum(1)
        zero = torch.zeros_like(g)
        tol = _normalised_rounding(R, err, scorable, zero, 1, zero, A, u)
    else:
        raise UserError(f"rlgrad does not know TRL's multi_objective_aggregation '{aggregation}'")
    split = {k: torch.where(scorable, v, 0.0).float() for k, v in split.items()}
    return RewardView(total=torch.where(scorable, total, float("nan")).float(), group_ids=g,
                      reward_std=std_total.float(), components={k: rz[:, j].float() for j, k in enumerate(names)},
                      split=split, advantage=A, tol=torch.where(scorable, tol, 0.0))
