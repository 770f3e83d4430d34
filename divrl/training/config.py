"""Typed configuration of ``divrl train`` / ``divrl presample``.

A run is described by one YAML file with the sections below (any section or key may be
left out: the dataclass default applies) plus ``key=value`` overrides with dotted keys
(``algorithm.clip_high=0.28``). A YAML file may start with ``extends: other.yaml`` (a path
relative to the file): the other file is loaded first and this one is merged over it, key
by key. Unknown keys and invalid values raise :class:`ConfigError` before any work starts,
naming the key and the closest valid one.

Each section is a dataclass in its own module, beside what reads it (``model_config``:
model and data; ``rollout_config``; ``algorithm_config``; ``reference_config``;
``train_config``: train, optim, logging, checkpoint); this module joins them into
:class:`Config`, checks what spans sections, and re-exports every section class.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from divrl.rollout.registry import get_engine
from divrl.training import authors_config
from divrl.training.algorithm_config import AlgorithmConfig
from divrl.training.config_io import (
    ConfigError,
    build_config,
    dump_config,
    parse_override,
    read_config_mapping,
)
from divrl.training.model_config import DataConfig, ModelConfig
from divrl.training.reference_config import ReferenceConfig
from divrl.training.rollout_config import RolloutConfig
from divrl.training.train_config import (
    CheckpointConfig,
    LoggingConfig,
    OptimConfig,
    TrainConfig,
)

__all__ = [
    "AlgorithmConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimConfig",
    "ReferenceConfig",
    "RolloutConfig",
    "TrainConfig",
    "check_divisibility",
    "config_from_dict",
    "dump_config",
    "load_config",
    "parse_override",
    "reject_non_finite",
]


def reject_non_finite(config: Any, key: str = "") -> None:
    """Raise :class:`ConfigError` for a NaN or infinite number anywhere in ``config`` (a
    :class:`Config`; sections, lists and mappings such as ``algorithm.loss_options`` are
    walked). No float option has a meaning for them, and comparisons let NaN through (a NaN
    clip skips every step, a NaN Lp-Reg rho crashes at step 1). Off switches are 0 or null."""
    if dataclasses.is_dataclass(config):  # mappings last: they mirror options named first
        for f in sorted(dataclasses.fields(config), key=lambda f: str(f.type).startswith("dict")):
            reject_non_finite(getattr(config, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(config, dict | list | tuple):
        named = config.items() if isinstance(config, dict) else ((None, v) for v in config)
        for name, item in named:
            reject_non_finite(item, key if name is None else f"{key}.{name}")
    elif isinstance(config, float) and not math.isfinite(config):
        raise ConfigError(
            f"{key}={config!r} must be a finite number (use 0 or null to turn a feature off)"
        )


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        reject_non_finite(self)
        algo = self.algorithm
        algo.resolve_rollout_is(separate_sampler=not get_engine(self.rollout.engine).uses_model)
        if algo.divergence is not None and algo.divergence_coef > 0 and self.reference.per_step < 1:
            raise ConfigError(
                "algorithm.divergence is set but reference.per_step=0: set reference.per_step "
                "to the number of reference samples per step"
            )
        if algo.divergence_weighting == "concat" and algo.loss_agg != "token-mean":
            raise ConfigError(
                "algorithm.divergence_weighting=concat is one token-mean over both streams: "
                "it needs algorithm.loss_agg=token-mean"
            )
        problems = authors_config.authors_assembly_problems(self)
        if self.train.batch_assembly == "authors" and problems:
            raise ConfigError("train.batch_assembly=authors: " + "; ".join(problems))
        if problems := authors_config.lp_reg_authors_problems(self):
            raise ConfigError("; ".join(problems))
        if problems := authors_config.replica_omit_problems(self):
            raise ConfigError("; ".join(problems))
        if problem := algo.estimator.group_size_problem(self.rollout.n):
            raise ConfigError(
                f"{problem}: raise rollout.n (now {self.rollout.n}) or change "
                "algorithm.advantage_options"
            )
        if algo.dynamic_sampling and self.rollout.n < 2:
            raise ConfigError("algorithm.dynamic_sampling needs rollout.n >= 2")
        if algo.overlong_buffer >= self.rollout.max_new_tokens:
            raise ConfigError(
                f"algorithm.overlong_buffer={algo.overlong_buffer} must be smaller than "
                f"rollout.max_new_tokens={self.rollout.max_new_tokens}"
            )

    @property
    def uses_reference_samples(self) -> bool:
        """DPH-RL: a divergence term on presampled reference responses."""
        return self.algorithm.divergence is not None and self.algorithm.divergence_coef > 0

    @property
    def reference_store(self) -> Path:
        return Path(self.reference.store or Path(self.logging.output_dir) / "reference")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_divisibility(config: Config, world: int) -> None:
    """Every process must get the same share of the prompts and reference samples
    (checked at launch, once the number of processes ``world`` is known)."""
    t = config.train
    mini = t.mini_batch_size or t.prompts_per_step
    if t.prompts_per_step % world or mini % world:
        raise ValueError(
            f"train.prompts_per_step={t.prompts_per_step} and the mini-batch size {mini} "
            f"must be divisible by the number of processes ({world})"
        )
    if config.reference.per_step % world:
        raise ValueError(
            f"reference.per_step={config.reference.per_step} must be divisible by the "
            f"number of processes ({world})"
        )
    # Under FSDP every forward is a collective: each process must run as many
    # micro-batches (rollouts and reference samples) in each mini-batch as the others.
    if problems := authors_config.launch_problems(config, world):
        raise ValueError("; ".join(problems))
    if t.strategy != "fsdp" or world == 1:
        return
    if config.reference.per_step % (world * t.num_mini_batches):
        raise ValueError(
            f"train.strategy=fsdp: reference.per_step={config.reference.per_step} must be "
            f"divisible by processes x mini-batches ({world} x {t.num_mini_batches})"
        )
    if t.micro_batch_tokens is not None:
        raise ValueError(
            "train.strategy=fsdp on several processes needs train.micro_batch_tokens=null: "
            "token-budget micro-batches differ in number between processes"
        )


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Build a validated :class:`Config` from a nested mapping."""
    return build_config(Config, raw)


def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> Config:
    """Load a YAML config (or the defaults when ``path`` is None) and apply overrides
    (``section.key=value``; reading: :mod:`divrl.training.config_io`)."""
    return config_from_dict(read_config_mapping(path, overrides, Config))
