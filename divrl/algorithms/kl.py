"""Estimators of KL(pi_theta || pi_ref) on the policy's own samples (the GRPO KL term)."""

from __future__ import annotations

import torch

from divrl.algorithms._utils import Registry, as_fp32, check_same_shape, k3

KL_ESTIMATORS = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


@KL_ESTIMATORS.register("k2")
def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


@KL_ESTIMATORS.register("k3")
def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    # k3 = exp(ref - lp) - (ref - lp) - 1.
    return k3(-log_ratio)


def kl_estimate(
    log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: str = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) on tokens sampled from pi_theta.

    With ``lp = log pi_theta``, ``ref = log pi_ref``:
    - ``k1``: ``lp - ref`` (unbiased, high variance, can be negative);
    - ``k2``: ``0.5 * (lp - ref)^2``;
    - ``k3`` (verl's ``low_var_kl``): ``exp(ref - lp) - (ref - lp) - 1`` with the log-ratio
      clamped to [-20, 20] and the value clamped to [-10, 10]; unbiased and >= 0.

    Args:
        log_prob: ``[batch, len]`` current policy log-probs (carries the gradient).
        ref_log_prob: ``[batch, len]`` reference-model log-probs of the same tokens.
        estimator: ``k1``, ``k2`` or ``k3``.

    Returns:
        ``[batch, len]`` fp32 per-token values; aggregate them with the response mask.
    """
    fn = KL_ESTIMATORS.get_or_raise(estimator)
    check_same_shape(log_prob=log_prob, ref_log_prob=ref_log_prob)
    return fn(as_fp32(log_prob) - as_fp32(ref_log_prob.detach()))
