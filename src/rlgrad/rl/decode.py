"""A lean batched decode loop for Qwen2 / Llama / Mistral-style HF causal LMs (``rollout.engine=native``).

It reads the HF model's own modules and parameters (norms, projections, MLPs, rotary embedding, LM
head) at every call, never a copy, so it always runs the actor's current weights; it replaces only
what makes ``generate`` slow for small models: the per-step cache / mask / processor machinery and
module-call overhead. For every block, on the new tokens::

    x = RMSNorm(h)
    q, k, v = x Wq + bq, x Wk + bk, x Wv + bv               q: [B, H, t, hd], k, v: [B, Hkv, t, hd]
    q, k = q cos + rotate_half(q) sin, same for k            RoPE at position_ids = cumsum(mask) - 1
    K[:, :, s:e], V[:, :, s:e] = k, v                        preallocated cache [B, Hkv, P + max_new, hd]
    h = h + softmax(q K^T * scaling + mask) V Wo             each KV head serves H / Hkv query heads (GQA)
    h = h + W_down (act(x' W_gate) * x' W_up),  x' = RMSNorm(h)      act = silu for these models

Prompts are left-padded; a padded key is masked out for every query. The ``n`` samples of a prompt
share its prefill (computed once, copied into their cache rows). Sampling mirrors ``generate``'s
processors (min_new_tokens, temperature, top-k, top-p, in that order), so greedy decoding gives
``generate``'s tokens; it draws from that distribution by inversion (one uniform per row, see
``draw``) rather than ``generate``'s ``torch.multinomial``, which is 40x slower on CPU for a large
vocabulary: the same distribution, not the same draws for a seed. Draws come from the global RNG
or, given one ``torch.Generator`` per prompt, from each prompt's own generator, so a prompt group's
samples do not depend on which other prompts share the batch (or the rank).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = {"qwen2", "llama", "mistral"}
# generation_config options (beyond min_new_tokens) that generate() would apply and decode() does not.
_NEUTRAL_GENERATION_OPTIONS = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_length": 0, "min_p": None,
                               "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "bad_words_ids": None,
                               "suppress_tokens": None, "begin_suppress_tokens": None, "sequence_bias": None,
                               "forced_bos_token_id": None, "forced_eos_token_id": None}


def unsupported_reason(model, max_len: int | None = None) -> str | None:
    """Why ``decode`` cannot run ``model`` (None when it can); ``max_len`` = prompt + response tokens."""
    c = getattr(model, "config", None)
    if any(hasattr(m, "lora_A") for m in model.modules()):  # decode calls the base weights functionally
        return "LoRA adapters (PEFT) are not run by the native decoder"
    if getattr(c, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return f"model_type {getattr(c, 'model_type', None)!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}"
    inner = getattr(model, "model", None)
    layer = getattr(inner, "layers", [None])[0]
    if not (all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb"))
            and hasattr(model, "lm_head")
            and all(hasattr(layer.mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn"))
            and hasattr(layer.input_layernorm, "variance_epsilon")):
        return f"{type(model).__name__} does not have the Qwen2/Llama module layout"
    windows = {getattr(layer.self_attn, "sliding_window", None) for layer in inner.layers}
    if c.model_type == "mistral":
        windows.add(getattr(c, "sliding_window", None))
    window = min((w for w in windows if w), default=None)
    if window is not None and (max_len is None or max_len > window):
        return f"sliding-window attention (window {window}) over sequences of up to {max_len} tokens"
    g = getattr(model, "generation_config", None)
    for name, neutral in _NEUTRAL_GENERATION_OPTIONS.items():
        v = getattr(g, name, None)
        if v is not None and v != neutral:
            return f"generation_config.{name}={v!r}"
    return None


def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x cos + rotate_half(x) sin, where rotate_half(x) = (-x2, x1) = roll(x, hd/2) with the sign kept in sin_signed."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin_signed)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v with q [B, H, t, hd], k and v [B, Hkv, e, hd], bias [B, 1, t, e] (0 / -inf)."""
    B, H, t, hd = q.shape
    kv, e = k.shape[1], k.shape[2]
    g = q.reshape(B, kv, -1, hd)  # [B, Hkv, (H / Hkv) t, hd]: the query heads sharing a KV head, side by side
    s = (g @ k.transpose(-1, -2)).view(B, kv, -1, t, e) * scale + bias[:, :, None]
    p = s.softmax(-1, dtype=torch.float32).to(v.dtype)  # in fp32, as HF does for half-precision models
    return (p.view(B, kv, -1, e) @ v).view(B, H, t, hd)


def rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """w * x / sqrt(mean(x^2) + eps), normalised in fp32 like HF's Qwen2/Llama/Mistral RMSNorm."""
    return norm.weight * F.rms_norm(x.float(), x.shape[-1:], eps=norm.variance_epsilon).to(x.dtype)


def linear(x: torch.Tensor, proj) -> torch.Tensor:
    return F.linear(x, proj.weight, proj.bias)


def blocks(model, h, cos, sin, k_cache, v_cache, s: int, e: int, bias) -> torch.Tensor:
    """Run the tokens at cache columns s..e-1 (``h``: [B, e - s, d]) through every block; final-normed last hidden.

    The modules' own parameters, called functionally (``F.linear`` / ``F.rms_norm``): the same maths as
    their ``forward`` without the per-call module overhead, which dominates one-token steps.
    """
    B, t, _ = h.shape
    for layer, kc, vc in zip(model.model.layers, k_cache, v_cache):
        attn, mlp = layer.self_attn, layer.mlp
        x = rms_norm(h, layer.input_layernorm)
        q = linear(x, attn.q_proj).view(B, t, -1, attn.head_dim).transpose(1, 2)
        k = linear(x, attn.k_proj).view(B, t, -1, attn.head_dim).transpose(1, 2)
        kc[:, :, s:e] = rope(k, cos, sin)
        vc[:, :, s:e] = linear(x, attn.v_proj).view(B, t, -1, attn.head_dim).transpose(1, 2)
        o = attend(rope(q, cos, sin), kc[:, :, :e], vc[:, :, :e], bias, attn.scaling)
        h = h + linear(o.transpose(1, 2).reshape(B, t, -1), attn.o_proj)
        x = rms_norm(h, layer.post_attention_layernorm)
        h = h + linear(mlp.act_fn(linear(x, mlp.gate_proj)) * linear(x, mlp.up_proj), mlp.down_proj)  # SwiGLU MLP
    return rms_norm(h[:, -1], model.model.norm)


def filtered_probs(scores: torch.Tensor, *, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The sampling distribution [B, V] of processed scores [B, V], as generate's warpers make it."""
    if temperature != 1.0:
        scores = scores / temperature
    if top_k > 0:  # keep the k largest (ties with the k-th included)
        kth = torch.topk(scores, min(top_k, scores.shape[-1])).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:  # drop the least likely tokens whose cumulative probability is <= 1 - top_p
        sorted_scores, order = scores.sort(-1)
        drop = sorted_scores.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[:, -1] = False  # always keep the most likely token
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores.softmax(-1)


def draw(probs: torch.Tensor, generators: list[torch.Generator] | None = None) -> torch.Tensor:
    """One token per row of ``probs`` [B, V], by inversion: the first token whose cumulative probability
    exceeds u·total, one uniform u per row.

    The same distribution as ``torch.multinomial(probs, 1)``, which on CPU draws an exponential per
    vocabulary entry (20 ms for 16 rows of a 49k vocabulary, against 0.5 ms here). The cumulative sum
    is in float64, so a token's share of [0, total) is its probability to about 1e-16; a token of
    probability 0 is never drawn. ``generators``: one per consecutive block of ``B / len(generators)``
    rows (a prompt's samples); None: the global RNG.
    """
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:]
    if generators is None:
        u = torch.rand(probs.shape[0], 1, dtype=torch.float64, device=probs.device)
    else:
        per = probs.shape[0] // len(generators)
        u = torch.cat([torch.rand(per, 1, dtype=torch.float64, generator=g, device=probs.device)
                       for g in generators])
    x = u * total  # < total (for u < 1 in float64 arithmetic): lands on a token of p > 0
    return torch.searchsorted(cdf, x, right=True)[:, 0]


def sample(scores: torch.Tensor, *, do_sample: bool, temperature: float, top_k: int, top_p: float,
           generators: list[torch.Generator] | None = None) -> torch.Tensor:
    """Next tokens [B] from processed scores [B, V]: greedy, or a draw from generate's warped distribution.

    ``generators``: one per consecutive block of ``B / len(generators)`` rows (a prompt's samples);
    None: the global RNG."""
    if not do_sample:
        return scores.argmax(-1)
    return draw(filtered_probs(scores, temperature=temperature, top_k=top_k, top_p=top_p), generators)


@torch.no_grad()
def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
           eos_token_id: int | list[int],
           pad_token_id: int, do_sample: bool, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
           top_k: int = 0, min_new_tokens: int = 0, on_logits=None, generators: list[torch.Generator] | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate up to ``max_new_tokens`` after each of the left-padded prompts ``[B0, P]``, ``n`` times each.

    Returns ``(tokens, log_probs)``, both ``[B0 * n, steps]`` (rows i*n .. i*n+n-1 continue prompt i):
    the new tokens (``pad_token_id`` after a row's EOS; stops once every row has emitted EOS) and, for
    each, log softmax(raw logits / temperature) at that token -- the sampling policy's log-prob before
    top-k / top-p (verl's old log-prob), 0 after EOS. ``on_logits(t, logits)`` sees each step's raw logits.
    ``generators`` (optional, one per prompt, on the model's device): the RNG of each prompt's samples.
    ``eos_token_id`` may list several stop tokens (EOS and a chat template's end of turn).
    """
    stops = torch.as_tensor(eos_token_id, device=input_ids.device).reshape(-1)
    B0, P = input_ids.shape
    B, T, dev, neg_inf = B0 * n, P + max_new_tokens, input_ids.device, float("-inf")
    valid = torch.cat([attention_mask.bool(), attention_mask.new_ones(B0, max_new_tokens, dtype=torch.bool)], 1)
    h = model.model.embed_tokens(input_ids)
    cos, sin = model.model.rotary_emb(h, (valid.long().cumsum(-1) - 1).clamp(min=0))  # the model's own RoPE
    half = cos.shape[-1] // 2
    # [B0, 1, T, hd]; sin carries rotate_half's sign (see rope)
    cos, sin = cos[:, None], torch.cat([-sin[..., :half], sin[..., half:]], -1)[:, None]
    hd, n_kv = model.model.layers[0].self_attn.head_dim, model.config.num_key_value_heads
    k_cache = [h.new_zeros(B, n_kv, T, hd) for _ in model.model.layers]
    v_cache = [h.new_zeros(B, n_kv, T, hd) for _ in model.model.layers]

    # Prefill, once per prompt (cache rows ::n): causal over valid keys; a padded query sees only itself
    # (its output is never used, but must not be NaN).
    causal, eye = torch.ones(P, P, dtype=torch.bool, device=dev).tril(), torch.eye(P, dtype=torch.bool, device=dev)
    allowed = causal & valid[:, None, None, :P] | eye & ~valid[:, None, :P, None]  # [B0, 1, P, P]
    bias = torch.zeros(allowed.shape, dtype=h.dtype, device=dev).masked_fill_(~allowed, neg_inf)
    hidden = blocks(model, h, cos[:, :, :P], sin[:, :, :P], [c[::n] for c in k_cache], [c[::n] for c in v_cache],
                    0, P, bias)
    logits = model.lm_head(hidden).float().repeat_interleave(n, 0)
    for c in k_cache + v_cache:
        c[:, :, :P] = c[::n, :, :P].repeat_interleave(n, 0)
    cos, sin, valid = cos.repeat_interleave(n, 0), sin.repeat_interleave(n, 0), valid.repeat_interleave(n, 0)
    bias = torch.zeros(B, 1, 1, T, dtype=h.dtype, device=dev).masked_fill_(~valid[:, None, None], neg_inf)

    done = torch.zeros(B, dtype=torch.bool, device=dev)
    tokens, log_probs = [], []
    for t in range(max_new_tokens):
        if on_logits is not None:
            on_logits(t, logits)
        scores = logits
        if t < min_new_tokens:  # no EOS before min_new_tokens
            scores = scores.clone()
            scores[:, stops] = neg_inf
        nxt = sample(scores, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                     generators=generators)
        nxt = nxt.masked_fill(done, pad_token_id)  # finished rows are padded
        logp = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, -1)
        tokens.append(nxt)
        log_probs.append(logp.gather(-1, nxt[:, None])[:, 0].masked_fill(done, 0.0))
        done |= torch.isin(nxt, stops)
        if t == max_new_tokens - 1 or bool(done.all()):
            break
        e = P + t  # cache column of the token just drawn; it attends to every valid column up to itself
        hidden = blocks(model, model.model.embed_tokens(nxt[:, None]), cos[:, :, e:e + 1], sin[:, :, e:e + 1],
                        k_cache, v_cache, e, e + 1, bias[..., :e + 1])
        logits = model.lm_head(hidden).float()
    if not tokens:
        return input_ids.new_zeros(B, 0), torch.zeros(B, 0, device=dev)
    return torch.stack(tokens, 1), torch.stack(log_probs, 1)
