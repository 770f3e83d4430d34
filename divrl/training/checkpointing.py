"""Checkpoints of a training run: save (atomically), load the latest, prune.

A checkpoint is ``checkpoints/step_NNNNNN`` of the run directory (layout in
:mod:`divrl.runs`): accelerate's state (model, optimiser, every process's RNG states), the
scheduler, the trainer's own state (step, sampler cursors) and a plain transformers model
directory for evaluation. It is written to a temp directory and renamed, so a run killed
while writing keeps its previous checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from divrl.runs import Checkpoint, RunDir

__all__ = ["load_checkpoint", "prune_checkpoints", "save_checkpoint"]


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
    """Write the checkpoint of ``step`` (every process calls this) and prune old ones."""
    acc = accelerator
    final = run.checkpoint(step).path
    tmp = run.temp_checkpoint_path(step)
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
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        prune_checkpoints(run, keep_last)
    acc.wait_for_everyone()
    return final


def prune_checkpoints(run: RunDir, keep_last: int) -> list[Path]:
    """Delete all but the ``keep_last`` newest checkpoints; returns the deleted paths."""
    old = [c.path for c in run.checkpoints()[:-keep_last]]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old


def load_checkpoint(run: RunDir, accelerator: Any, scheduler: Any) -> tuple[Checkpoint, dict]:
    """Restore accelerate's state and the scheduler from the newest checkpoint; returns it
    and its trainer state (step, sampler cursors) for the caller to apply."""
    ckpt = run.latest()
    if ckpt is None:
        raise FileNotFoundError(f"--resume: no checkpoint in {run.checkpoints_dir}")
    state = json.loads(ckpt.trainer_state_path.read_text())
    accelerator.load_state(str(ckpt.state_dir))
    scheduler.load_state_dict(torch.load(ckpt.scheduler_path, weights_only=True))
    return ckpt, state
