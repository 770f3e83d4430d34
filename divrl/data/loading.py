"""Load and write RLVR examples in the verl schema (JSONL, Parquet, ``datasets`` dirs).

verl schema, one row per prompt::

    {"data_source": "gsm8k",
     "prompt": [{"role": "user", "content": "..."}],      # or a plain string
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"index": 0, "db_path": "...", ...}}    # optional

Flat form: ``{"question": "...", "answer": "...", "data_source": "math"}`` (``data_source``
defaults to ``math``; ``db_path``/``db_id`` may sit at the top level).

SQL rows need a database: ``extra_info.db_path`` (absolute, or relative to ``db_dir`` or
to the data file's folder) or ``extra_info.db_id`` with ``db_dir`` (Spider/BIRD layout
``<db_dir>/<db_id>/<db_id>.sqlite`` or ``<db_dir>/<db_id>.sqlite``). Loaded examples
always carry an absolute ``extra_info["db_path"]``.
"""

from __future__ import annotations

import codecs
import json
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_DB_SUFFIXES = (".sqlite", ".db", ".sqlite3")


@dataclass
class Example:
    """One prompt with what is needed to score completions of it."""

    id: str = field(metadata={"help": "stable identifier (extra_info.index, id, or <stem>-<row>)"})
    prompt: str | list[dict[str, Any]] = field(
        metadata={"help": "prompt text, or chat messages [{'role', 'content'}]"}
    )
    data_source: str = field(metadata={"help": "verifier name for divrl.rewards.compute_score"})
    ground_truth: str = field(metadata={"help": "reference answer (math) or gold query (SQL)"})
    extra_info: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "per-example settings, e.g. db_path for SQL"}
    )


class DataFileError(ValueError):
    """A data file that cannot be read as rows at all (format, encoding, JSON, shape); the
    message names the file and, where it can, the line."""


class DataValidationError(ValueError):
    """A row failed validation; the message names the file, the row (1-based) and the field."""

    def __init__(self, path: Path | str, row: int, fieldname: str, message: str):
        super().__init__(f"{path}: row {row}: field {fieldname!r}: {message}")
        self.path = str(path)
        self.row = row
        self.field = fieldname


class LoadedExamples(list):
    """The list of examples returned by :func:`load_examples`, with load statistics.

    ``n_rows``: rows read; ``n_skipped``: invalid rows skipped (``skip_invalid=True``);
    ``errors``: their messages (first 100). Rows sharing an id are refused, or listed in
    ``duplicate_ids`` (id -> its 1-based rows) with ``refuse_duplicates=False``.
    """

    def __init__(self, examples: Iterable[Example] = ()):
        super().__init__(examples)
        self.n_rows = 0
        self.n_skipped = 0
        self.errors: list[str] = []
        self.duplicate_ids: dict[str, list[int]] = {}


def load_examples(
    path: str | Path,
    *,
    db_dir: str | Path | None = None,
    skip_invalid: bool = False,
    limit: int | None = None,
    refuse_duplicates: bool = True,
) -> list[Example]:
    """Read and validate examples from a JSONL file, a Parquet file or a ``datasets`` dir.

    Every row is validated before anything is returned (prompt present, ground truth a
    string or number, data source registered, SQL database found). A bad row raises
    :class:`DataValidationError` naming the file, the 1-based row number and the field;
    with ``skip_invalid=True`` it is logged and counted instead (see
    :class:`LoadedExamples`). ``limit`` keeps the first ``limit`` valid examples. Rows
    sharing an id raise too, unless ``refuse_duplicates=False`` (``divrl data check``,
    which lists them).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file not found: {path}")
    from divrl.rewards import get_verifier  # the registry validates data_source

    out, rows_of = LoadedExamples(), defaultdict(list)
    for row_no, row in _iter_rows(path):
        if limit is not None and len(out) >= limit:
            break
        out.n_rows += 1
        try:
            out.append(_to_example(row, path, row_no, db_dir, get_verifier))
            rows_of[out[-1].id].append(row_no)
        except DataValidationError as e:
            if not skip_invalid:
                raise
            out.n_skipped += 1
            if len(out.errors) < 100:
                out.errors.append(str(e))
    duplicates = sorted(i for i, rows in rows_of.items() if len(rows) > 1)
    out.duplicate_ids = {i: rows_of[i] for i in duplicates}
    if duplicates and refuse_duplicates:
        _refuse_duplicates(path, duplicates, rows_of)
    if out.n_skipped:
        logger.warning(
            "%s: skipped %d invalid row(s) of %d; first: %s",
            path,
            out.n_skipped,
            out.n_rows,
            out.errors[0],
        )
    return out


def _iter_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(1-based row number, row); for JSONL the row number is the line number."""
    if path.is_dir():
        yield from enumerate(_iter_dataset_dir(path), start=1)
    elif path.suffix == ".jsonl":
        yield from _iter_jsonl(path)
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        def rows():
            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                yield from batch.to_pylist()

        yield from enumerate(rows(), start=1)
    elif path.suffix == ".json":
        yield from enumerate(_read_json_list(path), start=1)
    else:
        raise DataFileError(
            f"{path}: unsupported data format {path.suffix!r}; use .jsonl, .json, .parquet "
            "or a directory written by datasets' save_to_disk"
        )


def _read_json_list(path: Path) -> list:
    """The rows of a ``.json`` data file: one JSON list (a UTF-8 byte-order mark is allowed).

    Raises:
        DataFileError: the file is not UTF-8, not JSON, too deeply nested or not a list
            (one line naming the file and where).
    """
    raw = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataFileError(
            f"{path}: invalid UTF-8 ({e.reason}) at byte {e.start + 1} (line {line}): save "
            "the file as UTF-8"
        ) from None
    try:
        data = json.loads(text, parse_float=_JsonFloat, parse_int=_json_int)
    except json.JSONDecodeError as e:
        raise DataFileError(
            f"{path}: invalid JSON at line {e.lineno} column {e.colno} ({e.msg}): a .json data "
            "file holds one JSON list of rows (or use .jsonl, one row per line)"
        ) from None
    except RecursionError:
        raise DataFileError(f"{path}: the JSON is nested too deeply to read") from None
    if not isinstance(data, list):
        raise DataFileError(
            f"{path}: a .json data file must hold a JSON list of rows, not a "
            f"{type(data).__name__}; put the rows in [...] (or use .jsonl, one row per line)"
        )
    return data


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """Rows of a JSONL file; a line that does not decode (invalid UTF-8, invalid JSON,
    nesting deeper than :data:`MAX_JSON_DEPTH`) becomes a :class:`_BadJson` naming its byte
    column, so that ``skip_invalid`` can skip it. Numbers keep their text (see
    :class:`_JsonFloat`); integers too long for ``int()`` (over 4300 digits) stay text."""
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue  # blank lines (e.g. a trailing newline) are not rows
            if line_no == 1:  # a UTF-8 byte-order mark (editors on Windows) is not JSON
                raw = raw.removeprefix(codecs.BOM_UTF8)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield line_no, _BadJson(f"invalid UTF-8 ({e.reason}) at byte column {e.start + 1}")
                continue
            try:
                row = json.loads(line, parse_float=_JsonFloat, parse_int=_json_int)
            except json.JSONDecodeError as e:
                column = len(line[: e.pos].encode("utf-8")) + 1
                yield line_no, _BadJson(f"invalid JSON ({e.msg} at byte column {column})")
                continue
            except RecursionError:
                row = None
            if row is None or _json_depth(row) > MAX_JSON_DEPTH:
                message = f"nested more than {MAX_JSON_DEPTH} levels deep"
                yield line_no, _BadJson(message, _deep_field(line))
                continue
            yield line_no, row


#: Deepest nesting a JSONL row may have (rows are a few levels deep; a 100k-deep
#: ``extra_info`` would crash any recursive reader later).
MAX_JSON_DEPTH = 64


class _JsonFloat(float):
    """A JSON number with a fraction or exponent that remembers its text, so that a ground
    truth ``1e300`` stays ``"1e300"`` (not a 301-digit integer)."""

    def __new__(cls, text: str) -> _JsonFloat:
        number = super().__new__(cls, text)
        number.text = text
        return number


def _json_int(text: str) -> int | str:
    # int() refuses more than sys.get_int_max_str_digits() (4300) digits: keep the text
    try:
        return int(text)
    except ValueError:
        return text


def _deep_field(line: str) -> str:
    """The top-level key of a JSON object line whose value nests deepest (a scan of the
    text, so that it works where json.loads hits the recursion limit)."""
    depth, in_string, escaped, start, last_string = 0, False, False, 0, ""
    key, deepest, worst = "<row>", 0, "<row>"
    for i, ch in enumerate(line):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string, last_string = False, line[start:i]
        elif ch == '"':
            in_string, start = True, i + 1
        elif ch == ":" and depth == 1:
            key = last_string
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest, worst = depth, key
        elif ch in "]}":
            depth -= 1
    return worst


def _json_depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value (iterative: no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:
                children = item.values() if isinstance(item, dict) else item
                stack.extend((child, depth + 1) for child in children)
    return deepest


def _iter_dataset_dir(path: Path) -> Iterator[Any]:
    import datasets

    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        raise ValueError(
            f"{path} is a DatasetDict with splits {list(ds)}; pass the split's directory, "
            f"e.g. {path / next(iter(ds))}"
        )
    yield from ds


class _BadJson:
    def __init__(self, message: str, field: str = "<row>"):
        self.message = message
        self.field = field


def _to_example(row: Any, path: Path, row_no: int, db_dir, get_verifier) -> Example:
    def fail(fieldname: str, message: str) -> DataValidationError:
        return DataValidationError(path, row_no, fieldname, message)

    if isinstance(row, _BadJson):
        raise fail(row.field, row.message)
    if not isinstance(row, dict):
        raise fail("<row>", f"expected an object, got {type(row).__name__}")

    extra = row.get("extra_info")
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise fail("extra_info", f"expected an object, got {type(extra).__name__}")
    # Parquet fills keys missing in some rows with nulls: drop them
    extra = {k: v for k, v in extra.items() if v is not None}

    if "prompt" in row or "reward_model" in row:
        prompt = _check_prompt(row.get("prompt"), fail)
        rm = row.get("reward_model")
        if not isinstance(rm, dict) or "ground_truth" not in rm:
            raise fail("reward_model.ground_truth", "missing (verl schema needs it)")
        gt = _check_answer(rm["ground_truth"], "reward_model.ground_truth", fail)
        data_source = row.get("data_source")
        if not isinstance(data_source, str) or not data_source:
            raise fail("data_source", "missing or not a string")
    elif "question" in row:
        prompt = _check_prompt(row.get("question"), fail, name="question")
        if "answer" not in row:
            raise fail("answer", "missing (flat form needs question and answer)")
        gt = _check_answer(row["answer"], "answer", fail)
        data_source = row.get("data_source") or "math"
        if not isinstance(data_source, str):
            raise fail("data_source", "not a string")
        for key in ("db_path", "db_id"):
            if row.get(key) is not None:
                extra.setdefault(key, row[key])
    else:
        raise fail(
            "prompt", "missing: rows need 'prompt' + 'reward_model' or 'question' + 'answer'"
        )

    try:
        get_verifier(data_source)
    except ValueError as e:
        raise fail("data_source", str(e)) from None

    if "answer_pattern" in extra:
        from divrl.rewards.math_reward import check_answer_pattern

        try:
            check_answer_pattern(extra["answer_pattern"])
        except ValueError as e:
            raise fail("extra_info.answer_pattern", str(e)) from None

    from divrl.profiles import get_profile

    profile = get_profile(data_source)
    needs_db = profile is not None and profile.needs_database
    if needs_db or "db_path" in extra or "db_id" in extra:
        extra["db_path"] = _resolve_db(extra, path, db_dir, fail)

    return Example(
        id=_row_id(row, extra, path, row_no),
        prompt=prompt,
        data_source=data_source,
        ground_truth=gt,
        extra_info=extra,
    )


def _check_prompt(prompt: Any, fail, name: str = "prompt"):
    if isinstance(prompt, str):
        if not prompt.strip():
            raise fail(name, "empty")
        return prompt
    if isinstance(prompt, list | tuple) and prompt:
        messages = []
        for j, m in enumerate(prompt):
            if not isinstance(m, dict) or not isinstance(m.get("content"), str):
                raise fail(f"{name}[{j}]", "chat messages need a string 'content'")
            if not isinstance(m.get("role"), str):
                raise fail(f"{name}[{j}]", "chat messages need a string 'role'")
            messages.append({"role": m["role"], "content": m["content"]})
        return messages
    if prompt is None:
        raise fail(name, "missing")
    raise fail(name, f"expected a string or a non-empty list of chat messages, got {prompt!r:.80}")


def _check_answer(value: Any, name: str, fail) -> str:
    if isinstance(value, bool) or value is None:
        raise fail(name, f"expected a string or a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise fail(name, f"not a finite number: {value!r}")
    if isinstance(value, int):  # any size: float(int) overflows past 308 digits
        return str(value)
    if isinstance(value, float):
        if isinstance(value, _JsonFloat):  # a JSONL number: the row's own text
            return value.text
        return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
    if isinstance(value, str):
        if not value.strip():
            raise fail(name, "empty")
        return value
    raise fail(name, f"expected a string or a number, got {type(value).__name__}")


def _resolve_db(extra: dict, path: Path, db_dir, fail) -> str:
    """Absolute path of the example's database: ``db_path`` first, then ``db_id``.

    A ``db_path`` that does not exist (e.g. written on another machine) is not fatal when
    ``db_id`` and ``db_dir`` can find the database instead.
    """
    bases = [Path(db_dir)] if db_dir is not None else []
    bases.append(path.parent if not path.is_dir() else path)
    tried: list[Path] = []
    if extra.get("db_path"):
        p = Path(str(extra["db_path"])).expanduser()
        tried += [p] if p.is_absolute() else [b / p for b in bases]
    db_id = str(extra["db_id"]) if extra.get("db_id") else None
    if db_id is not None and db_dir is not None:
        tried += [
            Path(db_dir) / sub / f"{db_id}{suf}" for sub in (db_id, "") for suf in _DB_SUFFIXES
        ]
    for candidate in tried:
        if candidate.is_file():
            from divrl.rewards.sql.database import check_sqlite_file

            try:
                check_sqlite_file(candidate)
            except ValueError as e:
                raise fail("extra_info.db_path", str(e)) from None
            return str(candidate.resolve())
    if extra.get("db_path"):
        raise fail("extra_info.db_path", f"database not found (tried {', '.join(map(str, tried))})")
    if db_id is not None:
        if db_dir is None:
            raise fail(
                "extra_info.db_id", f"db_id {db_id!r} given but no database directory (db_dir)"
            )
        raise fail(
            "extra_info.db_id",
            f"no database for {db_id!r} under {db_dir} (looked for <db_id>/<db_id>.sqlite, "
            "<db_id>.sqlite, .db, .sqlite3)",
        )
    raise fail("extra_info.db_path", "SQL examples need extra_info.db_path or extra_info.db_id")


def _refuse_duplicates(path: Path, duplicates: list[str], rows_of: dict[str, list]) -> None:
    """An id names one prompt: training splits prompts by id (DPH-RL's near-perfect set,
    the reference samples) and evaluation and scoring match completions by id."""
    first = min(duplicates, key=lambda i: rows_of[i][1])
    shown = "; ".join(
        f"{i!r} (rows {', '.join(map(str, rows_of[i][:4]))}{', ...' if len(rows_of[i]) > 4 else ''})"
        for i in duplicates[:5]
    )
    more = f" and {len(duplicates) - 5} more" if len(duplicates) > 5 else ""
    raise DataValidationError(
        path,
        rows_of[first][1],
        "id",
        f"{len(duplicates)} id(s) are used by several rows: {shown}{more}. Give every row a "
        "unique top-level 'id' (or extra_info.index); `divrl data convert` writes unique ids",
    )


def _row_id(row: dict, extra: dict, path: Path, row_no: int) -> str:
    for value in (row.get("id"), extra.get("index")):
        if value is not None and not isinstance(value, bool):
            return str(value)
    stem = path.name if path.is_dir() else path.stem
    return f"{stem}-{row_no}"


def example_to_row(ex: Example) -> dict[str, Any]:
    """The verl-schema row for an example (``id`` kept as an extra top-level column)."""
    return {
        "id": ex.id,
        "data_source": ex.data_source,
        "prompt": ex.prompt,
        "reward_model": {"style": "rule", "ground_truth": ex.ground_truth},
        "extra_info": dict(ex.extra_info),
    }


def write_examples(examples: Sequence[Example], path: str | Path) -> Path:
    """Write examples in the verl schema; the format follows the suffix (.jsonl/.parquet).

    Parquet needs one prompt type per column: when string and chat prompts are mixed,
    string prompts are written as a single user message.
    """
    path = Path(path)
    rows = [example_to_row(ex) for ex in examples]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        with path.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        if len({isinstance(r["prompt"], str) for r in rows}) > 1:
            for r in rows:
                if isinstance(r["prompt"], str):
                    r["prompt"] = [{"role": "user", "content": r["prompt"]}]
        if rows and not any(r["extra_info"] for r in rows):
            for r in rows:
                r["extra_info"] = None  # an all-empty struct column is not writable
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        raise ValueError(
            f"{path}: write_examples supports .jsonl and .parquet, not {path.suffix!r}"
        )
    return path
