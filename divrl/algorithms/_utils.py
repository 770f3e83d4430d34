"""Small tensor helpers shared by the algorithm modules (not part of the public API)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

# exp() of a log-ratio is clamped to this range everywhere, as in verl, so that a stale or
# extreme log-prob can never overflow to inf.
LOG_RATIO_CLAMP = 20.0
# verl (``low_var_kl``), the DPH-RL authors (forward KL) and the Lp-Reg authors (the proxy
# penalty) all clamp the k3 value to this range: one constant for the three uses.
K3_VALUE_CLAMP = 10.0

F = TypeVar("F", bound=Callable)


def as_fp32(x: torch.Tensor) -> torch.Tensor:
    """Cast to fp32 (a no-op on fp32 input); gradients flow through the cast."""
    return x if x.dtype == torch.float32 else x.float()


def float_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The mask as fp32 on ``like``'s device, broadcast to ``like``'s shape."""
    return mask.to(device=like.device, dtype=torch.float32).expand_as(like)


def broadcast_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Advantages ``[batch]`` or ``[batch, len]`` as fp32 ``[batch, len]`` (detached)."""
    adv = as_fp32(advantages.detach())
    if adv.dim() == 1:
        if adv.shape[0] != like.shape[0]:
            raise ValueError(
                f"advantages has {adv.shape[0]} entries but the batch has {like.shape[0]} rows"
            )
        adv = adv.unsqueeze(-1)
    if adv.dim() != 2:
        raise ValueError(f"advantages must be [batch] or [batch, len], got {tuple(adv.shape)}")
    return adv.expand_as(like)


def check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1; 0 when the mask is empty."""
    m = float_mask(mask, x)
    return (x * m).sum() / m.sum().clamp_min(1.0)


def to_float(x: torch.Tensor | float) -> float:
    return float(x.detach().float().item()) if isinstance(x, torch.Tensor) else float(x)


def clamp_log_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """``log_ratio`` clamped to ``[-20, 20]`` (the range every ``exp`` of a log-ratio uses)."""
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def clamped_ratio(log_ratio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(clamped log-ratio, exp of it)``: the importance ratio of every policy loss.

    ``r = exp(clamp(log_ratio, -20, 20))``; the clamped log-ratio is returned too because the
    metrics (``pg/approx_kl``) and KL-Cov's ``|lp - old|`` use it.
    """
    clamped = clamp_log_ratio(log_ratio)
    return clamped, torch.exp(clamped)


def k3(d: torch.Tensor) -> torch.Tensor:
    """The k3 ("low_var_kl") value ``exp(d) - d - 1`` of a log-ratio ``d``, clamped.

    ``d`` is clamped to ``[-20, 20]`` first (this changes no value: the result saturates at 10
    from ``|d| ~ 2.6 / 11`` on, but it keeps ``exp(d)`` finite so the value clamp's zero
    gradient never meets an inf), then the value to ``[-10, 10]``. ``expm1`` keeps it accurate
    near ``d = 0``. Used by the reverse-KL estimator (``d = ref - lp``), DPH's forward KL
    (``d = lp - ref``) and Lp-Reg's penalty (``d = proxy - lp``).
    """
    d = clamp_log_ratio(d)
    return (torch.expm1(d) - d).clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)


class Registry(dict):
    """A name -> callable table with a decorator and an error that lists valid names."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[F], F]:
        def decorator(fn: F) -> F:
            if name in self:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self[name] = fn
            return fn

        return decorator

    def get_or_raise(self, name: str) -> Callable:
        if name not in self:
            valid = ", ".join(sorted(self))
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {valid}")
        return self[name]
