"""Group-relative advantages (GRPO and its scale variants)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from divrl.algorithms._utils import as_fp32

ADVANTAGE_SCALES = ("group", "batch", "none")


def _group_index(
    group_ids: torch.Tensor | Sequence[Hashable], device: torch.device
) -> torch.Tensor:
    """Map arbitrary group ids to contiguous integers ``0..G-1``, shape ``[N]``."""
    if isinstance(group_ids, torch.Tensor):
        return torch.unique(group_ids.reshape(-1), return_inverse=True)[1].to(device)
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(g, len(index)) for g in group_ids], device=device)


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Sequence[Hashable],
    scale: str = "group",
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO outcome advantages, one per response.

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` over the responses of the same group
    (prompt), with Bessel's correction in the std as in verl. A group of size 1 gets mean 0
    and std 1 (so its advantage is its reward, as in verl).

    Args:
        rewards: ``[N]`` scalar rewards.
        group_ids: ``[N]`` ids (tensor of ints, or any hashables); groups need not be
            contiguous in the batch.
        scale: ``group`` (per-group std, GRPO), ``batch`` (centre per group, divide by the
            std of all N rewards, as TRL's ``scale_rewards="batch"``), ``none`` (centre
            only: Dr.GRPO).
        eps: added to the std.

    Returns:
        ``[N]`` fp32 advantages, detached.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; valid: {', '.join(ADVANTAGE_SCALES)}")
    r = as_fp32(rewards.detach()).reshape(-1)
    n = r.shape[0]
    if len(group_ids) != n:
        raise ValueError(f"{n} rewards but {len(group_ids)} group ids")
    if n == 0:
        return r.clone()
    idx = _group_index(group_ids, r.device)
    num_groups = int(idx.max()) + 1
    count = torch.zeros(num_groups, device=r.device).index_add_(0, idx, torch.ones_like(r))
    total = torch.zeros(num_groups, device=r.device).index_add_(0, idx, r)
    mean = total / count
    sq_dev = torch.zeros(num_groups, device=r.device).index_add_(0, idx, (r - mean[idx]) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp_min(1.0))
    singleton = count == 1
    mean = torch.where(singleton, torch.zeros_like(mean), mean)
    std = torch.where(singleton, torch.ones_like(std), std)

    centred = r - mean[idx]
    if scale == "group":
        return centred / (std[idx] + eps)
    if scale == "batch":
        batch_std = r.std(unbiased=True) if n > 1 else torch.ones((), device=r.device)
        return centred / (batch_std + eps)
    return centred
