"""Rollout: batched sampling and the tensors of the batch convention.

Sampling runs on transformers' ``generate`` (engine ``hf``) or on rlgrad's own decode loop
(``native``, ``rlgrad.rl.decode``); both also return the sampling policy's log-prob of every
response token, which the trainer uses as the old log-probs.

See ``rlgrad.batch`` for the alignment: ``[N, L]`` over prompt+response, prompts
left-padded, ``response_mask[i, t] = 1`` for response tokens (the EOS included) whose
log-prob is predicted from position ``t - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlgrad.algos.logprobs import forward_log_probs
from rlgrad.batch import response_start
from rlgrad.errors import UserError


@dataclass
class Generation:
    input_ids: torch.Tensor  # [N, L]
    attention_mask: torch.Tensor  # [N, L]
    response_mask: torch.Tensor  # [N, L] float
    responses: list[str]  # decoded response text, special tokens removed
    response_lengths: torch.Tensor  # [N] response tokens (EOS included)
    truncated: torch.Tensor  # [N] bool: hit the length limit without EOS
    # [N, L] log softmax(raw logits / temperature) at each response token, as the sampling model computed it
    # (verl's old log-prob: before top-k / top-p); zero outside response_mask.
    log_probs: torch.Tensor | None = None


def group_seed(seed: int, stream: int, step: int, group: int) -> int:
    """Seed of one prompt group's sampling generator (``rollout.group_seeded_sampling``); stream 0: training,
    1: separate analysis batches, 2: validation."""
    return (((seed * 1_000_003 + stream) * 1_000_033 + step) * 1_000_037 + group) % (1 << 62)


CHAT_TEMPLATE_MODES = ("auto", "true", "false")


def uses_chat_template(tokenizer, mode: str) -> bool:
    """``data.apply_chat_template``: auto (when the tokenizer has a template) | true (an error without one) | false."""
    has = bool(getattr(tokenizer, "chat_template", None))
    if mode == "true" and not has:
        raise UserError("data.apply_chat_template=true, but the tokenizer has no chat template "
                        "(set data.apply_chat_template=auto or false)")
    return has and mode != "false"


def prompt_messages(example, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The chat messages of a task example: its own (verl's parquet ``prompt``), or one user turn; a
    ``system_prompt`` is put first unless the messages already start with a system turn."""
    messages = ([dict(m) for m in example.messages] if example.messages
                else [{"role": "user", "content": example.prompt}])
    if system_prompt and messages[0].get("role") != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def render_prompts(tokenizer, examples, chat: bool, system_prompt: str | None = None) -> list[str]:
    """The text the model is given for each example: its messages through the tokenizer's chat template
    (``add_generation_prompt=True``, as verl and TRL render prompts), or, without one, the plain prompt."""
    if not chat:
        return [e.prompt for e in examples]
    return [tokenizer.apply_chat_template(prompt_messages(e, system_prompt), tokenize=False,
                                          add_generation_prompt=True) for e in examples]


def stop_token_ids(tokenizer, model=None, chat: bool = False) -> list[int]:
    """The tokens a response ends at: EOS, the model's generation_config EOS ids and, with a chat template,
    the token that closes an assistant turn (``<|im_end|>``, ``<|eot_id|>`` ...), found by rendering one."""
    ids = [tokenizer.eos_token_id]
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += gen_eos if isinstance(gen_eos, list) else [gen_eos]
    if chat:
        marker = "rlgrad-end-of-turn-probe"
        turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": marker}]
        text = tokenizer.apply_chat_template(turns, tokenize=False)
        after = tokenizer(text[text.rindex(marker) + len(marker):], add_special_tokens=False)["input_ids"]
        special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
        ids += [t for t in after[:1] if t in special]
    return sorted({int(i) for i in ids if i is not None})


def check_prompt_rendering(tokenizer, model, mode: str, system_prompt: str | None, examples) -> tuple[bool, list[int]]:
    """``(chat template on?, stop token ids)`` for ``data.apply_chat_template`` / ``data.system_prompt``, after
    rendering ``examples`` once: a template that refuses them (a system turn Gemma's rejects, Mistral's turn
    order) or a system prompt with no template to put it in is a one-line error before the run starts."""
    chat = uses_chat_template(tokenizer, mode)
    if system_prompt and not chat:
        raise UserError("data.system_prompt needs a chat template, and this run renders none "
                        f"(data.apply_chat_template={mode}, tokenizer template: "
                        f"{'yes' if getattr(tokenizer, 'chat_template', None) else 'none'})")
    try:
        render_prompts(tokenizer, examples, chat, system_prompt)
        return chat, stop_token_ids(tokenizer, model, chat)
    except Exception as e:  # jinja's TemplateError and friends: the template's own words
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"the tokenizer's chat template cannot render this run's prompts "
                        f"(data.apply_chat_template={mode}, data.system_prompt="
                        f"{'set' if system_prompt else 'null'}): {first}") from None


class PromptTooLong(UserError):
    """A prompt over ``data.max_prompt_length``; ``index``: its position in the call (the caller names its source)."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index


def check_prompt_lengths(tokenizer, examples, chat: bool, system_prompt: str | None, max_prompt_length: int) -> None:
    """Every prompt of ``examples`` (a data file's rows) within ``max_prompt_length`` tokens, measured before the run
    writes anything: the first one over is a one-line error naming its row, not a refusal at whichever step samples
    it. A chunk at a time, each prompt cut one token past the limit (a 3,000,000-token prompt is never held whole as
    token ids but to count them for the message)."""
    for first in range(0, len(examples), 256):
        chunk = examples[first:first + 256]
        prompts = render_prompts(tokenizer, chunk, chat, system_prompt)
        ids = tokenizer(prompts, add_special_tokens=False, truncation=True, max_length=max_prompt_length + 1)
        over = next((i for i, row in enumerate(ids["input_ids"]) if len(row) > max_prompt_length), None)
        if over is not None:
            tokens = len(tokenizer(prompts[over], add_special_tokens=False)["input_ids"])
            source = (chunk[over].meta or {}).get("source") or f"data row {first + over + 1}"
            raise UserError(f"{source}: the prompt has {tokens} tokens, more than data.max_prompt_length="
                            f"{max_prompt_length}: {prompts[over][:60]!r}")


def encode_prompts(tokenizer, prompts: list[str], max_prompt_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tokenizer(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
    lengths = enc["attention_mask"].sum(-1)
    if int(lengths.max()) > max_prompt_length:
        i = int(lengths.argmax())
        raise PromptTooLong(f"prompt {i} has {int(lengths[i])} tokens, more than data.max_prompt_length="
                            f"{max_prompt_length}: {prompts[i][:60]!r}", i)
    return enc["input_ids"], enc["attention_mask"]


class _RawLogProbs:
    """Forward hook for ``generate``: log softmax(raw logits / T) of each decode step at the token drawn from it.

    The token drawn from step k's logits is the input of step k + 1 (or, for the last, read from the output),
    so only one step's log-softmax is held at a time.
    """

    def __init__(self, temperature: float):
        self.temperature, self.pending, self.out = temperature, None, []

    def __call__(self, module, args, kwargs, output):
        if self.pending is not None:
            self.take((kwargs["input_ids"] if "input_ids" in kwargs else args[0])[:, -1])
        self.pending = torch.log_softmax(output.logits[:, -1].float() / self.temperature, -1)

    def take(self, tokens: torch.Tensor) -> None:
        self.out.append(self.pending.gather(-1, tokens[:, None])[:, 0])
        self.pending = None


def _hf_generate(model, ids, att, kwargs: dict, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers ``generate``: new tokens [B, steps] and their raw-logit log-probs [B, steps]."""
    rec = _RawLogProbs(temperature)
    handle = model.register_forward_hook(rec, with_kwargs=True)
    try:
        resp = model.generate(input_ids=ids, attention_mask=att, **kwargs)[:, ids.shape[1]:]
    finally:
        handle.remove()
    if rec.pending is not None and len(rec.out) < resp.shape[1]:
        rec.take(resp[:, len(rec.out)])
    lp = torch.stack(rec.out, 1)[:, :resp.shape[1]] if rec.out else torch.zeros(resp.shape, device=resp.device)
    return resp, lp


def resolve_engine(model, engine: str, max_len: int | None = None) -> str:
    """``hf`` | ``native`` for ``rollout.engine`` (``auto``: native when ``decode`` supports the model)."""
    from rlgrad.rl.decode import unsupported_reason

    if engine == "hf":
        return "hf"
    why = unsupported_reason(model, max_len)
    if engine == "native" and why is not None:
        raise UserError(f"rollout.engine=native cannot run this model ({why}); use rollout.engine=auto or hf")
    if engine not in ("auto", "native"):
        raise UserError(f"rollout.engine must be one of auto, hf, native, got {engine!r}")
    return "native" if why is None else "hf"


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], *, n: int, max_new_tokens: int, do_sample: bool,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, max_prompt_length: int = 256,
             micro_batch_size: int = 256, engine: str = "hf", seeds: list[int] | None = None,
             stop_ids: list[int] | None = None) -> Generation:
    """Sample ``n`` responses per prompt (samples of prompt i are rows i*n .. i*n+n-1).

    ``engine``: ``hf`` (transformers ``generate``), ``native`` (``rlgrad.rl.decode``; its micro-batches
    hold whole prompt groups, ``max(1, micro_batch_size // n)`` prompts) or ``auto`` (native when the
    model supports it). Both also return each response token's log-prob under the raw logits /
    ``temperature`` (``Generation.log_probs``, also when greedy).

    ``seeds`` (optional, one per prompt): prompt i's samples are drawn from a generator seeded with
    ``seeds[i]`` instead of the global RNG, so they do not depend on the other prompts of the call
    (how prompts are split over micro-batches or ranks). ``hf`` then generates prompt by prompt.
    ``stop_ids``: the tokens a response ends at (default: EOS; see ``stop_token_ids``).
    """
    prompt_ids, prompt_att = encode_prompts(tokenizer, prompts, max_prompt_length)
    return generate_from_ids(model, tokenizer, prompt_ids, prompt_att, n=n, max_new_tokens=max_new_tokens,
                             do_sample=do_sample, temperature=temperature, top_p=top_p, top_k=top_k,
                             micro_batch_size=micro_batch_size, engine=engine, seeds=seeds, stop_ids=stop_ids)


def left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> left-padded ``(input_ids, attention_mask)`` ``[N, max length]``."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], dtype=torch.long)
    att = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids.reshape(len(rows), width), att.reshape(len(rows), width)


@torch.no_grad()
def generate_from_ids(model, tokenizer, prompt_ids: torch.Tensor, prompt_att: torch.Tensor, *, n: int,
                      max_new_tokens: int, do_sample: bool, temperature: float = 1.0, top_p: float = 1.0,
                      top_k: int = 0, micro_batch_size: int = 256, engine: str = "hf",
                      seeds: list[int] | None = None, stop_ids: list[int] | None = None) -> Generation:
    """``generate`` on prompts already tokenized and left-padded (``prompt_ids``, ``prompt_att`` ``[P, L]``):
    what a multi-turn episode samples from, its own token history."""
    from rlgrad.rl.decode import decode

    ids, att = prompt_ids.repeat_interleave(n, 0), prompt_att.repeat_interleave(n, 0)
    device = next(model.parameters()).device
    stops = stop_ids or [tokenizer.eos_token_id]
    eos, pad = stops if len(stops) > 1 else stops[0], tokenizer.pad_token_id
    engine = resolve_engine(model, engine, ids.shape[1] + max_new_tokens)
    kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad, do_sample=do_sample)
    if do_sample:
        kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else None)
    was_training = model.training
    model.eval()
    outs, lps = [], []
    try:
        if engine == "native":  # whole prompt groups per micro-batch: a prompt is prefilled once for its n samples
            per = max(1, micro_batch_size // n)
            for s in range(0, prompt_ids.shape[0], per):
                gens = None if seeds is None else [torch.Generator(device=device).manual_seed(int(x))
                                                   for x in seeds[s:s + per]]
                out, lp = decode(model, prompt_ids[s:s + per].to(device), prompt_att[s:s + per].to(device), n=n,
                                 max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                                 do_sample=do_sample, temperature=temperature, top_p=top_p, top_k=top_k,
                                 min_new_tokens=getattr(model.generation_config, "min_new_tokens", None) or 0,
                                 generators=gens)
                outs.append(out.cpu())
                lps.append(lp.float().cpu())
        elif seeds is not None:  # prompt by prompt, each from its own seed (the global RNG left as it was)
            for i, seed in enumerate(seeds):
                with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                    torch.manual_seed(int(seed))
                    out, lp = _hf_generate(model, ids[i * n:(i + 1) * n].to(device),
                                           att[i * n:(i + 1) * n].to(device), kwargs, temperature)
                outs.append(out.cpu())
                lps.append(lp.float().cpu())
        else:
            for s in range(0, ids.shape[0], micro_batch_size):
                out, lp = _hf_generate(model, ids[s:s + micro_batch_size].to(device),
                                       att[s:s + micro_batch_size].to(device), kwargs, temperature)
                outs.append(out.cpu())
                lps.append(lp.float().cpu())
    finally:
        model.train(was_training)
    width = max(o.shape[1] for o in outs)
    resp = torch.cat([torch.nn.functional.pad(o, (0, width - o.shape[1]), value=pad) for o in outs])
    resp_lp = torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in lps])

    # A response runs up to and including its first stop token; everything after is padding.
    is_eos = torch.isin(resp, torch.tensor(stops))
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    resp_valid_l = (~after_eos).long()  # generate only pads after EOS (or past the longest sample)
    input_ids = torch.cat([ids, resp], 1)
    attention_mask = torch.cat([att, resp_valid_l], 1)
    response_mask = torch.cat([torch.zeros_like(att), resp_valid_l], 1).float()
    log_probs = torch.cat([torch.zeros_like(att, dtype=torch.float32), resp_lp], 1) * response_mask
    lengths = resp_valid_l.sum(-1)
    truncated = ~is_eos.any(-1)
    texts = tokenizer.batch_decode([r[m.bool()] for r, m in zip(resp, resp_valid_l)], skip_special_tokens=True)
    return Generation(input_ids, attention_mask, response_mask, texts, lengths, truncated, log_probs)


@torch.no_grad()
def compute_log_probs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor,
                      *, temperature: float, micro_batch_size: int, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Masked log-probs (and entropies) for a whole batch, in micro-batches, without grad."""
    device = next(model.parameters()).device
    if input_ids.shape[0] == 0:  # a rank whose share the filter emptied
        z = torch.zeros(input_ids.shape, dtype=torch.float32)
        return z, (z if with_entropy else None)
    start = response_start(response_mask)  # no logits for prompt positions
    lps, ents = [], []
    for s in range(0, input_ids.shape[0], micro_batch_size):
        sl = slice(s, s + micro_batch_size)
        lp, ent = forward_log_probs(model, input_ids[sl].to(device), attention_mask[sl].to(device),
                                    temperature=temperature, with_entropy=with_entropy, start=start)
        lps.append(lp.cpu())
        if with_entropy:
            ents.append(ent.cpu())
    logp = torch.cat(lps) * response_mask
    return logp, (torch.cat(ents) * response_mask if with_entropy else None)
