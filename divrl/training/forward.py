"""Teacher-forced forward passes over (prompt, response) pairs."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence

import torch

from divrl.algorithms import token_log_probs
from divrl.rollout import collate

__all__ = ["batch_log_probs", "response_logits", "to_device"]


@functools.cache
def _accepts_logits_to_keep(forward) -> bool:
    return "logits_to_keep" in inspect.signature(forward).parameters


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


def response_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logits that predict each response token: ``[B, R, vocab]`` (R = response columns).

    ``batch`` comes from :func:`divrl.rollout.collate` (prompt left-padded, response
    right-padded, so the response occupies the last R columns). Only the last R + 1
    positions' logits are materialised when the model supports ``logits_to_keep``.
    """
    resp_len = batch["responses"].shape[1]
    inner = getattr(model, "module", model)  # DDP wrapper -> the transformers model
    kwargs = {}
    if _accepts_logits_to_keep(type(inner).forward):
        kwargs["logits_to_keep"] = resp_len + 1
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
        **kwargs,
    )
    return out.logits[:, -resp_len - 1 : -1]


@torch.no_grad()
def batch_log_probs(
    model: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    temperature: float,
    micro_batch_size: int,
    chunk_size: int | None = None,
    length_bucketing: bool = True,
) -> list[list[float]]:
    """Per-token log-probs of each response under ``model`` (one list per response, in the
    input order). ``length_bucketing`` sorts the pairs by length before cutting them into
    micro-batches (less padding; the values do not change)."""
    device = next(model.parameters()).device
    order = list(range(len(prompt_ids)))
    if length_bucketing:
        order.sort(key=lambda i: len(prompt_ids[i]) + len(response_ids[i]))
    out: list[list[float]] = [[] for _ in order]
    for start in range(0, len(order), micro_batch_size):
        idx = order[start : start + micro_batch_size]
        prompts, responses = [prompt_ids[i] for i in idx], [response_ids[i] for i in idx]
        batch = to_device(collate(prompts, responses, pad_token_id), device)
        logits = response_logits(model, batch)
        lp = token_log_probs(logits, batch["responses"], temperature, chunk_size).cpu()
        for j, i in enumerate(idx):
            out[i] = lp[j, : len(response_ids[i])].tolist()
    return out
