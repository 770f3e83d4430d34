"""How a training checkpoint is written and read: one interface, two formats.

Both write ``<run>/checkpoints/step_NNNNNN`` (layout in :mod:`divrl.runs`) under a temp
name and rename it when complete, so a run killed while saving keeps its previous one:

- :class:`PlainCheckpoints` (``train.strategy=ddp``): accelerate's state (model,
  optimiser, every process's RNG states) in ``state/``, and a transformers model folder
  in ``model/`` for evaluation. A failed write (a full disk) removes the temp directory
  and raises an error naming the path and the free space.
- :class:`ShardedCheckpoints` (``train.strategy=fsdp``): DCP shards of model and AdamW in
  ``state/`` (:mod:`divrl.checkpoint.dcp`), ``model/`` without weights until ``divrl
  export`` / ``divrl eval`` writes them, and ``rng_state_<rank>.pth`` per process. DCP
  stores global tensors, so a run saved on N processes resumes on M (a rank without its
  own RNG file takes rank 0's).

Both add the scheduler (``scheduler.pt``) and the trainer's state (``trainer_state.json``:
step, sampler cursors, the run's id), and prune the run's own older checkpoints.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from divrl.checkpoint.dcp import DCP_DIR, is_sharded_checkpoint, load_dcp, save_dcp
from divrl.fileio import write_failed
from divrl.runs import Checkpoint, RunDir

__all__ = [
    "CheckpointStrategy",
    "PlainCheckpoints",
    "ShardedCheckpoints",
    "looks_sharded",
    "prune_checkpoints",
]


def prune_checkpoints(run: RunDir, keep_last: int, run_id: str | None) -> list[Path]:
    """Delete all but the ``keep_last`` newest checkpoints written by run ``run_id``;
    checkpoints of any other run are never touched. The pins of evaluations that are gone
    go too (each kept a pruned checkpoint's data on disk). Returns the deleted paths."""
    if run_id is None:
        return []
    old = [c.path for c in run.own_checkpoints(run_id)[:-keep_last]]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    run.sweep_stale_pins()
    return old


def looks_sharded(path: Path) -> bool:
    """A DCP checkpoint, or what is left of one whose ``.metadata`` is gone (its shards)."""
    return is_sharded_checkpoint(path) or any((path / DCP_DIR).glob("*.distcp"))


@dataclass
class CheckpointStrategy(ABC):
    """Writes and reads the checkpoints of one run; every process calls :meth:`save` and
    :meth:`load` (collectives). ``accelerator`` gives the process's rank and barriers."""

    run: RunDir
    accelerator: Any
    keep_last: int
    #: the ``train.strategy`` that writes this format, and how errors name its checkpoints
    train_strategy: ClassVar[str]
    label: ClassVar[str]

    @abstractmethod
    def write(self, step: int, trainer_state: dict[str, Any]) -> Path:
        """Write the checkpoint of ``step`` (atomically); returns its path."""

    @abstractmethod
    def load(self, ckpt: Checkpoint) -> dict[str, Any]:
        """Restore the run's state from ``ckpt``; returns its trainer state."""

    @abstractmethod
    def reads(self, path: Path) -> bool:
        """Whether ``path`` is a checkpoint of this strategy's format."""

    def save(self, step: int, trainer_state: dict[str, Any]) -> Path:
        """Write the checkpoint of ``step``, then prune the run's own old ones."""
        path = self.write(step, trainer_state)
        if self.accelerator.is_main_process:
            prune_checkpoints(self.run, self.keep_last, trainer_state.get("run_id"))
        self.accelerator.wait_for_everyone()
        return path


# torch's zip writer reports a failed write (ENOSPC included) as a RuntimeError
_TORCH_WRITE_ERRORS = ("inline_container", "PytorchStreamWriter", "file write failed")


def _is_write_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) or any(m in str(exc) for m in _TORCH_WRITE_ERRORS)


@dataclass
class PlainCheckpoints(CheckpointStrategy):
    """accelerate's state + a transformers model folder (``model``: as prepared by
    accelerate, e.g. DDP-wrapped)."""

    train_strategy: ClassVar[str] = "ddp"
    label: ClassVar[str] = "checkpoints"

    model: torch.nn.Module
    scheduler: Any
    tokenizer: Any

    def write(self, step: int, trainer_state: dict[str, Any]) -> Path:
        acc, run = self.accelerator, self.run
        final, tmp = run.checkpoint(step).path, run.temp_checkpoint_path(step)
        staged = Checkpoint(tmp, step)  # the same layout, under the temp name
        try:
            if acc.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            acc.wait_for_everyone()
            acc.save_state(str(staged.state_dir))  # model, optimiser, every process's RNG
            state_dict = acc.get_state_dict(self.model)
            if acc.is_main_process:
                torch.save(self.scheduler.state_dict(), staged.scheduler_path)
                staged.trainer_state_path.write_text(json.dumps(trainer_state, indent=2))
                # a plain transformers directory, for evaluation and as a starting point
                unwrapped = acc.unwrap_model(self.model)
                unwrapped.save_pretrained(staged.model_dir, state_dict=state_dict)
                self.tokenizer.save_pretrained(staged.model_dir)
        except (OSError, RuntimeError) as exc:
            if not _is_write_error(exc):
                raise
            error = write_failed(tmp, exc)
            shutil.rmtree(tmp, ignore_errors=True)  # give the space back
            raise error from exc
        if acc.is_main_process:
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        return final

    def load(self, ckpt: Checkpoint) -> dict[str, Any]:
        state = json.loads(ckpt.trainer_state_path.read_text())
        self.accelerator.load_state(str(ckpt.state_dir))
        self.scheduler.load_state_dict(torch.load(ckpt.scheduler_path, weights_only=True))
        return state

    def reads(self, path: Path) -> bool:
        return not looks_sharded(path)


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


@dataclass
class ShardedCheckpoints(CheckpointStrategy):
    """DCP shards (``model``: the FSDP model, or a plain one on a single process, without
    accelerate's wrapper; ``optimizer``: the AdamW itself), loadable on any number of
    processes into a sharded or a plain model."""

    train_strategy: ClassVar[str] = "fsdp"
    label: ClassVar[str] = "sharded checkpoints"

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    tokenizer: Any

    @property
    def rank(self) -> int:
        return self.accelerator.process_index

    def write(self, step: int, trainer_state: dict[str, Any]) -> Path:
        def extra(tmp: Path) -> None:
            torch.save(_rng_state(), _rng_path(tmp, self.rank))
            if self.rank == 0:
                staged = Checkpoint(tmp, step)  # the layout of divrl.runs, under the temp name
                torch.save(self.scheduler.state_dict(), staged.scheduler_path)
                staged.trainer_state_path.write_text(json.dumps(trainer_state, indent=2))

        path = self.run.checkpoint(step).path
        return save_dcp(path, self.model, self.optimizer, tokenizer=self.tokenizer, extra=extra)

    def load(self, ckpt: Checkpoint) -> dict[str, Any]:
        load_dcp(ckpt.path, self.model, self.optimizer)
        self.scheduler.load_state_dict(torch.load(ckpt.scheduler_path, weights_only=True))
        rng = _rng_path(ckpt.path, self.rank)
        if not rng.is_file():  # resumed on more processes than saved
            rng = _rng_path(ckpt.path, 0)
        _set_rng_state(torch.load(rng, weights_only=False))
        return json.loads(ckpt.trainer_state_path.read_text())

    def reads(self, path: Path) -> bool:
        return looks_sharded(path)
