"""Rollouts with vLLM, colocated with the trainer (as TRL's ``vllm_mode="colocate"``).

vLLM is an optional extra (``pip install divrl[vllm]``, a CUDA machine): this module
imports it only when an engine is built, so ``import divrl`` never needs it. Each
training process runs its own vLLM engine on its own GPU (``external_launcher``
executor, one engine per rank, sharing GPU memory with training).

Only vLLM's public interface is used: ``LLM`` (with ``worker_extension_cls`` and
``logprobs_mode``), ``SamplingParams``, ``TokensPrompt``, ``LLM.generate``,
``LLM.collective_rpc`` and ``LLM.reset_prefix_cache``. The weight sync after each
optimiser step calls :meth:`WeightSyncExtension.divrl_load_weights` on every vLLM worker
through ``collective_rpc`` (the worker-extension route of vLLM's RLHF examples), never
vLLM's internal executor attributes. The installed version is checked when an engine is
built (:data:`SUPPORTED_VERSIONS`).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from divrl.rollout.base import RolloutEngine, RolloutOutput, SamplingParams, check_prompts
from divrl.rollout.registry import EngineContext, register_engine

if TYPE_CHECKING:  # annotations only
    from divrl.rollout.base import PromptIds, Seeds

__all__ = [
    "SUPPORTED_VERSIONS",
    "VLLM_API",
    "VLLMEngine",
    "VLLMOptions",
    "WeightSyncExtension",
    "check_vllm_version",
]

# [lowest, first unsupported). Lowest: 0.20.0, the first vLLM whose requirements admit
# transformers 5 (divrl's own requirement): 0.12-0.19 require transformers < 5, and 0.10.2-0.11
# (logprobs_mode arrived in 0.10.2) predate transformers 5. Highest: 0.34, whose source still
# defines every name in VLLM_API (scripts/vllm_api_check.py on its wheel).
SUPPORTED_VERSIONS = ((0, 20, 0), (0, 35, 0))

#: every vLLM name the engine uses, for scripts/vllm_api_check.py (a check against a vLLM
#: source tree or wheel without importing it): (kind, where, names). ``exports``: names of
#: the module ``where``; ``fields``: names a class ``where`` declares (annotated fields,
#: ``__init__`` / method parameters, ``self.<name>`` assignments); ``methods``: methods of
#: class ``where``; ``literal``: strings in the files under ``where`` (a path in the package).
VLLM_API: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("exports", "vllm", ("LLM", "SamplingParams", "__version__")),
    ("exports", "vllm.inputs", ("TokensPrompt",)),
    (
        "fields",
        "LLM",
        (
            "model",
            "gpu_memory_utilization",
            "dtype",
            "seed",
            "trust_remote_code",
            "enforce_eager",
            "use_tqdm",
        ),
    ),
    ("methods", "LLM", ("generate", "collective_rpc", "reset_prefix_cache")),
    (
        "fields",
        "EngineArgs",  # LLM(**kwargs) passes these on
        (
            "max_model_len",
            "distributed_executor_backend",
            "worker_extension_cls",
            "logprobs_mode",
            "max_num_seqs",
        ),
    ),
    ("literal", "config", ("processed_logprobs", "external_launcher")),
    (
        "fields",
        "SamplingParams",
        (
            "n",
            "temperature",
            "top_p",
            "top_k",
            "max_tokens",
            "stop",
            "include_stop_str_in_output",
            "logprobs",
            "seed",
        ),
    ),
    ("fields", "TokensPrompt", ("prompt_token_ids",)),
    ("fields", "RequestOutput", ("outputs",)),
    ("fields", "CompletionOutput", ("text", "token_ids", "logprobs", "finish_reason")),
    ("fields", "Logprob", ("logprob",)),
    ("fields", "Worker", ("model_runner",)),  # WeightSyncExtension runs in the worker
)


def _version_tuple(version: str) -> tuple[int, int, int]:
    parts = [int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3]]
    return (*parts, 0, 0, 0)[:3]  # type: ignore[return-value]


def check_vllm_version(version: str, *, allow_untested: bool = False) -> None:
    """Raise ImportError unless vLLM ``version`` is one divrl supports.

    ``allow_untested=True`` (engine option ``allow_untested_version``) lets any version
    through, for trying a newer vLLM on purpose.
    """
    low, high = SUPPORTED_VERSIONS
    if allow_untested or low <= _version_tuple(version) < high:
        return
    shown = ".".join(map(str, low)), ".".join(map(str, high[:2]))
    raise ImportError(
        f"vLLM {version} is installed; divrl's vllm engine supports vLLM >= {shown[0]}, "
        f"< {shown[1]}: pip install 'vllm>={shown[0]},<{shown[1]}', or set the engine option "
        "allow_untested_version=true (rollout.engine_options.allow_untested_version=true) "
        "to try this one"
    )


class WeightSyncExtension:
    """Mixed into every vLLM worker (``worker_extension_cls``): loads the trainer's weights.

    vLLM calls it in the worker, where ``self.model_runner`` is the worker's own model
    runner; ``load_weights`` takes Hugging Face names and copies each tensor into vLLM's
    (fused, possibly sharded) parameters as it reads it.
    """

    def divrl_load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        loaded = self.model_runner.model.load_weights(weights=weights)  # type: ignore[attr-defined]
        return len(loaded) if loaded is not None else 0


WORKER_EXTENSION = f"{__name__}.WeightSyncExtension"


@contextlib.contextmanager
def _single_process_rendezvous() -> Iterator[None]:
    """``external_launcher`` reads the launcher's RANK / WORLD_SIZE / MASTER_* variables
    while the engine is built; a plain ``python`` process (no torchrun) gets those of a
    one-process group for that time (left set, they would make accelerate think it was
    launched by torchrun)."""
    added = {}
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            added["MASTER_PORT"] = str(s.getsockname()[1])
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        if key not in os.environ:
            added[key] = value
    if "MASTER_ADDR" not in os.environ:
        added["MASTER_ADDR"] = "127.0.0.1"
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


class VLLMEngine(RolloutEngine):
    """A colocated ``vllm.LLM`` on this process's GPU.

    Args:
        model_path: the directory/name of the initial policy (vLLM loads it itself).
        gpu_memory_utilization: share of the GPU vLLM may take (the rest is training's).
        dtype: vLLM's dtype string (``"bfloat16"``...).
        seed: base seed (the rank is added, so ranks sample differently).
        max_model_len: prompt + response tokens.
        enforce_eager: no CUDA graphs (faster start, slower decoding).
        max_num_seqs: sequences decoded at once (None: vLLM's default).
        allow_untested_version: build on a vLLM outside :data:`SUPPORTED_VERSIONS`.

    ``log_probs`` are vLLM's ``processed_logprobs``: at the sampling temperature (as the
    ``hf`` engine's); with ``top_p < 1`` or ``top_k > 0`` vLLM renormalises them over the
    kept tokens, where ``hf`` reports them before truncation.
    """

    def __init__(
        self,
        model_path: str,
        *,
        gpu_memory_utilization: float = 0.3,
        dtype: str = "bfloat16",
        seed: int = 0,
        max_model_len: int | None = None,
        trust_remote_code: bool = False,
        enforce_eager: bool = False,
        max_num_seqs: int | None = None,
        allow_untested_version: bool = False,
    ) -> None:
        try:
            import vllm
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise ImportError(
                "rollout.engine=vllm needs vLLM: pip install 'divrl[vllm]' (CUDA only), "
                "or use rollout.engine=hf"
            ) from exc
        check_vllm_version(getattr(vllm, "__version__", "0"), allow_untested=allow_untested_version)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self._context_length = max_model_len
        extra = {} if max_num_seqs is None else {"max_num_seqs": max_num_seqs}
        with _single_process_rendezvous():
            self.llm = vllm.LLM(
                model=model_path,
                gpu_memory_utilization=gpu_memory_utilization,
                dtype=dtype,
                seed=seed + rank,
                max_model_len=max_model_len,
                trust_remote_code=trust_remote_code,
                enforce_eager=enforce_eager,
                # one engine per training process, launched by torchrun/accelerate
                distributed_executor_backend="external_launcher",
                worker_extension_cls=WORKER_EXTENSION,
                # log-probs after temperature (vLLM's default reports them before it)
                logprobs_mode="processed_logprobs",
                **extra,
            )

    batched_seeds = True  # a seed per request, in one generate call

    @property
    def context_length(self) -> int | None:
        return self._context_length

    def generate(
        self, prompt_ids: PromptIds, params: SamplingParams, seeds: Seeds = None
    ) -> RolloutOutput:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        check_prompts(prompt_ids, seeds)

        def sampling(seed: int | None) -> VSamplingParams:
            return VSamplingParams(
                n=params.n,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else -1,
                max_tokens=params.max_new_tokens,
                stop=list(params.stop) or None,
                include_stop_str_in_output=True,
                logprobs=0,  # the sampled token's log-prob only
                seed=seed,
            )

        sp = [sampling(s) for s in seeds] if seeds is not None else sampling(None)
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
        results = self.llm.generate(prompts, sp, use_tqdm=False)
        out = RolloutOutput()
        for i, result in enumerate(results):
            for completion in result.outputs:
                tokens = list(completion.token_ids)
                out.prompt_index.append(i)
                out.prompt_ids.append(list(prompt_ids[i]))
                out.response_ids.append(tokens)
                out.log_probs.append(
                    [
                        step[tok].logprob
                        for tok, step in zip(tokens, completion.logprobs, strict=True)
                    ]
                )
                out.texts.append(completion.text)
                out.truncated.append(completion.finish_reason == "length")
        return out

    @torch.no_grad()
    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream ``(name, full tensor)`` pairs into every vLLM worker's ``load_weights``.

        The colocated engine's worker lives in this process (``external_launcher``), so
        ``collective_rpc`` hands it the iterator itself: vLLM copies each tensor as it
        reads it, and a lazy iterator (the trainer's ``iter_full_parameters``, which
        gathers one parameter at a time from the FSDP shards) never holds a second full
        model. The prefix cache is reset: its entries were computed by the old weights.
        """
        self.llm.collective_rpc("divrl_load_weights", args=(weights,))
        self.llm.reset_prefix_cache()


@dataclass(frozen=True)
class VLLMOptions:
    """Options of the ``vllm`` engine (see :class:`VLLMEngine`); ``dtype`` (vLLM's name,
    e.g. ``"bfloat16"`` or ``"auto"``) overrides the command's (training: the compute dtype,
    ``train.param_dtype`` or ``model.dtype``; eval: ``"auto"``, the checkpoint's)."""

    gpu_memory_utilization: float = 0.3
    enforce_eager: bool = False
    max_num_seqs: int | None = None
    dtype: str | None = None
    allow_untested_version: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.gpu_memory_utilization < 1.0:
            raise ValueError(
                f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1)"
            )
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs} must be >= 1")


@register_engine(
    "vllm",
    options=VLLMOptions,
    summary="vLLM colocated on this process's GPU (one engine per rank); CUDA only",
    uses_model=False,
    requires=(
        (
            "vllm",
            "pip install -e '.[vllm]' in the divrl checkout (CUDA only), or use the hf engine",
        ),
    ),
)
def build_vllm(context: EngineContext, options: VLLMOptions) -> VLLMEngine:
    return VLLMEngine(
        context.model_path,
        gpu_memory_utilization=options.gpu_memory_utilization,
        dtype=options.dtype or context.dtype,
        seed=context.seed,
        max_model_len=context.max_model_len,
        trust_remote_code=context.trust_remote_code,
        enforce_eager=options.enforce_eager,
        max_num_seqs=options.max_num_seqs,
        allow_untested_version=options.allow_untested_version,
    )
