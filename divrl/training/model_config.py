"""The ``model`` and ``data`` sections of the training config: which policy is trained and on
which prompts (read by :mod:`divrl.training.loading` and :mod:`divrl.data.prompts`; a null
path means the toy world's, filled by ``divrl.commands.train.with_toy_defaults``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from divrl.training.config_io import ConfigError, choice, help_field, positive

__all__ = ["DataConfig", "ModelConfig"]


@dataclass
class ModelConfig:
    path: str | None = help_field(
        "Hugging Face model directory or hub name (any causal LM transformers loads); "
        "null = the toy base model built by divrl.toy",
        None,
    )
    toy_size: str = help_field(
        "size of the toy world used when path is null: one the world declares ('full', the "
        "default; `divrl toy build --size` names a world's sizes when given another), "
        "checked when the world is built",
        "full",
    )
    toy_world: str = help_field(
        "which toy world path null means: a name in the world registry (divrl.toy.worlds."
        "WORLDS; `divrl toy build --help` lists them), checked when the world is built",
        "sql",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = help_field(
        "dtype the policy is loaded in", "float32"
    )
    gradient_checkpointing: bool = help_field("recompute activations in backward", False)
    trust_remote_code: bool = help_field("passed to from_pretrained", False)


@dataclass
class DataConfig:
    train_path: str | None = help_field(
        "training prompts, JSONL/Parquet in the verl schema; null = the toy world's train split",
        None,
    )
    db_dir: str | None = help_field("SQLite databases of SQL tasks (null = the toy world's)", None)
    eval_paths: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "help": "eval sets of `divrl eval --config`, {name: path} (JSONL/Parquet, verl "
            "schema); names become folder names under the eval output; not read by training"
        },
    )
    template: str = help_field("prompt template passed to divrl.data.render_prompt", "plain")
    limit: int | None = help_field("use only the first N training examples", None)
    shuffle: bool = help_field("reshuffle the prompts every epoch (seeded by train.seed)", True)
    max_prompt_length: int = help_field(
        "longest prompt in tokens; longer ones are handled by data.truncation", 1024
    )
    # --- fidelity to the authors' scripts: what happens to prompts over max_prompt_length
    truncation: Literal["error", "drop", "left"] = help_field(
        "prompts longer than data.max_prompt_length: 'error' stops at load time naming how "
        "many; 'drop' leaves them out; 'left' keeps their last max_prompt_length tokens "
        "(verl's truncation='left'). The count dropped or truncated is always printed",
        "error",
    )
    skip_invalid: bool = help_field(
        "skip training rows that fail to decode or validate (each is counted and the first "
        "logged with its file, line and field) instead of stopping",
        False,
    )

    def __post_init__(self) -> None:
        from divrl.data.templates import template_names

        if self.limit is not None:
            positive("data.limit", self.limit)
        positive("data.max_prompt_length", self.max_prompt_length)
        choice("data.template", self.template, template_names())
        for name, path in self.eval_paths.items():
            if not isinstance(name, str) or not isinstance(path, str) or not path:
                raise ConfigError(
                    f"data.eval_paths: {name!r}: {path!r} must be a set name and a file path, "
                    "e.g. data.eval_paths: {test: data/test.jsonl}"
                )
