"""LoRA on the actor (``actor.lora``): PEFT adapters put on the initial weights, saved and loaded as a PEFT adapter.

The trainer trains, samples from and measures the Hugging Face model with the adapters inside it
(``PeftModel.get_base_model()``: its LoRA layers run the adapters, its base weights are frozen), so everything
that takes a causal LM keeps working and the instruments see the adapters as the trainable parameters. The
``PeftModel`` around it is what a checkpoint saves: ``adapter_model.safetensors`` and ``adapter_config.json``, which
``PeftModel.from_pretrained(initial_model, "global_step_N/actor")`` loads (the initial model: ``model.path``, or the
embedded default's warm start, which ``load_actor`` rebuilds from the seed).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlgrad.errors import UserError

if TYPE_CHECKING:
    from rlgrad.config.algorithm import LoRAConfig


def _peft():
    try:
        import peft
    except ImportError:
        raise UserError("'actor.lora.rank' > 0 needs peft: pip install 'rlgrad[lora]'") from None
    return peft


def add_adapters(model: torch.nn.Module, settings: LoRAConfig) -> torch.nn.Module:
    """``model`` with fresh LoRA adapters (PEFT's initialisation: A random, B zero, so the policy starts as
    ``model``), as a ``PeftModel``; its base weights frozen. No dropout: the update and the instruments see the
    same function."""
    peft = _peft()
    targets = settings.target_modules if isinstance(settings.target_modules, str) else list(settings.target_modules)
    config = peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha, target_modules=targets, lora_dropout=0.0,
                             task_type="CAUSAL_LM")
    try:
        return peft.get_peft_model(model, config)
    except ValueError as e:  # a target module the model does not have
        raise UserError(f"'actor.lora.target_modules' {settings.target_modules!r}: {str(e).splitlines()[0]}") from None


def load_adapters(model: torch.nn.Module, path: Path) -> torch.nn.Module:
    """The adapter saved at ``path`` (a checkpoint's ``actor/``) on ``model``, trainable, as a ``PeftModel``."""
    peft = _peft()
    if not (Path(path) / "adapter_config.json").is_file():
        raise UserError(f"checkpoint '{Path(path).parent}' holds no LoRA adapter (no actor/adapter_config.json): it "
                        "was saved by a run without actor.lora.rank")
    return peft.PeftModel.from_pretrained(model, path, is_trainable=True)
