"""Policy-gradient losses: the PPO/GRPO/DAPO clipped surrogate and its registered variants.

Every loss in :data:`POLICY_LOSSES` takes ``(log_prob, old_log_prob, advantages, mask,
**options)`` and returns ``(loss, metrics)``, so the trainer picks one by name
(``get_policy_loss("kl_cov")``) and a new method is one decorated function plus its options
dataclass (:mod:`divrl.algorithms.loss_options`), registered together with
:func:`register_policy_loss`. :func:`policy_loss_options` builds a loss's validated options
from a name and overrides, rejecting an option the loss does not take.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from divrl.algorithms._utils import (
    Registry,
    as_fp32,
    broadcast_advantages,
    check_same_shape,
    clamp_log_ratio,
    clamped_ratio,
    float_mask,
    masked_mean,
    to_float,
)
from divrl.algorithms.aggregation import aggregate
from divrl.algorithms.loss_options import GSPOOptions, LossOptions, VanillaOptions

POLICY_LOSSES = Registry("policy loss")
# name -> the options dataclass of that loss (same keys as POLICY_LOSSES).
POLICY_LOSS_OPTIONS: dict[str, type[LossOptions]] = {}

F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class PolicyLossSpec:
    """A registered policy loss: its name, its function and its options dataclass."""

    name: str
    fn: Callable[..., tuple[torch.Tensor, dict[str, float]]]
    options: type[LossOptions]


def register_policy_loss(name: str, options: type[LossOptions]) -> Callable[[F], F]:
    """Register a policy loss under ``name`` together with its options dataclass."""
    if name != options.LOSS:
        raise ValueError(f"{options.__name__}.LOSS={options.LOSS!r} but the loss is {name!r}")

    def decorator(fn: F) -> F:
        POLICY_LOSSES.register(name)(fn)
        POLICY_LOSS_OPTIONS[name] = options
        return fn

    return decorator


def get_policy_loss(name: str):
    """The registered policy loss called ``name`` (``ValueError`` listing valid names)."""
    return POLICY_LOSSES.get_or_raise(name)


def policy_loss_spec(name: str) -> PolicyLossSpec:
    """``PolicyLossSpec(name, fn, options)`` of a registered loss (``ValueError`` if unknown)."""
    return PolicyLossSpec(name, POLICY_LOSSES.get_or_raise(name), POLICY_LOSS_OPTIONS[name])


def policy_loss_options(name: str, **overrides: Any) -> LossOptions:
    """The validated options of loss ``name``: its defaults with ``overrides`` applied.

    Raises:
        ValueError: unknown loss; an option the loss does not declare (the message names the
            loss and lists its options, and says why when the loss refuses it, e.g.
            ``dual_clip`` for ``gspo``); a value out of its bounds.
    """
    options = policy_loss_spec(name).options
    valid = ", ".join(options.names())
    for key in sorted(set(overrides) - set(options.names())):
        if key in options.REFUSED:
            raise ValueError(
                f"policy loss {name!r} does not take {key!r}: {options.REFUSED[key]}; "
                f"its options: {valid}"
            )
        raise ValueError(f"policy loss {name!r} has no option {key!r}; its options: {valid}")
    return options(**overrides)


def clipped_surrogate(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped surrogate ``[batch, len]`` plus the token masks used by metrics."""
    check_same_shape(log_prob=log_prob, old_log_prob=old_log_prob)
    lp, old = as_fp32(log_prob), as_fp32(old_log_prob.detach())
    adv = broadcast_advantages(advantages, lp)
    log_ratio, ratio = clamped_ratio(lp - old)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    parts = {
        "ratio": ratio.detach(),
        "log_ratio": log_ratio.detach(),
        "clipped": (clipped > unclipped).detach(),
        "dual_clipped": torch.zeros_like(loss, dtype=torch.bool),
    }
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (the paper uses 3), got {dual_clip}")
        bound = -adv * dual_clip
        dual = (adv < 0) & (loss > bound)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
        parts["dual_clipped"] = dual.detach()
    return loss, parts


def surrogate_metrics(parts: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    m = float_mask(mask, parts["ratio"])
    return {
        "pg/clip_frac": to_float(masked_mean(parts["clipped"].float(), m)),
        "pg/dual_clip_frac": to_float(masked_mean(parts["dual_clipped"].float(), m)),
        # verl's ppo_kl: mean of (old - new) on the sampled tokens, a k1 estimate of
        # KL(old || new).
        "pg/approx_kl": to_float(masked_mean(-parts["log_ratio"], m)),
        "pg/ratio_mean": to_float(masked_mean(parts["ratio"], m)),
        "pg/ratio_max": to_float((parts["ratio"] * m).max()) if m.numel() else 0.0,
    }


@register_policy_loss("vanilla", VanillaOptions)
def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = VanillaOptions.clip_low,
    clip_high: float = VanillaOptions.clip_high,
    dual_clip: float | None = VanillaOptions.dual_clip,
    agg: str = VanillaOptions.agg,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO / GRPO / DAPO clipped surrogate.

    ``r = exp(clamp(lp - old, -20, 20))``,
    ``L = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))``;
    with ``dual_clip = c`` (c > 1, e.g. 3), for ``A < 0``: ``L = min(L, -A * c)``.
    GRPO uses 0.2/0.2, DAPO's clip-higher 0.2/0.28.

    Args:
        log_prob: ``[batch, len]`` log pi_theta of the sampled tokens (carries the gradient).
        old_log_prob: ``[batch, len]`` log pi_old (detached).
        advantages: ``[batch]`` or ``[batch, len]``.
        mask: ``[batch, len]`` response mask.
        agg: aggregation mode (see :func:`divrl.algorithms.aggregate`).
        token_weights: optional ``[batch, len]`` or ``[batch, 1]`` detached factors on the
            per-token loss before aggregation (denominators stay the mask's), e.g. a rollout
            engine's truncated importance-sampling weights; metrics are unweighted.

    Returns:
        ``(loss, metrics)`` with ``pg/clip_frac``, ``pg/dual_clip_frac``, ``pg/approx_kl``
        (mean of ``old - lp``), ``pg/ratio_mean``, ``pg/ratio_max``.
    """
    loss_mat, parts = clipped_surrogate(
        log_prob, old_log_prob, advantages, mask, clip_low, clip_high, dual_clip
    )
    if token_weights is not None:
        loss_mat = loss_mat * as_fp32(token_weights.detach())
    loss = aggregate(loss_mat, mask, agg)
    return loss, {"pg/loss": to_float(loss), **surrogate_metrics(parts, mask)}


@register_policy_loss("gspo", GSPOOptions)
def gspo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = GSPOOptions.clip_low,
    clip_high: float = GSPOOptions.clip_high,
    agg: str = GSPOOptions.agg,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: the clipped surrogate with a sequence-level importance ratio.

    ``s_i = exp(mean_t (lp - old))`` over the response tokens of sequence i; the per-token
    ratio is ``sg(s_i) * exp(lp - sg(lp))`` (value ``s_i``, gradient of ``lp``), then
    ``L = max(-A * s, -A * clip(s, 1 - clip_low, 1 + clip_high))``. Defaults are the GSPO
    paper's clip range (3e-4 / 4e-4) and its sequence-mean aggregation.
    """
    check_same_shape(log_prob=log_prob, old_log_prob=old_log_prob)
    lp, old = as_fp32(log_prob), as_fp32(old_log_prob.detach())
    m = float_mask(mask, lp)
    adv = broadcast_advantages(advantages, lp)
    seq_log_ratio = ((lp - old) * m).sum(-1) / m.sum(-1).clamp_min(1.0)
    seq_log_ratio = clamp_log_ratio(seq_log_ratio)
    log_ratio = seq_log_ratio.detach().unsqueeze(-1) + lp - lp.detach()
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = aggregate(torch.maximum(unclipped, clipped), m, agg)
    parts = {
        "ratio": ratio.detach(),
        "log_ratio": log_ratio.detach(),
        "clipped": (clipped > unclipped).detach(),
        "dual_clipped": torch.zeros_like(ratio, dtype=torch.bool),
    }
    return loss, {"pg/loss": to_float(loss), **surrogate_metrics(parts, m)}
