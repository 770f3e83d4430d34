"""Small tensor helpers shared by the algorithm modules (not part of the public API)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

# exp() of a log-ratio is clamped to this range everywhere, as in verl, so that a stale or
# extreme log-prob can never overflow to inf.
LOG_RATIO_CLAMP = 20.0

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


def safe_exp_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


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
