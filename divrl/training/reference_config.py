"""The ``reference`` section of the training config: how ``divrl presample`` builds the DPH-RL
reference store and how many of its samples a training step rehearses (read by
:mod:`divrl.training.presample` and the trainer's reference draw)."""

from __future__ import annotations

from dataclasses import dataclass

from divrl.training.config_io import ConfigError, help_field, positive

__all__ = ["ReferenceConfig"]


@dataclass
class ReferenceConfig:
    store: str | None = help_field(
        "DPH-RL reference store written by `divrl presample` (null = <logging.output_dir>/"
        "reference)",
        None,
    )
    k: int = help_field("presample: responses per training prompt from the initial model", 8)
    threshold: int | None = help_field(
        "presample: a prompt is near-perfect with at least this many of k correct (null = k)",
        None,
    )
    temperature: float = help_field("presample: sampling temperature", 1.0)
    top_p: float = help_field("presample: nucleus threshold", 0.95)
    response_top_p: float | None = help_field(
        "presample: top_p of the kept reference responses (null = top_p; DPH-RL's: 0.9)", None
    )
    per_step: int = help_field("reference samples trained on per step (all processes together)", 0)
    batch_size: int = help_field("presample: prompts per generation call", 16)
    failed_to_exploration: bool = help_field(
        "presample: a near-perfect prompt whose extra response fails goes to the exploration "
        "set (the paper's text) instead of neither set (the authors' code)",
        False,
    )
    allow_store_mismatch: bool = help_field(
        "train on a reference store presampled for another model, data, sampling settings "
        "or split rule (a warning instead of an error)",
        False,
    )
    keep_presampled: bool = help_field(
        "presample: also keep the correct responses among each near-perfect prompt's k "
        "presampled ones as reference samples (false = the authors' code: only the one "
        "extra response per prompt; true for a toy world whose base solves few prompts "
        "reliably, where that leaves a store of a few samples)",
        False,
    )

    def __post_init__(self) -> None:
        positive("reference.k", self.k)
        if self.threshold is not None and not 1 <= self.threshold <= self.k:
            raise ConfigError(f"reference.threshold={self.threshold} must be in [1, k={self.k}]")
        positive("reference.temperature", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"reference.top_p={self.top_p} must be in (0, 1]")
        if self.response_top_p is not None and not 0.0 < self.response_top_p <= 1.0:
            raise ConfigError(f"reference.response_top_p={self.response_top_p} must be in (0, 1]")
        positive("reference.per_step", self.per_step, allow_zero=True)
        positive("reference.batch_size", self.batch_size)
