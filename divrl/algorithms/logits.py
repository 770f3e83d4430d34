"""Per-token quantities from LM-head logits, computed in row chunks.

A ``[batch, len, vocab]`` logits tensor at a realistic vocabulary (152,064) is the largest
tensor of a step; a naive ``logits.float().log_softmax(-1)`` makes one or two more copies of
it. Every function here walks the rows in chunks of ``chunk_size`` positions, casting only
one chunk to fp32 at a time; when a gradient is needed, the chunk's intermediates are
recomputed in backward (activation checkpointing) instead of kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

# The proxy log-prob of a filtered token (true value: log 0). It is below every finite
# log-prob, so the Lp-Reg filter ``lp < proxy`` never selects the token, and ``proxy - lp``
# stays finite, so no loss or gradient becomes inf/NaN even in a branch that is not taken.
FILTERED_LOG_PROB = torch.finfo(torch.float32).min


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

    def fn_multi(rows: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
        return fn(rows, *args).unsqueeze(-1)

    return map_rows_multi(fn_multi, logits, *row_args, chunk_size=chunk_size).squeeze(-1)


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


@dataclass
class LogitStats:
    """What one pass over the logits yields, each ``[...]`` fp32.

    ``log_prob`` and ``entropy`` carry gradients (when the logits do); ``proxy_log_prob``
    and ``log_normalizer`` (the Lp-Reg min-p proxy, present only when ``minp_kappa`` was
    given) are detached.
    """

    log_prob: torch.Tensor
    entropy: torch.Tensor | None = None
    proxy_log_prob: torch.Tensor | None = None
    log_normalizer: torch.Tensor | None = None


def logit_stats(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_entropy: bool = True,
    minp_kappa: float | None = None,
) -> LogitStats:
    """Log-probs of the sampled tokens, entropy and the Lp-Reg proxy in one chunked pass.

    Per chunk of positions the logits are cast to fp32 and ``log_softmax`` is computed
    once; the log-prob is gathered from it, the entropy is ``-sum p log p`` of it, and the
    min-p normaliser reuses the same row maximum. With gradients enabled and
    ``chunk_size`` set, each chunk is recomputed in backward, so the peak extra memory is a
    few chunk-sized fp32 buffers instead of several ``[..., vocab]`` copies.

    Args:
        logits: ``[..., vocab]``.
        tokens: ``[...]`` sampled token ids.
        temperature: sampling temperature (the proxy filter uses untempered probabilities,
            see :func:`divrl.algorithms.minp_log_normalizer`).
        chunk_size: positions per chunk (``None``: all at once).
        with_entropy: also return the entropy.
        minp_kappa: when given, also return the proxy log-prob and ``log Z``.
    """
    _validate(logits, tokens, temperature)
    if minp_kappa is not None and not 0.0 <= minp_kappa <= 1.0:
        raise ValueError(f"minp_kappa must be in [0, 1] (the paper uses 0.02), got {minp_kappa}")
    log_kappa = (
        None if minp_kappa is None else (math.log(minp_kappa) if minp_kappa > 0 else -math.inf)
    )

    def fn(rows: torch.Tensor, toks: torch.Tensor) -> torch.Tensor:
        x = rows.float()
        idx = toks.long().unsqueeze(-1)
        logp = torch.log_softmax(x / temperature, -1)
        out = [logp.gather(-1, idx).squeeze(-1)]
        if with_entropy:
            out.append(-(torch.exp(logp) * logp).sum(-1))
        if log_kappa is not None:
            with torch.no_grad():
                xd, lpd = x.detach(), logp.detach()
                keep = xd >= xd.amax(-1, keepdim=True) + log_kappa
                log_z = torch.logsumexp(lpd.masked_fill(~keep, -math.inf), -1)
                kept = keep.gather(-1, idx).squeeze(-1)
                tok_lp = out[0].detach()
                proxy = torch.where(
                    kept, tok_lp - log_z, torch.full_like(tok_lp, FILTERED_LOG_PROB)
                )
            out += [proxy, log_z]
        return torch.stack(out, -1)

    stacked = map_rows_multi(fn, logits, tokens, chunk_size=chunk_size)
    parts = list(stacked.unbind(-1))
    stats = LogitStats(log_prob=parts.pop(0))
    if with_entropy:
        stats.entropy = parts.pop(0)
    if log_kappa is not None:
        stats.proxy_log_prob, stats.log_normalizer = parts[0].detach(), parts[1].detach()
    return stats


def map_rows_multi(
    fn: Callable[..., torch.Tensor],
    logits: torch.Tensor,
    *row_args: torch.Tensor,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Like :func:`map_rows` for an ``fn`` returning ``[M, K]``; returns ``[..., K]``."""
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    flat_args = [a.reshape(-1) for a in row_args]
    rows = flat.shape[0]
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if chunk_size is None or chunk_size >= rows:
        out = fn(flat, *flat_args)
        return out.reshape(*lead, out.shape[-1])
    grad = torch.is_grad_enabled() and flat.requires_grad
    outs = []
    for start in range(0, rows, chunk_size):
        chunk = flat[start : start + chunk_size]
        chunk_args = [a[start : start + chunk_size] for a in flat_args]
        if grad:
            outs.append(checkpoint(fn, chunk, *chunk_args, use_reentrant=False))
        else:
            outs.append(fn(chunk, *chunk_args))
    out = torch.cat(outs)
    return out.reshape(*lead, out.shape[-1])
