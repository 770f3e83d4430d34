"""Rollouts with vLLM, colocated with the trainer (as TRL's ``vllm_mode="colocate"``).

vLLM is an optional extra (``pip install divrl[vllm]``, a CUDA machine): this module
imports it only when an engine is built, so ``import divrl`` never needs it. Each
training process runs its own vLLM engine on its own GPU (``external_launcher``
executor, one engine per rank, sharing GPU memory with training); after every optimiser
step the trainer calls :meth:`VLLMEngine.sync_weights`, which streams the policy's
parameters into vLLM's model through its ``load_weights`` and resets the prefix cache.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from divrl.rollout.base import RolloutEngine, RolloutOutput, SamplingParams

__all__ = ["VLLMEngine"]


class VLLMEngine(RolloutEngine):
    """A colocated ``vllm.LLM`` on this process's GPU.

    Args:
        model_path: the directory/name of the initial policy (vLLM loads it itself).
        gpu_memory_utilization: share of the GPU vLLM may take (the rest is training's).
        dtype: vLLM's dtype string (``"bfloat16"``...).
        seed: base seed (the rank is added, so ranks sample differently).
        max_model_len: prompt + response tokens.
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
    ) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise ImportError(
                "rollout.engine=vllm needs vLLM: pip install 'divrl[vllm]' (CUDA only), "
                "or use rollout.engine=hf"
            ) from exc
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.llm = LLM(
            model=model_path,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            seed=seed + rank,
            max_model_len=max_model_len,
            trust_remote_code=trust_remote_code,
            # one engine per training process, launched by torchrun/accelerate
            distributed_executor_backend="external_launcher",
        )

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> RolloutOutput:  # pragma: no cover - needs a GPU
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

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
        """Stream ``(name, full tensor)`` pairs into vLLM's ``load_weights``.

        vLLM copies each tensor into its own weights as it reads it, so a lazy iterator
        (the trainer's ``iter_full_parameters``, which gathers one parameter at a time
        from the FSDP shards) never holds a second full model.
        """
        # The colocated engine's model lives in this process (TRL's colocate path).
        engine_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        engine_model.load_weights(weights)
        self.llm.reset_prefix_cache()
