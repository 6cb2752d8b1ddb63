"""Rollout: batched sampling with ``generate`` and the tensors of the batch convention.

See ``rlgrad.batch`` for the alignment: ``[N, L]`` over prompt+response, prompts
left-padded, ``response_mask[i, t] = 1`` for response tokens (the EOS included) whose
log-prob is predicted from position ``t - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlgrad.batch import position_ids_from_mask
from rlgrad.errors import UserError


@dataclass
class Generation:
    input_ids: torch.Tensor  # [N, L]
    attention_mask: torch.Tensor  # [N, L]
    response_mask: torch.Tensor  # [N, L] float
    responses: list[str]  # decoded response text, special tokens removed
    response_lengths: torch.Tensor  # [N] response tokens (EOS included)
    truncated: torch.Tensor  # [N] bool: hit the length limit without EOS


def encode_prompts(tokenizer, prompts: list[str], max_prompt_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tokenizer(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
    lengths = enc["attention_mask"].sum(-1)
    if int(lengths.max()) > max_prompt_length:
        i = int(lengths.argmax())
        raise UserError(f"prompt {i} has {int(lengths[i])} tokens, more than data.max_prompt_length="
                        f"{max_prompt_length}: {prompts[i][:60]!r}")
    return enc["input_ids"], enc["attention_mask"]


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], *, n: int, max_new_tokens: int, do_sample: bool,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, max_prompt_length: int = 256,
             micro_batch_size: int = 256) -> Generation:
    """Sample ``n`` responses per prompt (samples of prompt i are rows i*n .. i*n+n-1)."""
    ids, att = encode_prompts(tokenizer, prompts, max_prompt_length)
    ids, att = ids.repeat_interleave(n, 0), att.repeat_interleave(n, 0)
    device = next(model.parameters()).device
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad, do_sample=do_sample)
    if do_sample:
        kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else None)
    was_training = model.training
    model.eval()
    outs = []
    for s in range(0, ids.shape[0], micro_batch_size):
        out = model.generate(input_ids=ids[s:s + micro_batch_size].to(device),
                             attention_mask=att[s:s + micro_batch_size].to(device), **kwargs)
        outs.append(out[:, ids.shape[1]:].cpu())
    model.train(was_training)
    width = max(o.shape[1] for o in outs)
    resp = torch.cat([torch.nn.functional.pad(o, (0, width - o.shape[1]), value=pad) for o in outs])

    # A response runs up to and including its first EOS; everything after is padding.
    is_eos = resp == eos
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    resp_valid_l = (~after_eos).long()  # generate only pads after EOS (or past the longest sample)
    input_ids = torch.cat([ids, resp], 1)
    attention_mask = torch.cat([att, resp_valid_l], 1)
    response_mask = torch.cat([torch.zeros_like(att), resp_valid_l], 1).float()
    lengths = resp_valid_l.sum(-1)
    truncated = ~is_eos.any(-1)
    texts = tokenizer.batch_decode([r[m.bool()] for r, m in zip(resp, resp_valid_l)], skip_special_tokens=True)
    return Generation(input_ids, attention_mask, response_mask, texts, lengths, truncated)


def forward_log_probs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                      temperature: float = 1.0, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-prob of ``input_ids[:, t]`` under the logits at ``t - 1`` (column 0 is 0).

    Logits are divided by the rollout temperature, as verl does, so that old log-probs
    describe the distribution the samples were drawn from.
    """
    from rlgrad.rl.core import entropy_from_logits, logprobs_from_logits

    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids_from_mask(attention_mask), use_cache=False).logits
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    zero = torch.zeros_like(input_ids[:, :1], dtype=logits.dtype)
    logp = torch.cat([zero, logprobs_from_logits(logits, input_ids[:, 1:])], 1)
    ent = torch.cat([zero, entropy_from_logits(logits)], 1) if with_entropy else None
    return logp, ent


@torch.no_grad()
def compute_log_probs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor,
                      *, temperature: float, micro_batch_size: int, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Masked log-probs (and entropies) for a whole batch, in micro-batches, without grad."""
    device = next(model.parameters()).device
    lps, ents = [], []
    for s in range(0, input_ids.shape[0], micro_batch_size):
        sl = slice(s, s + micro_batch_size)
        lp, ent = forward_log_probs(model, input_ids[sl].to(device), attention_mask[sl].to(device),
                                    temperature=temperature, with_entropy=with_entropy)
        lps.append(lp.cpu())
        if with_entropy:
            ents.append(ent.cpu())
    logp = torch.cat(lps) * response_mask
    return logp, (torch.cat(ents) * response_mask if with_entropy else None)
