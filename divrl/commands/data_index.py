"""``divrl data index IN --out OUT``: a copy of a verl data file with an ``extra_info.index``
on every row (the prompt id the presample through verl reads), duplicates refused
(:func:`divrl.integrations.verl.data.assign_indexes`; docs/verl.md)."""

from __future__ import annotations

import argparse


def add_index_arguments(sub) -> None:
    index = sub.add_parser(
        "index",
        help="write a copy of a verl data file with extra_info.index on every row",
        description="Write IN to --out with an extra_info.index on every row that lacks one "
        "(its id column when the file has one, else its row number in IN); every other "
        "column as read. Two rows sharing an index are refused, naming them (exit 2).",
    )
    index.add_argument("file", metavar="IN", help="the verl .parquet / .jsonl file (left as it is)")
    index.add_argument(
        "--out", required=True, help="the indexed copy, .parquet or .jsonl (data.train_files)"
    )
    index.add_argument(
        "--overwrite", action="store_true", help="replace --out when that file exists"
    )


def run_index(args: argparse.Namespace) -> int:
    """Input errors propagate to divrl.cli's handler (one line, exit code 2)."""
    from divrl.cli import UsageError
    from divrl.integrations.verl.data import assign_indexes

    try:
        rows, assigned = assign_indexes(args.file, args.out, args.overwrite)
    except (ValueError, FileExistsError) as exc:
        raise UsageError(str(exc)) from exc
    print(f"{args.out}: {rows} rows, extra_info.index assigned to {assigned} of them")
    return 0
