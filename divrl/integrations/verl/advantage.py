"""``divrl_grpo``: verl's GRPO outcome advantage with unscorable responses left out.

divrl's reward function (:mod:`divrl.integrations.verl.reward`) scores an unscorable
response (a verifier timeout, a crashed worker, a verifier error) NaN. verl's own ``grpo``
estimator would spread that NaN over the response's whole group; ``divrl_grpo``
(``algorithm.adv_estimator=divrl_grpo``) is verl's GRPO with the unscorable responses out
of their group's mean and std and advantage 0 (:func:`divrl.algorithms.group_advantages`,
which equals verl's ``compute_grpo_outcome_advantage`` when every response is scorable:
Bessel's std, a group of one with mean 0 and std 1, ``epsilon`` 1e-6, and
``algorithm.norm_adv_by_std_in_grpo=false`` for Dr.GRPO's centring only).

A step whose unscorable share exceeds ``algorithm.divrl_max_unscorable`` (default 0.1; add
it with ``+algorithm.divrl_max_unscorable=0.2``) stops the run with
:class:`~divrl.rewards.types.UnscorableShareError`; each step with unscorable responses
logs their count. Single-turn rollouts only: verl hands a registered estimator every row,
not the final turn of each multi-turn session.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from divrl.algorithms import group_advantages
from divrl.rewards.types import UnscorableShareError, unscorable_share_message

__all__ = ["DEFAULT_MAX_UNSCORABLE", "DIVRL_GRPO", "MAX_UNSCORABLE_KEY", "divrl_grpo_advantage"]

logger = logging.getLogger(__name__)

DIVRL_GRPO = "divrl_grpo"
#: the key of verl's ``algorithm`` config section the estimator reads its limit from
MAX_UNSCORABLE_KEY = "divrl_max_unscorable"
DEFAULT_MAX_UNSCORABLE = 0.1


def _setting(config: Any, key: str, default: Any) -> Any:
    getter = getattr(config, "get", None)
    value = getter(key, default) if getter is not None else None
    return default if value is None else value


def max_unscorable(config: Any) -> float:
    """``algorithm.divrl_max_unscorable`` (default 0.1), checked to be a share."""
    value = _setting(config, MAX_UNSCORABLE_KEY, DEFAULT_MAX_UNSCORABLE)
    try:
        share = float(value)
    except (TypeError, ValueError):
        share = float("nan")
    if not 0.0 <= share <= 1.0:
        raise ValueError(
            f"algorithm.{MAX_UNSCORABLE_KEY}={value!r} must be a share from 0 to 1 (e.g. 0.1: "
            "stop when more than a tenth of a step's responses are unscorable)"
        )
    return share


@register_adv_est(DIVRL_GRPO)
def divrl_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both ``[B, T]``: ``A_i`` of :func:`group_advantages` on the
    outcome scores ``r_i = sum_t token_level_rewards[i, t]`` grouped by ``index`` (verl's
    uid), broadcast over the response's tokens; 0 where ``r_i`` is NaN (unscorable)."""
    scores = token_level_rewards.sum(dim=-1)
    n_unscorable, n = int((~torch.isfinite(scores)).sum()), scores.numel()
    limit = max_unscorable(config)
    if n_unscorable:
        logger.warning("divrl_grpo: %d of %d responses were unscorable", n_unscorable, n)
    if n and n_unscorable > limit * n:
        raise UnscorableShareError(
            unscorable_share_message(
                "this step", n_unscorable, n, limit, f"algorithm.{MAX_UNSCORABLE_KEY}"
            )
        )
    norm = bool(_setting(config, "norm_adv_by_std_in_grpo", True))
    adv = group_advantages(scores, list(index), scale="group" if norm else "none", eps=epsilon)
    adv = adv.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask
    return adv, adv
