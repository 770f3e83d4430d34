"""The rollout-engine interface: prompt token ids in; response ids, log-probs, texts out."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "ENGINE_ATTRIBUTES",
    "EngineError",
    "PromptIds",
    "RolloutEngine",
    "RolloutOutput",
    "SamplingParams",
    "Seeds",
    "check_engine",
    "check_prompts",
    "collate",
    "repeat_samples",
]


#: the attributes of :class:`RolloutEngine` that the commands read from any engine, each
#: declared there with its default
ENGINE_ATTRIBUTES = ("generate", "sync_weights", "batched_seeds", "context_length")
#: the prompts of a ``generate`` call, each as its token ids (the type every engine takes)
PromptIds = Sequence[Sequence[int]]
#: ``generate``'s seeds: one per prompt, or None for unseeded sampling
Seeds = Sequence[int] | None


class EngineError(ValueError):
    """An unknown engine name, an option the engine does not take or accept, or an input
    no engine can generate from (a user error of every command; re-exported by
    :mod:`divrl.rollout.registry`)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``top_k=0`` and ``top_p=1.0`` switch those filters off;
    ``temperature=0`` decodes greedily (then ``log_probs`` are at temperature 1)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Any, **changes: Any) -> SamplingParams:
        """The sampling settings of any object with these fields (``rollout.*`` of a
        training config, an eval config), with ``changes`` applied: the one way every
        caller builds them, so a new field reaches all of them."""
        names = [f.name for f in dataclasses.fields(cls)]
        values = {name: getattr(settings, name) for name in names if hasattr(settings, name)}
        values["stop"] = tuple(values.get("stop", ()))
        return cls(**{**values, **changes})

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError("SamplingParams: n and max_new_tokens must be >= 1")
        if not 0 <= self.temperature < float("inf") or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(
                "SamplingParams: temperature must be finite and >= 0 (0 = greedy), top_p in (0, 1], "
                "top_k >= 0"
            )


@dataclass
class RolloutOutput:
    """``len(prompts) * n`` sampled sequences, prompt-major (prompt i's n samples adjacent).

    ``response_ids[j]`` stops after the EOS token or the first stop string (both kept);
    ``log_probs[j][t]`` is log pi(token t) under the sampling policy at the sampling
    temperature, before top-p/top-k truncation (what vLLM's ``logprobs`` and verl's
    ``old_log_prob`` report). ``truncated[j]`` is True when the response hit
    ``max_new_tokens`` without ending.
    """

    prompt_index: list[int] = field(default_factory=list)
    prompt_ids: list[list[int]] = field(default_factory=list)
    response_ids: list[list[int]] = field(default_factory=list)
    log_probs: list[list[float]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.response_ids)

    def extend(self, other: RolloutOutput, index_offset: int = 0) -> None:
        self.prompt_index += [i + index_offset for i in other.prompt_index]
        self.prompt_ids += other.prompt_ids
        self.response_ids += other.response_ids
        self.log_probs += other.log_probs
        self.texts += other.texts
        self.truncated += other.truncated


class RolloutEngine(abc.ABC):
    """Samples responses for tokenised prompts. Implementations: ``hf``, ``static``,
    ``vllm`` and any registered engine (:mod:`divrl.rollout.registry`).

    The contract every engine keeps (:data:`ENGINE_ATTRIBUTES` names the attributes the
    commands read; :func:`divrl.rollout.build_engine` refuses an engine without one, so a
    command never meets it half way through a run):

    - ``generate(prompt_ids, params, seeds=None) -> RolloutOutput`` (abstract);
    - ``sync_weights(weights)``: default, nothing (an engine that shares the policy);
    - ``batched_seeds``, default False: True when ``generate(..., seeds=...)`` costs no
      more than without seeds (vLLM: one seed per request; ``static``: per-row
      generators). ``divrl eval`` then seeds every prompt on its own, so its samples do not
      depend on batching; with False it samples each batch from one seeded stream, because
      ``hf`` draws seeded prompts one call each;
    - ``context_length``, default None (unknown): prompt + response tokens the engine can
      hold, where it ends a response. ``divrl eval`` flags a sample that ended there
      (``at_context``), falling back to the model's ``max_position_embeddings`` when None.
    """

    batched_seeds: bool = False

    @property
    def context_length(self) -> int | None:
        """Prompt + response tokens the engine can hold (a response ends there), if known."""
        return None

    @abc.abstractmethod
    def generate(
        self, prompt_ids: PromptIds, params: SamplingParams, seeds: Seeds = None
    ) -> RolloutOutput:
        """Sample ``params.n`` responses for every prompt.

        ``seeds`` (one per prompt), when given, make each prompt's samples a function of
        its seed alone, independent of batching and of the number of processes.
        """

    def sync_weights(  # noqa: B027 - hf shares the model
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        """Load the trained policy's weights into the engine (after each update).

        ``weights``: ``(Hugging Face name, full tensor)`` pairs, possibly a lazy iterator
        that gathers each tensor from the shards as it is consumed (a collective under FSDP:
        an engine that consumes it must do so on every process; one that shares the
        model, like ``hf``, leaves it unconsumed and nothing is gathered).
        """


def check_engine(engine: Any, name: str) -> Any:
    """``engine`` when it has every attribute of the engine contract
    (:data:`ENGINE_ATTRIBUTES`).

    Raises:
        EngineError: naming the engine ``name`` and what it lacks (subclassing
            :class:`RolloutEngine` gives the defaults).
    """
    missing = [attr for attr in ENGINE_ATTRIBUTES if not hasattr(engine, attr)]
    if missing:
        raise EngineError(
            f"rollout engine {name!r} built {type(engine).__name__}, which lacks "
            f"{', '.join(missing)}: an engine subclasses divrl.rollout.RolloutEngine, whose "
            "defaults declare them (docs/scaling.md, 'How to add an engine')"
        )
    return engine


def check_prompts(prompt_ids: PromptIds, seeds: Seeds = None) -> None:
    """Refuse a prompt without tokens (there is nothing to continue: a model would sample
    from a pad token, or a batch of one fail in a reshape), and ``seeds`` that are not one
    per prompt: what every engine's ``generate`` checks first.

    Raises:
        ValueError: naming the first empty prompt's index, or the seed count.
    """
    if seeds is not None and len(seeds) != len(prompt_ids):
        raise ValueError("generate: need one seed per prompt")
    for i, ids in enumerate(prompt_ids):
        if len(ids) == 0:
            raise ValueError(
                f"generate: prompt {i} has no token ids; every prompt needs at least one "
                "token (e.g. the tokenizer's BOS token)"
            )


def repeat_samples(out: RolloutOutput, n: int) -> RolloutOutput:
    """``out`` (one sample per prompt) with each sample repeated ``n`` times, prompt-major:
    the ``n`` samples of greedy decoding, which are all the same."""
    repeated = RolloutOutput()
    for j in range(len(out)):
        for _ in range(n):
            repeated.prompt_index.append(out.prompt_index[j])
            repeated.prompt_ids.append(list(out.prompt_ids[j]))
            repeated.response_ids.append(list(out.response_ids[j]))
            repeated.log_probs.append(list(out.log_probs[j]))
            repeated.texts.append(out.texts[j])
            repeated.truncated.append(out.truncated[j])
    return repeated


def pad_token_id(tokenizer: Any) -> int:
    """The id that pads batches: the tokenizer's pad token, else its end-of-sequence token.

    The one fallback every batch builder uses (rollout, training, presampling, evaluation),
    so that no two places pad with different ids. A list of EOS ids gives its first.

    Raises:
        EngineError: the tokenizer has neither (a ValueError).
    """
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if isinstance(candidate, list | tuple):
            candidate = candidate[0] if candidate else None
        if candidate is not None:
            return int(candidate)

    raise EngineError(
        "the tokenizer has neither a pad token nor an eos token (end of sequence): set eos_token "
        "(and pad_token) in the model's tokenizer_config.json"
    )


def collate(
    prompt_ids: PromptIds,
    response_ids: Sequence[Sequence[int]],
    pad_token_id: int,
    response_length: int | None = None,
) -> dict[str, torch.Tensor]:
    """Pad sequences for a teacher-forced forward pass (verl layout).

    Prompts are left-padded to the longest prompt P, responses right-padded to R (the
    longest response, or ``response_length``), so every response starts at column P.

    Returns ``input_ids`` / ``attention_mask`` / ``position_ids`` ``[B, P + R]``,
    ``responses`` and ``response_mask`` ``[B, R]`` (mask is float 1.0 on response tokens).
    """
    batch = len(prompt_ids)
    plen = max(len(p) for p in prompt_ids)
    rlen = response_length or max(1, max(len(r) for r in response_ids))
    input_ids = torch.full((batch, plen + rlen), pad_token_id, dtype=torch.long)
    attention = torch.zeros((batch, plen + rlen), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        if len(r) > rlen:
            raise ValueError(f"response of {len(r)} tokens exceeds response_length={rlen}")
        input_ids[i, plen - len(p) : plen] = torch.as_tensor(p, dtype=torch.long)
        input_ids[i, plen : plen + len(r)] = torch.as_tensor(r, dtype=torch.long)
        attention[i, plen - len(p) : plen + len(r)] = 1
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": position_ids,
        "responses": input_ids[:, plen:],
        "response_mask": attention[:, plen:].float(),
    }
