"""Reductions across the processes of a data-parallel run (no-ops on one process)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Collective"]

_OPS = {"sum": "SUM", "min": "MIN", "max": "MAX"}


class Collective:
    """``world`` processes, this one being ``rank``; tensors reduced on ``device``."""

    def __init__(self, world: int, rank: int, device: torch.device) -> None:
        self.world, self.rank, self.device = world, rank, device

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Element-wise ``op`` (sum, min or max) of ``values`` over all processes (float64)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.world > 1:
            torch.distributed.all_reduce(t, op=getattr(torch.distributed.ReduceOp, _OPS[op]))
        return t.tolist()

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, by rank."""
        if self.world == 1:
            return [obj]
        gathered: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(gathered, obj)
        return gathered
