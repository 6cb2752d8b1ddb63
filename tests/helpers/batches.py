"""A tiny model and a sampled GRPO batch with one zero-variance group, for the engine's and the instruments' tests.
"""

from __future__ import annotations

import torch

from rlgrad.algos.advantages import group_reward_std, grpo_advantages
from rlgrad.algos.objective import LossSettings
from rlgrad.batch import Batch
from rlgrad.config.model import ModelConfig, TinyModelConfig
from rlgrad.models import build_char_tokenizer, build_tiny_model
from rlgrad.rl.rollout import compute_log_probs, generate


def built_hook(cfg, cls):
    """The hook of type ``cls`` that ``hooks_from_config`` builds for ``cfg`` (the one place hooks meet the config)."""
    from rlgrad.analysis import hooks_from_config

    return next(h for h in hooks_from_config(cfg) if isinstance(h, cls))


def make_batch(model, tok, n_prompts=5, n=4, seed=0, zero_group=True, old_noise=0.1) -> Batch:
    """Sampled groups of ``n`` with random scores (group 0 constant when ``zero_group``); old and reference log-probs
    a little off the model's, so ratios and KL are not trivially 1 and 0."""
    torch.manual_seed(seed)
    prompts = ["1+2=", "13+4=", "7*8=", "99-5=", "3+3="][:n_prompts]
    gen = generate(model, tok, prompts, n=n, max_new_tokens=5, do_sample=True)
    g = torch.arange(n_prompts).repeat_interleave(n)
    scores = torch.rand(len(g))
    if zero_group:
        scores[:n] = 0.7  # group 0 has zero reward variance
    b = Batch(
        input_ids=gen.input_ids, attention_mask=gen.attention_mask, response_mask=gen.response_mask, group_ids=g,
        scores=scores, reward_std=group_reward_std(scores, g))
    b.old_log_probs, _ = compute_log_probs(model, b.input_ids, b.attention_mask, b.response_mask,
                                           temperature=1.0, micro_batch_size=64)
    b.old_log_probs = b.old_log_probs + old_noise * torch.randn_like(b.old_log_probs) * b.response_mask
    b.ref_log_probs = b.old_log_probs + 0.1 * torch.randn_like(b.old_log_probs) * b.response_mask
    b.advantages = grpo_advantages(scores, g, norm_by_std=True)[:, None] * b.response_mask
    return b


def tiny_model_and_tokenizer():
    """The tiny Qwen2 (hidden 32, 2 layers, GQA) and the char tokenizer every engine test uses."""
    tok = build_char_tokenizer()
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=48))
    return build_tiny_model(cfg, tok, seed=3), tok


# Loss settings that cover verl's aggregation modes, PPO and CISPO, with and without the KL and entropy terms.
SETTINGS = [
    LossSettings(loss_agg_mode="token-mean", use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, horizon=5),
    LossSettings(loss_agg_mode="seq-mean-token-mean", use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01,
                 horizon=5, policy_loss="cispo"),
    LossSettings(loss_agg_mode="seq-mean-token-sum-norm", use_kl_loss=False, entropy_coeff=0.0, horizon=5,
                 clip_ratio_low=0.05, clip_ratio_high=0.05),
    LossSettings(loss_agg_mode="seq-mean-token-sum", use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01,
                 horizon=5, kl_loss_type="k2"),
    LossSettings(loss_agg_mode="token-sum", use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, horizon=5,
                 policy_loss="gspo", kl_loss_type="low_var_kl+"),
    LossSettings(loss_agg_mode="seq-mean-token-mean", horizon=5, policy_loss="gspo", clip_ratio_low=0.02,
                 clip_ratio_high=0.02, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k1+"),
]
