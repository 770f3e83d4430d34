"""Loss aggregation over the tokens of a batch (the four modes of verl's ``agg_loss``, and
``micro-batch-token-mean``: verl's token-mean as its actor applies it, per micro-batch).

Every mode reduces the batch it is given. The trainer calls it per micro-batch and weighs
the micro-batches (divrl.training.update): by their share of the stream's tokens for
``token-mean`` (so the update is the token-mean of the whole mini-batch), by their share of
its sequences for ``micro-batch-token-mean`` (the verl actor's ``loss * len(micro-batch) /
mini-batch size`` under dynamic batch sizes, ``loss / accumulation count`` with fixed
micro-batches: a token in a short micro-batch weighs more), and equally otherwise.
"""

from __future__ import annotations

import torch

from divrl.algorithms._utils import Registry, as_fp32, float_mask

AGGREGATIONS = Registry("aggregation mode")


@AGGREGATIONS.register("token-mean")
def _token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, horizon: int | None) -> torch.Tensor:
    # Every valid token of the batch weighs the same (both papers' code default).
    return (loss_mat * mask).sum() / mask.sum().clamp_min(1.0)


@AGGREGATIONS.register("micro-batch-token-mean")
def _micro_batch_token_mean(
    loss_mat: torch.Tensor, mask: torch.Tensor, horizon: int | None
) -> torch.Tensor:
    # Within one micro-batch it is the token-mean; the difference is the trainer's weight.
    return _token_mean(loss_mat, mask, horizon)


@AGGREGATIONS.register("seq-mean-token-mean")
def _seq_mean_token_mean(
    loss_mat: torch.Tensor, mask: torch.Tensor, horizon: int | None
) -> torch.Tensor:
    tokens = mask.sum(-1)
    seq = (loss_mat * mask).sum(-1) / tokens.clamp_min(1.0)
    # Sequences without a valid token have no loss to average; leaving them out keeps the
    # mean well defined (verl would produce NaN there).
    nonempty = (tokens > 0).float()
    return (seq * nonempty).sum() / nonempty.sum().clamp_min(1.0)


@AGGREGATIONS.register("seq-mean-token-sum")
def _seq_mean_token_sum(
    loss_mat: torch.Tensor, mask: torch.Tensor, horizon: int | None
) -> torch.Tensor:
    return (loss_mat * mask).sum(-1).mean()


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(
    loss_mat: torch.Tensor, mask: torch.Tensor, horizon: int | None
) -> torch.Tensor:
    # Dr.GRPO: a constant normaliser, so longer responses are not down-weighted per token.
    horizon = loss_mat.shape[-1] if horizon is None else horizon
    if horizon <= 0:
        raise ValueError(f"horizon must be positive, got {horizon}")
    return (loss_mat * mask).sum() / (loss_mat.shape[0] * horizon)


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    horizon: int | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    Args:
        loss_mat: ``[batch, response_len]`` per-token loss (any float dtype).
        mask: ``[batch, response_len]``, 1 on response tokens, 0 on padding.
        mode: one of
            - ``token-mean``: ``sum(L*mask) / sum(mask)``;
            - ``micro-batch-token-mean``: the same on the batch given (the trainer weighs
              micro-batches by sequence share: module docstring);
            - ``seq-mean-token-mean``: mean over sequences of ``sum_t L*mask / sum_t mask``
              (sequences with no valid token are left out);
            - ``seq-mean-token-sum``: mean over sequences of ``sum_t L*mask``;
            - ``seq-mean-token-sum-norm``: ``sum(L*mask) / (batch * horizon)`` (Dr.GRPO).
        horizon: the normaliser of ``seq-mean-token-sum-norm``; defaults to the padded
            length ``response_len``.

    Returns:
        A scalar fp32 tensor. An all-zero mask gives 0, never NaN.
    """
    fn = AGGREGATIONS.get_or_raise(mode)
    loss = as_fp32(loss_mat)
    if loss.dim() != 2:
        raise ValueError(f"loss_mat must be [batch, response_len], got {tuple(loss.shape)}")
    return fn(loss, float_mask(mask, loss), horizon)
