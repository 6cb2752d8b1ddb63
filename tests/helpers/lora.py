"""A PEFT LoRA copy of the tiny engine model, for the LoRA tests of the engine and the instruments."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

peft = pytest.importorskip("peft", reason="the LoRA tests need peft: pip install 'rlgrad[lora]'")


def lora_model(model: nn.Module, rank: int = 4, targets: tuple[str, ...] = ("q_proj", "v_proj", "gate_proj",
                                                                              "down_proj"), seed: int = 5) -> nn.Module:
    """``model`` (copied) with LoRA adapters on ``targets``: a PEFT ``PeftModel`` whose trainable parameters are the
    adapters only. Both adapter matrices are random (PEFT's ``init_lora_weights=False``): with B = 0, as a fresh
    adapter starts, every gradient reaching A would be zero and the tests could not tell A's from nothing."""
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets), lora_dropout=0.0,
                             init_lora_weights=False, task_type="CAUSAL_LM")
    return peft.get_peft_model(copy.deepcopy(model), config)


def adapter_grads(model: nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    """Plain autograd of ``loss`` with respect to every trainable parameter (the adapters), by name."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return {n: torch.zeros_like(p) if g is None else g for (n, p), g in zip(named, grads)}


def relative_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """‖got − want‖ / ‖want‖ over all parameters together (float64)."""
    assert sorted(got) == sorted(want)
    diff = sum(float((got[n].double() - want[n].double()).pow(2).sum()) for n in want)
    norm = sum(float(want[n].double().pow(2).sum()) for n in want)
    return (diff / norm) ** 0.5 if norm > 0 else diff ** 0.5
