"""The layout of a training run directory, known in one place.

A run directory (``logging.output_dir``) holds::

    config.yaml                 the resolved config of the run
    metrics.jsonl               one JSON record per training step
    tensorboard/                TensorBoard events (optional)
    checkpoints/step_NNNNNN/    one per saved step: ``state/`` (accelerate: model,
                                optimiser, RNG), ``scheduler.pt``, ``trainer_state.json``
                                and ``model/`` (a plain transformers directory)
    checkpoints/.tmp_step_*/    a checkpoint being written (renamed when complete)

This module sits below training and evaluation (it imports neither): both ask it where
things are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Checkpoint", "RunDir"]

_STEP_DIR = re.compile(r"step_(\d+)")


@dataclass(frozen=True)
class Checkpoint:
    """One saved step of a run."""

    path: Path
    step: int

    @classmethod
    def at(cls, path: str | Path) -> Checkpoint:
        """The checkpoint directory ``path`` (its step read from a ``step_N`` name, else -1)."""
        path = Path(path)
        match = _STEP_DIR.fullmatch(path.name)
        return cls(path, int(match.group(1)) if match else -1)

    @property
    def model_dir(self) -> Path:
        """The checkpoint's transformers model directory."""
        return self.path / "model"

    @property
    def state_dir(self) -> Path:
        """accelerate's state (model, optimiser, RNG states)."""
        return self.path / "state"

    @property
    def scheduler_path(self) -> Path:
        return self.path / "scheduler.pt"

    @property
    def trainer_state_path(self) -> Path:
        return self.path / "trainer_state.json"

    def has_model(self) -> bool:
        return (self.model_dir / "config.json").is_file()


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory (nothing is created until a writer asks)."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def metrics_path(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def config_path(self) -> Path:
        return self.root / "config.yaml"

    @property
    def tensorboard_dir(self) -> Path:
        return self.root / "tensorboard"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Checkpoint:
        """Where the checkpoint of ``step`` is (or would be) written."""
        return Checkpoint(self.checkpoints_dir / f"step_{step:06d}", step)

    def temp_checkpoint_path(self, step: int) -> Path:
        """Where the checkpoint of ``step`` is written before its atomic rename."""
        return self.checkpoints_dir / f".tmp_step_{step:06d}"

    def checkpoints(self) -> list[Checkpoint]:
        """Complete checkpoints, oldest step first (temp directories are not listed)."""
        if not self.checkpoints_dir.is_dir():
            return []
        found = []
        for path in self.checkpoints_dir.iterdir():
            match = _STEP_DIR.fullmatch(path.name)
            if match and path.is_dir():
                found.append(Checkpoint(path, int(match.group(1))))
        return sorted(found, key=lambda c: c.step)

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint, or None."""
        ckpts = self.checkpoints()
        return ckpts[-1] if ckpts else None

    def final_model(self) -> Path | None:
        """The model directory of the newest checkpoint that holds one, or None."""
        for ckpt in reversed(self.checkpoints()):
            if ckpt.has_model():
                return ckpt.model_dir
        return None
