"""BIRD (https://bird-bench.github.io) to verl-schema examples.

Layout: ``<src>/<split>.json`` (a list of objects with ``question``, ``evidence``, ``SQL``,
``db_id``) and ``<src>/<split>_databases/<db_id>/<db_id>.sqlite``. Rows get
``data_source="bird"`` (BIRD's set comparison, 30 s per query).
"""

from __future__ import annotations

from pathlib import Path

from divrl.data.converters.sql_common import build_examples, read_json_list
from divrl.data.loading import Example


def convert(
    src: Path, split: str, *, template: str | None, limit: int | None, seed: int
) -> list[Example]:
    """Examples of BIRD's ``split`` (``dev`` or ``train``) under ``src``.

    ``template`` is a ``str.format`` text with ``{schema}``, ``{evidence}``, ``{question}``.
    """
    src = Path(src)
    rows = read_json_list(src / f"{split}.json", ("question", "SQL", "db_id"))
    return build_examples(
        rows,
        src=src,
        src_file=src / f"{split}.json",
        db_for=lambda db_id: Path(f"{split}_databases") / db_id / f"{db_id}.sqlite",
        data_source="bird",
        gold_field="SQL",
        evidence_field="evidence",
        split=split,
        template=template,
        limit=limit,
        seed=seed,
    )
