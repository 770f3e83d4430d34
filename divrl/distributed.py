"""Reductions across the processes of a data-parallel run (no-ops on one process), and
the end of its process group.

At the package root, importing nothing from divrl: the trainer, presampling and the TRL
adapter (a layer above training, which it must not import) share it."""

from __future__ import annotations

import gc
import logging
from typing import Any

import torch

__all__ = [
    "Collective",
    "live_ddp_wrappers",
    "release_process_group",
    "warn_if_ddp_wrappers_live",
]

logger = logging.getLogger(__name__)

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


def release_process_group() -> None:
    """Destroy the default process group at the end of a run, after its DDP wrappers.

    Call it once the caller has dropped its references to the prepared (DDP-wrapped)
    model. Why the order matters: a DDP wrapper's C++ ``Reducer`` holds the group, and when
    the Reducer is the group's last holder it destroys the group with the GIL held, joining
    gloo's worker threads, while one of them may be waiting for the GIL to free a finished
    collective's tensors: the rank then never exits (3 of 11 CPU runs of the 2-process TRL
    test hung so; pytorch/pytorch#56297). With the wrappers gone first,
    ``destroy_process_group`` drops the last reference, and it releases the GIL.
    A wrapper still alive here is named in a warning: it keeps the hazard.
    """
    if not torch.distributed.is_initialized():
        return
    warn_if_ddp_wrappers_live()
    torch.distributed.destroy_process_group()


def warn_if_ddp_wrappers_live() -> bool:
    """Collect garbage, then warn (and return True) when a DDP wrapper is still alive."""
    gc.collect()  # wrappers in reference cycles (module <-> hooks) go now, group alive
    alive = live_ddp_wrappers()
    if alive:
        logger.warning(
            "%d DistributedDataParallel wrapper(s) outlive the process group; the process "
            "may hang at exit (drop every reference to the prepared model first)",
            len(alive),
        )
    return bool(alive)


def live_ddp_wrappers() -> list[torch.nn.Module]:
    """The ``DistributedDataParallel`` modules still alive in this process."""
    ddp = torch.nn.parallel.DistributedDataParallel
    return [o for o in gc.get_objects() if isinstance(o, ddp)]
