"""Checkpoints of a run trained with ``train.strategy=fsdp``: the sharded counterpart of
:mod:`divrl.training.checkpointing`, called from the same checkpoint stage of the trainer.

A sharded checkpoint ``checkpoints/step_NNNNNN`` holds::

    state/                 torch.distributed.checkpoint: model + AdamW shards (every rank)
    model/                 config, generation config, tokenizer: no weights until
                           ``divrl export`` / ``divrl eval`` writes them
    scheduler.pt           the learning-rate schedule (rank 0)
    trainer_state.json     step, sampler cursors, world size (rank 0)
    rng_state_<rank>.pth   each rank's python / numpy / torch (/ CUDA) RNG states

It is written under ``.tmp_step_NNNNNN`` and renamed when complete
(:func:`~divrl.training.fsdp_checkpoint.save_sharded_checkpoint`), so a run killed while
saving resumes from the previous one, and one that fails to load is skipped for the
previous one (:mod:`divrl.training.checkpointing`). DCP stores global tensors, so a run saved on N
processes resumes on M (a rank without its own RNG file takes rank 0's).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from divrl.runs import Checkpoint, RunDir
from divrl.training.fsdp_checkpoint import load_sharded_checkpoint, save_sharded_checkpoint

__all__ = ["load_sharded_run_checkpoint", "save_sharded_run_checkpoint"]


def _rng_path(root: Path, rank: int) -> Path:
    return root / f"rng_state_{rank}.pth"


def _rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_sharded_run_checkpoint(
    run: RunDir,
    step: int,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    tokenizer: Any,
    trainer_state: dict[str, Any],
) -> Path:
    """Write the sharded checkpoint of ``step`` (a collective: every process calls it).

    Pruning old checkpoints is the caller's (rank 0, after this returns).
    """

    def extra(tmp: Path) -> None:
        torch.save(_rng_state(), _rng_path(tmp, rank))
        if rank == 0:
            staged = Checkpoint(tmp, step)  # the layout of divrl.runs, under the temp name
            torch.save(scheduler.state_dict(), staged.scheduler_path)
            staged.trainer_state_path.write_text(json.dumps(trainer_state, indent=2))

    return save_sharded_checkpoint(
        run.checkpoint(step).path, model, optimizer, tokenizer=tokenizer, extra=extra
    )


def load_sharded_run_checkpoint(
    ckpt: Checkpoint,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
) -> dict[str, Any]:
    """Restore model, optimiser, scheduler and this rank's RNG states from ``ckpt``;
    returns its trainer state (step, sampler cursors) for the caller to apply.

    ``model`` may be sharded over any number of processes or be a plain model on one
    (DCP reshards). A collective when distributed.
    """
    load_sharded_checkpoint(ckpt.path, model, optimizer)
    scheduler.load_state_dict(torch.load(ckpt.scheduler_path, weights_only=True))
    rng = _rng_path(ckpt.path, rank)
    if not rng.is_file():  # resumed on more processes than saved
        rng = _rng_path(ckpt.path, 0)
    _set_rng_state(torch.load(rng, weights_only=False))
    return json.loads(ckpt.trainer_state_path.read_text())
