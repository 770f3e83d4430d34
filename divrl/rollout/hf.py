"""Rollouts with transformers ``generate`` (batched, KV cache): the CPU default."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch

from divrl.rollout.base import RolloutEngine, RolloutOutput, SamplingParams, pad_token_id

__all__ = ["HFEngine", "response_length"]


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
        if eos is None:
            raise ValueError("the tokenizer has no eos_token_id; the hf engine needs one")
        self.eos_ids = {eos} if isinstance(eos, int) else set(eos)
        self.pad_id = pad_token_id(tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> RolloutOutput:
        out = RolloutOutput()
        was_training = self.model.training
        self.model.eval()
        with self.full_weights():
            try:
                self._generate_all(prompt_ids, params, seeds, out)
            finally:
                self.model.train(was_training)
        return out

    def _generate_all(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None,
        out: RolloutOutput,
    ) -> None:
        if seeds is not None:
            if len(seeds) != len(prompt_ids):
                raise ValueError("generate: need one seed per prompt")
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
    def _generate_batch(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams
    ) -> RolloutOutput:
        plen = max(len(p) for p in prompt_ids)
        ids = torch.full((len(prompt_ids), plen), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompt_ids):  # left padding: generation continues every row
            ids[i, plen - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, plen - len(p) :] = 1
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
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=params.n,
            synced_gpus=False,
            stopping_criteria=self._stop_criteria(params.stop, plen),
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
        new_tokens = new_tokens.cpu()

        out = RolloutOutput()
        for row in range(new_tokens.shape[0]):
            tokens = new_tokens[row].tolist()
            length, ended = response_length(tokens, self.eos_ids, params.stop, self._decode)
            tokens = tokens[:length]
            out.prompt_index.append(row // params.n)
            out.prompt_ids.append(list(prompt_ids[row // params.n]))
            out.response_ids.append(tokens)
            out.log_probs.append(log_probs[row, :length].tolist())
            out.texts.append(self._decode(tokens))
            out.truncated.append(not ended)
        return out

    def _stop_criteria(self, stop: Sequence[str], prompt_len: int):
        """Stop a row once its decoded response contains a stop string.

        Decoding the text (rather than transformers' ``stop_strings``, which needs a
        tokenizer with a byte-level vocabulary map) works with any tokenizer.
        """
        if not stop:
            return None
        from transformers import StoppingCriteria, StoppingCriteriaList

        engine = self

        class _StopOnStrings(StoppingCriteria):
            def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
                done = [
                    any(s in engine._decode(row[prompt_len:].tolist()) for s in stop)
                    for row in input_ids
                ]
                return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

        return StoppingCriteriaList([_StopOnStrings()])

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)
