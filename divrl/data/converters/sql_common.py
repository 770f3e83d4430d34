"""Shared by the BIRD and Spider converters: schema prompts from an SQLite file."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from divrl.data.loading import DataValidationError, Example

_EXAMPLE_ROWS = 3
_MAX_EXAMPLE_CHARS = 40

SQL_PROMPT = """Task: you are an SQL expert. Given the SQLite database schema below (with a \
few example values per column) and a question, write one SQLite query that answers it.

Database schema:
{schema}

{evidence}Question:
{question}

Return only the information the question asks for. Think step by step, then give the final \
query in a fenced block:
```sql
-- your query
```"""


def read_json_list(path: Path, required: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows of a JSON list file, each checked to hold the ``required`` fields."""
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path} (is --src the dataset's folder?)")
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataValidationError(path, 0, "file", f"not valid JSON: {e}") from None
    if not isinstance(rows, list):
        raise DataValidationError(path, 0, "file", "expected a JSON list of questions")
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise DataValidationError(path, i, "row", "expected an object")
        for name in required:
            if not isinstance(row.get(name), str) or not row[name].strip():
                raise DataValidationError(path, i, name, "missing or not a non-empty string")
    return rows


def _quote(value: Any) -> str:
    if isinstance(value, str):
        short = value if len(value) <= _MAX_EXAMPLE_CHARS else value[:_MAX_EXAMPLE_CHARS] + "..."
        return "'" + short.replace("'", "''").replace("\n", " ") + "'"
    if isinstance(value, bytes):
        return "<blob>"
    return repr(value)


def schema_prompt(db_path: Path) -> str:
    """``CREATE TABLE`` statements with example values of each column as comments."""
    from divrl.rewards.sql.database import connect_readonly

    conn = connect_readonly(str(db_path))
    conn.set_authorizer(None)  # the schema table and PRAGMA-free reads are ours
    try:
        tables = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' "
            "AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
        ).fetchall()
        parts = []
        for name, create in tables:
            quoted = '"' + name.replace('"', '""') + '"'
            cur = conn.execute(f"SELECT * FROM {quoted} LIMIT {_EXAMPLE_ROWS}")
            columns = [d[0] for d in cur.description]
            rows = cur.fetchall()
            examples = "\n".join(
                f"-- {col}: example values [{', '.join(_quote(r[i]) for r in rows)}]"
                for i, col in enumerate(columns)
            )
            parts.append(f"{create.strip()};\n{examples}")
        return "\n\n".join(parts)
    finally:
        conn.close()


def database_path(src: Path, relative: Path, src_file: Path, row: int) -> Path:
    """``src / relative`` resolved (symlinks followed), refused unless it stays inside
    ``src``: a ``db_id`` read from the benchmark's JSON names a database of the
    benchmark, never another file on the machine."""
    db_id = relative.parts[-1] if relative.parts else ""
    if relative.is_absolute() or ".." in relative.parts:
        raise DataValidationError(
            src_file, row, "db_id", f"{str(relative)!r} must be a database name, not a path"
        )
    root, resolved = src.resolve(), (src / relative).resolve()
    if root not in resolved.parents:
        raise DataValidationError(
            src_file,
            row,
            "db_id",
            f"{src / relative} resolves to {resolved}, outside --src {src} (a symbolic "
            f"link?); copy the database of {db_id!r} into --src",
        )
    return resolved


def _db_id(row: dict[str, Any], src_file: Path, i: int) -> str:
    db_id = row.get("db_id")
    if not isinstance(db_id, str) or not db_id.strip() or "/" in db_id or "\\" in db_id:
        raise DataValidationError(
            src_file, i, "db_id", f"{db_id!r} must be a database name, not a path"
        )
    if db_id in (".", ".."):
        raise DataValidationError(src_file, i, "db_id", f"{db_id!r} is not a database name")
    return db_id


def _schema(db_path: Path, src_file: Path, i: int, schemas: dict[Path, str]) -> str:
    """The schema prompt of ``db_path`` (cached); a file that is no readable SQLite
    database is an error naming the row that points to it."""
    import sqlite3

    from divrl.rewards.sql.database import check_sqlite_file

    if db_path not in schemas:
        try:
            check_sqlite_file(db_path)
            schemas[db_path] = schema_prompt(db_path)
        except (ValueError, sqlite3.Error) as e:
            raise DataValidationError(
                src_file, i, "db_id", f"{db_path}: damaged or not an SQLite 3 database ({e})"
            ) from None
    return schemas[db_path]


def _evidence(row: dict[str, Any], field: str | None, src_file: Path, i: int) -> str:
    value = row.get(field) if field else None
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataValidationError(
            src_file, i, field, f"must be a string (or absent), got {type(value).__name__}"
        )
    return value.strip()


def build_examples(
    rows: list[dict[str, Any]],
    *,
    src: Path,
    src_file: Path,
    db_for: Any,
    data_source: str,
    gold_field: str,
    evidence_field: str | None,
    split: str,
    template: str | None,
    limit: int | None,
    seed: int,
) -> list[Example]:
    """Examples in file order (shuffled by ``seed`` before ``limit`` when one is given).
    ``db_for(db_id)`` is a database's path relative to ``src``."""
    from divrl.data.converters import format_prompt

    order = list(range(len(rows)))
    if limit is not None:
        random.Random(seed).shuffle(order)
        order = sorted(order[:limit])
    schemas: dict[Path, str] = {}
    examples = []
    for i in order:
        row = rows[i]
        db_id = _db_id(row, src_file, i + 1)
        db_path = database_path(src, db_for(db_id), src_file, i + 1)
        if not db_path.is_file():
            raise DataValidationError(src_file, i + 1, "db_id", f"no database at {db_path}")
        evidence = _evidence(row, evidence_field, src_file, i + 1)
        fields = {
            "schema": _schema(db_path, src_file, i + 1, schemas),
            "evidence": f"External knowledge:\n{evidence}\n\n" if evidence else "",
            "question": row["question"].strip(),
        }
        prompt = format_prompt(template or SQL_PROMPT, src_file, **fields)
        examples.append(
            Example(
                id=f"{data_source}-{split}-{i}",
                prompt=[{"role": "user", "content": prompt}],
                data_source=data_source,
                ground_truth=row[gold_field].strip(),
                extra_info={"index": i, "db_id": db_id, "db_path": str(db_path)},
            )
        )
    return examples
