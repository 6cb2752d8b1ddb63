"""Models, strictly offline: a local Hugging Face causal LM, or the embedded default; value models
(the critic) are the same architecture with a scalar head, loaded from the same weights.

``model.path`` may also name a ``.gguf`` file (llama.cpp's format, e.g. a quantised instruct model).
transformers dequantises it (needs the ``gguf`` and ``accelerate`` packages: ``pip install 'rlgrad[gguf]'``);
that is done once per file: the float32 result is saved as a Hugging Face directory (model + tokenizer,
safetensors) under the cache, ``<cache>/gguf/<stem>-<sha256[:16]>``, keyed by the file's content, and
later loads read that directory.

The embedded default is a ~1M-parameter Qwen2 with a character-level tokenizer saved in
Hugging Face format, warm-started by a short supervised phase on the task so that RL
starts from partial competence. The warm start is cached by a hash of everything that
determines it, and reused by later runs; the warm starts of the presets' and examples' settings ship with
rlgrad (``rlgrad/warmstarts``, made by ``scripts/generate/build_warmstarts.py``), so a first run starts in seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from rlgrad.config.model import ModelConfig, TinyModelConfig, not_local_hint
from rlgrad.errors import UserError

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub, whatever a config says
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

WARMSTART_VERSION = 3  # bump when the warm-start recipe changes, so stale caches are not reused (3: the byte-level
# character tokenizer, which AutoTokenizer reloads whole)
SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
# Warm starts of the presets' and examples' settings, made by scripts/generate/build_warmstarts.py (package data).
SHIPPED_WARMSTARTS = Path(__file__).parent / "warmstarts"


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # our own progress bar is the one a user should watch


CHARS = [chr(i) for i in range(32, 127)] + ["\n"]  # the embedded tokenizer's one-token characters ...
EXTRA_CHARS = ["√"]  # ... and the tasks' others (sokoban's box on a target, frozen_lake's player on the goal)


def _byte_level(text: str) -> str:
    """``text``'s UTF-8 bytes in GPT-2's byte-level alphabet (" " is "Ġ", "\n" is "Ċ")."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    return "".join(b2u[b] for b in text.encode("utf-8"))


def build_char_tokenizer():
    """One token per character (``CHARS``, ids 3.., then ``EXTRA_CHARS``); saved/loaded as a normal HF tokenizer.

    It is a byte-level BPE, the layout of Qwen2's own tokenizer, so that any loader reads it alike: the embedded
    default is saved with a ``qwen2`` model config, and transformers 5's AutoTokenizer (TRL's, verl's) rebuilds a
    Qwen2 directory's tokenizer with Qwen2's class, pre-tokenizer and byte-level decoder whatever tokenizer.json
    holds (a word-level one lost every space and newline). A character of several UTF-8 bytes is one token through
    BPE merges of its bytes (its byte tokens exist only for those merges and are never produced)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + [_byte_level(c) for c in CHARS])}
    merges = []
    for ch in EXTRA_CHARS:
        pieces = list(_byte_level(ch))
        for p in pieces:
            vocab.setdefault(p, len(vocab))
        for k in range(1, len(pieces)):
            merges.append(("".join(pieces[:k]), pieces[k]))
            vocab.setdefault("".join(pieces[:k + 1]), len(vocab))
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([  # each character alone: no merge across two of them
        pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left")


def build_tiny_model(cfg: ModelConfig, tokenizer, seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tiny = cfg.tiny
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=tiny.hidden_size, intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_hidden_layers, num_attention_heads=tiny.num_attention_heads,
        num_key_value_heads=tiny.num_key_value_heads, max_position_embeddings=tiny.max_position_embeddings,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, initializer_range=tiny.initializer_range,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _cache_dir(explicit: str | os.PathLike | None) -> Path:
    """rlgrad's cache: ``explicit`` (model.cache_dir), else $RLGRAD_CACHE, else ~/.cache/rlgrad."""
    return Path(explicit or os.environ.get("RLGRAD_CACHE") or Path.home() / ".cache" / "rlgrad")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _check_model_dir(path: str | os.PathLike, key: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise UserError(not_local_hint(str(path), key)
                        or f"{key} '{path}' is not a directory or a .gguf file (rlgrad only loads local models)")
    if not (p / "config.json").is_file():
        raise UserError(f"{key} '{path}' has no config.json: not a Hugging Face model directory")
    try:
        json.loads((p / "config.json").read_text()).get("architectures")
    except (OSError, ValueError, AttributeError):
        raise UserError(f"{key} '{path}': config.json is not a JSON object") from None
    return p


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


GGUF_MAGIC = b"GGUF"
_GGUF_SOURCE = "rlgrad-gguf.json"  # written into a cached directory: where it came from (and that it is complete)
_sha_memo: dict[tuple, str] = {}


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a GGUF file rather than a model directory: a ``.gguf`` name (existing or
    not, so that a missing file gets a GGUF error) or a file that starts with the GGUF magic."""
    p = Path(path)
    if p.is_dir():
        return False
    if p.suffix.lower() == ".gguf":
        return True
    try:
        with open(p, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _sha256(p: Path) -> str:
    st = p.stat()
    memo = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if memo not in _sha_memo:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
        _sha_memo[memo] = h.hexdigest()
    return _sha_memo[memo]


def _gguf_load_kwargs(p: Path) -> dict:
    """Extra ``from_pretrained`` arguments: transformers >= 5 may keep GGUF weights packed (not saveable), so
    ask it for a plain dense model where it can be asked."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(gguf_file=p.name, dequantize=True)}


def _drop_quantisation(model) -> None:
    """Remove the quantisation bookkeeping from a model whose weights are dense now."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            delattr(model, attr)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


def _dequantise_gguf(p: Path, key: str):
    """transformers' GGUF loader: the float32 model and the tokenizer stored in the file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"{key} '{p}' is a GGUF file, which needs the {' and '.join(missing)} package"
                        f"{'s' if len(missing) > 1 else ''}: pip install 'rlgrad[gguf]'")
    kwargs = _gguf_load_kwargs(p)
    try:
        tokenizer = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, local_files_only=True,
                                                     dtype=torch.float32, **kwargs)
    except Exception as e:  # a corrupt file or an architecture transformers cannot convert: bad input
        raise UserError(f"{key} '{p}' could not be loaded as a GGUF model: {_first_line(e)}") from None
    _drop_quantisation(model)
    state = model.state_dict()
    bad = [n for n, t in state.items() if not t.is_floating_point()]
    if bad:
        raise UserError(f"{key} '{p}' could not be dequantised ({bad[0]} is still {state[bad[0]].dtype})")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "left"
    return model, tokenizer


def gguf_model_dir(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, key: str = "model.path",
                   log=print) -> Path:
    """The Hugging Face directory a ``.gguf`` file dequantises to, built on first use.

    Cached as ``<cache>/gguf/<stem>-<first 16 hex of the file's sha256>`` (``cache_dir``, else $RLGRAD_CACHE,
    else ~/.cache/rlgrad): written to a temporary directory and renamed into place, so a reader never sees
    a half-written one and concurrent builders are harmless. A cached directory needs neither ``gguf`` nor
    the file's quantisation kernels: it is a plain float32 safetensors checkpoint with its tokenizer.
    """
    p = Path(path)
    if not p.exists():
        raise UserError(f"{key} '{path}' does not exist")
    if not p.is_file():
        raise UserError(f"{key} '{path}' is not a file")
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise UserError(f"{key} '{path}' cannot be read: {_first_line(e)}") from None
    if magic != GGUF_MAGIC:
        raise UserError(f"{key} '{path}' is not a GGUF file (it does not start with the GGUF magic bytes)")
    sha = _sha256(p)
    final = _cache_dir(cache_dir) / "gguf" / f"{p.stem}-{sha[:16]}"
    if (final / _GGUF_SOURCE).is_file() and (final / "config.json").is_file():
        return final
    log(f"dequantising {p.name} into a Hugging Face directory (once; cached at {final})")
    model, tokenizer = _dequantise_gguf(p, key)
    import transformers

    source = {"file": str(p.resolve()), "sha256": sha, "bytes": p.stat().st_size,
              "transformers": transformers.__version__}
    final.parent.mkdir(parents=True, exist_ok=True)
    _save_into_cache(final, model, tokenizer, {_GGUF_SOURCE: json.dumps(source, indent=1) + "\n"})
    return final


def _save_into_cache(final: Path, model, tokenizer, extra: dict[str, str] | None = None) -> None:
    """Save a model and its tokenizer (and ``extra`` files, written last) into a temporary directory next to
    ``final`` and rename it into place: a cache entry is whole or absent."""
    _quiet_transformers()
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text)
        try:
            os.rename(tmp, final)  # atomic; another process may have won the race, which is fine
        except OSError:
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_model_path(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                       key: str = "model.path", log=print) -> Path:
    """A model directory as given, or the (cached) dequantised directory of a ``.gguf`` file."""
    return gguf_model_dir(path, cache_dir, key, log=log) if is_gguf(path) else Path(path)


# tokenizer_config.json classes meaning "tokenizer.json as it is" (what save_pretrained writes for a tokenizer built
# from a `tokenizers` object, like the embedded default's character tokenizer).
_GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _load_tokenizer(p: Path):
    """The directory's tokenizer. A generic one is loaded as its tokenizer.json says: AutoTokenizer would take the
    class of config.json's model type (Qwen2's byte-level pre-tokenizer for the embedded default), which drops the
    spaces and newlines of a character tokenizer."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg = p / "tokenizer_config.json"
    declared = json.loads(cfg.read_text()).get("tokenizer_class") if cfg.is_file() else None
    if declared in _GENERIC_TOKENIZERS and (p / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(p, local_files_only=True)
    return AutoTokenizer.from_pretrained(p, local_files_only=True)


def load_pretrained(path: str | os.PathLike, dtype: str = "float32", key: str = "model.path", *,
                    cache_dir: str | os.PathLike | None = None, log=print):
    """Load a local HF causal LM and its tokenizer; a bad path is a UserError, never a hub lookup.

    ``path``: a Hugging Face directory or a ``.gguf`` file (dequantised once into ``cache_dir``, see
    ``gguf_model_dir``). The tokenizer pads on the left, with EOS as the pad token when it has none.
    """
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    p = _check_model_dir(resolve_model_path(path, cache_dir, key, log=log), key)
    arch = json.loads((p / "config.json").read_text()).get("architectures") or []
    if arch and not any("CausalLM" in a or "LMHead" in a for a in arch):
        raise UserError(f"{key} '{path}' is not a causal language model (architectures: {', '.join(arch)})")
    if not any((p / f).is_file() for f in TOKENIZER_FILES):
        raise UserError(f"{key} '{path}' has no tokenizer ({' / '.join(TOKENIZER_FILES)}): save it next to the model")
    try:
        tokenizer = _load_tokenizer(p)
        model = AutoModelForCausalLM.from_pretrained(p, local_files_only=True, dtype=_dtype(dtype))
    except Exception as e:  # a truncated or mismatched checkpoint fails deep inside transformers/safetensors
        raise UserError(f"{key} '{path}' could not be loaded: {_first_line(e)}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def load_value_model(path: str | os.PathLike, dtype: str = "float32", key: str = "critic.model.path", *,
                     cache_dir: str | os.PathLike | None = None, log=print):
    """A value model: the architecture at ``path`` with one scalar output per token.

    As verl does, this is ``AutoModelForTokenClassification`` with ``num_labels=1``: from a causal-LM
    checkpoint it loads the base model's weights (the LM head is dropped) and adds a ``score`` head
    (Linear hidden -> 1). A head missing from the checkpoint starts at ZERO (weight and bias), so the
    first values are 0 and the base model starts exactly as the checkpoint (transformers' random init
    would give arbitrary initial values, and would draw from the global RNG); a checkpoint that has the
    head (a saved critic) keeps it. Classifier dropout is off, as in verl's critic. ``path`` may be a
    ``.gguf`` file, as in ``load_pretrained``.
    """
    from transformers import AutoConfig, AutoModelForTokenClassification

    _quiet_transformers()
    p = _check_model_dir(resolve_model_path(path, cache_dir, key, log=log), key)
    try:
        config = AutoConfig.from_pretrained(p, local_files_only=True, num_labels=1)
        config.classifier_dropout = 0.0
        with torch.random.fork_rng(devices=[]):  # the fresh head's throwaway init must not shift the run's RNG
            model, info = AutoModelForTokenClassification.from_pretrained(
                p, config=config, local_files_only=True, dtype=_dtype(dtype), output_loading_info=True)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise UserError(f"{key} '{path}' could not be loaded as a value model: {str(e).splitlines()[0]}") from None
    missing = set(info["missing_keys"])
    head = model.score
    if {n for n, _ in model.named_parameters()} & missing - {"score.weight", "score.bias"}:
        raise UserError(f"{key} '{path}' lacks base-model weights: {sorted(missing)[:3]}")
    with torch.no_grad():
        for name, param in head.named_parameters():
            if f"score.{name}" in missing:
                param.zero_()
    return model


def cache_root(cfg: ModelConfig) -> Path:
    return _cache_dir(cfg.cache_dir)


def warmstart_key(cfg: ModelConfig, task_name: str, seed: int, task_spec: dict | None = None) -> str:
    """``task_spec``: what else the warm start depends on (a multi-turn task's environment and agent settings)."""
    tiny = asdict(cfg.tiny)
    if tiny["initializer_range"] == TinyModelConfig.initializer_range:  # added later: the default keeps the
        del tiny["initializer_range"]  # names (and shipped files) of the warm starts made before it
    spec = {"v": WARMSTART_VERSION, "tiny": tiny, "task": task_name, "seed": seed,
            "steps": cfg.warmstart_steps, "lr": cfg.warmstart_lr, "bs": cfg.warmstart_batch_size}
    if task_spec:
        spec["task_spec"] = task_spec
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def sft_batch(tokenizer, prompts: list[str], targets: list[str]) -> tuple[torch.Tensor, ...]:
    """Left-padded prompt+target+EOS sequences; labels cover the target and EOS only."""
    enc_p = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]  # one batched call each
    enc_t = tokenizer(list(targets), add_special_tokens=False)["input_ids"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    width = max(len(p) + len(t) + 1 for p, t in zip(enc_p, enc_t))
    ids, lab, att = [], [], []
    for p, t in zip(enc_p, enc_t):
        fill = width - len(p) - len(t) - 1
        ids.append([pad] * fill + list(p) + list(t) + [eos])
        lab.append([-100] * (fill + len(p)) + list(t) + [eos])
        att.append([0] * fill + [1] * (width - fill))
    ids, att, lab = torch.tensor(ids), torch.tensor(att), torch.tensor(lab)
    return ids, att, lab


def warmstart_schedule(opt: torch.optim.Optimizer, lr: float, steps: int) -> torch.optim.lr_scheduler.OneCycleLR:
    """The warm start's one-cycle schedule over ``steps`` steps: 10% warm-up, then cosine annealing.

    At 10 steps, 10% is exactly one step and torch's warm-up phase would end at step 0 (a division by zero on
    the first step); there the warm-up takes 15% (it still ends between steps 0 and 1, as at 11 steps). Every
    other number of steps keeps ``pct_start=0.1``: shipped warm starts are identified by their settings."""
    total = max(steps, 2)
    pct_start = 0.1 if float(0.1 * total) - 1 != 0 else 0.15
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total, pct_start=pct_start)


def supervised_warmstart(model, tokenizer, task, cfg: ModelConfig, seed: int, log=None,
                         stop_after: int | None = None) -> None:
    """A short SFT phase on the task's reference responses (AdamW, one-cycle schedule).

    A task may supply its own warm-start teacher, ``task.warmstart_target(example, rng)``
    (arithmetic: a sloppy one, so that RL has mistakes to fix); otherwise ``task.sft_target``. A multi-turn task
    hands whole contexts and answers instead, ``task.warmstart_pairs(n, rng, eos)`` (a sloppy planner's turns).
    ``stop_after``: stop after that many steps of the same schedule (a shipped warm start's checkable prefix).
    """
    rng = random.Random(seed)
    teacher = getattr(task, "warmstart_target", None)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.warmstart_lr, weight_decay=0.0)
    sched = warmstart_schedule(opt, cfg.warmstart_lr, cfg.warmstart_steps)
    model.train()
    t0, every, loss_sum = time.perf_counter(), max(1, cfg.warmstart_steps // 10), 0.0
    for k in range(cfg.warmstart_steps if stop_after is None else min(stop_after, cfg.warmstart_steps)):
        if log is not None and k and k % every == 0 and cfg.warmstart_steps >= 20:  # a long one says how far it is
            left = (time.perf_counter() - t0) / k * (cfg.warmstart_steps - k)
            # the mean loss since the last line: a plateau that does not fall is a model that has not learnt yet
            log(f"  warm start: step {k}/{cfg.warmstart_steps}, loss {loss_sum / every:.3f}, "
                f"about {left / 60:.1f} min left")
            loss_sum = 0.0
        if hasattr(task, "warmstart_pairs"):
            prompts, targets = task.warmstart_pairs(cfg.warmstart_batch_size, rng, tokenizer.eos_token)
        else:
            ex = task.train_examples(cfg.warmstart_batch_size, rng)
            prompts, targets = [e.prompt for e in ex], [teacher(e, rng) if teacher else task.sft_target(e) for e in ex]
        ids, att, lab = (t.to(model.device) for t in sft_batch(tokenizer, prompts, targets))
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=att, position_ids=pos).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), lab[:, 1:].flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_sum += float(loss.detach())
    model.eval()


def build_warmstart(cfg: ModelConfig, task, seed: int, log=None, stop_after: int | None = None,
                    device: str = "cpu"):
    """The embedded default warm-started here: (model, tokenizer). What ``scripts/generate/build_warmstarts.py``
    ships."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(cfg, tokenizer, seed).to(device)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        supervised_warmstart(model, tokenizer, task, cfg, seed, log=log, stop_after=stop_after)
    return model, tokenizer


def shipped_warmstart(task_name: str, key: str) -> Path | None:
    """The warm start rlgrad ships for ``task_name`` and ``warmstart_key`` (the presets' and examples'), if any."""
    path = SHIPPED_WARMSTARTS / f"{task_name}-{key}.safetensors"
    return path if path.is_file() else None


@contextlib.contextmanager
def _build_lock(final: Path, log=print):
    """One builder per cache entry across processes: a second run waits for the first instead of building the
    same warm start again."""
    with open(final.parent / f"{final.name}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another run that is building {final.name}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def embedded_default(cfg: ModelConfig, task, seed: int, log=print):
    """The warm-started tiny default's directory: from the cache, else from the weights rlgrad ships for the
    presets' settings (seconds), else built here and cached. ``seed`` (the run's) counts only with
    model.warmstart_seed null."""
    seed = seed if cfg.warmstart_seed is None else cfg.warmstart_seed
    key = warmstart_key(cfg, task.name, seed, task.warmstart_spec() if hasattr(task, "warmstart_spec") else None)
    final = cache_root(cfg) / "warmstart" / f"{task.name}-{key}"

    def cached() -> bool:
        return (final / "config.json").is_file() and (final / "model.safetensors").is_file()

    if cached():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(final, log):
        if cached():  # built by the run we waited for
            return final
        if (shipped := shipped_warmstart(task.name, key)) is not None:
            from safetensors.torch import load_model

            tokenizer = build_char_tokenizer()
            model = build_tiny_model(cfg, tokenizer, seed)
            load_model(model, shipped)
        else:
            log(f"building the embedded default model (warm start: {cfg.warmstart_steps} SFT steps on "
                f"{task.name}); cached at {final}")
            model, tokenizer = build_warmstart(cfg, task, seed, log=log)
        _save_into_cache(final, model, tokenizer)
    return final


def initial_weights(cfg: ModelConfig, task, seed: int, log=print) -> str | Path:
    """Where a run's initial actor weights live (a Hugging Face directory): model.path if set (a ``.gguf``
    file: its cached dequantised directory), else the (cached) embedded default."""
    if cfg.path:
        return resolve_model_path(cfg.path, cache_root(cfg), key="model.path", log=log)
    return embedded_default(cfg, task, seed, log=log)


def load_actor(cfg: ModelConfig, task, seed: int, log=print):
    """The actor and tokenizer for a run: model.path if set, else the embedded default."""
    return load_pretrained(initial_weights(cfg, task, seed, log=log), cfg.dtype)


def load_critic(cfg: ModelConfig, critic_path: str | None, task, seed: int, log=print):
    """The value model for a run: ``critic_path`` (critic.model.path) if set, else the actor's initial
    weights (the same checkpoint, dequantised GGUF or warm-started default the actor starts from) with a
    zero value head.

    critic.model.path is a Hugging Face directory only (the config check rejects anything else); to start
    a critic from a ``.gguf`` file, leave it unset with model.path the file, or give it the file's cached
    directory (``gguf_model_dir``)."""
    if critic_path:
        return load_value_model(critic_path, cfg.dtype, key="critic.model.path")
    return load_value_model(initial_weights(cfg, task, seed, log=log), cfg.dtype,
                            key="model.path" if cfg.path else "embedded default")
