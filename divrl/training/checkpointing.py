"""The trainer's checkpoint stage: when to save, which format (:mod:`divrl.checkpoint`:
plain under ``train.strategy=ddp``, DCP shards under ``fsdp``), and what a resume with
changed optimiser settings must set again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from divrl.checkpoint.resume import load_latest
from divrl.checkpoint.strategies import CheckpointStrategy, PlainCheckpoints, ShardedCheckpoints
from divrl.runs import Checkpoint, RunDir
from divrl.training.run_session import RunDirError

logger = logging.getLogger(__name__)

__all__ = ["CheckpointStage", "apply_optimizer_changes", "is_due"]


def is_due(checkpoint: Any, step: int, total_steps: int) -> bool:
    """Whether ``step`` is saved: every ``checkpoint.save_every`` steps, and the last step
    of the run with ``checkpoint.save_final`` (``checkpoint``: the config's section)."""
    every = checkpoint.save_every
    return bool(every and step % every == 0) or (step == total_steps and checkpoint.save_final)


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
    """The trainer's checkpoint stage: save with the run's strategy and prune, find and
    load the newest checkpoint on resume (in either format a single process can read).

    ``models`` is :func:`divrl.training.loading.load_models`'s result (a
    ``PolicyModels``): the model as the update uses it, its optimiser, schedule, tokenizer.
    """

    run: RunDir
    accelerator: Any
    models: Any
    strategy: str
    keep_last: int

    def _strategies(self) -> tuple[CheckpointStrategy, CheckpointStrategy]:
        """(sharded, plain). DCP wants the model without accelerate's DDP wrapper and the
        AdamW itself; accelerate's own state wants what it prepared."""
        m, acc = self.models, self.accelerator
        policy = m.model if m.sharded else acc.unwrap_model(m.model)
        adamw = getattr(m.optimizer, "optimizer", m.optimizer)
        common = (self.run, acc, self.keep_last)
        sharded = ShardedCheckpoints(*common, policy, adamw, m.scheduler, m.tokenizer)
        return sharded, PlainCheckpoints(*common, m.model, m.scheduler, m.tokenizer)

    def save(self, step: int, trainer_state: dict[str, Any]) -> Path:
        """Write the checkpoint of ``step`` (every process calls this) and prune."""
        sharded, plain = self._strategies()
        return (sharded if self.strategy == "fsdp" else plain).save(step, trainer_state)

    def load_latest(self) -> tuple[Checkpoint, dict, list[Checkpoint]]:
        """``--resume``: the newest checkpoint that loads, sharded (restored into the
        policy and AdamW themselves, on any number of processes) or plain (through
        accelerate). A run sharded over several processes refuses a plain checkpoint."""
        return load_latest(self.run, self._strategies(), refuse_others=self.models.sharded)


def load_rehearsal_state(controller: Any, state: dict[str, Any], path: Path) -> None:
    """Restore the rehearsal controller's eta from checkpoint ``state`` (read from ``path``);
    a checkpoint without it restarts eta with a warning, and a saved eta outside bounds
    changed under ``--resume-with-changes`` stops the resume with one line."""
    saved = state.get("rehearsal_control")
    if saved is None:
        logger.warning("the checkpoint has no rehearsal controller state: eta restarts")
        return
    try:
        controller.load_state_dict(saved)
    except ValueError as exc:
        raise RunDirError(f"--resume: {path}: {exc}") from None
