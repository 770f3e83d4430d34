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
    scorable: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO outcome advantages, one per response.

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` over the *scorable* responses of the
    same group (prompt), with Bessel's correction in the std as in verl. A group of size 1
    gets mean 0 and std 1 (so its advantage is its reward, as in verl).

    An unscorable response (``scorable[i]`` false, or a NaN reward: a verifier timeout or a
    crashed worker, see docs/rewards.md) has no verdict: it is left out of its group's mean
    and std (and of the batch std) and gets ``A_i = 0``, as TRL does with NaN rewards. A
    group whose scorable responses number one (among several) has no baseline: ``A = 0``.

    Args:
        rewards: ``[N]`` scalar rewards (NaN marks an unscorable response).
        group_ids: ``[N]`` ids (tensor of ints, or any hashables); groups need not be
            contiguous in the batch.
        scale: ``group`` (per-group std, GRPO), ``batch`` (centre per group, divide by the
            std of all N rewards, as TRL's ``scale_rewards="batch"``), ``none`` (centre
            only: Dr.GRPO).
        eps: added to the std.
        scorable: ``[N]`` bool, false for an unscorable response (default: every response
            with a finite reward).

    Returns:
        ``[N]`` fp32 advantages, detached, 0 for the unscorable responses.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; valid: {', '.join(ADVANTAGE_SCALES)}")
    r = as_fp32(rewards.detach()).reshape(-1)
    n = r.shape[0]
    if len(group_ids) != n:
        raise ValueError(f"{n} rewards but {len(group_ids)} group ids")
    if n == 0:
        return r.clone()
    valid = torch.isfinite(r)
    if scorable is not None:
        if scorable.numel() != n:
            raise ValueError(f"{n} rewards but {scorable.numel()} scorable flags")
        valid &= scorable.reshape(-1).to(device=r.device, dtype=torch.bool)
    r = torch.where(valid, r, torch.zeros_like(r))
    w = valid.to(r.dtype)
    idx = _group_index(group_ids, r.device)
    num_groups = int(idx.max()) + 1
    size = torch.zeros(num_groups, device=r.device).index_add_(0, idx, torch.ones_like(r))
    count = torch.zeros(num_groups, device=r.device).index_add_(0, idx, w)
    total = torch.zeros(num_groups, device=r.device).index_add_(0, idx, r * w)
    mean = total / count.clamp_min(1.0)
    sq_dev = torch.zeros(num_groups, device=r.device).index_add_(0, idx, w * (r - mean[idx]) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp_min(1.0))
    singleton = size == 1
    mean = torch.where(singleton, torch.zeros_like(mean), mean)
    std = torch.where(singleton, torch.ones_like(std), std)

    centred = (r - mean[idx]) * w
    if scale == "group":
        return centred / (std[idx] + eps)
    if scale == "batch":
        kept = r[valid]
        batch_std = kept.std(unbiased=True) if kept.numel() > 1 else torch.ones((), device=r.device)
        return centred / (batch_std + eps)
    return centred
