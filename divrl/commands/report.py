"""``divrl report RUN_DIR... --base BASE_EVAL_DIR --out REPORT_DIR``: compare runs.

A run may be named by the YAML config it was trained with (the run folder that config
resolves to).

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
        metavar="[NAME=]RUN_DIR[,RUN_DIR...]",
        help="training run directories (with eval/), eval directories, or the YAML configs "
        "the runs were trained with (their logging.output_dir); NAME defaults to the "
        "directory name (a config's file name). Several runs of one method (its seeds): NAME=RUN1,RUN2,RUN3 or "
        "NAME repeated; each seed keeps its row and the method gets a mean ± s.e. row",
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
    parser.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="show models that are not like for like (evaluated at another checkpoint than "
        "the run's last step, on other prompts or with other eval settings, or trained on "
        "other data or data handling) with their rows marked; without it they are refused "
        "(exit code 2)",
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
    if args.allow_mismatch:
        out += ["--allow-mismatch"]
    return out


def _named(spec: str) -> tuple[str | None, str]:
    name, sep, path = spec.partition("=")
    return (name, path) if sep else (None, spec)


def _seeds(specs: list[str]) -> list[tuple[str | None, str, str | None]]:
    """``(row name, path, method)`` per run: ``NAME=A,B`` and a repeated ``NAME`` make the
    runs seeds of the method NAME (rows ``NAME #1``, ``NAME #2``, ...); a path that exists
    with its comma is one run."""
    from pathlib import Path

    listed: list[tuple[str | None, str]] = []
    for spec in specs:
        name, path = _named(spec)
        parts = [path] if Path(path).exists() or "," not in path else path.split(",")
        listed += [(name, p) for p in parts if p]
    counts: dict[str, int] = {}
    for name, _ in listed:
        if name is not None:
            counts[name] = counts.get(name, 0) + 1
    out, seen = [], dict.fromkeys(counts, 0)
    for name, path in listed:
        if name is None or counts[name] == 1:
            out.append((name, path, None))
            continue
        seen[name] += 1
        out.append((f"{name} #{seen[name]}", path, name))
    return out


def _run_of_config(path: str, name: str | None) -> tuple[str, str | None]:
    """A YAML config file stands for its run: the folder ``divrl train`` wrote with it
    (``logging.output_dir``, as the config resolves it), named after the file by default."""
    from pathlib import Path

    if Path(path).suffix not in (".yaml", ".yml") or not Path(path).is_file():
        return path, name
    from divrl.training.config import load_config

    return str(load_config(path, []).logging.output_dir), name or Path(path).stem


def run(args: argparse.Namespace) -> int:
    """Input errors propagate to divrl.cli's handler (one paragraph, exit code 2)."""
    from divrl.cli import UsageError
    from divrl.evaluation.report import build_report, load_model_eval, missing_evals
    from divrl.evaluation.report_checks import check_like_for_like

    runs = []
    for name, path, method in _seeds(args.runs):
        path, name = _run_of_config(path, name)
        runs.append(load_model_eval(path, name))
        runs[-1].group = method
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
    mismatches = check_like_for_like(runs, base)
    if mismatches and not args.allow_mismatch:
        raise UsageError(
            "not like for like: "
            + "; ".join(mismatches)
            + ". Make them alike, or pass --allow-mismatch to show these rows marked"
        )
    for line in mismatches:
        print(f"divrl report: warning: not like for like: {line}", file=sys.stderr)
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
