"""Rollout importance-sampling correction: the sampler's log-probs against the trainer's.

An engine that samples with its own kernels (vLLM: bf16 kernels, other batching) gives
log-probs ``log mu`` that differ from the trainer's ``log pi_old`` of the same tokens, so
the samples are slightly off-policy. The correction reweighs each token's policy loss by
the importance ratio ``rho = pi_old / mu``, truncated (TIS) and/or masked past a bound
(IcePop), as verl's ``rollout_is`` / ``rollout_is_threshold`` and TRL's
``vllm_importance_sampling_correction`` do; the losses take the result as
``token_weights``.
"""

from __future__ import annotations

import torch

from divrl.algorithms._utils import as_fp32, check_same_shape, clamp_log_ratio, float_mask

#: the levels of :func:`rollout_is_weights` (verl's ``rollout_is`` values); None = off
ROLLOUT_IS_LEVELS = ("token", "sequence")


def rollout_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    mask: torch.Tensor,
    level: str | None = "token",
    threshold: float = 2.0,
    rs_threshold: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights of the sampled tokens, and masking past a ratio bound.

    With ``d_t = clamp(old_t - rollout_t, -20, 20)`` on the response tokens (0 elsewhere):

    - ``level="token"``: ``w_t = min(exp(d_t), threshold)`` (TIS; TRL's ``token_truncate``);
    - ``level="sequence"``: ``w_t = min(exp(clamp(sum_t d_t)), threshold)``, one weight for
      every token of the sequence (TRL's ``sequence_truncate``, verl's ``sequence``);
    - ``level=None``: ``w_t = 1`` (masking only);
    - ``rs_threshold = b`` (> 1): tokens whose own ratio ``exp(d_t)`` lies outside
      ``[1/b, b]`` get ``w_t = 0`` (IcePop; verl's token-level rejection with a single
      bound, TRL's ``token_mask``); the loss's denominators keep them.

    Args:
        old_log_prob: ``[batch, len]`` the trainer's log pi_old of the sampled tokens.
        rollout_log_prob: ``[batch, len]`` the engine's log-probs of the same tokens.
        mask: ``[batch, len]`` response mask.
        level: ``"token"``, ``"sequence"`` or None.
        threshold: the truncation cap C (>= 1).
        rs_threshold: the masking bound b (> 1), or None (no masking).

    Returns:
        ``(weights, metrics)``: ``[batch, len]`` fp32 detached weights (0 off the mask) and
        ``rollout/is_weight_mean`` (mean weight of the response tokens),
        ``rollout/is_clipped_frac`` (share of tokens whose weight the cap lowered),
        ``rollout/rs_masked_frac`` (share masked), ``rollout/is_ratio_max`` (largest
        uncapped ratio).
    """
    check_same_shape(old_log_prob=old_log_prob, rollout_log_prob=rollout_log_prob)
    if level is not None and level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout IS level {level!r}: use one of {ROLLOUT_IS_LEVELS} or None")
    if threshold < 1.0:
        raise ValueError(f"rollout IS threshold={threshold} must be >= 1")
    if rs_threshold is not None and rs_threshold <= 1.0:
        raise ValueError(f"rollout rejection bound={rs_threshold} must be > 1")
    old = as_fp32(old_log_prob.detach())
    m = float_mask(mask, old)
    diff = clamp_log_ratio(torch.nan_to_num(old - as_fp32(rollout_log_prob.detach())) * m)
    if level == "sequence":
        raw = torch.exp(clamp_log_ratio(diff.sum(-1, keepdim=True))).expand_as(diff)
    else:
        raw = torch.exp(diff)
    weights = raw.clamp(max=threshold) if level is not None else torch.ones_like(raw)
    clipped = (raw > threshold) if level is not None else torch.zeros_like(raw, dtype=torch.bool)
    masked = torch.zeros_like(raw, dtype=torch.bool)
    if rs_threshold is not None:
        token_ratio = torch.exp(diff)
        masked = (token_ratio > rs_threshold) | (token_ratio < 1.0 / rs_threshold)
        weights = weights.masked_fill(masked, 0.0)
    weights = weights * m
    tokens = m.sum().clamp_min(1.0)
    metrics = {
        "rollout/is_weight_mean": float(weights.sum() / tokens),
        "rollout/is_clipped_frac": float((clipped.float() * m).sum() / tokens),
        "rollout/rs_masked_frac": float((masked.float() * m).sum() / tokens),
        "rollout/is_ratio_max": float((raw * m).max()) if m.numel() else 0.0,
    }
    return weights, metrics
