"""``divrl train CONFIG [key=value ...]``: RL on a causal LM (GRPO/DAPO, DPH-RL, Lp-Reg...).

Runs on one process or under ``accelerate launch`` / ``torchrun`` (one shard of the
prompts per process). ``--resume`` continues from the newest checkpoint of the run's
``logging.output_dir``; a folder that holds another run is refused unless ``--resume`` or
``--overwrite`` is given (see docs/reliability.md). Ctrl-C stops with one line and exit
code 130; the last checkpoint is intact.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from divrl.training.config import Config


CONFIG_HELP = (
    "Every config key (section.key=value) with its default and meaning: docs/training.md, "
    '"Configuration reference"; `divrl train CONFIG [KEY=VALUE ...] --print-config` prints '
    "the resolved config (every key, after extends and overrides) without training."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = CONFIG_HELP
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
        "--overwrite",
        action="store_true",
        help="delete the run already in logging.output_dir (config, metrics, checkpoints) and "
        "start a new one there; without it (or --resume) such a folder is refused",
    )
    parser.add_argument(
        "--resume-with-changes",
        metavar="KEYS",
        action="append",
        default=[],
        help="with --resume: config keys (comma-separated, e.g. optim.lr,train.total_steps) "
        "that may differ from the run's config.yaml; recorded in its history.jsonl",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )
    parser.add_argument(
        "--allow-store-mismatch",
        action="store_true",
        help="train on a DPH reference store presampled for another model, data, sampling "
        "settings or split rule (a warning instead of an error; the same as "
        "reference.allow_store_mismatch=true)",
    )


def with_toy_defaults(config):
    """``config`` with a null ``model.path`` / ``data.train_path`` (and ``data.db_dir``)
    filled from the toy world ``model.toy_world`` (built on first use at ``model.toy_size``); a config with
    both paths set is returned unchanged, after the world's module is imported (what it
    registers, its profile, is then registered here). The trainer itself never guesses
    paths."""
    from divrl.toy import get_world
    from divrl.toy.worlds import import_world
    from divrl.training.config import ConfigError

    try:
        # the world's module registers its rows' profile (verifier) at import: needed even
        # when the paths are given (the demo's and the reproduction's subprocesses)
        import_world(config.model.toy_world)
        if config.model.path is not None and config.data.train_path is not None:
            return config
        world = get_world(config.model.toy_world, size=config.model.toy_size, progress=False)
    except ValueError as exc:  # a world or size the registry does not have
        raise ConfigError(
            f"model.toy_world={config.model.toy_world!r} / model.toy_size="
            f"{config.model.toy_size!r}: {exc}"
        ) from exc
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
    if getattr(args, "allow_store_mismatch", False):
        config.reference.allow_store_mismatch = True
    if args.print_config:
        print(dump_config(config), end="")
        return 0
    from divrl.rollout import check_engine_installed, check_engine_model

    check_engine_installed(config.rollout.engine)  # before any model loads
    check_engine_model(config.rollout.engine, config.model.path)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from divrl.distributed import release_process_group

    code = _train(args, config)
    # the trainer (and its DDP wrapper) is gone now: release the process group before the
    # interpreter exits, in that order (else a rank can hang at exit under torchrun)
    release_process_group()
    return code


def _train(args: argparse.Namespace, config: Config) -> int:
    """Train (or resume) the run and print its last step; the exit code."""
    from divrl.fileio import DiskFullError
    from divrl.rewards.types import UnscorableShareError
    from divrl.runs import RunLockedError
    from divrl.training.run_session import RunDirError
    from divrl.training.trainer import Trainer

    allowed = tuple(k.strip() for arg in args.resume_with_changes for k in arg.split(",") if k)
    trainer = None
    try:
        trainer = Trainer(
            with_toy_defaults(config),
            resume=args.resume,
            overwrite=args.overwrite,
            resume_with_changes=allowed,
        )
        if _already_finished(trainer):
            return 0
        history = trainer.train()
    except (RunDirError, RunLockedError) as exc:
        print(f"divrl train: {exc}", file=sys.stderr)
        return 2
    except (DiskFullError, UnscorableShareError) as exc:
        print(f"divrl train: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        step = trainer.step if trainer is not None else 0
        print(f"divrl train: interrupted at step {step}; resume with --resume", file=sys.stderr)
        return 130
    if history and _every_step_skipped(trainer.config, history):
        if trainer.accelerator.is_main_process:
            print(
                f"divrl train: every one of the {len(history)} steps skipped its optimiser "
                "update (a non-finite loss or gradient norm; see the warnings above): the "
                f"model did not change. Metrics in {trainer.metrics_path}",
                file=sys.stderr,
            )
        return 1
    short = sum(1 for m in history if m.get("dapo/short_batch", 0) > 0)
    if short and trainer.accelerator.is_main_process:
        print(
            f"divrl train: {short} of {len(history)} steps trained on fewer groups than "
            "train.prompts_per_step: dynamic sampling ran out of generation rounds "
            "(algorithm.refill_exhausted=continue; dapo/short_batch in the metrics)",
            file=sys.stderr,
        )
    if trainer.accelerator.is_main_process and history:
        last = history[-1]
        model = trainer.run.final_model()
        saved = (
            f"model in {model}"
            if model is not None
            else "no model saved (set checkpoint.save_final=true or checkpoint.save_every)"
        )
        print(
            f"step {last['step']}: reward {last.get('reward/shaped', float('nan')):.4f}, "
            f"pass@1 {last.get('reward/pass@1', float('nan')):.4f}; "
            f"metrics in {trainer.metrics_path}; {saved}"
        )
    return 0


def _every_step_skipped(config: Config, history: list[dict]) -> bool:
    """Whether no step of this session updated the model (each skipped all its updates)."""
    updates = config.train.num_mini_batches * config.train.ppo_epochs
    return all(m.get("actor/skipped_steps", 0) >= updates for m in history)


def _already_finished(trainer) -> bool:
    """Say so (and return True) when a resumed run has nothing left to do."""
    total = trainer.config.train.total_steps
    if trainer.step < total:
        return False
    if trainer.accelerator.is_main_process:
        print(
            f"{trainer.run.root}: the run already finished at step {trainer.step} "
            f"(train.total_steps={total}); nothing to do. To train further, resume with "
            f"a larger train.total_steps=N (N > {total})"
        )
    return True
