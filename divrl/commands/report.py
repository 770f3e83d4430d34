"""``divrl report RUN_DIR... --base BASE_EVAL_DIR --out REPORT_DIR``: compare runs.

A run directory holds ``metrics.jsonl`` (``divrl train``) and its evaluation in ``eval/``
(``divrl eval --out RUN_DIR/eval``); an eval directory alone works too. Writes
``report.md``, ``report.html`` and PNG plots. See docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="[NAME=]RUN_DIR",
        help="training run directories (with eval/) or eval directories; NAME defaults to "
        "the directory name",
    )
    parser.add_argument("--base", help="eval directory of the base model ([NAME=]DIR)")
    parser.add_argument("--out", required=True, help="report directory")
    parser.add_argument("--title", default="divrl report", help="report title")
    parser.add_argument(
        "--spark-words",
        default="",
        help="comma-separated words whose probability is plotted over each run's "
        "checkpoints (e.g. ' wait, however'); loads every checkpoint",
    )
    parser.add_argument(
        "--spark-split",
        help="eval set whose base responses are the contexts (default: the first eval set)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit code 2) when a model lacks an eval set that another model has; "
        "without it that is a warning on stderr and in the report",
    )


def _argv(args: argparse.Namespace) -> list[str]:
    """The command line as given (for the report's provenance line)."""
    out = [*args.runs, *(["--base", args.base] if args.base else []), "--out", args.out]
    if args.title != "divrl report":
        out += ["--title", args.title]
    if args.spark_words:
        out += ["--spark-words", args.spark_words]
    if args.spark_split:
        out += ["--spark-split", args.spark_split]
    if args.strict:
        out += ["--strict"]
    return out


def _named(spec: str) -> tuple[str | None, str]:
    name, sep, path = spec.partition("=")
    return (name, path) if sep else (None, spec)


def run(args: argparse.Namespace) -> int:
    """Input errors propagate to divrl.cli's handler (one paragraph, exit code 2)."""
    from divrl.cli import UsageError
    from divrl.evaluation.report import build_report, load_model_eval, missing_evals

    runs = [load_model_eval(path, name) for name, path in map(_named, args.runs)]
    base = None
    if args.base:
        name, path = _named(args.base)
        base = load_model_eval(path, name or "base")
    names = [m.name for m in runs] + ([base.name] if base else [])
    if len(set(names)) != len(names):
        raise UsageError(f"model names must differ, got {names}; use NAME=DIR")
    missing = missing_evals(([base] if base else []) + runs)
    if missing and args.strict:
        raise UsageError("--strict: " + "; ".join(missing))
    for line in missing:
        print(f"divrl report: warning: {line}", file=sys.stderr)
    words = [w for w in args.spark_words.split(",") if w.strip()]
    path = build_report(
        runs,
        base,
        args.out,
        title=args.title,
        spark_words=words,
        spark_split=args.spark_split,
        command="divrl report " + shlex.join(_argv(args)),
    )
    print(f"report: {path} (and {path.with_suffix('.html')}, self-contained)")
    return 0
