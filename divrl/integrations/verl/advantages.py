"""divrl's advantage estimators in verl's own registry (``register_adv_est``).

Each estimator of :data:`divrl.algorithms.ADVANTAGE_ESTIMATORS` is registered as
``divrl_<name>`` (verl keeps its own ``grpo``, ``rloo``, ``gpg``, ``grpo_passk``), chosen
with ``algorithm.adv_estimator=divrl_<name>``. verl calls an estimator with
``(token_level_rewards [bs, T], response_mask [bs, T], index [bs], epsilon, config, ...)``
and takes ``(advantages, returns)``, both ``[bs, T]``: the outcome reward of a response is
its token rewards' sum, its advantage is broadcast over its response tokens.

Options: the estimator's own, read from ``algorithm.divrl_advantage_options`` of verl's
algorithm config when present (a mapping by the option names of ``divrl train``'s
``algorithm.advantage_options``); where the estimator takes ``eps``, verl's ``epsilon``.
``algorithm.norm_adv_by_std_in_grpo=false`` is honoured by the estimators that declare a
std scale (``AdvantageOptions.SCALE`` ``group`` or ``batch``, e.g. ``divrl_grpo``): they
run as the registered estimator whose scale is ``none`` (Dr. GRPO's centring only), as
verl's ``grpo`` does. Importing this module registers them (once).

Unscorable responses: divrl's reward function (:mod:`divrl.integrations.verl.reward`)
scores a response without a verdict (a verifier timeout, a crashed worker, a verifier
error) NaN. verl's own estimators would spread that NaN over the response's group; every
``divrl_*`` estimator leaves it out of its group's statistics with advantage 0
(:func:`divrl.algorithms.compute_advantages`; equal to verl's ``grpo`` when every response
is scorable), logs the count, and stops the run with
:class:`~divrl.rewards.types.UnscorableShareError` when a step's unscorable share exceeds
``algorithm.divrl_max_unscorable`` (default 0.1; ``+algorithm.divrl_max_unscorable=0.2``).
Single-turn rollouts only: verl hands a registered estimator every row, not the final turn
of each multi-turn session.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

from divrl.algorithms import ADVANTAGE_ESTIMATORS, advantage_options, compute_advantages
from divrl.algorithms.advantages import ADVANTAGE_OPTIONS
from divrl.rewards.types import UnscorableShareError, unscorable_share_message

__all__ = [
    "DEFAULT_MAX_UNSCORABLE",
    "MAX_UNSCORABLE_KEY",
    "OPTIONS_KEY",
    "PREFIX",
    "check_unscorable",
    "max_unscorable",
    "register_divrl_advantages",
    "verl_estimator",
]

logger = logging.getLogger(__name__)

PREFIX = "divrl_"
#: the key of verl's algorithm config holding the estimator's options
OPTIONS_KEY = "divrl_advantage_options"
#: the key of verl's ``algorithm`` config section holding the unscorable share's limit
MAX_UNSCORABLE_KEY = "divrl_max_unscorable"
DEFAULT_MAX_UNSCORABLE = 0.1


def _setting(config: Any, key: str, default: Any) -> Any:
    getter = getattr(config, "get", None)
    value = getter(key, default) if getter is not None else getattr(config, key, default)
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


def check_unscorable(scores: torch.Tensor, config: Any, who: str) -> None:
    """Log a step's unscorable responses (NaN scores); stop past the configured share."""
    n_unscorable, n = int((~torch.isfinite(scores)).sum()), scores.numel()
    limit = max_unscorable(config)
    if n_unscorable:
        logger.warning("%s: %d of %d responses were unscorable", who, n_unscorable, n)
    if n and n_unscorable > limit * n:
        raise UnscorableShareError(
            unscorable_share_message(
                "this step", n_unscorable, n, limit, f"algorithm.{MAX_UNSCORABLE_KEY}"
            )
        )


def _run_as(name: str, config: Any) -> str:
    """``name``, or the unscaled estimator when verl's ``norm_adv_by_std_in_grpo`` is off
    and ``name`` declares a std scale."""
    if ADVANTAGE_OPTIONS[name].SCALE not in ("group", "batch"):
        return name
    if bool(_setting(config, "norm_adv_by_std_in_grpo", True)):
        return name
    return next(n for n in sorted(ADVANTAGE_OPTIONS) if ADVANTAGE_OPTIONS[n].SCALE == "none")


def _options_from(config: Any, name: str, epsilon: float) -> dict[str, Any]:
    raw: Mapping[str, Any] | None = None
    if config is not None:
        getter = getattr(config, "get", None)
        raw = getter(OPTIONS_KEY, None) if getter else getattr(config, OPTIONS_KEY, None)
    options = dict(raw or {})
    if "eps" in advantage_options(name).names() and "eps" not in options:
        options["eps"] = float(epsilon)
    return options


def verl_estimator(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """divrl's estimator ``name`` with verl's calling convention."""

    def estimate(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: Any,
        epsilon: float = 1e-6,
        config: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scores = token_level_rewards.sum(dim=-1)
        check_unscorable(scores, config, f"{PREFIX}{name}")
        groups = index.tolist() if hasattr(index, "tolist") else list(index)
        run = _run_as(name, config)
        options = advantage_options(run, **_options_from(config, run, epsilon))
        with torch.no_grad():
            adv, _ = compute_advantages(run, scores, groups, options)
        adv = adv.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask
        return adv, adv

    estimate.__name__ = estimate.__qualname__ = f"{PREFIX}{name}"
    estimate.__doc__ = ADVANTAGE_ESTIMATORS[name].__doc__
    return estimate


def register_divrl_advantages() -> tuple[str, ...]:
    """Register every divrl estimator not yet in verl's registry; the names registered."""
    done = []
    for name in sorted(ADVANTAGE_ESTIMATORS):
        key = f"{PREFIX}{name}"
        if key not in ADV_ESTIMATOR_REGISTRY:
            register_adv_est(key)(verl_estimator(name))
            done.append(key)
    return tuple(done)


REGISTERED = register_divrl_advantages()
