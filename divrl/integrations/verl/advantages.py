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
Importing this module registers them (once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

from divrl.algorithms import ADVANTAGE_ESTIMATORS, advantage_options, compute_advantages

__all__ = ["OPTIONS_KEY", "PREFIX", "register_divrl_advantages", "verl_estimator"]

PREFIX = "divrl_"
#: the key of verl's algorithm config holding the estimator's options
OPTIONS_KEY = "divrl_advantage_options"


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
        groups = index.tolist() if hasattr(index, "tolist") else list(index)
        options = advantage_options(name, **_options_from(config, name, epsilon))
        with torch.no_grad():
            adv, _ = compute_advantages(name, scores, groups, options)
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
