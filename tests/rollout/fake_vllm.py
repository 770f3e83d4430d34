"""A CPU stand-in for vLLM's public offline API, over a transformers model.

vLLM needs a GPU, so divrl's ``vllm`` engine is tested against this module, installed as
``vllm`` in ``sys.modules`` (:func:`install`). It mirrors the parts of vLLM's public
interface divrl calls, with vLLM's names, defaults and behaviour:

- ``LLM(model, *, tokenizer, trust_remote_code, tensor_parallel_size, dtype, seed,
  gpu_memory_utilization, enforce_eager, **engine_args)``: unknown engine arguments are a
  TypeError (vLLM's ``EngineArgs``); ``worker_extension_cls`` (a qualified name) is mixed
  into the worker class; ``logprobs_mode`` ``raw_logprobs`` (vLLM's default: before the
  temperature) or ``processed_logprobs`` (after temperature and top-k/top-p).
- ``LLM.generate(prompts, sampling_params, *, use_tqdm, ...)``: one ``SamplingParams`` or
  one per prompt; token prompts (``TokensPrompt``); returns ``RequestOutput`` objects whose
  ``outputs`` are ``CompletionOutput(index, text, token_ids, cumulative_logprob, logprobs,
  finish_reason, stop_reason)`` with ``logprobs`` one ``{token id: Logprob}`` per token.
- Decoding: a request's ``seed`` seeds its own generator (else the engine's, seeded by
  ``LLM(seed=)``); ``temperature=0`` is greedy; top-k (``0`` or ``-1`` = off) and top-p
  filter; the response ends at EOS (kept in ``token_ids``, left out of ``text``), at the
  first stop string (``finish_reason="stop"``, ``stop_reason`` the string; the text cut
  after it with ``include_stop_str_in_output``, before it otherwise), or at
  ``max_tokens`` / ``max_model_len`` (``finish_reason="length"``).
- ``LLM.collective_rpc(method, timeout, args, kwargs)`` runs a worker method (a name or a
  callable taking the worker) and returns one result per worker (here: one worker);
  ``worker.model_runner.model.load_weights(weights)`` takes Hugging Face names and returns
  the names loaded; ``LLM.reset_prefix_cache()``.

The signatures are compared with the installed vLLM's when it is importable
(``test_fake_vllm_signatures_match_vllm``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch

__version__ = "0.34.0"

# EngineArgs names the fake accepts besides LLM's own keywords (vLLM takes many more)
ENGINE_ARGS = {
    "max_model_len",
    "distributed_executor_backend",
    "worker_extension_cls",
    "logprobs_mode",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_sleep_mode",
    "enable_prefix_caching",
}


#: every LLM built, newest last (tests read the served weights)
INSTANCES: list[LLM] = []


class SamplingParams:
    """vLLM's ``SamplingParams`` (the fields divrl uses, with vLLM's defaults)."""

    def __init__(
        self,
        n: int = 1,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        ignore_eos: bool = False,
        max_tokens: int | None = 16,
        min_tokens: int = 0,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        detokenize: bool = True,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        include_stop_str_in_output: bool = False,
    ) -> None:
        if n < 1 or temperature < 0 or not 0 < top_p <= 1 or top_k < -1:
            raise ValueError(f"invalid sampling parameters n={n} T={temperature} p={top_p}")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self.n, self.temperature, self.top_p, self.top_k = n, temperature, top_p, top_k
        self.seed, self.max_tokens, self.logprobs = seed, max_tokens, logprobs
        self.stop = [stop] if isinstance(stop, str) else list(stop or [])
        self.skip_special_tokens = skip_special_tokens
        self.include_stop_str_in_output = include_stop_str_in_output


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


def TokensPrompt(prompt_token_ids: list[int]) -> dict[str, Any]:  # vLLM: a TypedDict
    return {"prompt_token_ids": prompt_token_ids}


class _Model:
    """The worker's model: vLLM's ``load_weights`` contract over a transformers model."""

    def __init__(self, hf_model: torch.nn.Module) -> None:
        self.hf_model = hf_model
        # the KV cache argument: `cache` in newer transformers, `past_key_values` before
        forward = inspect.signature(hf_model.forward).parameters
        self.cache_arg = "cache" if "cache" in forward else "past_key_values"

    @torch.no_grad()
    def load_weights(self, weights) -> set[str]:
        params = dict(self.hf_model.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name not in params:
                raise KeyError(f"load_weights: unexpected parameter {name!r}")
            params[name].copy_(tensor.to(params[name].dtype))
            loaded.add(name)
        return loaded


class _Worker:
    def __init__(self, model: _Model) -> None:
        self.model_runner = types.SimpleNamespace(model=model)


def _worker_class(extension: str | None) -> type:
    if not extension:
        return _Worker
    module, _, name = extension.rpartition(".")
    ext = getattr(importlib.import_module(module), name)
    clash = [a for a in vars(ext) if not a.startswith("__") and hasattr(_Worker, a)]
    if clash:
        raise ValueError(f"worker extension {extension} redefines worker attributes {clash}")
    return type("Worker", (_Worker, ext), {})


class LLM:
    """vLLM's offline ``LLM`` over a transformers model on the CPU (see the module doc)."""

    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        seed: int | None = 0,
        gpu_memory_utilization: float = 0.9,
        enforce_eager: bool = False,
        **kwargs: Any,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # what external_launcher would read for its process group
        self.env_at_init = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
        unknown = set(kwargs) - ENGINE_ARGS
        if unknown:
            raise TypeError(f"EngineArgs.__init__() got unexpected keyword arguments {unknown}")
        self.init_kwargs = dict(
            model=model, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager, trust_remote_code=trust_remote_code, **kwargs,
        )  # fmt: skip
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer or model)
        hf_model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.hf_model = hf_model
        # the KV cache argument: `cache` in newer transformers, `past_key_values` before
        forward = inspect.signature(hf_model.forward).parameters
        self.cache_arg = "cache" if "cache" in forward else "past_key_values"
        self.worker = _worker_class(kwargs.get("worker_extension_cls"))(_Model(hf_model))
        self.max_model_len = kwargs.get("max_model_len") or hf_model.config.max_position_embeddings
        self.logprobs_mode = kwargs.get("logprobs_mode", "raw_logprobs")
        self.generator = torch.Generator().manual_seed(seed or 0)
        eos = self.tokenizer.eos_token_id
        self.eos_ids = {eos} if isinstance(eos, int) else set(eos)
        self.prefix_cache_resets = 0
        self.requests = 0
        INSTANCES.append(self)

    def get_tokenizer(self):
        return self.tokenizer

    def generate(
        self,
        prompts,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        lora_request=None,
        priority: list[int] | None = None,
    ) -> list[RequestOutput]:
        prompts = prompts if isinstance(prompts, list) else [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = sampling_params if isinstance(sampling_params, list) else None
        if params is not None and len(params) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        outputs = []
        for i, prompt in enumerate(prompts):
            sp = params[i] if params is not None else sampling_params
            ids = list(prompt["prompt_token_ids"])
            self.requests += 1
            outputs.append(RequestOutput(str(self.requests), None, ids, self._request(ids, sp)))
        return outputs

    @torch.no_grad()
    def _request(self, prompt: list[int], sp: SamplingParams) -> list[CompletionOutput]:
        gen = self.generator if sp.seed is None else torch.Generator().manual_seed(sp.seed)
        room = self.max_model_len - len(prompt)
        limit = min(sp.max_tokens or room, room)
        rows = [_Row() for _ in range(sp.n)]
        step_ids = torch.tensor([prompt] * sp.n)
        cache: dict[str, Any] = {}
        for _ in range(limit):
            out = self.hf_model(input_ids=step_ids, use_cache=True, **cache)
            cache = {self.cache_arg: out.past_key_values}
            tokens, logprobs = self._sample(out.logits[:, -1].float(), sp, gen)
            for row, tok, lp in zip(rows, tokens.tolist(), logprobs.tolist(), strict=True):
                if row.finish_reason is None:
                    self._append(row, tok, lp, sp)
            if all(r.finish_reason is not None for r in rows):
                break
            step_ids = tokens[:, None]
        return [self._completion(i, r, sp) for i, r in enumerate(rows)]

    def _sample(self, logits: torch.Tensor, sp: SamplingParams, gen: torch.Generator):
        raw = torch.log_softmax(logits, dim=-1)
        if sp.temperature == 0:  # greedy; vLLM computes greedy log-probs at temperature 1
            tokens = logits.argmax(-1)
            return tokens, raw.gather(-1, tokens[:, None])[:, 0]
        scaled = logits / sp.temperature
        if sp.top_k > 0:
            kth = scaled.topk(min(sp.top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if sp.top_p < 1:  # keep the most likely tokens until their mass reaches top_p
            ranked, order = scaled.sort(-1, descending=True)
            probs = torch.softmax(ranked, -1)
            ranked = ranked.masked_fill(probs.cumsum(-1) - probs > sp.top_p, float("-inf"))
            scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, ranked)
        processed = torch.log_softmax(scaled, dim=-1)
        tokens = torch.multinomial(processed.exp(), 1, generator=gen)[:, 0]
        source = processed if self.logprobs_mode == "processed_logprobs" else raw
        return tokens, source.gather(-1, tokens[:, None])[:, 0]

    def _append(self, row: _Row, token: int, logprob: float, sp: SamplingParams) -> None:
        row.tokens.append(token)
        row.logprobs.append(logprob)
        if token in self.eos_ids:
            row.finish_reason = "stop"
            return
        text = self._decode(row.tokens, sp)
        hits = [(text.find(s), s) for s in sp.stop if s in text]
        if hits:
            at, stop = min(hits)
            row.finish_reason, row.stop_reason = "stop", stop
            row.text = text[: at + len(stop)] if sp.include_stop_str_in_output else text[:at]

    def _completion(self, index: int, row: _Row, sp: SamplingParams) -> CompletionOutput:
        text = row.text if row.text is not None else self._decode(row.tokens, sp)
        logprobs = None
        if sp.logprobs is not None:
            logprobs = [{t: Logprob(lp, 1)} for t, lp in zip(row.tokens, row.logprobs, strict=True)]
        return CompletionOutput(
            index, text, row.tokens, sum(row.logprobs), logprobs,
            row.finish_reason or "length", row.stop_reason,
        )  # fmt: skip

    def _decode(self, tokens: list[int], sp: SamplingParams) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=sp.skip_special_tokens)

    def collective_rpc(
        self,
        method,
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        if isinstance(method, str):
            return [getattr(self.worker, method)(*args, **(kwargs or {}))]
        return [method(self.worker, *args, **(kwargs or {}))]

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        self.prefix_cache_resets += 1
        return True


@dataclass
class _Row:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | None = None
    text: str | None = None


def install(monkeypatch, version: str = __version__) -> types.ModuleType:
    """Put this module in ``sys.modules`` as ``vllm`` (and ``vllm.inputs``) for a test."""
    module = types.ModuleType("vllm")
    for name in ("LLM", "SamplingParams", "RequestOutput", "CompletionOutput"):
        setattr(module, name, globals()[name])
    module.__version__ = version
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = TokensPrompt
    module.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    return module
