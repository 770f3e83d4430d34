"""Per-token quantities from LM-head logits in one lean, chunked pass.

A ``[batch, len, vocab]`` logits tensor at a realistic vocabulary (152,064) is the largest
tensor of a step; a naive ``logits.float().log_softmax(-1)`` followed by an entropy and
autograd keeps several more full-size fp32 copies alive for backward. Here the rows are
walked in chunks of ``chunk_size`` positions, only one chunk is cast to fp32 at a time, and
the backward is written by hand: it keeps only the per-row log-normaliser and entropy, and
recomputes each chunk's softmax once to write the logits' gradient directly
(``d lp / d s = onehot - p``, ``d H / d s = -p (log p + H)``, ``s = logits / T``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

# The proxy log-prob of a filtered token (true value: log 0). It is below every finite
# log-prob, so the Lp-Reg filter ``lp < proxy`` never selects the token, and ``proxy - lp``
# stays finite, so no loss or gradient becomes inf/NaN even in a branch that is not taken.
FILTERED_LOG_PROB = torch.finfo(torch.float32).min


def validate_logits(logits: torch.Tensor, tokens: torch.Tensor | None, temperature: float) -> None:
    if logits.dim() < 2:
        raise ValueError(f"logits must be [..., vocab], got {tuple(logits.shape)}")
    if tokens is not None and tuple(tokens.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"tokens {tuple(tokens.shape)} must match logits without the vocab dim "
            f"{tuple(logits.shape[:-1])}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _chunks(rows: int, chunk_size: int | None) -> list[slice]:
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    step = rows if chunk_size is None else chunk_size
    return [slice(i, i + step) for i in range(0, rows, max(step, 1))]


def map_rows(
    fn: Callable[..., torch.Tensor],
    logits: torch.Tensor,
    *row_args: torch.Tensor,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Apply ``fn(logits_rows [M, V], *args_rows [M]) -> [M]`` chunk by chunk, no gradient.

    Returns a tensor shaped ``logits.shape[:-1]`` (used by the detached Lp-Reg proxy).
    """
    flat = logits.detach().reshape(-1, logits.shape[-1])
    flat_args = [a.reshape(-1) for a in row_args]
    with torch.no_grad():
        outs = [fn(flat[s], *(a[s] for a in flat_args)) for s in _chunks(flat.shape[0], chunk_size)]
    return torch.cat(outs).reshape(logits.shape[:-1])


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


def _forward_rows(
    rows: torch.Tensor,
    toks: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    log_kappa: float | None,
) -> list[torch.Tensor]:
    """[lp, lse, (entropy), (proxy, log_z)] for one chunk, each ``[M]`` fp32.

    One ``exp`` over the chunk serves the normaliser, the entropy and the proxy's ``Z``.
    """
    x = rows.float()
    s = x / temperature if temperature != 1.0 else x
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    sum_e = e.sum(-1)
    lse = m.squeeze(-1) + torch.log(sum_e)
    idx = toks.long().unsqueeze(-1)
    lp = s.gather(-1, idx).squeeze(-1) - lse
    out = [lp, lse]
    if with_entropy:
        # H = lse - E_p[s] = lse - sum(e * s) / sum(e)
        out.append(lse - torch.linalg.vecdot(e, s) / sum_e)
    if log_kappa is not None:
        # p_v >= kappa * max p  <=>  logit_v - max logit >= log kappa: the filter is on the
        # untempered logits, i.e. s_v >= max s + log(kappa) / T.
        keep = s >= m + log_kappa / temperature
        log_z = torch.log(e.masked_fill_(~keep, 0.0).sum(-1)) - torch.log(sum_e)
        kept = keep.gather(-1, idx).squeeze(-1)
        out += [torch.where(kept, lp - log_z, torch.full_like(lp, FILTERED_LOG_PROB)), log_z]
    return out


class _LogitStatsFn(torch.autograd.Function):
    """Chunked log-prob / entropy / proxy with an analytic, chunked backward."""

    @staticmethod
    def forward(ctx, logits2d, tokens, temperature, chunk_size, with_entropy, log_kappa):
        parts = [
            _forward_rows(logits2d[s], tokens[s], temperature, with_entropy, log_kappa)
            for s in _chunks(logits2d.shape[0], chunk_size)
        ]
        cols = [torch.cat(c) for c in zip(*parts, strict=True)]
        lp, lse = cols[0], cols[1]
        entropy = cols[2] if with_entropy else torch.zeros_like(lp)
        ctx.save_for_backward(logits2d, tokens, lse, entropy)
        # an unused output (e.g. a detached entropy) then gets None, not a zero tensor, and
        # its part of the backward is skipped
        ctx.set_materialize_grads(False)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        extra = cols[3:] if with_entropy else cols[2:]
        ctx.mark_non_differentiable(*extra)
        return (lp, entropy, *extra)

    @staticmethod
    def backward(ctx, grad_lp, grad_entropy, *_):
        logits2d, tokens, lse, entropy = ctx.saved_tensors
        t = ctx.temperature
        grad = torch.empty_like(logits2d)
        if grad_lp is None and grad_entropy is None:
            return None, None, None, None, None, None
        g_lp = torch.zeros_like(lse) if grad_lp is None else grad_lp.float()
        use_h = ctx.with_entropy and grad_entropy is not None
        g_h = grad_entropy.float() if use_h else None
        for s in _chunks(logits2d.shape[0], ctx.chunk_size):
            x = logits2d[s].float()
            logp = (x / t if t != 1.0 else x) - lse[s].unsqueeze(-1)
            p = torch.exp(logp)
            if use_h:
                # d H / d s_j = -p_j (log p_j + H)
                coef = logp.add_(entropy[s].unsqueeze(-1)).mul_(g_h[s].unsqueeze(-1))
                coef.add_(g_lp[s].unsqueeze(-1))
                grad_s = p.mul_(coef).neg_()
            else:
                grad_s = p.mul_(-g_lp[s].unsqueeze(-1))
            # d lp / d s_j = onehot_j - p_j
            grad_s.scatter_add_(-1, tokens[s].long().unsqueeze(-1), g_lp[s].unsqueeze(-1))
            if t != 1.0:
                grad_s.div_(t)
            grad[s] = grad_s.to(grad.dtype)
        return grad, None, None, None, None, None


def logit_stats(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_entropy: bool = True,
    minp_kappa: float | None = None,
) -> LogitStats:
    """Sampled-token log-probs, entropy and the Lp-Reg proxy in one chunked pass.

    ``log_prob = log softmax(logits / T)[token]``; ``entropy = -sum_v p_v log p_v`` of the
    same tempered distribution; with ``minp_kappa``, the min-p proxy's ``log Z`` and the
    token's proxy log-prob (see :func:`divrl.algorithms.proxy_log_prob`), detached.

    Memory: besides the gradient of the logits (same dtype as the logits), only
    chunk-sized fp32 buffers and per-position scalars are allocated, forward or backward;
    the backward is analytic (no autograd graph over ``[..., vocab]`` tensors). Double
    backward is not supported.

    Args:
        logits: ``[..., vocab]`` (fp32 or bf16).
        tokens: ``[...]`` sampled token ids.
        temperature: sampling temperature.
        chunk_size: positions per chunk (``None``: all rows at once).
        with_entropy: also return the entropy.
        minp_kappa: when given (in [0, 1]), also return the proxy log-prob and ``log Z``.
    """
    validate_logits(logits, tokens, temperature)
    if minp_kappa is not None and not 0.0 <= minp_kappa <= 1.0:
        raise ValueError(f"minp_kappa must be in [0, 1] (the paper uses 0.02), got {minp_kappa}")
    log_kappa = None
    if minp_kappa is not None:
        log_kappa = math.log(minp_kappa) if minp_kappa > 0 else -math.inf
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    outs = _LogitStatsFn.apply(
        flat, tokens.reshape(-1), float(temperature), chunk_size, with_entropy, log_kappa
    )
    outs = [o.reshape(lead) for o in outs]
    stats = LogitStats(log_prob=outs[0], entropy=outs[1] if with_entropy else None)
    if log_kappa is not None:
        stats.proxy_log_prob, stats.log_normalizer = outs[2].detach(), outs[3].detach()
    return stats


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
    return logit_stats(logits, tokens, temperature, chunk_size, with_entropy=False).log_prob


def entropy_from_logits(
    logits: torch.Tensor, chunk_size: int | None = None, temperature: float = 1.0
) -> torch.Tensor:
    """Full-vocabulary entropy ``H = -sum softmax(x) log softmax(x)`` of ``x = logits / T``.

    Args:
        logits: ``[..., vocab]``.
        chunk_size: positions per chunk (``None``: all at once).

    Returns:
        ``[...]`` fp32 entropies in nats, differentiable (the entropy bonus needs it).
    """
    tokens = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    return logit_stats(logits, tokens, temperature, chunk_size).entropy
