"""``divrl data check [FILE] [--config CONFIG] [KEY=VALUE ...]``: every row validated, the
databases opened read-only, the ground truths read by their profiles, and, when the config
names a model, the prompts' lengths against its ``data.*`` settings (docs/data.md).

Exit 0 with a summary when the file can be trained on as it is; 2 with one line per
problem otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

PROG = "divrl data check"


def add_check_arguments(sub) -> None:
    check = sub.add_parser(
        "check",
        help="check a data file against a config before training on it",
        description="Validate every row of a verl-schema file, open its SQLite databases "
        "read-only, read its ground truths with their profiles and (when the config names a "
        "model) measure its prompts against data.max_prompt_length / data.truncation / "
        "data.template. Exit 0 with a summary, or 2 with one line per problem.",
    )
    check.add_argument(
        "file",
        nargs="?",
        default=None,
        help="the .jsonl / .parquet file or datasets folder to check (default: the config's "
        "data.train_path)",
    )
    check.add_argument(
        "--config",
        default=None,
        help="the YAML config you will train with (its model's tokenizer, data.* settings and "
        "data.db_dir); without it, and without model.path=..., lengths are not checked",
    )
    check.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides of the config"
    )


def run_check(args: argparse.Namespace) -> int:
    from divrl.data.check import CheckResult, check_answers, check_databases, check_rows
    from divrl.training.config import ConfigError, load_config

    if args.file is not None and "=" in args.file and not Path(args.file).exists():
        # no FILE, overrides only: argparse gave the first override to the optional FILE
        args.overrides, args.file = [args.file, *args.overrides], None
    try:
        config = load_config(args.config, list(args.overrides))
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if args.file is None:
        if config.data.train_path is None:
            print(
                f"{PROG}: no file to check: name one (divrl data check FILE) or pass a "
                "--config that sets data.train_path",
                file=sys.stderr,
            )
            return 2
        args.file = str(config.data.train_path)
    result = CheckResult()
    # the loader's "skipped N invalid rows" warning: every one of them is listed below
    loader = logging.getLogger("divrl.data.loading")
    level = loader.level
    loader.setLevel(logging.ERROR)
    try:
        examples = check_rows(args.file, config.data.db_dir, result)
    finally:
        loader.setLevel(level)
    check_databases(examples, result)
    check_answers(examples, result, unusable=_unusable_by_equivalence)
    _check_lengths(config, examples, result)
    print(f"{args.file}:")
    for line in result.lines:
        print(f"  {line}")
    for problem in result.problems:
        print(f"{PROG}: {problem}", file=sys.stderr)
    if result.problems:
        print(f"{PROG}: {args.file}: {len(result.problems)} problem line(s)", file=sys.stderr)
        return 2
    print("ok")
    return 0


def _unusable_by_equivalence(examples) -> list[str | None]:
    """A gold answer its profile's answer equivalence cannot cluster (an SQL query that
    fails on its database, say) cannot be matched by any response: say so per example."""
    from divrl.evaluation.equivalence import ClusterRequest, cluster_answers

    requests = [ClusterRequest([ex.ground_truth], ex.data_source, ex.extra_info) for ex in examples]
    return [
        "its profile's answer equivalence cannot use it (for SQL: the query fails on its "
        "database or exceeds the verifier's limits)"
        if ids[0] < 0
        else None
        for ids in cluster_answers(requests)
    ]


def _check_lengths(config, examples, result) -> None:
    from divrl.data.check import check_lengths

    if config.model.path is None:
        result.lines.append(
            "prompt lengths: not checked (no model: pass --config with model.path, or "
            "model.path=PATH)"
        )
        return
    tokenizer, context = _tokenizer(str(config.model.path), config.model.trust_remote_code)
    problems_before = len(result.problems)
    kept = check_lengths(examples, tokenizer, config.data, result, context)
    per_step = config.train.prompts_per_step
    if examples and kept == 0 and not result.problems[problems_before:]:
        result.problems.append("no prompt would train with these data.* settings")
    elif 0 < kept < per_step:
        result.lines.append(
            f"only {kept} prompts for train.prompts_per_step={per_step}: every batch repeats "
            "prompts"
        )


def _tokenizer(path: str, trust_remote_code: bool):
    """The model's tokenizer and context length, without loading its weights."""
    from divrl.rollout.model_source import check_model_source

    check_model_source(path)
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    model_config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    context = getattr(model_config, "max_position_embeddings", None)
    return tokenizer, context if isinstance(context, int) and context > 0 else None
