"""verl on a CPU machine, for the verl integration's tests (``tests/integrations/test_verl.py`` and the ranks it
starts).

verl 0.9 ships platforms for CUDA/NPU/ROCm only: ``rlgrad.integrations.verl_cpu`` registers a CPU platform and
verl's FSDP engine for it through verl's registries. The builders make verl's FSDP2 ``TrainingWorker`` and the
batch verl's trainer hands to the actor update.
"""

from __future__ import annotations

import os

import numpy as np
import torch

# verl's CPU support lives in rlgrad (verl_cpu): loaded here and, through verl's hook, in every subprocess
os.environ.setdefault("VERL_USE_EXTERNAL_MODULES", "rlgrad.integrations.verl_cpu")

from verl import DataProto  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.model import compute_position_id_with_mask  # noqa: E402
from verl.workers.config import ActorConfig, FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig  # noqa: E402
from verl.workers.engine_workers import TrainingWorkerConfig  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

import rlgrad.integrations.verl_cpu  # noqa: E402,F401  (the platform and engine registrations)
from rlgrad.integrations.verl import TrainingWorker  # noqa: E402

B, P, R, N = 16, 6, 5, 4  # rows, prompt and response widths, samples per prompt


def worker(model_dir, cls=TrainingWorker, **model):
    """``model``: more of verl's ``HFModelConfig`` (``lora_rank``, ``lora_alpha``, ``target_modules``)."""
    torch.manual_seed(0)
    mc = HFModelConfig(path=str(model_dir), use_remove_padding=False, override_config={"attn_implementation": "eager"},
                       **model)
    # fp32 compute: verl's default bf16 mixed precision rounds its gradient at ~1% (rlgrad's replica is fp32)
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    ec = FSDPEngineConfig(forward_only=False, strategy="fsdp2", micro_batch_size_per_gpu=4, mixed_precision=fp32,
                          param_offload=False, use_dynamic_bsz=False)
    w = cls(TrainingWorkerConfig(model_type="language_model", model_config=mc, engine_config=ec,
                                 optimizer_config=FSDPOptimizerConfig(lr=1e-2), checkpoint_config=None))
    w.reset()
    return w


def actor_config(**kw):
    return ActorConfig(strategy="fsdp2", rollout_n=N, ppo_micro_batch_size_per_gpu=4, ppo_mini_batch_size=2,
                       **{"use_kl_loss": True, "kl_loss_coef": 0.1, "entropy_coeff": 0.01, **kw})


def verl_batch(seed=0, rows=None):
    """A batch as verl's trainer hands it to the actor update: left-padded prompts, right-padded responses,
    verl's no-padding TensorDict, groups in ``uid`` (rows of a group not adjacent, as after verl's balancing)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 90, (B, P + R), generator=g)
    attn = torch.ones(B, P + R, dtype=torch.long)
    for i in range(B):
        attn[i, :int(torch.randint(0, 3, (1,), generator=g))] = 0  # prompt padding
        attn[i, P + R - int(torch.randint(0, 3, (1,), generator=g)):] = 0  # response padding
    resp_mask = attn[:, P:].clone()
    scores = torch.zeros(B, R)
    reward = torch.tensor([float(torch.rand(1, generator=g) < 0.2 * (i // N + 1)) for i in range(B)])
    last = resp_mask.sum(1) - 1
    scores[torch.arange(B), last] = reward
    perm = torch.randperm(B, generator=g)
    uid = np.array([f"p{int(i) // N}" for i in perm], dtype=object)
    d = {"input_ids": input_ids, "prompts": input_ids[:, :P], "attention_mask": attn,
         "position_ids": compute_position_id_with_mask(attn), "responses": input_ids[:, P:],
         "response_mask": resp_mask, "advantages": torch.randn(B, R, generator=g) * resp_mask,
         "old_log_probs": -torch.rand(B, R, generator=g) * 4 - 0.5, "ref_log_prob": -torch.rand(B, R, generator=g) * 4,
         "token_level_scores": scores[perm], "uid": uid}
    d = {k: (v[perm] if isinstance(v, torch.Tensor) and k != "token_level_scores" else v) for k, v in d.items()}
    if rows is not None:
        d = {k: v[rows] for k, v in d.items()}
    td = left_right_2_no_padding(DataProto.from_single_dict(d, meta_info={"temperature": 1.0}).to_tensordict())
    n = len(d["uid"])
    tu.assign_non_tensor(td, global_batch_size=n, mini_batch_size=n, epochs=1, calculate_entropy=True,
                         temperature=1.0, dataloader_kwargs={"shuffle": False})
    return td, d
