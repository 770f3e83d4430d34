"""``divrl train CONFIG [key=value ...]``: RL on a causal LM (GRPO/DAPO, DPH-RL, Lp-Reg...).

Runs on one process or under ``accelerate launch`` / ``torchrun`` (one shard of the
prompts per process). ``--resume`` continues from the newest checkpoint of the run's
``logging.output_dir``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from divrl.training.config import Config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        nargs="?",
        help="YAML config (e.g. configs/toy/grpo.yaml); default settings if omitted",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted overrides, e.g. train.total_steps=10 algorithm.clip_high=0.28",
    )
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )


def with_toy_defaults(config):
    """``config`` with a null ``model.path`` / ``data.train_path`` (and ``data.db_dir``)
    filled from the toy world (built on first use at ``model.toy_size``); a config with
    both paths set is returned unchanged. The trainer itself never guesses paths."""
    if config.model.path is not None and config.data.train_path is not None:
        return config
    from divrl.toy import ensure_toy_world

    world = ensure_toy_world(size=config.model.toy_size, progress=False)
    config.model.path = config.model.path or str(world.model_dir)
    config.data.train_path = config.data.train_path or str(world.splits["train"])
    if config.data.db_dir is None and world.db_dir:
        config.data.db_dir = str(world.db_dir)
    return config


def _split_config_arg(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    # `divrl train key=value` (no file) puts the first override in `config`
    if (
        args.config is not None
        and "=" in args.config
        and not args.config.endswith((".yaml", ".yml"))
    ):
        return None, [args.config, *args.overrides]
    return args.config, list(args.overrides)


def load_config_arg(args: argparse.Namespace, command: str) -> Config | None:
    """The validated config of ``args.config`` + ``args.overrides``, or None after printing
    the config error as ``divrl <command>: ...`` (the caller exits with status 2)."""
    from divrl.training.config import ConfigError, load_config

    path, overrides = _split_config_arg(args)
    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        print(f"divrl {command}: {exc}", file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    from divrl.training.config import dump_config

    config = load_config_arg(args, "train")
    if config is None:
        return 2
    if args.print_config:
        print(dump_config(config), end="")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from divrl.training.trainer import Trainer

    trainer = Trainer(with_toy_defaults(config), resume=args.resume)
    history = trainer.train()
    if trainer.accelerator.is_main_process and history:
        last = history[-1]
        print(
            f"step {last['step']}: reward {last.get('reward/shaped', float('nan')):.4f}, "
            f"pass@1 {last.get('reward/pass@1', float('nan')):.4f}; "
            f"metrics in {trainer.metrics_path}"
        )
    return 0
