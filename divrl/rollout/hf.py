"""Rollouts with transformers ``generate`` (batched, KV cache): the CPU default."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from divrl.rollout.base import (
    PromptIds,
    RolloutEngine,
    RolloutOutput,
    SamplingParams,
    Seeds,
    check_prompts,
    pad_token_id,
    repeat_samples,
)
from divrl.rollout.registry import EngineError, register_policy_engine

__all__ = ["HFEngine", "HFOptions", "cut_at_stop", "response_length"]

logger = logging.getLogger(__name__)


def response_length(
    tokens: Sequence[int], eos_token_ids: set[int], stop: Sequence[str], decode
) -> tuple[int, bool]:
    """Length of a generated response (EOS / first stop string included) and whether it ended.

    ``decode(ids) -> str``. A stop string may span several tokens: the response ends at
    the shortest prefix whose text contains one (found by bisection: containment is
    monotone in the prefix length).
    """
    end = len(tokens)
    ended = False
    for i, tok in enumerate(tokens):
        if tok in eos_token_ids:
            end, ended = i + 1, True
            break
    if stop and any(s in decode(tokens[:end]) for s in stop):
        lo, hi = 1, end
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in decode(tokens[:mid]) for s in stop):
                hi = mid
            else:
                lo = mid + 1
        end, ended = lo, True
    return end, ended


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to the end of its first stop string (all of it when it has none).

    The response's last token may run past the stop string (a token ``"x;y"`` for the stop
    ``";"``): its id stays in the response, its text after the stop string goes, as vLLM's
    ``include_stop_str_in_output`` cuts it.
    """
    hits = [(text.find(s), s) for s in stop if s in text]
    if not hits:
        return text
    at, first = min(hits)
    return text[: at + len(first)]


class HFEngine(RolloutEngine):
    """Samples with ``model.generate`` on the training model itself (no weight copy).

    Args:
        model: a transformers causal LM (unwrapped: not the DDP wrapper).
        tokenizer: its tokenizer; needs ``eos_token_id``; ``pad_token_id`` falls back to EOS.
        batch_size: prompts per ``generate`` call when no seeds are given.
        full_weights: for a sharded (FSDP) model, a factory of the context manager that
            makes its full parameters live (``divrl.training.fsdp.full_parameters``); every
            ``generate`` call runs inside one, a collective on entry, so every process must
            call ``generate`` equally often. Inside it ``generate`` runs with
            ``synced_gpus=False``: no collective per token, processes may stop at different
            lengths.

    A response also ends where prompt + response reaches the model's context
    (``config.max_position_embeddings``), as vLLM's ``max_model_len`` ends it: past it the
    positions are ones the model never saw. Such responses are ``truncated``; the first
    batch that has one logs a warning and ``context_capped`` counts them.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        batch_size: int = 16,
        full_weights: Callable[[], AbstractContextManager] | None = None,
    ) -> None:
        self.model = model
        self.full_weights = full_weights or contextlib.nullcontext
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        eos = tokenizer.eos_token_id
        if eos is None or (isinstance(eos, list | tuple) and not eos):
            raise EngineError(
                "the tokenizer has no end-of-sequence token (eos_token_id), so no response "
                "could end before max_new_tokens: set eos_token in the model's "
                "tokenizer_config.json (or tokenizer.eos_token = ... before building the engine)"
            )
        self.eos_ids = {eos} if isinstance(eos, int) else set(eos)
        self.pad_id = pad_token_id(tokenizer)
        self.context_capped = 0  # responses cut at the model's context so far

    # generate(..., seeds=...) draws each seeded prompt in a call of its own: seeds cost
    # one call per prompt, so divrl eval batches this engine under one seed instead
    batched_seeds = False

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def context_length(self) -> int | None:
        """The model's context in tokens (``config.max_position_embeddings``), if it has one."""
        value = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return value if isinstance(value, int) and value > 0 else None

    def _response_caps(self, prompt_ids: PromptIds, max_new_tokens: int) -> list[int] | None:
        """Per prompt, the most new tokens that fit in the context; None when all fit."""
        context = self.context_length
        if context is None or max(len(p) for p in prompt_ids) + max_new_tokens <= context:
            return None
        longest = max(len(p) for p in prompt_ids)
        if longest >= context:
            raise ValueError(
                f"a prompt of {longest} tokens leaves no room in the model's context of "
                f"{context} tokens (config.max_position_embeddings): shorten the prompts "
                "(data.max_prompt_length with data.truncation) or use a model with a longer "
                "context"
            )
        return [min(max_new_tokens, context - len(p)) for p in prompt_ids]

    def generate(
        self, prompt_ids: PromptIds, params: SamplingParams, seeds: Seeds = None
    ) -> RolloutOutput:
        check_prompts(prompt_ids, seeds)
        if params.temperature == 0 and params.n > 1:
            # greedy decoding gives every sample the same tokens: decode once, copy n times
            # (transformers refuses num_return_sequences > 1 without sampling)
            once = self.generate(prompt_ids, dataclasses.replace(params, n=1), seeds)
            return repeat_samples(once, params.n)
        out = RolloutOutput()
        if not prompt_ids:
            return out
        was_training = self.model.training
        self.model.eval()
        with self.full_weights():
            try:
                self._generate_all(prompt_ids, params, seeds, out)
            finally:
                self.model.train(was_training)
        return out

    def _generate_all(
        self, prompt_ids: PromptIds, params: SamplingParams, seeds: Seeds, out: RolloutOutput
    ) -> None:
        if seeds is not None:
            devices = [self.device] if self.device.type == "cuda" else []
            for i, (ids, seed) in enumerate(zip(prompt_ids, seeds, strict=True)):
                # fork_rng: the seeded samples leave the caller's RNG stream untouched.
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(seed)
                    out.extend(self._generate_batch([ids], params), index_offset=i)
        else:
            for start in range(0, len(prompt_ids), self.batch_size):
                chunk = prompt_ids[start : start + self.batch_size]
                out.extend(self._generate_batch(chunk, params), index_offset=start)

    @torch.no_grad()
    def _generate_batch(self, prompt_ids: PromptIds, params: SamplingParams) -> RolloutOutput:
        plen = max(len(p) for p in prompt_ids)
        ids = torch.full((len(prompt_ids), plen), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompt_ids):  # left padding: generation continues every row
            ids[i, plen - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, plen - len(p) :] = 1
        caps = self._response_caps(prompt_ids, params.max_new_tokens)
        max_new_tokens = max(caps) if caps else params.max_new_tokens
        greedy = params.temperature == 0
        # explicit filters (top_k 0 = off) so that the model's generation_config adds none
        sampling = (
            {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
            if greedy
            else {
                "do_sample": True,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k,
            }
        )
        gen = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            **sampling,
            min_p=None,
            repetition_penalty=1.0,
            max_new_tokens=max_new_tokens,
            num_return_sequences=params.n,
            synced_gpus=False,
            stopping_criteria=self._stop_criteria(params.stop, plen, caps, params.n),
            pad_token_id=self.pad_id,
            eos_token_id=sorted(self.eos_ids),
            return_dict_in_generate=True,
            output_logits=True,
        )
        new_tokens = gen.sequences[:, plen:]
        # Raw logits per step -> log-softmax at the sampling temperature (1 for greedy), one
        # step at a time so that no [B, T, vocab] fp32 tensor is ever built.
        temperature = 1.0 if greedy else params.temperature
        log_probs = torch.stack(
            [
                torch.log_softmax(step.float() / temperature, dim=-1)
                .gather(-1, new_tokens[:, t : t + 1])
                .squeeze(-1)
                for t, step in enumerate(gen.logits)
            ],
            dim=1,
        ).cpu()
        return self._outputs(prompt_ids, params, caps, new_tokens.cpu(), log_probs)

    def _outputs(
        self,
        prompt_ids: PromptIds,
        params: SamplingParams,
        caps: list[int] | None,
        tokens: torch.Tensor,
        log_probs: torch.Tensor,
    ) -> RolloutOutput:
        """The decoded rows (prompt-major, ``params.n`` a prompt; ``caps``: each prompt's
        room in the context, or None) cut where they ended: EOS, the first stop string, the
        context. The one place a row becomes a response, for ``hf`` and ``static`` alike."""
        out = RolloutOutput()
        capped = 0
        for row, (ids, lps) in enumerate(zip(tokens.tolist(), log_probs.tolist(), strict=True)):
            prompt = row // params.n
            if caps is not None:
                ids = ids[: caps[prompt]]
            length, ended = response_length(ids, self.eos_ids, params.stop, self._decode)
            capped += not ended and length < params.max_new_tokens
            out.prompt_index.append(prompt)
            out.prompt_ids.append(list(prompt_ids[prompt]))
            out.response_ids.append(ids[:length])
            out.log_probs.append(lps[:length])
            out.texts.append(cut_at_stop(self._decode(ids[:length]), params.stop))
            out.truncated.append(not ended)
        if capped:
            self._report_capped(capped, len(out), params.max_new_tokens)
        return out

    def _report_capped(self, capped: int, rows: int, max_new_tokens: int) -> None:
        if not self.context_capped:
            logger.warning(
                "%d of %d responses reached the model's context of %d tokens before "
                "max_new_tokens=%d and were cut there (truncated); later batches are counted "
                "in HFEngine.context_capped",
                capped,
                rows,
                self.context_length,
                max_new_tokens,
            )
        self.context_capped += capped

    def _stop_criteria(self, stop: Sequence[str], prompt_len: int, caps: list[int] | None, n: int):
        """Stop a row once its decoded response contains a stop string, or once it has
        ``caps[prompt]`` new tokens (its prompt's room in the context).

        Decoding the text (rather than transformers' ``stop_strings``, which needs a
        tokenizer with a byte-level vocabulary map) works with any tokenizer.
        """
        from transformers import StoppingCriteria, StoppingCriteriaList

        criteria: list[StoppingCriteria] = []
        if caps is not None:
            # generate's rows are prompt-major: prompt i's n samples adjacent
            room = torch.tensor(caps, dtype=torch.long).repeat_interleave(n)

            class _StopAtContext(StoppingCriteria):
                def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
                    return (input_ids.shape[1] - prompt_len >= room).to(input_ids.device)

            criteria.append(_StopAtContext())
        if stop:
            criteria.append(self._stop_on_strings(stop, prompt_len))
        return StoppingCriteriaList(criteria) if criteria else None

    def _stop_on_strings(self, stop: Sequence[str], prompt_len: int):
        from transformers import StoppingCriteria

        engine = self

        class _StopOnStrings(StoppingCriteria):
            def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
                done = [
                    any(s in engine._decode(row[prompt_len:].tolist()) for s in stop)
                    for row in input_ids
                ]
                return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

        return _StopOnStrings()

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)


@dataclass(frozen=True)
class HFOptions:
    """Options of the ``hf`` engine.

    ``batch_size``: prompts per ``generate`` call when no seeds are given (the
    training rollouts with ``rollout.seeded=false``; presampling and evaluation batch
    themselves and pass at most this many).
    """

    batch_size: int = 64

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1")


build_hf = register_policy_engine(
    "hf",
    HFEngine,
    options=HFOptions,
    summary="transformers generate on the policy itself (no weight copy); CPU or GPU",
)
