"""verl's data files for DPH-RL: the exploration prompts of a reference store, and a
prompt id (``extra_info.index``) on every row.

DPH-RL rolls out only the prompts the initial model does not already solve (``D_exp``);
``divrl presample`` records the split in the store. verl reads its training prompts from a
file, so :func:`write_exploration_split` writes that subset of the training file in the
verl schema:

    python -m divrl.integrations.verl.data TRAIN.parquet STORE OUT.parquet

A row's prompt id is its ``id`` column, else ``extra_info.index`` (as ``divrl train``
reads it), so the file must be the one the store was presampled from.

The presample through verl takes each prompt's id from ``extra_info.index`` (verl's
``index``), so every row needs its own; :func:`assign_indexes` (``divrl data index IN
--out OUT``) writes a copy of a file with the missing ones filled in.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from divrl.data.loading import load_examples, write_examples
from divrl.data.reference_store import ReferenceStore


def write_exploration_split(
    train_path: str | Path | Sequence[str | Path],
    store_path: str | Path,
    out_path: str | Path,
    overwrite: bool = False,
) -> int:
    """Write the exploration prompts of ``train_path`` (one file, or verl's list of
    ``data.train_files``) to ``out_path``; their number.

    Raises:
        FileExistsError: ``out_path`` exists and ``overwrite`` is False.
        ValueError: no training prompt is in the store's exploration split (another file).
    """
    out = Path(out_path)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists: pass --overwrite to replace it")
    wanted = ReferenceStore(store_path).exploration_ids
    paths = [train_path] if isinstance(train_path, str | Path) else list(train_path)
    examples = [ex for path in paths for ex in load_examples(path) if str(ex.id) in wanted]
    if not examples:
        raise ValueError(
            f"none of the prompts of {train_path} is in the exploration split of {store_path}: "
            "was the store presampled from this file?"
        )
    write_examples(examples, out)
    return len(examples)


def assign_indexes(src: str | Path, out: str | Path, overwrite: bool = False) -> tuple[int, int]:
    """Write ``src`` (a verl ``.parquet`` or ``.jsonl`` file) to ``out`` with an
    ``extra_info.index`` on every row; ``(rows, indexes assigned)``.

    A row without one gets its ``id`` column when the file has one (the id ``divrl train``
    and the exploration split read first, so every reader names the row alike), else its
    row number in ``src``. The index is written into the file, not computed when verl reads
    it: verl's dataset reads ``extra_info.index`` (0 when missing) after its own row
    selection (``data.max_samples``) and filter (``filter_overlong_prompts``), so a number
    counted there would not be the row number ``divrl train`` and the exploration split
    count in the file; and a hash of the prompt would give two rows that repeat a prompt
    (datasets do) one id. Every other column is written as read. Indexes of mixed types
    (numbers beside ids) are all written as strings (the ids compare as strings anyway).

    Raises:
        FileNotFoundError: no file ``src``.
        FileExistsError: ``out`` exists and ``overwrite`` is False.
        ValueError: two rows share an index (after filling in), naming them; a format
            other than ``.parquet`` / ``.jsonl``.
    """
    src, out = Path(src), Path(out)
    for path in (src, out):
        if path.suffix not in (".parquet", ".jsonl"):
            raise ValueError(f"{path}: divrl data index reads and writes .parquet or .jsonl")
    if not src.is_file():
        raise FileNotFoundError(f"{src}: no such file (the verl data file to index)")
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise FileExistsError(f"{out} exists: pass --overwrite to replace it")
    rows = _read_rows(src)
    extras, assigned, seen = [], 0, {}
    for number, row in enumerate(rows):
        extra = dict(row.get("extra_info") or {})
        if extra.get("index") is None:
            extra["index"] = row["id"] if row.get("id") is not None else number
            assigned += 1
        key = str(extra["index"])
        if key in seen:
            raise ValueError(
                f"rows {seen[key]} and {number} of {src} share extra_info.index {key!r}: "
                "every row needs its own (the presample's prompt id); give one of them "
                "another index, or drop the repeated row"
            )
        seen[key] = number
        extras.append(extra)
    if len({type(e["index"]) for e in extras}) > 1:
        for extra in extras:
            extra["index"] = str(extra["index"])
    _write_rows(src, out, rows, extras, overwrite)
    return len(rows), assigned


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl":
        lines = path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _write_rows(src: Path, out: Path, rows: list, extras: list, overwrite: bool) -> None:
    """``rows`` with ``extras`` as their ``extra_info`` (every other column as read),
    written whole to ``out`` (a temp file renamed)."""
    from divrl.fileio import atomic_path

    with atomic_path(out, replace=overwrite) as tmp:
        if out.suffix == ".jsonl":
            lines = (
                json.dumps({**row, "extra_info": extra}, ensure_ascii=False) + "\n"
                for row, extra in zip(rows, extras, strict=True)
            )
            tmp.write_text("".join(lines), encoding="utf-8")
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        # a parquet source keeps its columns' types: only extra_info is rebuilt
        table = pq.read_table(src) if src.suffix == ".parquet" else pa.Table.from_pylist(rows)
        column, names = pa.array(extras), table.column_names
        if "extra_info" in names:
            table = table.set_column(names.index("extra_info"), "extra_info", column)
        else:
            table = table.append_column("extra_info", column)
        pq.write_table(table, tmp)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("train", help="the training file the store was presampled from")
    ap.add_argument("store", help="the reference store `divrl presample` wrote")
    ap.add_argument("out", help="the exploration prompts, .parquet or .jsonl")
    ap.add_argument("--overwrite", action="store_true", help="replace OUT when it exists")
    args = ap.parse_args(argv)
    n = write_exploration_split(args.train, args.store, args.out, args.overwrite)
    print(f"{n} exploration prompts -> {args.out}")


if __name__ == "__main__":
    main()
