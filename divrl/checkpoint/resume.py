"""``--resume``: the newest checkpoint that loads, whichever strategy wrote it.

A checkpoint that fails to load (a truncated ``optimizer.bin``, a damaged DCP shard or
``.metadata`` of a sharded one) is skipped with a warning and the previous one is loaded;
the caller moves the failed ones aside (:func:`set_corrupt_aside`) once it holds the run's
lock. Every process reads the same files, and DCP raises on every rank when one fails
(``CheckpointException``), so all processes fall back to the same checkpoint.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
from collections.abc import Sequence
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException

from divrl.checkpoint.strategies import CheckpointStrategy
from divrl.runs import Checkpoint, RunDir

__all__ = ["load_latest", "newest_that_loads", "set_corrupt_aside"]

logger = logging.getLogger(__name__)

# what reading a damaged checkpoint raises (torch.load / safetensors / json / pickle)
LOAD_ERRORS = (
    OSError,
    EOFError,
    RuntimeError,
    ValueError,
    KeyError,
    pickle.UnpicklingError,
    CheckpointException,
)


def load_latest(
    run: RunDir, strategies: Sequence[CheckpointStrategy], *, refuse_others: bool = False
) -> tuple[Checkpoint, dict[str, Any], list[Checkpoint]]:
    """Restore the newest checkpoint of ``run`` that loads with the strategy whose format
    the newest checkpoint has (``strategies``, first match wins). Returns it, its trainer
    state and the newer checkpoints that failed to load.

    ``refuse_others``: only the first strategy may load (a run sharded over several
    processes cannot read a DDP checkpoint: accelerate's ``load_state`` would skip the
    unprepared FSDP model silently).
    """
    ckpts = run.checkpoints()
    if not ckpts:
        raise FileNotFoundError(f"--resume: no checkpoint in {run.checkpoints_dir}")
    latest = ckpts[-1].path
    strategy = next((s for s in strategies if s.reads(latest)), None)
    if strategy is None or (refuse_others and strategy is not strategies[0]):
        wrote = strategy.train_strategy if strategy is not None else "another divrl version"
        raise ValueError(
            f"--resume: {latest} was written under train.strategy={wrote}; resume it with "
            f"train.strategy={wrote} (this run cannot read its state)"
        )
    own = [c for c in ckpts if strategy.reads(c.path)]
    return newest_that_loads(run, own, strategy.load, strategy.label)


def newest_that_loads(
    run: RunDir, ckpts: list[Checkpoint], load: Any, what: str
) -> tuple[Checkpoint, dict[str, Any], list[Checkpoint]]:
    """``(checkpoint, load(checkpoint), newer ones that failed)`` for the newest of
    ``ckpts`` that loads; each failure is a warning, all failing a RuntimeError."""
    corrupt: list[Checkpoint] = []
    for ckpt in reversed(ckpts):
        try:
            state = load(ckpt)
        except LOAD_ERRORS as exc:
            logger.warning(
                "checkpoint %s does not load (%s: %s); falling back to the previous one",
                ckpt.path,
                type(exc).__name__,
                str(exc)[:200],
            )
            corrupt.append(ckpt)
            continue
        return ckpt, state, corrupt
    raise RuntimeError(
        f"--resume: none of the {len(ckpts)} {what} in {run.checkpoints_dir} loads "
        "(see the warnings above); start again with --overwrite"
    )


def set_corrupt_aside(run: RunDir, corrupt: list[Checkpoint]) -> None:
    """Rename checkpoints that failed to load to ``corrupt_step_N`` (kept for inspection,
    no longer listed, so they are neither loaded nor counted by pruning)."""
    for ckpt in corrupt:
        target = run.corrupt_checkpoint_path(ckpt.step)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(ckpt.path, target)
        logger.warning("moved the unloadable checkpoint %s to %s", ckpt.path, target)
