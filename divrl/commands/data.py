"""``divrl data convert``: official benchmark layouts to verl-schema files; ``divrl data
check``: what a data file holds and what training would make of it.

``divrl data convert <name> --src <dir> --split <split> --out <file.parquet|jsonl>
[--template T] [--limit N] [--seed S]``; the converters are the benchmark profiles'
(:func:`divrl.data.converters.converter_names`; the profile table of docs/rewards.md) and
docs/data.md. ``divrl data check FILE [--config CONFIG] [KEY=VALUE ...]``: docs/data.md,
"Checking a file". ``divrl data index FILE --out OUT``: a verl file with an
``extra_info.index`` on every row (docs/verl.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from divrl.cli import seed_int
from divrl.data.converters import converter_names, get_converter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    convert = sub.add_parser(
        "convert",
        help="convert a benchmark's official files to verl-schema rows",
        description="Convert a benchmark's official files to verl-schema rows (docs/data.md).",
    )
    convert.add_argument("name", choices=converter_names(), help="which benchmark layout")
    convert.add_argument("--src", required=True, help="the benchmark's folder, as shipped")
    convert.add_argument("--split", required=True, help="split to convert, e.g. train, dev, test")
    convert.add_argument(
        "--out",
        required=True,
        help="output file: .jsonl or .parquet, outside --src (an existing file is refused "
        "unless --overwrite)",
    )
    convert.add_argument(
        "--overwrite", action="store_true", help="replace --out when that file exists"
    )
    convert.add_argument(
        "--template",
        default=None,
        help="prompt wording: a str.format string with the converter's fields (e.g. "
        "'{problem}' for math, '{question}' for gsm8k), or @FILE to read it from a file",
    )
    convert.add_argument(
        "--limit", type=int, default=None, help="keep a random sample of N rows (source order)"
    )
    convert.add_argument("--seed", type=seed_int, default=0, help="seed of the --limit sample")
    from divrl.commands.data_check import add_check_arguments
    from divrl.commands.data_index import add_index_arguments

    add_check_arguments(sub)
    add_index_arguments(sub)


def run(args: argparse.Namespace) -> int:
    if args.data_command == "check":
        from divrl.commands.data_check import run_check

        return run_check(args)
    if args.data_command == "index":
        from divrl.commands.data_index import run_index

        return run_index(args)
    out = Path(args.out)
    if out.suffix not in (".jsonl", ".parquet"):
        print(f"divrl data: --out must end in .jsonl or .parquet, got {out}", file=sys.stderr)
        return 2
    if args.limit is not None and args.limit < 0:
        print(f"divrl data: --limit must be >= 0, got {args.limit}", file=sys.stderr)
        return 2
    src = Path(args.src)
    if not src.is_dir():
        print(f"divrl data: --src {src} is not a folder", file=sys.stderr)
        return 2
    refused = _refuse_out(out, src, args.overwrite)
    if refused:
        print(f"divrl data: {refused}", file=sys.stderr)
        return 2
    template = args.template
    if template is not None and template.startswith("@"):
        try:
            template = Path(template[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            print(
                f"divrl data: --template {template}: cannot read it as UTF-8 text ({e})",
                file=sys.stderr,
            )
            return 2
    try:
        examples = get_converter(args.name).convert(
            src, args.split, template=template, limit=args.limit, seed=args.seed
        )
    except ValueError as e:  # LayoutError and template errors name the file and field
        print(f"divrl data: {e}", file=sys.stderr)
        return 2
    if not examples:
        print(f"divrl data: {src} has no rows for split {args.split!r}", file=sys.stderr)
        return 2
    try:
        _write_atomically(examples, out, args.overwrite)
    except FileExistsError:
        print(
            f"divrl data: {out} appeared while converting; pass --overwrite to replace it",
            file=sys.stderr,
        )
        return 2
    sources = sorted({ex.data_source for ex in examples})
    print(f"wrote {len(examples)} examples ({', '.join(sources)}) to {out}")
    return 0


def _refuse_out(out: Path, src: Path, overwrite: bool) -> str | None:
    """Why ``out`` may not be written (None: it may): it is (or links to) a file of the
    benchmark's folder ``src``, or it exists and ``overwrite`` is not set."""
    target, root = out.resolve(), src.resolve()
    inside = target == root or root in target.parents
    if inside and (target.exists() or out.is_symlink()):
        return (
            f"--out {out} is (or links to) a file of the benchmark's folder --src {src}; "
            "write the converted rows outside it"
        )
    if target.is_dir():
        return f"--out {out} is a folder; name a .jsonl or .parquet file"
    if (out.exists() or out.is_symlink()) and not overwrite:
        return f"--out {out} exists; pass --overwrite to replace it, or choose another file"
    return None


def _write_atomically(examples, out: Path, overwrite: bool) -> None:
    """Write beside ``out`` and rename: an interrupted run never leaves half a file, and
    without ``overwrite`` a file created at ``out`` meanwhile is kept (FileExistsError)."""
    from divrl.data import write_examples
    from divrl.fileio import atomic_path

    with atomic_path(out, replace=overwrite) as tmp:
        write_examples(examples, tmp)
