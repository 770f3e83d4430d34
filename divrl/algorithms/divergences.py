"""DPH-RL: f-divergences to the initial policy, estimated on stored reference samples.

With ``u = pi_theta / pi_ref`` evaluated per token of a response sampled from the initial
policy (``log u = lp - ref``, ``ref`` stored at presampling time), an f-divergence is
``D_f(pi_ref || pi_theta)``-style expectation ``E_{pi_ref}[f(u)]``. No reference model runs
during training: only the stored ``ref`` log-probs are needed.

Every generator takes ``log_u`` (not ``u``) so that ``u`` underflowing to 0 or overflowing
stays finite; ``log_u`` is clamped to [-20, 20] as the authors' code does for its k3 form.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from divrl.algorithms._utils import (
    Registry,
    as_fp32,
    check_same_shape,
    clamp_log_ratio,
    float_mask,
    k3,
    masked_mean,
    to_float,
)
from divrl.algorithms.aggregation import aggregate

Generator = Callable[[torch.Tensor], torch.Tensor]
#: name -> :class:`DivergenceSpec`; add one with :func:`register_divergence`
DIVERGENCES = Registry("divergence kind")

LN2 = math.log(2.0)


@dataclass(frozen=True)
class DivergenceSpec:
    """One f-divergence: its name, the factory that builds its generator ``f(log_u)`` from
    its options (and checks them: the one place they are validated), and a one-line
    description for help texts and docs."""

    name: str
    factory: Callable[..., Generator]
    summary: str

    @property
    def options(self) -> tuple[str, ...]:
        """The options the factory takes, by keyword (e.g. ``("alpha",)``)."""
        return tuple(inspect.signature(self.factory).parameters)

    def generator(self, **options: Any) -> Generator:
        """The generator, built from the options this divergence takes (others ignored:
        ``divergence_alpha`` is one setting shared by every kind)."""
        return self.factory(**{k: v for k, v in options.items() if k in self.options})


def register_divergence(name: str, summary: str) -> Callable[[Callable[..., Generator]], Any]:
    """Register a divergence: decorate a factory whose keyword arguments are the
    divergence's options (validated there, raising ValueError) and which returns
    ``f(log_u)``, convex in ``u = exp(log_u)`` with ``f(1) = 0``. The trainer's
    ``algorithm.divergence``, the TRL adapter's ``divergence`` and their help texts take
    every registered name."""

    def decorator(factory: Callable[..., Generator]) -> Callable[..., Generator]:
        DIVERGENCES.register(name)(DivergenceSpec(name, factory, summary))
        return factory

    return decorator


def check_divergence_setting(kind: str, alpha: float | None, prefix: str = "") -> None:
    """Refuse an unknown divergence or options it does not accept, in one ValueError that
    names the settings (``{prefix}divergence``, ``{prefix}divergence_alpha``): the check
    of every settings parser (divrl train, the verl plugin)."""
    if kind not in DIVERGENCES:
        raise ValueError(f"{prefix}divergence={kind!r}; valid: {', '.join(sorted(DIVERGENCES))}")
    try:  # the divergence checks its own options
        divergence_generator(kind, alpha)
    except ValueError as exc:
        raise ValueError(
            f"{prefix}divergence={kind} with {prefix}divergence_alpha={alpha}: {exc}"
        ) from exc


def divergence_summaries() -> str:
    """``"forward_kl (KL(pi_ref || pi_theta), DPH-F), js (...)"``: the registered kinds with
    their descriptions, for help texts."""
    return ", ".join(f"{name} ({spec.summary})" for name, spec in sorted(DIVERGENCES.items()))


def _clamped(log_u: torch.Tensor) -> torch.Tensor:
    return clamp_log_ratio(as_fp32(log_u))


@register_divergence("forward_kl", "KL(pi_ref || pi_theta), DPH-F")
def _forward_kl() -> Generator:
    def f(log_u: torch.Tensor) -> torch.Tensor:
        # u - 1 - log u; E_ref = KL(pi_ref || pi_theta). Gradient (u - 1) grad log pi_theta.
        # The authors' k3 form, value clamped to [-10, 10].
        return k3(as_fp32(log_u))

    return f


@register_divergence("reverse_kl", "KL(pi_theta || pi_ref)")
def _reverse_kl() -> Generator:
    def f(log_u: torch.Tensor) -> torch.Tensor:
        # u log u - u + 1; E_ref = KL(pi_theta || pi_ref).
        lu = _clamped(log_u)
        return torch.exp(lu) * lu - torch.expm1(lu)

    return f


@register_divergence("js", "2 x Jensen-Shannon, DPH-JS")
def _js() -> Generator:
    def f(log_u: torch.Tensor) -> torch.Tensor:
        # u log u - (u + 1) log((u + 1) / 2), rearranged with log(1 + u) = softplus(log u)
        # and log u - softplus(log u) = -softplus(-log u) into terms that neither cancel
        # catastrophically for large u nor produce 0 * log 0 = NaN as u -> 0 (where the
        # value tends to ln 2). E_ref = 2 * JS(pi_ref, pi_theta).
        lu = _clamped(log_u)
        u = torch.exp(lu)
        return -u * F.softplus(-lu) - F.softplus(lu) + (u + 1.0) * LN2

    return f


@register_divergence("alpha", "alpha-divergence, needs divergence_alpha in (0, 1)")
def _alpha(alpha: float | None = None) -> Generator:
    if alpha is None or not (0.0 < float(alpha) < 1.0):
        raise ValueError(
            f"the alpha divergence needs 0 < alpha < 1 (the paper uses 0.2, 0.5, 0.8); got {alpha!r}"
        )
    a = float(alpha)

    def f(log_u: torch.Tensor) -> torch.Tensor:
        # (u^(1-a) - (1-a) u - a) / (a (a - 1)) written as
        # (expm1((1-a) log u) - (1-a) expm1(log u)) / (a (a - 1)) for accuracy near u = 1.
        lu = _clamped(log_u)
        return (torch.expm1((1.0 - a) * lu) - (1.0 - a) * torch.expm1(lu)) / (a * (a - 1.0))

    return f


def divergence_generator(kind: str, alpha: float | None = None) -> Generator:
    """The per-token generator ``f(log_u)`` of an f-divergence, ``log_u = lp - ref``.

    Kinds (``u = pi_theta / pi_ref``; each is convex with ``f(1) = 0``, hence >= 0):
    - ``forward_kl``: ``u - 1 - log u`` (the authors' k3 form: ``log u`` clamped to
      [-20, 20], value clamped to [-10, 10]); ``E_ref[f] = KL(pi_ref || pi_theta)``; its
      gradient is ``(u - 1) * grad log pi_theta`` (SFT on reference samples weighted by
      ``1 - u``), exactly 0 at initialisation.
    - ``reverse_kl``: ``u log u - u + 1``; ``E_ref[f] = KL(pi_theta || pi_ref)``.
    - ``js``: ``u log u - (u + 1) log((u + 1) / 2)``; ``E_ref[f] = 2 * JS`` (the paper writes
      JS with a factor 1/2; the authors' code, like this one, lets eta absorb the 2), so it is
      bounded by ``2 ln 2``; ``f(u -> 0) = ln 2``. The authors' code computes ``u * log(u)``
      directly and returns NaN when u underflows; this one works in log space.
    - ``alpha`` (0 < alpha < 1): ``(u^(1-alpha) - (1-alpha) u - alpha) / (alpha (alpha - 1))``;
      ``E_ref[f] = (1 - sum p^alpha q^(1-alpha)) / (alpha (1 - alpha))``; alpha -> 1 gives the
      forward-KL generator, alpha -> 0 the reverse-KL one.

    ``log_u`` is clamped to [-20, 20] in every kind so the values stay finite.

    Raises:
        ValueError: unknown ``kind`` (lists the valid ones) or invalid ``alpha``.
    """
    return DIVERGENCES.get_or_raise(kind).generator(alpha=alpha)


def reference_divergence_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    mask: torch.Tensor,
    kind: str,
    alpha: float | None = None,
    agg: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """The DPH-RL divergence term on reference samples: ``aggregate(f(lp - ref), mask)``.

    The responses are the stored samples of the initial policy for near-perfect prompts, so
    ``mean_tokens f(u)`` estimates ``D_f`` per token. The trainer adds ``eta *`` this loss to
    the policy loss of the exploration rollouts (the paper's ``L_pg + eta * L_f``).

    Args:
        log_prob: ``[batch, len]`` log pi_theta of the reference responses' tokens.
        ref_log_prob: ``[batch, len]`` stored log pi_ref of the same tokens.
        mask: ``[batch, len]`` response mask.
        kind, alpha: see :func:`divergence_generator`.
        agg: aggregation mode.

    Returns:
        ``(loss, metrics)`` with ``dph/divergence`` (the aggregated value),
        ``dph/log_u_mean`` and ``dph/u_mean`` (mean ``pi_theta / pi_ref`` per token).
    """
    generator = divergence_generator(kind, alpha)
    check_same_shape(log_prob=log_prob, ref_log_prob=ref_log_prob)
    log_u = as_fp32(log_prob) - as_fp32(ref_log_prob.detach())
    values = generator(log_u)
    m = float_mask(mask, values)
    loss = aggregate(values, m, agg)
    lu = clamp_log_ratio(log_u.detach())
    return loss, {
        "dph/divergence": to_float(loss),
        "dph/log_u_mean": to_float(masked_mean(lu, m)),
        "dph/u_mean": to_float(masked_mean(torch.exp(lu), m)),
    }
