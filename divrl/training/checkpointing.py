"""Checkpoints of a training run: save (atomically), load the latest good one, prune.

A checkpoint is ``checkpoints/step_NNNNNN`` of the run directory (layout in
:mod:`divrl.runs`): accelerate's state (model, optimiser, every process's RNG states), the
scheduler, the trainer's own state (step, sampler cursors, the run's id) and a plain
transformers model directory for evaluation. It is written to a temp directory and
renamed, so a run killed while writing keeps its previous checkpoint; a failed write (a
full disk) removes the temp directory and raises an error naming the path and the free
space. A checkpoint that fails to load (a truncated ``optimizer.bin``) is skipped with a
warning and the previous one is loaded.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch

from divrl.fileio import write_failed
from divrl.runs import Checkpoint, RunDir

__all__ = [
    "apply_optimizer_changes",
    "load_checkpoint",
    "prune_checkpoints",
    "save_checkpoint",
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
    try:
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp / "state"))  # model, optimiser, every process's RNG states
        state_dict = acc.get_state_dict(model)
        if acc.is_main_process:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2))
            # a plain transformers directory, for evaluation and as a starting point
            acc.unwrap_model(model).save_pretrained(tmp / "model", state_dict=state_dict)
            tokenizer.save_pretrained(tmp / "model")
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
    corrupt: list[Checkpoint] = []
    for ckpt in reversed(ckpts):
        try:
            state = json.loads(ckpt.trainer_state_path.read_text())
            accelerator.load_state(str(ckpt.state_dir))
            scheduler.load_state_dict(torch.load(ckpt.scheduler_path, weights_only=True))
        except _LOAD_ERRORS as exc:
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
        f"--resume: none of the {len(ckpts)} checkpoints in {run.checkpoints_dir} loads "
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
