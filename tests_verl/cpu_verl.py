"""Test-only pieces that let verl 0.9.1's own trainer (``python -m verl.trainer.main_ppo``)
run on a CPU, for the end-to-end test (``test_main_ppo.py``). Never part of the library.

verl loads this module in every process that imports verl when
``VERL_USE_EXTERNAL_MODULES=tests_verl.cpu_verl`` is set, and then:

- ``VERL_PLATFORM=cpu`` picks :class:`PlatformCPU` (verl's ``verl/plugin/platform``
  registry): device ``cpu``, gloo, and Ray's ``GPU`` resource as the slot a worker takes
  (verl's resource check counts only ``GPU``/``NPU``; the driver starts Ray with fake GPUs);
- ``VERL_ENGINE_DEVICE=cuda`` makes verl's engine registry hand out its FSDP engines, which
  it registers for ``cuda``/``npu`` only; they run on whatever ``get_device_name()`` says;
- ``actor_rollout_ref.rollout.name=cpu_hf`` selects :class:`CPURolloutReplica`, a rollout
  backend added to verl's two rollout registries: a Ray actor that samples with
  ``transformers``' ``generate`` and takes the trainer's weights after every update;
- ``torch.distributed.init_process_group`` is wrapped so that the backend string verl builds
  on a CPU (``cpu:gloo,cpu:gloo``, which torch refuses) names each device once;
- verl is told trl is absent (see :func:`_hide_trl`).
"""

from __future__ import annotations

import hashlib
import os
from types import ModuleType
from typing import Any

import ray
import torch
import torch.distributed
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM = "cpu"
ROLLOUT = "cpu_hf"


class _CPUDevice(ModuleType):
    """``torch.cpu`` plus the no-ops verl calls on its device module."""

    def __init__(self):
        super().__init__("divrl_test_cpu_device")

    def __getattr__(self, name: str):
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name in {"empty_cache", "reset_peak_memory_stats", "manual_seed", "manual_seed_all"}:
            return lambda *a, **k: None
        if "memory" in name:  # memory_allocated, max_memory_reserved, ...: no device memory
            return lambda *a, **k: 0
        if name == "get_device_name":  # the MFU estimate's device table: unknown
            return lambda *a, **k: "cpu"
        if name == "mem_get_info":
            return lambda *a, **k: (0, 0)
        if name in {"get_rng_state", "set_rng_state"}:  # checkpoints: the CPU generator's
            return getattr(torch, name)
        raise AttributeError(name)


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl's platform interface on a CPU (gloo; a fake Ray GPU as each worker's slot)."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = _CPUDevice()

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return True

    def current_device(self) -> str:
        # verl moves tensors with ``.to(get_device_id())``; an index would mean cuda:N
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        pass

    def synchronize(self, device_index=None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    def nvtx_range(self, msg: str):
        import contextlib

        return contextlib.nullcontext()

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


_init_process_group = torch.distributed.init_process_group


def _init_process_group_once_per_device(*args, **kwargs):
    """verl passes ``cpu:gloo,<device>:<backend>``; on a CPU that names ``cpu`` twice."""
    backend = kwargs.get("backend")
    if isinstance(backend, str) and "," in backend:
        pairs = dict(part.split(":", 1) for part in backend.split(","))
        kwargs["backend"] = ",".join(f"{d}:{b}" for d, b in pairs.items())
    if os.environ.get("DIVRL_VERL_DUMP"):  # a worker: verl and the plugin are imported
        from tests_verl import loss_dump

        loss_dump.install()
    return _init_process_group(*args, **kwargs)


torch.distributed.init_process_group = _init_process_group_once_per_device


def _hide_trl() -> None:
    """verl 0.9.1 imports trl's ``AutoModelForCausalLMWithValueHead`` whenever trl is
    installed, and trl 1.16 (divrl's test extra) no longer has it: report trl absent to verl
    (it needs trl only for value-head models, which GRPO does not load)."""
    import verl.utils.import_utils

    verl.utils.import_utils.is_trl_available = lambda: False


def _server_name(replica_rank: int) -> str:
    return f"divrl_test_cpu_rollout_{replica_rank}"


def _sample_seed(steps, prompt_ids: tuple, k: int) -> int:
    digest = hashlib.sha256(repr((steps, prompt_ids, k)).encode()).digest()
    return int.from_bytes(digest[:4], "little")


class DrawCounter:
    """How many samples of each prompt every replica together has drawn under one set of
    weights: one Ray actor that the replicas share."""

    def __init__(self):
        self.drawn: dict[tuple, int] = {}

    def next(self, key: tuple) -> int:
        k = self.drawn[key] = self.drawn.get(key, -1) + 1
        return k


class CPURolloutServer:
    """One rollout replica: the HF model, sampled token by token by ``generate``."""

    def __init__(self, config, model_config, counter=None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(1)
        path = model_config.get("local_path") or model_config.path  # a DictConfig here
        self.config = config
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        self.eos = AutoTokenizer.from_pretrained(path).eos_token_id
        self.global_steps = None
        self.counter = counter  # a DrawCounter shared by every replica

    def ready(self) -> bool:
        return True

    def load_weights(self, state: dict, global_steps=None) -> int:
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or len(missing) == len(self.model.state_dict()):
            raise RuntimeError(f"weights do not fit the rollout model: {unexpected or missing}")
        self.global_steps = global_steps
        return len(state)

    @torch.no_grad()
    def generate(self, request_id, prompt_ids, sampling_params, image_data=None, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        temperature = float(sampling_params.get("temperature", 1.0))
        top_k = int(sampling_params.get("top_k", -1) or -1)
        greedy = temperature == 0.0
        # the k-th sample of a prompt under one set of weights is the same in every run,
        # whichever replica draws it: a prompt's samples are the same set in every run. Which
        # of the prompt's rows gets which of them follows the requests' arrival order, and
        # verl's batch holds the rows in the order they finished: neither is reproducible.
        key = (self.global_steps, tuple(prompt_ids))
        k = ray.get(self.counter.next.remote(key))
        torch.manual_seed(_sample_seed(*key, k))
        out = self.model.generate(
            torch.tensor([list(prompt_ids)]),
            do_sample=not greedy,
            temperature=None if greedy else temperature,
            top_p=None if greedy else float(sampling_params.get("top_p", 1.0)),
            top_k=None if greedy or top_k <= 0 else top_k,
            max_new_tokens=self.config.response_length,
            eos_token_id=self.eos,
            pad_token_id=self.eos,
            output_logits=True,
            return_dict_in_generate=True,
        )
        tokens = out.sequences[0, len(prompt_ids) :]
        log_probs = None
        if sampling_params.get("logprobs"):
            logits = torch.stack(out.logits, dim=1)[0].float()
            if not greedy:
                logits = logits / temperature
            log_probs = logits.log_softmax(-1).gather(-1, tokens[:, None])[:, 0].tolist()
        return TokenOutput(
            token_ids=tokens.tolist(),
            log_probs=log_probs,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    # verl's replica calls these around weight updates; one CPU process has nothing to free
    def wake_up(self):
        pass

    def sleep(self):
        pass

    def clear_kv_cache(self):
        pass

    def release_kv_cache(self):
        pass

    def resume_kv_cache(self):
        pass

    def abort_all_requests(self, reject_request: bool = False):
        pass

    def resume_generation(self):
        pass


def _replica_class():
    from verl.workers.rollout.replica import RolloutReplica

    class CPURolloutReplica(RolloutReplica):
        """verl's replica interface over one :class:`CPURolloutServer` actor."""

        def rollout_worker_use_gpu(self) -> bool:
            return False

        async def launch_servers(self):
            counter = (
                ray.remote(DrawCounter)
                .options(name="divrl_test_cpu_rollout_draws", get_if_exists=True, num_cpus=0)
                .remote()
            )
            server = (
                ray.remote(CPURolloutServer)
                .options(name=_server_name(self.replica_rank), num_cpus=0)
                .remote(self.config, self.model_config, counter)
            )
            await server.ready.remote()
            self.servers = [server]
            self._server_handle = server
            self._server_address = _server_name(self.replica_rank)

    return CPURolloutReplica


def _adapter_class():
    from verl.workers.rollout.base import BaseRollout
    from verl.workers.rollout.utils import ensure_async_iterator

    class CPUServerAdapter(BaseRollout):
        """The actor worker's side of the CPU rollout: sends the trainer's weights to the
        replica's server (verl's naive checkpoint engine calls ``update_weights``)."""

        async def resume(self, tags: list[str]):
            pass

        async def release(self):
            pass

        async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs):
            state = {}
            async for name, tensor in ensure_async_iterator(weights):
                if hasattr(tensor, "full_tensor"):
                    tensor = tensor.full_tensor()
                state[name] = tensor.detach().to("cpu", copy=True)
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            # one replica per (infer_tp x infer_pp) group of ranks: the mesh's size over its
            # data-parallel dimension (each data-parallel rank's replica gets the weights)
            replica = self.device_mesh.size() // self.device_mesh["dp"].size()
            if rank % replica == 0:
                server = ray.get_actor(_server_name(rank // replica))
                await server.load_weights.remote(state, kwargs.get("global_steps"))

    return CPUServerAdapter


def _register_rollout() -> None:
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = f"{__name__}.CPUServerAdapter"
    RolloutReplicaRegistry.register(ROLLOUT, _replica_class)


def __getattr__(name: str):
    # verl's rollout registry imports its classes by dotted name; build them on first use
    if name == "CPUServerAdapter":
        return _adapter_class()
    raise AttributeError(name)


if os.environ.get("VERL_PLATFORM") == PLATFORM:
    _hide_trl()
    _register_rollout()
