"""The ``rollout`` section of the training config: the engine that samples the responses and
its sampling settings (read by :mod:`divrl.training.loading` and
:mod:`divrl.training.experience`; the engine's own options are checked by the engine)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from divrl.rollout import engine_summaries
from divrl.training.config_io import ConfigError, help_field, positive

__all__ = ["RolloutConfig"]

_ENGINE_HELP = (
    f"rollout engine, a registered name (divrl.rollout.engine_names()): {engine_summaries()}; "
    "options of the engine go in engine_options"
)


@dataclass
class RolloutConfig:
    engine: str = help_field(_ENGINE_HELP, "auto")
    engine_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "the engine's own options, checked by the engine (hf: batch_size; vllm: "
            "gpu_memory_utilization, enforce_eager, max_num_seqs, allow_untested_version); "
            "filled with the engine's defaults, so config.yaml shows every value used"
        },
    )
    n: int = help_field("responses sampled per prompt (the GRPO group size)", 8)
    temperature: float = help_field("sampling temperature (also divides the training logits)", 1.0)
    top_p: float = help_field("nucleus sampling threshold (1.0 = off)", 1.0)
    top_k: int = help_field("top-k sampling (0 = off)", 0)
    max_new_tokens: int = help_field("maximum response length in tokens", 256)
    stop: list[str] = field(
        default_factory=list,
        metadata={"help": "stop strings; the response ends with the first one"},
    )
    seeded: bool = help_field(
        "generate each prompt's n responses in their own call from a seed derived from "
        "(train.seed, step, prompt position), so that samples do not depend on the number of "
        "processes or on batching (slow: one generate call per prompt). false: batched "
        "generation seeded per (step, process), still reproducible and resumable",
        False,
    )

    def __post_init__(self) -> None:
        from divrl.rollout.registry import EngineError, engine_options

        positive("rollout.n", self.n)
        positive("rollout.temperature", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"rollout.top_p={self.top_p} must be in (0, 1]")
        positive("rollout.top_k", self.top_k, allow_zero=True)
        positive("rollout.max_new_tokens", self.max_new_tokens)
        try:
            options = engine_options(self.engine, self.engine_options or {})
        except EngineError as exc:
            raise ConfigError(f"rollout.engine / rollout.engine_options: {exc}") from exc
        self.engine_options = dataclasses.asdict(options)

    @property
    def options(self) -> Any:
        """The engine's typed options object (its dataclass), built from ``engine_options``."""
        from divrl.rollout.registry import engine_options

        return engine_options(self.engine, self.engine_options)

    @staticmethod
    def migrate(raw: dict[str, Any]) -> dict[str, Any]:
        """Read the keys of the flat section of earlier versions (``rollout.batch_size``,
        ``rollout.gpu_memory_utilization``) as the chosen engine's options; for another
        engine they had no effect and are dropped, with a warning either way."""
        from divrl.training.rollout_migration import migrate_rollout_section

        try:
            return migrate_rollout_section(raw)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
