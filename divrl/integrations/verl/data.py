"""DPH-RL's training set for verl: the exploration prompts of a reference store.

DPH-RL rolls out only the prompts the initial model does not already solve (``D_exp``);
``divrl presample`` records the split in the store. verl reads its training prompts from a
file, so this writes that subset of the training file in the verl schema:

    python -m divrl.integrations.verl.data TRAIN.parquet STORE OUT.parquet

A row's prompt id is its ``id`` column, else ``extra_info.index`` (as ``divrl train``
reads it), so the file must be the one the store was presampled from.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

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
