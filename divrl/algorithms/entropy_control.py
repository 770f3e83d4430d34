"""Entropy-control baselines compared against in the Lp-Reg paper.

Entropy bonus, 80/20 (policy gradient on the highest-entropy tokens only), KL-Cov and
Clip-Cov (verl's ``kl_cov`` / ``clip_cov`` policy losses). The covariance used by the last
two is ``cov_t = (A_t - mean A) * (lp_t - mean lp)`` over the valid tokens of the batch,
detached: tokens whose log-prob moves together with their advantage drive entropy down.
"""

from __future__ import annotations

import math

import torch

from divrl.algorithms._utils import (
    as_fp32,
    broadcast_advantages,
    check_same_shape,
    clamped_ratio,
    float_mask,
    masked_mean,
    to_float,
)
from divrl.algorithms.aggregation import aggregate
from divrl.algorithms.loss_options import ClipCovOptions, HighEntropyOptions, KLCovOptions
from divrl.algorithms.policy_loss import clipped_surrogate, register_policy_loss, surrogate_metrics


def entropy_bonus(
    entropy: torch.Tensor, mask: torch.Tensor, coef: float = 0.002, agg: str = "token-mean"
) -> tuple[torch.Tensor, dict[str, float]]:
    """The entropy-bonus term ``-coef * aggregate(H)`` to add to the loss.

    Args:
        entropy: ``[batch, len]`` full-vocabulary entropies (differentiable), e.g. from
            :func:`divrl.algorithms.entropy_from_logits`.
        mask: ``[batch, len]``.
        coef: bonus weight (the Lp-Reg paper's baseline: 0.002).
    """
    mean_entropy = aggregate(entropy, mask, agg)
    loss = -coef * mean_entropy
    return loss, {"entropy/bonus_loss": to_float(loss), "entropy/mean": to_float(mean_entropy)}


def high_entropy_mask(
    entropy: torch.Tensor, mask: torch.Tensor, top_fraction: float = 0.2
) -> torch.Tensor:
    """The top ``top_fraction`` highest-entropy valid tokens of the batch (the 80/20 rule).

    ``k = max(1, ceil(top_fraction * N_valid))`` tokens are kept (ties broken by position).

    Args:
        entropy: ``[batch, len]``.
        mask: ``[batch, len]`` response mask.

    Returns:
        ``[batch, len]`` bool, True on the kept tokens (a subset of the mask).
    """
    if not 0.0 < top_fraction <= 1.0:
        raise ValueError(
            f"top_fraction must be in (0, 1] (the 80/20 rule: 0.2), got {top_fraction}"
        )
    valid = mask.to(entropy.device).bool()
    n_valid = int(valid.sum())
    keep = torch.zeros_like(valid)
    if n_valid == 0:
        return keep
    k = max(1, math.ceil(top_fraction * n_valid))
    scores = torch.where(
        valid, as_fp32(entropy.detach()), torch.full_like(entropy, -math.inf, dtype=torch.float32)
    )
    keep.view(-1)[torch.topk(scores.reshape(-1), k).indices] = True
    return keep


@register_policy_loss("high_entropy", HighEntropyOptions)
def high_entropy_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    entropy: torch.Tensor | None = None,
    top_fraction: float = HighEntropyOptions.top_fraction,
    clip_low: float = HighEntropyOptions.clip_low,
    clip_high: float = HighEntropyOptions.clip_high,
    dual_clip: float | None = HighEntropyOptions.dual_clip,
    agg: str = HighEntropyOptions.agg,
) -> tuple[torch.Tensor, dict[str, float]]:
    """80/20: the clipped surrogate on the top ``top_fraction`` highest-entropy tokens only.

    The other tokens get no policy gradient; the loss is normalised over the kept tokens.
    ``entropy`` (``[batch, len]``) is required. ``dual_clip`` as in
    :func:`divrl.algorithms.policy_loss`.
    """
    if entropy is None:
        raise ValueError("the high_entropy (80/20) loss needs the per-token entropy")
    keep = high_entropy_mask(entropy, mask, top_fraction)
    loss_mat, parts = clipped_surrogate(
        log_prob, old_log_prob, advantages, mask, clip_low, clip_high, dual_clip
    )
    loss = aggregate(loss_mat, keep, agg)
    return loss, {
        "pg/loss": to_float(loss),
        **surrogate_metrics(parts, mask),
        "entropy/kept_tokens": float(keep.sum()),
        "entropy/kept_min_entropy": to_float(entropy.detach()[keep].min()) if keep.any() else 0.0,
    }


def _covariance(adv: torch.Tensor, lp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    m = valid.float()
    a = adv.detach()
    x = lp.detach()
    return (a - masked_mean(a, m)) * (x - masked_mean(x, m))


@register_policy_loss("kl_cov", KLCovOptions)
def kl_cov_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    kl_cov_ratio: float = KLCovOptions.kl_cov_ratio,
    ppo_kl_coef: float = KLCovOptions.ppo_kl_coef,
    agg: str = KLCovOptions.agg,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov: ``-A * r`` everywhere (no ratio clipping at all), plus ``coef * |lp - old|`` on
    the top ``kl_cov_ratio`` share of valid tokens by covariance
    (``k = max(1, int(kl_cov_ratio * N_valid))``), as in verl's ``kl_cov`` loss.

    Args:
        log_prob, old_log_prob, mask: ``[batch, len]``.
        advantages: ``[batch]`` or ``[batch, len]``.
        kl_cov_ratio: share of tokens penalised (verl recipe: 0.002; 0.0002 for 32B).
        ppo_kl_coef: weight of ``|lp - old|``.
    """
    check_same_shape(log_prob=log_prob, old_log_prob=old_log_prob)
    lp, old = as_fp32(log_prob), as_fp32(old_log_prob.detach())
    adv = broadcast_advantages(advantages, lp)
    valid = float_mask(mask, lp) > 0
    log_ratio, ratio = clamped_ratio(lp - old)
    loss_mat = -adv * ratio
    penalised = torch.zeros_like(valid)
    n_valid = int(valid.sum())
    if n_valid > 0 and kl_cov_ratio > 0:
        k = max(1, int(n_valid * kl_cov_ratio))
        cov = torch.where(valid, _covariance(adv, lp, valid), torch.full_like(lp, -math.inf))
        penalised.view(-1)[torch.topk(cov.reshape(-1), k).indices] = True
        loss_mat = torch.where(penalised, loss_mat + ppo_kl_coef * log_ratio.abs(), loss_mat)
    loss = aggregate(loss_mat, valid, agg)
    return loss, {
        "pg/loss": to_float(loss),
        "pg/approx_kl": to_float(masked_mean(-log_ratio.detach(), valid)),
        "pg/abs_kl": to_float(masked_mean(log_ratio.detach().abs(), valid)),
        "kl_cov/num_penalized": float(penalised.sum()),
    }


@register_policy_loss("clip_cov", ClipCovOptions)
def clip_cov_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio: float = ClipCovOptions.clip_ratio,
    clip_cov_lb: float = ClipCovOptions.clip_cov_lb,
    clip_cov_ub: float = ClipCovOptions.clip_cov_ub,
    clip_low: float = ClipCovOptions.clip_low,
    clip_high: float = ClipCovOptions.clip_high,
    dual_clip: float | None = ClipCovOptions.dual_clip,
    agg: str = ClipCovOptions.agg,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov: the clipped surrogate, with the gradient of a few high-covariance tokens cut.

    Among valid tokens that the ratio clip did not already clip and whose covariance lies in
    ``(clip_cov_lb, clip_cov_ub)``, ``max(floor(clip_ratio * N_valid), 1)`` are drawn at
    random (``generator`` makes the draw reproducible) and their loss is multiplied by 0.
    As in verl's ``clip_cov``, the covariance here uses the live ``lp`` minus its detached
    mean. ``dual_clip`` as in :func:`divrl.algorithms.policy_loss`; dual-clipped tokens
    already have no gradient and are not eligible for the cut.
    """
    loss_mat, parts = clipped_surrogate(
        log_prob, old_log_prob, advantages, mask, clip_low, clip_high, dual_clip
    )
    lp = as_fp32(log_prob)
    adv = broadcast_advantages(advantages, lp)
    valid = float_mask(mask, lp) > 0
    cov = _covariance(adv, lp, valid)
    already_clipped = parts["clipped"] | parts["dual_clipped"]
    eligible = valid & ~already_clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    cut = torch.zeros_like(valid)
    idx = eligible.reshape(-1).nonzero().squeeze(-1)
    if idx.numel() > 0:
        num = max(int(clip_ratio * int(valid.sum())), 1)
        perm = torch.randperm(idx.numel(), generator=generator, device="cpu").to(idx.device)
        cut.view(-1)[idx[perm[:num]]] = True
    loss_mat = loss_mat * (~cut).float()
    loss = aggregate(loss_mat, valid, agg)
    return loss, {
        "pg/loss": to_float(loss),
        **surrogate_metrics(parts, valid),
        "clip_cov/num_cut": float(cut.sum()),
        "clip_cov/num_eligible": float(eligible.sum()),
    }
