"""``model.*``: the policy model (a local Hugging Face directory or .gguf, or the embedded tiny default and its
warm start). Part of the config schema; the field docs are the user documentation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from rlgrad.config.fields import setting as _f

# A Hugging Face hub id: owner/name (no leading '/', '.', '~'; one slash).
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+")


def not_local_hint(path: str, key: str = "model.path") -> str | None:
    """The one-line answer for a model path that names nothing on this machine but reads as a Hugging Face hub
    id (``Qwen/Qwen2.5-0.5B``): rlgrad never downloads, so say how to. None for a path that exists or could not
    be a hub id."""
    if Path(path).exists() or not _HUB_ID.fullmatch(str(path)):
        return None
    return (f"{key} '{path}' is no local folder, and rlgrad loads local files only: if it names a Hugging Face hub "
            f"model, download it first (`hf download {path} --local-dir DIR`, or `huggingface-cli download {path} "
            f"--local-dir DIR`), then set {key}=DIR")


@dataclass
class TinyModelConfig:
    """Architecture of the embedded default model (a Qwen2 built locally; used when model.path is null)."""

    hidden_size: int = _f(128, "Width of the residual stream.", ge=1)
    num_hidden_layers: int = _f(4, "Transformer blocks.", ge=1)
    num_attention_heads: int = _f(4, "Query heads.", ge=1)
    num_key_value_heads: int = _f(2, "Key/value heads (grouped-query attention).", ge=1)
    intermediate_size: int = _f(384, "MLP width.", ge=1)
    max_position_embeddings: int = _f(256, "Longest prompt+response the model accepts.", ge=2)
    initializer_range: float = _f(0.02, "Standard deviation of the initial weights (Qwen2's initializer_range). "
                                  "Larger lets a narrow model's attention pick out tokens sooner.", gt=0)


@dataclass
class ModelConfig:
    path: str | None = _f(None, "Local Hugging Face causal-LM directory (with its tokenizer), or a .gguf file "
                          "(dequantised once, cached as a Hugging Face directory). null: the embedded default. "
                          "Never fetched from a hub.")
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    warmstart_steps: int = _f(1500, "Supervised warm-start steps for the "
                              "embedded default (0: RL from scratch). Cached.", ge=0)
    warmstart_lr: float = _f(2e-3, "Learning rate of the warm start.", gt=0)
    warmstart_batch_size: int = _f(64, "Examples per warm-start step.", ge=1)
    warmstart_seed: int | None = _f(1, "Seed of the embedded default's initial weights and warm start, apart from "
                                    "trainer.seed: runs that differ only in trainer.seed share one cached warm "
                                    "start. null: trainer.seed (each seed builds its own initial model).",
                                    ge=0, le=2**32 - 1)
    cache_dir: str | None = _f(None, "Where warm-started default models and dequantised .gguf models are "
                               "cached (default: $RLGRAD_CACHE or ~/.cache/rlgrad).")
    dtype: str = _f("float32", "Parameter dtype. The trainer refuses float16 (one-line error before step 1): "
                    "AdamW on float16 parameters without fp32 master weights turns them NaN at the first update; "
                    "bfloat16 trains.", choices=("float32", "bfloat16", "float16"))
