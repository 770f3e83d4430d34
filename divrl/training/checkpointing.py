"""Checkpoints of a training run: save (atomically), load the latest good one, prune.

A checkpoint is ``checkpoints/step_NNNNNN`` of the run directory (layout in
:mod:`divrl.runs`): accelerate's state (model, optimiser, every process's RNG states), the
scheduler, the trainer's own state (step, sampler cursors, the run's id) and a plain
transformers model directory for evaluation. It is written to a temp directory and
renamed, so a run killed while writing keeps its previous checkpoint; a failed write (a
full disk) removes the temp directory and raises an error naming the path and the free
space. A checkpoint that fails to load (a truncated ``optimizer.bin``, a damaged DCP shard
or ``.metadata`` of a sharded one) is skipped with a warning and the previous one is loaded.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from divrl.fileio import write_failed
from divrl.runs import Checkpoint, RunDir
from divrl.training.fsdp_checkpoint import DCP_DIR, is_sharded_checkpoint
from divrl.training.sharded_checkpointing import (
    load_sharded_run_checkpoint,
    save_sharded_run_checkpoint,
)

__all__ = [
    "CheckpointStage",
    "apply_optimizer_changes",
    "is_due",
    "load_checkpoint",
    "load_latest_checkpoint",
    "prune_checkpoints",
    "save_checkpoint",
    "save_sharded_checkpoint",
    "set_corrupt_aside",
]

logger = logging.getLogger(__name__)

# what reading a damaged checkpoint raises (torch.load / safetensors / json / pickle)
_LOAD_ERRORS = (OSError, EOFError, RuntimeError, ValueError, KeyError, pickle.UnpicklingError)


def save_checkpoint(
    run: RunDir,
    step: int,
    accelerator: Any,
    model: torch.nn.Module,
    scheduler: Any,
    tokenizer: Any,
    trainer_state: dict[str, Any],
    keep_last: int,
) -> Path:
    """Write the checkpoint of ``step`` (every process calls this) and prune old ones of
    the same run (``trainer_state["run_id"]``)."""
    acc = accelerator
    final = run.checkpoint(step).path
    tmp = run.temp_checkpoint_path(step)
    staged = Checkpoint(tmp, step)  # the same layout, under the temp name
    try:
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        acc.save_state(str(staged.state_dir))  # model, optimiser, every process's RNG states
        state_dict = acc.get_state_dict(model)
        if acc.is_main_process:
            torch.save(scheduler.state_dict(), staged.scheduler_path)
            staged.trainer_state_path.write_text(json.dumps(trainer_state, indent=2))
            # a plain transformers directory, for evaluation and as a starting point
            acc.unwrap_model(model).save_pretrained(staged.model_dir, state_dict=state_dict)
            tokenizer.save_pretrained(staged.model_dir)
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
        prune_checkpoints(run, keep_last, trainer_state.get("run_id"))
    acc.wait_for_everyone()
    return final


# torch's zip writer reports a failed write (ENOSPC included) as a RuntimeError
_TORCH_WRITE_ERRORS = ("inline_container", "PytorchStreamWriter", "file write failed")


def _is_write_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) or any(m in str(exc) for m in _TORCH_WRITE_ERRORS)


def is_due(checkpoint: Any, step: int, total_steps: int) -> bool:
    """Whether ``step`` is saved: every ``checkpoint.save_every`` steps, and the last step
    of the run with ``checkpoint.save_final`` (``checkpoint``: the config's section)."""
    every = checkpoint.save_every
    return bool(every and step % every == 0) or (step == total_steps and checkpoint.save_final)


def prune_checkpoints(run: RunDir, keep_last: int, run_id: str | None) -> list[Path]:
    """Delete all but the ``keep_last`` newest checkpoints written by run ``run_id``;
    checkpoints of any other run are never touched. Returns the deleted paths."""
    if run_id is None:
        return []
    old = [c.path for c in run.own_checkpoints(run_id)[:-keep_last]]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old


def load_checkpoint(
    run: RunDir, accelerator: Any, scheduler: Any
) -> tuple[Checkpoint, dict, list[Checkpoint]]:
    """Restore accelerate's state and the scheduler from the newest checkpoint that loads.

    Returns it, its trainer state (step, sampler cursors) for the caller to apply, and the
    newer checkpoints that failed to load (each reported with a warning; the caller moves
    them aside with :func:`set_corrupt_aside` once it holds the run's lock).
    """
    ckpts = run.checkpoints()
    if not ckpts:
        raise FileNotFoundError(f"--resume: no checkpoint in {run.checkpoints_dir}")

    def load(ckpt: Checkpoint) -> dict:
        state = json.loads(ckpt.trainer_state_path.read_text())
        accelerator.load_state(str(ckpt.state_dir))
        scheduler.load_state_dict(torch.load(ckpt.scheduler_path, weights_only=True))
        return state

    return _newest_that_loads(run, ckpts, load, "checkpoints")


def _newest_that_loads(
    run: RunDir, ckpts: list[Checkpoint], load: Any, what: str
) -> tuple[Checkpoint, dict, list[Checkpoint]]:
    """``(checkpoint, load(checkpoint), newer ones that failed)`` for the newest of
    ``ckpts`` that loads; each failure is a warning, all failing a RuntimeError."""
    corrupt: list[Checkpoint] = []
    for ckpt in reversed(ckpts):
        try:
            state = load(ckpt)
        except (*_LOAD_ERRORS, CheckpointException) as exc:
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


def save_sharded_checkpoint(
    run: RunDir,
    step: int,
    accelerator: Any,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    tokenizer: Any,
    trainer_state: dict[str, Any],
    keep_last: int,
) -> Path:
    """:func:`save_checkpoint` under ``train.strategy=fsdp`` (every process calls it):
    ``model`` is the FSDP model (or a plain one on a single process), ``optimizer`` the
    AdamW itself; DCP shards via :mod:`~divrl.training.sharded_checkpointing`."""
    path = save_sharded_run_checkpoint(
        run, step, rank, model, optimizer, scheduler, tokenizer, trainer_state
    )
    if accelerator.is_main_process:
        prune_checkpoints(run, keep_last, trainer_state.get("run_id"))
    accelerator.wait_for_everyone()
    return path


def load_latest_checkpoint(
    run: RunDir,
    accelerator: Any,
    scheduler: Any,
    sharded: bool,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
) -> tuple[Checkpoint, dict, list[Checkpoint]]:
    """``--resume``: the newest checkpoint, sharded (DCP: restored into ``model`` and
    ``optimizer``, the policy and AdamW themselves, on any number of processes) or not
    (:func:`load_checkpoint`, through ``accelerator``). Returns the checkpoint, its
    trainer state and the newer checkpoints that failed to load.

    A run under ``train.strategy=fsdp`` on several processes (``sharded``) refuses a DDP
    checkpoint: accelerate's ``load_state`` would skip the unprepared FSDP model silently.
    """
    latest = run.latest()
    if latest is not None and _looks_sharded(latest.path):
        return _load_newest_sharded(run, rank, model, optimizer, scheduler)
    if sharded and latest is not None:
        raise ValueError(
            f"--resume: {latest.path} was written under train.strategy=ddp; resume it "
            "with train.strategy=ddp (a sharded run cannot read a DDP checkpoint's state)"
        )
    return load_checkpoint(run, accelerator, scheduler)


def _looks_sharded(path: Path) -> bool:
    """A DCP checkpoint, or what is left of one whose ``.metadata`` is gone (its shards)."""
    return is_sharded_checkpoint(path) or any((path / DCP_DIR).glob("*.distcp"))


def _load_newest_sharded(
    run: RunDir, rank: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler
) -> tuple[Checkpoint, dict, list[Checkpoint]]:
    """The newest sharded checkpoint that loads, as :func:`load_checkpoint` does for DDP
    ones. Every process reads the same files, and DCP raises on every rank when one fails
    (``CheckpointException``), so all processes fall back to the same checkpoint; the
    model and optimiser are overwritten completely by the one that loads."""
    ckpts = [c for c in run.checkpoints() if _looks_sharded(c.path)]
    return _newest_that_loads(
        run,
        ckpts,
        lambda ckpt: load_sharded_run_checkpoint(ckpt, rank, model, optimizer, scheduler),
        "sharded checkpoints",
    )


def set_corrupt_aside(run: RunDir, corrupt: list[Checkpoint]) -> None:
    """Rename checkpoints that failed to load to ``corrupt_step_N`` (kept for inspection,
    no longer listed, so they are neither loaded nor counted by pruning)."""
    for ckpt in corrupt:
        target = run.corrupt_checkpoint_path(ckpt.step)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(ckpt.path, target)
        logger.warning("moved the unloadable checkpoint %s to %s", ckpt.path, target)


def apply_optimizer_changes(
    optimizer: Any, scheduler: Any, optim: Any, changed: dict[str, Any]
) -> list[str]:
    """After a resume that accepted changes (``--resume-with-changes``) to ``optim.lr``,
    ``betas``, ``eps`` or ``weight_decay``: the restored optimiser and scheduler hold the
    saved values; set the new ones so the next update uses them. Returns the keys set.

    (A changed schedule, warm-up or ``train.total_steps`` needs nothing here: the
    scheduler's lambda comes from the new config, its state only holds the step.)
    """
    done = []
    groups = optimizer.param_groups
    if "optim.lr" in changed:
        scheduler.base_lrs = [optim.lr] * len(groups)
        lambdas = getattr(scheduler, "lr_lambdas", None)
        for i, group in enumerate(groups):
            group["initial_lr"] = optim.lr
            factor = lambdas[i](scheduler.last_epoch) if lambdas else 1.0
            group["lr"] = optim.lr * factor
        scheduler._last_lr = [g["lr"] for g in groups]
        done.append("optim.lr")
    for key, value in (
        ("betas", tuple(optim.betas)),
        ("eps", optim.eps),
        ("weight_decay", optim.weight_decay),
    ):
        if f"optim.{key}" in changed:
            for group in groups:
                group[key] = value
            done.append(f"optim.{key}")
    return done


@dataclass
class CheckpointStage:
    """The trainer's checkpoint stage: save (plain, or DCP-sharded under
    ``train.strategy=fsdp``) and prune, find and load the newest checkpoint on resume.

    ``models`` is :func:`divrl.training.loading.load_models`'s result (a
    ``PolicyModels``): the model as the update uses it, its optimiser, schedule, tokenizer.
    """

    run: RunDir
    accelerator: Any
    models: Any
    strategy: str
    keep_last: int

    def _policy_and_adamw(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """The model without accelerate's DDP wrapper and the AdamW itself (DCP wants both)."""
        m, acc = self.models, self.accelerator
        policy = m.model if m.sharded else acc.unwrap_model(m.model)
        return policy, getattr(m.optimizer, "optimizer", m.optimizer)

    def save(self, step: int, trainer_state: dict[str, Any]) -> Path:
        """Write the checkpoint of ``step`` (every process calls this) and prune."""
        m, acc = self.models, self.accelerator
        if self.strategy == "fsdp":
            policy, adamw = self._policy_and_adamw()
            return save_sharded_checkpoint(
                self.run,
                step,
                acc,
                acc.process_index,
                policy,
                adamw,
                m.scheduler,
                m.tokenizer,
                trainer_state,
                self.keep_last,
            )
        return save_checkpoint(
            self.run, step, acc, m.model, m.scheduler, m.tokenizer, trainer_state, self.keep_last
        )

    def load_latest(self) -> tuple[Checkpoint, dict, list[Checkpoint]]:
        """See :func:`load_latest_checkpoint`."""
        policy, adamw = self._policy_and_adamw()
        acc, m = self.accelerator, self.models
        return load_latest_checkpoint(
            self.run, acc, m.scheduler, m.sharded, acc.process_index, policy, adamw
        )
