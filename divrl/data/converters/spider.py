"""Spider (https://yale-lily.github.io/spider) to verl-schema examples.

Layout: ``<src>/dev.json`` or ``<src>/train_spider.json`` (a list of objects with
``question``, ``query``, ``db_id``) and ``<src>/database/<db_id>/<db_id>.sqlite``. Rows get
``data_source="spider"`` (test-suite comparison).
"""

from __future__ import annotations

from pathlib import Path

from divrl.data.converters.sql_common import build_examples, read_json_list
from divrl.data.loading import Example

_SPLIT_FILES = {
    "dev": "dev.json",
    "train": "train_spider.json",
    "train_spider": "train_spider.json",
}


def convert(
    src: Path, split: str, *, template: str | None, limit: int | None, seed: int
) -> list[Example]:
    """Examples of Spider's ``split`` (``dev`` or ``train``) under ``src``.

    ``template`` is a ``str.format`` text with ``{schema}``, ``{evidence}``, ``{question}``.
    """
    src = Path(src)
    if split not in _SPLIT_FILES:
        raise ValueError(f"Spider split {split!r}: use one of {sorted(_SPLIT_FILES)}")
    path = src / _SPLIT_FILES[split]
    rows = read_json_list(path, ("question", "query", "db_id"))
    return build_examples(
        rows,
        src=src,
        src_file=path,
        db_for=lambda db_id: Path("database") / db_id / f"{db_id}.sqlite",
        data_source="spider",
        gold_field="query",
        evidence_field=None,
        split=split,
        template=template,
        limit=limit,
        seed=seed,
    )
