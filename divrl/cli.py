"""The ``divrl`` command line.

Each subcommand lives in its own module that exposes ``add_arguments(parser)`` and
``run(args) -> int``; modules are imported only when their subcommand runs, so that
``divrl --help`` stays fast and an optional dependency of one command never breaks another.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help). Add a subcommand by adding one line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("divrl.commands.train", "RL training: GRPO/DAPO, DPH-RL, Lp-Reg and baselines"),
    "presample": ("divrl.commands.presample", "DPH-RL: presample the reference store"),
    "score": ("divrl.commands.score", "score a JSONL of completions against a dataset"),
    "data": ("divrl.commands.data", "convert BIRD/Spider/MATH/GSM8K files to verl-schema rows"),
    "eval": ("divrl.commands.eval", "sample and score a model: Pass@k, maj@k, diversity"),
    "export": ("divrl.commands.export", "Hugging Face folder from a sharded (fsdp) checkpoint"),
    "report": ("divrl.commands.report", "Markdown/HTML report comparing runs and the base model"),
    "demo": ("divrl.commands.demo", "toy world end to end: GRPO, DPH-JS, Lp-Reg vs the base"),
    "toy": ("divrl.commands.toy", "build the toy world (SQL + math data, tiny base model)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser_for(argv)
    args = parser.parse_args(argv)
    if getattr(args, "_module", None) is None:
        parser.print_help()
        return 2
    return int(importlib.import_module(args._module).run(args) or 0)


def build_parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """Build the parser, importing only the module of the subcommand named in ``argv``."""
    parser = argparse.ArgumentParser(
        prog="divrl",
        description="RLVR that keeps diversity: DPH-RL, Lp-Reg and their baselines.",
    )
    from divrl import __version__

    parser.add_argument("--version", action="version", version=f"divrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        sub_parser.set_defaults(_module=module_name)
        if argv and argv[0] == name:
            importlib.import_module(module_name).add_arguments(sub_parser)
    return parser


if __name__ == "__main__":
    sys.exit(main())
