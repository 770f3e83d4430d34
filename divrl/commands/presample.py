"""``divrl presample CONFIG [key=value ...]``: DPH-RL's reference store from the initial model.

Samples ``reference.k`` responses per training prompt, splits the prompts into
near-perfect and exploration sets and stores one correct extra response per near-perfect
prompt with its initial-policy log-probs at ``reference.store``. Run it once before
``divrl train`` with a DPH preset (same config file). An earlier store at that path is
replaced; a folder or file that is not a store is refused unless ``--overwrite``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
from pathlib import Path

from divrl.cli import UsageError
from divrl.commands.train import load_config_arg, with_toy_defaults


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML config (the DPH preset you will train)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted overrides, e.g. reference.k=16 reference.threshold=7",
    )
    parser.add_argument(
        "--failed-to-exploration",
        action="store_true",
        help="move a near-perfect prompt whose extra response fails to the exploration set "
        "(the paper's text; the authors' code keeps it out of both); the same as "
        "reference.failed_to_exploration=true",
    )
    trl = parser.add_argument_group(
        "without a config file (TRL-style names; each is the same as the override it names)"
    )
    trl.add_argument("--model", help="model folder or hub id: model.path=MODEL")
    trl.add_argument(
        "--dataset",
        help="training prompts (JSONL/Parquet; TRL's prompt column or the verl schema): "
        "data.train_path=DATASET",
    )
    trl.add_argument(
        "--template",
        help="prompt template: data.template=NAME ('chat' applies the tokenizer's chat "
        "template, as TRL does for conversational prompts)",
    )
    trl.add_argument(
        "--store",
        help="where the store goes: reference.store=DIR (default with --dataset and no "
        "config: runs/<dataset file stem>/reference)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace whatever reference.store names even when it is not a reference store "
        "(a store there is replaced without it; any other folder or file is refused)",
    )


#: flag -> the override it stands for
FLAG_KEYS = {
    "model": "model.path",
    "dataset": "data.train_path",
    "template": "data.template",
    "store": "reference.store",
}


def flag_overrides(args: argparse.Namespace) -> None:
    """Append the overrides the TRL-style flags stand for to ``args.overrides`` (a key set
    both ways is refused: one of them would be ignored)."""
    words = ([args.config] if args.config else []) + list(args.overrides)
    given = {w.split("=", 1)[0] for w in words if "=" in w}
    flags = {key: getattr(args, flag) for flag, key in FLAG_KEYS.items()}
    config_file = args.config is not None and args.config.endswith((".yaml", ".yml"))
    dataset = flags["data.train_path"]
    placed = flags["reference.store"] or given & {"reference.store", "logging.output_dir"}
    if dataset and not config_file and not placed:
        flags["reference.store"] = f"runs/{Path(dataset).stem}/reference"
    for key, value in flags.items():
        if value is None:
            continue
        if key in given:
            flag = next(f for f, k in FLAG_KEYS.items() if k == key)
            raise UsageError(f"give --{flag} or {key}=..., not both")
        args.overrides = [*args.overrides, f"{key}={value}"]


def run(args: argparse.Namespace) -> int:
    flag_overrides(args)
    config = load_config_arg(args, "presample")
    if config is None:
        return 2
    from divrl.rollout import check_engine_installed, check_engine_model

    check_engine_installed(config.rollout.engine)  # before any model loads
    check_engine_model(config.rollout.engine, config.model.path)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from divrl.distributed import release_process_group
    from divrl.training.presample import presample

    if args.failed_to_exploration:
        config.reference.failed_to_exploration = True
    manifest = presample(
        with_toy_defaults(config), progress=config.logging.progress, overwrite=args.overwrite
    )
    from accelerate import PartialState

    state = PartialState()
    if state.is_main_process:  # every process of a torchrun launch returns the manifest
        print(json.dumps(manifest["stats"], indent=2))
        print(f"reference store: {config.reference_store}")
        print(f"next: {next_command(args)}")
    # release the process group before the interpreter exits (no DDP wrapper here)
    release_process_group()
    return 0


def next_command(args: argparse.Namespace) -> str:
    """The ``divrl train`` command that trains on this store: the same config and overrides
    (the store is matched to the training prompts and settings, so they must agree)."""
    words = ["divrl", "train"] + ([args.config] if args.config else []) + list(args.overrides)
    if args.failed_to_exploration:
        words.append("reference.failed_to_exploration=true")
    return shlex.join(words)
