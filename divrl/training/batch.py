"""Padded batches of (prompt, response) pairs, built once and cut by index.

:class:`PaddedPairs` left-pads prompts to the longest prompt ``P`` and right-pads responses
to the longest response ``R`` (the pad id in the padding), as
:func:`divrl.rollout.collate` does, so :meth:`PaddedPairs.model_inputs` cuts any
micro-batch out without re-padding. Every field is a tensor with rows first (or None), so
:meth:`PaddedPairs.select` needs no list of fields.

- :class:`Experience`: one process's scored rollouts of a step, with everything the update
  reads per row.
- :class:`ReferenceSamples`: a DPH-RL reference store's samples with their stored
  log-probs, padded once when training starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from divrl.rollout import collate

__all__ = ["Experience", "PaddedPairs", "ReferenceSamples", "concat_pairs", "pad_right", "pad_rows"]

Self = TypeVar("Self", bound="PaddedPairs")


def pad_rows(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    """``[len(rows), width]`` float32, each row's values first and zeros after."""
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.float32)
    return out


def _pad_pairs(
    prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], pad_id: int
) -> dict[str, torch.Tensor]:
    full = collate(prompt_ids, response_ids, pad_id)
    plen = full["input_ids"].shape[1] - full["responses"].shape[1]
    return {
        "prompts": full["input_ids"][:, :plen],
        "prompt_mask": full["attention_mask"][:, :plen],
        "responses": full["responses"],
        "response_mask": full["response_mask"],
    }


@dataclass
class PaddedPairs:
    """``N`` (prompt, response) pairs padded once."""

    prompts: torch.Tensor  # [N, P] long, left-padded
    prompt_mask: torch.Tensor  # [N, P] long
    responses: torch.Tensor  # [N, R] long, right-padded
    response_mask: torch.Tensor  # [N, R] float

    def __len__(self) -> int:
        return self.responses.shape[0]

    @property
    def prompt_lengths(self) -> torch.Tensor:
        return self.prompt_mask.sum(-1)

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1).long()

    def select(self: Self, idx: Sequence[int] | torch.Tensor | slice) -> Self:
        """The rows ``idx`` (every field, present or future)."""
        return dataclasses.replace(
            self,
            **{
                f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[idx]
                for f in dataclasses.fields(self)
            },
        )

    def truncate(self: Self, n: int) -> Self:
        """The first ``n`` rows."""
        return self.select(slice(0, n))

    def by_length(self, indices: Sequence[int]) -> list[int]:
        """``indices`` sorted (stably) by prompt + response length, for length-bucketed
        micro-batches: a padded micro-batch costs ``B x (longest prompt + longest response)``."""
        total = (self.prompt_lengths + self.response_lengths).tolist()
        return sorted(indices, key=lambda i: total[i])

    def model_inputs(self, idx: Sequence[int]) -> dict[str, torch.Tensor]:
        """The rows ``idx`` padded to their own longest prompt and response (the
        :func:`divrl.rollout.collate` layout and values), on the CPU."""
        rows = torch.as_tensor(list(idx), dtype=torch.long)
        plen = int(self.prompt_lengths[rows].max())
        rlen = max(1, int(self.response_lengths[rows].max()))
        width = self.prompts.shape[1]
        input_ids = torch.cat(
            [self.prompts[rows, width - plen :], self.responses[rows, :rlen]], dim=1
        )
        attention = torch.cat(
            [self.prompt_mask[rows, width - plen :], self.response_mask[rows, :rlen].long()],
            dim=1,
        )
        return {
            "input_ids": input_ids,
            "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
            "responses": input_ids[:, plen:],
            "response_mask": attention[:, plen:].float(),
        }


def pad_right(t: torch.Tensor, width: int, value: float = 0) -> torch.Tensor:
    """``[N, width]``: ``t``'s columns first (cut at ``width``), ``value`` after."""
    out = torch.full((t.shape[0], width), value, dtype=t.dtype)
    w = min(width, t.shape[1])
    out[:, :w] = t[:, :w]
    return out


def _pad_left(t: torch.Tensor, width: int, value: float) -> torch.Tensor:
    out = torch.full((t.shape[0], width), value, dtype=t.dtype)
    out[:, width - t.shape[1] :] = t
    return out


def concat_pairs(parts: Sequence[PaddedPairs], pad_id: int) -> PaddedPairs:
    """The rows of ``parts`` in order, as one :class:`PaddedPairs` padded to the longest
    prompt (on the left) and the longest response (on the right) of them all."""
    plen = max(p.prompts.shape[1] for p in parts)
    rlen = max(p.responses.shape[1] for p in parts)
    return PaddedPairs(
        prompts=torch.cat([_pad_left(p.prompts, plen, pad_id) for p in parts]),
        prompt_mask=torch.cat([_pad_left(p.prompt_mask, plen, 0) for p in parts]),
        responses=torch.cat([pad_right(p.responses, rlen, pad_id) for p in parts]),
        response_mask=torch.cat([pad_right(p.response_mask, rlen, 0) for p in parts]),
    )


@dataclass
class Experience(PaddedPairs):
    """One process's scored rollouts of a step (``N`` rows)."""

    rollout_log_probs: torch.Tensor  # [N, R] the engine's sampling log-probs
    rewards: torch.Tensor  # [N] shaped rewards (score + overlong penalty)
    scores: torch.Tensor  # [N] verifier scores
    groups: torch.Tensor  # [N] group id (one per prompt)
    truncated: torch.Tensor  # [N] bool: hit max_new_tokens
    advantages: torch.Tensor | None = None  # [N]
    old_log_probs: torch.Tensor | None = None  # [N, R] off-policy only
    proxy_log_probs: torch.Tensor | None = None  # [N, R] off-policy Lp-Reg only
    log_normalizers: torch.Tensor | None = None  # [N, R] off-policy Lp-Reg only (log Z)
    ref_log_probs: torch.Tensor | None = None  # [N, R] reverse-KL only
    lp_reg_selected: torch.Tensor | None = None  # [N, R] bool, Lp-Reg's scope-wide selection

    @classmethod
    def from_rollouts(
        cls,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        rollout_log_probs: Sequence[Sequence[float]],
        rewards: Sequence[float],
        scores: Sequence[float],
        groups: Sequence[int],
        truncated: Sequence[bool],
        pad_id: int,
    ) -> Experience:
        """Pad the rows once."""
        pairs = _pad_pairs(prompt_ids, response_ids, pad_id)
        return cls(
            **pairs,
            rollout_log_probs=pad_rows(rollout_log_probs, pairs["responses"].shape[1]),
            rewards=torch.tensor(list(rewards)),
            scores=torch.tensor(list(scores)),
            groups=torch.tensor(list(groups)),
            truncated=torch.tensor(list(truncated), dtype=torch.bool),
        )


@dataclass
class ReferenceSamples(PaddedPairs):
    """DPH-RL reference samples with their stored log-probs under the initial policy."""

    ref_log_probs: torch.Tensor  # [M, R]

    @classmethod
    def from_samples(cls, samples: Sequence[Any], pad_id: int) -> ReferenceSamples:
        """From :class:`~divrl.data.reference_store.ReferenceSample` rows."""
        pairs = _pad_pairs(
            [s.prompt_ids for s in samples], [s.response_ids for s in samples], pad_id
        )
        width = pairs["responses"].shape[1]
        return cls(**pairs, ref_log_probs=pad_rows([s.ref_log_probs for s in samples], width))
