"""verl 0.9 on a CPU machine: load this module into every verl process with verl's own hook,

    VERL_USE_EXTERNAL_MODULES=rlgrad.integrations.verl_cpu python -m rlgrad.integrations.verl_main \\
        actor_rollout_ref.rollout.name=hf_cpu actor_rollout_ref.actor.strategy=fsdp2 ... (docs/integrations.md)

for tests, demos and debugging of the launch without GPUs (slow: HF ``generate``, no batching across
requests). Everything is added through verl's registries; nothing of verl is edited or patched:

- ``CpuPlatform``, registered with verl's ``PlatformRegistry`` as ``cpu`` (selected by ``VERL_PLATFORM=cpu``,
  set here). Its Ray resource is ``GPU``: verl's resource pools ask Ray for one device per worker and check the
  cluster's ``GPU``/``NPU`` count, so Ray must be started with a device count (``ray_kwargs.ray_init.num_gpus``);
  on a CPU-only torch the ``CUDA_VISIBLE_DEVICES`` Ray then sets is harmless.
- ``CpuFSDPEngine``, verl's FSDP engine registered for the ``cpu`` device: verl gives a forward-only (reference)
  model a pinned-memory CPU offload, and pinning needs an accelerator; on CPU the weights are in host memory
  already, so the reference model is built without an offload policy.
- ``hf_cpu``, a rollout backend (``RolloutReplicaRegistry`` and verl's rollout-class table): one Ray actor per
  replica holding a Hugging Face model that answers verl's token-in-token-out ``generate`` with ``generate``,
  and takes the trainer's weights after each update through ``HFServerAdapter.update_weights``.

verl's process-group backend string for a device ``cpu`` with backend ``gloo`` is ``cpu:gloo,cpu:gloo``, which
torch refuses: rlgrad's worker (``rlgrad.integrations.verl``) joins a plain ``gloo`` group on this platform
before verl's worker would create it. verl's ``fsdp`` (FSDP1) refuses ``sync_module_states`` with CPU tensors:
use ``strategy=fsdp2``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import ray
import torch

os.environ.setdefault("VERL_PLATFORM", "cpu")

from verl.plugin.platform.platform_base import PlatformBase  # noqa: E402
from verl.plugin.platform.platform_manager import PlatformRegistry  # noqa: E402

PLATFORM = "cpu"
ROLLOUT = "hf_cpu"


class _CpuDevice:
    """What verl calls on a device module (``torch.cuda``'s role), for the CPU."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    def set_device(self, *a): pass
    def manual_seed(self, s): torch.manual_seed(s)
    def manual_seed_all(self, s): torch.manual_seed(s)
    def empty_cache(self): pass
    def is_available(self): return True
    def device_count(self): return 1
    def current_device(self): return "cpu"
    def get_device_name(self, *a): return "CPU"
    def memory_allocated(self, *a): return 0
    def memory_reserved(self, *a): return 0
    def max_memory_allocated(self, *a): return 0
    def max_memory_reserved(self, *a): return 0
    def mem_get_info(self, *a): return (0, 0)
    def synchronize(self, *a): pass
    def reset_peak_memory_stats(self, *a): pass
    # verl's checkpoint manager saves the CPU generator as "cpu" and, on resume, restores the device generator of the
    # platform's name from it: on this platform both are torch's CPU generator (torch.cpu has no rng functions).
    def get_rng_state(self, *a): return torch.get_rng_state()
    def set_rng_state(self, state, *a): torch.set_rng_state(state)


@PlatformRegistry.register(PLATFORM)
class CpuPlatform(PlatformBase):
    device_name = "cpu"
    vendor_name = "cpu"
    device_module = _CpuDevice()

    def is_available(self): return True
    def current_device(self): return "cpu"
    def device_count(self): return 1
    def set_device(self, i): pass
    def synchronize(self, i=None): pass
    def manual_seed(self, s): torch.manual_seed(s)
    def manual_seed_all(self, s): torch.manual_seed(s)
    def set_allocator_settings(self, s): pass
    def empty_cache(self): pass
    def get_device_capability(self, i=0): return (None, None)
    def communication_backend_name(self): return "gloo"
    def visible_devices_envvar(self): return "CUDA_VISIBLE_DEVICES"
    def nvtx_range(self, msg): return contextlib.nullcontext()
    def profiler_start(self): pass
    def profiler_stop(self): pass
    def ray_resource_name(self): return "GPU"  # see the module docstring
    def ray_noset_envvars(self): return []
    def is_ipc_supported(self): return False
    def cudart(self): return None


def is_cpu_platform() -> bool:
    """Whether verl runs on this module's CPU platform (in this process)."""
    from verl.utils.device import get_device_name

    return get_device_name() == "cpu"


# ---- the FSDP engine ---------------------------------------------------------------------------------
from verl.workers.engine import EngineRegistry  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead  # noqa: E402


@EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device=PLATFORM)
class CpuFSDPEngine(FSDPEngineWithLMHead):
    """verl's FSDP engine; a forward-only model is sharded without verl's pinned-memory CPU offload."""

    def _build_fsdp_module(self, module):
        # verl picks CPUOffloadPolicy(pin_memory=True) from engine_config.forward_only inside this method only
        # (the bf16 load of a forward-only model happens earlier, in _build_module, and is kept).
        forward_only = self.engine_config.forward_only
        self.engine_config.forward_only = False
        try:
            return super()._build_fsdp_module(module)
        finally:
            self.engine_config.forward_only = forward_only


# ---- the rollout backend ---------------------------------------------------------------------------------
from verl.workers.rollout import base as _rollout_base  # noqa: E402
from verl.workers.rollout.base import BaseRollout  # noqa: E402
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput  # noqa: E402


def _server_name(replica_rank: int) -> str:
    return f"rlgrad_hf_cpu_server_{replica_rank}"


class HFServer:
    """One rollout replica: a Hugging Face model answering verl's token-in-token-out ``generate``."""

    def __init__(self, model_path: str, trust_remote_code: bool = False, max_model_len: int | None = None):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)  # requests run concurrently in the actor's threads; one core each
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                          trust_remote_code=trust_remote_code).eval()
        self.max_model_len = max_model_len
        self.lock = asyncio.Lock()  # weights are replaced between steps, never during a generate
        self.version = 0
        self.failure: str | None = None  # the first generate error, one line: every later call fails with it

    def ready(self) -> bool:
        return True

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       **_multimodal) -> TokenOutput:
        """verl's server ``generate``: response token ids and their log-probabilities under the sampling
        distribution (temperature, top-k/top-p as verl passes them)."""
        self._check()
        try:
            p = dict(sampling_params)
            max_new = int(p.get("max_tokens", p.get("max_new_tokens", 16)))
            if self.max_model_len:
                max_new = min(max_new, self.max_model_len - len(prompt_ids))
            if max_new < 1:
                raise ValueError(f"a prompt of {len(prompt_ids)} tokens leaves no room to generate "
                                 f"(max_model_len {self.max_model_len})")
            temperature = float(p.get("temperature", 1.0))
            kw = {"do_sample": temperature > 0, "max_new_tokens": max_new,
                  "pad_token_id": self.model.config.eos_token_id}
            if temperature > 0:
                top_k = max(int(p.get("top_k", -1) or 0), 0)  # verl's -1 (off) is HF's 0
                kw.update(temperature=temperature, top_p=float(p.get("top_p", 1.0)), top_k=top_k)
            async with self.lock:
                return await asyncio.to_thread(self._generate, list(prompt_ids), kw)
        except Exception as e:  # noqa: BLE001 - any generate error ends the rollout, see _check
            first = str(e).splitlines()[0] if str(e) else ""
            self.failure = self.failure or f"hf_cpu rollout: generate failed: {type(e).__name__}: {first}"
            self._check()
            raise  # pragma: no cover - _check raised

    def _check(self) -> None:
        """Fail hard after a generate error. verl 0.9.1's sync trainer marks a prompt group whose generation
        raised as failed and trains on the step's other groups with the missing samples padded; with
        ``trainer.v1.sampler.sync_refill_failed_groups=true`` its sampler refills failed groups in a loop with no
        bound. Here every later request fails with the first cause, and so does the trainer's next weight update
        (``update_weights``), which ends the launch within the step, naming the cause in one line."""
        if self.failure:
            raise RuntimeError(self.failure)

    @torch.no_grad()
    def _generate(self, prompt_ids: list[int], kw: dict) -> TokenOutput:
        ids = torch.tensor([prompt_ids])
        res = self.model.generate(ids, attention_mask=torch.ones_like(ids), output_scores=True,
                                  return_dict_in_generate=True, **kw)
        new = res.sequences[0, ids.shape[1]:]
        logp = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(res.scores, new, strict=True)]
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        tokens = new.tolist()
        stop = "completed" if tokens and tokens[-1] in eos else "length"
        return TokenOutput(token_ids=tokens, log_probs=logp, stop_reason=stop,
                           extra_fields={"global_steps": self.version})

    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> None:
        self._check()
        async with self.lock:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            if unexpected:
                raise ValueError(f"hf_cpu rollout: unexpected weights {unexpected[:3]}")
            self.model.tie_weights()
            if global_steps is not None:
                self.version = global_steps

    # verl's replica controls: nothing to free or resume on a CPU
    async def wake_up(self, tags: list[str] | None = None): pass
    async def sleep(self): pass
    async def clear_kv_cache(self): pass
    async def release_kv_cache(self): pass
    async def resume_kv_cache(self): pass
    async def start_profile(self, **kw): pass
    async def stop_profile(self): pass
    async def abort_all_requests(self, reject_request: bool = False, **kw) -> dict: return {}
    async def resume_generation(self): pass


class HFReplica(RolloutReplica):
    """verl's rollout replica for ``hf_cpu``: one ``HFServer`` actor (tensor parallelism 1)."""

    async def launch_servers(self):
        name = _server_name(self.replica_rank) + (f"_{self.name_suffix}" if self.name_suffix else "")
        server = ray.remote(HFServer).options(name=name, num_cpus=0, max_concurrency=self.max_concurrency).remote(
            self.model_config.local_path if hasattr(self.model_config, "local_path") else self.model_config.path,
            bool(getattr(self.model_config, "trust_remote_code", False)),
            getattr(self.config, "max_model_len", None))
        await server.ready.remote()  # a server that cannot start fails here, not at the first request
        self.servers = [server]
        self._server_handle = server
        self._server_address = name


class HFServerAdapter(BaseRollout):
    """The trainer side of ``hf_cpu`` (in verl's actor worker): sends the updated weights to the server."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **kw):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", 0))
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.is_leader = rank % world == 0

    async def resume(self, tags: list[str]): pass
    async def release(self): pass

    async def update_weights(self, weights, global_steps: int | None = None, wire_format: str = "named_tensors",
                             **kwargs):
        if wire_format != "named_tensors":
            raise ValueError(f"hf_cpu rollout takes wire_format='named_tensors', not {wire_format!r}")
        state = {}
        for name, t in weights:  # every rank iterates: gathering FSDP shards is collective
            t = t.full_tensor() if hasattr(t, "full_tensor") else t
            if self.is_leader:
                state[name] = t.detach().to("cpu", torch.float32).clone()
        if self.is_leader:
            await ray.get_actor(_server_name(self.replica_rank)).update_weights.remote(state, global_steps)


RolloutReplicaRegistry.register(ROLLOUT, lambda: HFReplica)
# verl 0.9 has no register function for the worker-side rollout class: this table is what get_rollout_class reads
_rollout_base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = f"{__name__}.HFServerAdapter"
