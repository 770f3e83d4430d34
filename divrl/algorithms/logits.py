"""Per-token quantities from LM-head logits, computed in row chunks.

A ``[batch, len, vocab]`` logits tensor at a realistic vocabulary (152,064) is the largest
tensor of a step; a naive ``logits.float().log_softmax(-1)`` makes one or two more copies of
it. Every function here walks the rows in chunks of ``chunk_size`` positions, casting only
one chunk to fp32 at a time; when a gradient is needed, the chunk's intermediates are
recomputed in backward (activation checkpointing) instead of kept.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint


def _validate(logits: torch.Tensor, tokens: torch.Tensor | None, temperature: float) -> None:
    if logits.dim() < 2:
        raise ValueError(f"logits must be [..., vocab], got {tuple(logits.shape)}")
    if tokens is not None and tuple(tokens.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"tokens {tuple(tokens.shape)} must match logits without the vocab dim "
            f"{tuple(logits.shape[:-1])}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def map_rows(
    fn: Callable[..., torch.Tensor],
    logits: torch.Tensor,
    *row_args: torch.Tensor,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Apply ``fn(logits_rows [M, V], *args_rows [M]) -> [M]`` over chunks of positions.

    Returns a tensor shaped ``logits.shape[:-1]``. With ``chunk_size`` set and gradients
    enabled, each chunk runs under activation checkpointing, so no full-size fp32 copy of
    the logits is kept for backward.
    """
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    flat_args = [a.reshape(-1) for a in row_args]
    rows = flat.shape[0]
    if chunk_size is None or chunk_size >= rows:
        return fn(flat, *flat_args).reshape(lead)
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    grad = torch.is_grad_enabled() and flat.requires_grad
    outs = []
    for start in range(0, rows, chunk_size):
        chunk = flat[start : start + chunk_size]
        chunk_args = [a[start : start + chunk_size] for a in flat_args]
        if grad:
            outs.append(checkpoint(fn, chunk, *chunk_args, use_reentrant=False))
        else:
            outs.append(fn(chunk, *chunk_args))
    return torch.cat(outs).reshape(lead)


def token_log_probs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """``log softmax(logits / T)[token]`` per position, differentiable.

    Args:
        logits: ``[..., vocab]`` (fp32 or bf16; computed in fp32).
        tokens: ``[...]`` token ids.
        temperature: the sampling temperature the log-probs are taken at.
        chunk_size: positions per chunk (``None``: all at once).

    Returns:
        ``[...]`` fp32 log-probs.
    """
    _validate(logits, tokens, temperature)

    def fn(rows: torch.Tensor, toks: torch.Tensor) -> torch.Tensor:
        x = rows.float() / temperature
        return x.gather(-1, toks.long().unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, -1)

    return map_rows(fn, logits, tokens, chunk_size=chunk_size)


def entropy_from_logits(
    logits: torch.Tensor, chunk_size: int | None = None, temperature: float = 1.0
) -> torch.Tensor:
    """Full-vocabulary entropy ``H = logsumexp(x) - sum softmax(x) * x`` of ``x = logits / T``.

    Args:
        logits: ``[..., vocab]``.
        chunk_size: positions per chunk (``None``: all at once).

    Returns:
        ``[...]`` fp32 entropies in nats, differentiable (the entropy bonus needs it).
    """
    _validate(logits, None, temperature)

    def fn(rows: torch.Tensor) -> torch.Tensor:
        x = rows.float() / temperature
        return torch.logsumexp(x, -1) - (torch.softmax(x, -1) * x).sum(-1)

    return map_rows(fn, logits, chunk_size=chunk_size)
