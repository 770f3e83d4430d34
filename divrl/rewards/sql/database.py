"""Opening dataset databases read-only and running one query under limits.

How a database is opened (measured, see docs/rewards.md): ``mode=ro`` on a WAL-mode file
creates ``-shm``/``-wal`` files beside it and fails on read-only media; ``immutable=1``
never writes anything and works on read-only media, but ignores a ``-wal`` file, so on a
WAL database whose ``-wal`` still holds committed pages it answers from stale data (a
table created in the WAL is missing). So: ``immutable=1`` unless the file is in WAL mode
with a non-empty ``-wal`` beside it; then a private, checkpointed copy in the temp folder
(one per database version, shared by workers, made atomically) is opened instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from typing import Any
from urllib.parse import quote

SQLITE_HEADER = b"SQLite format 3\x00"
_MAX_VALUE_BYTES = 1_000_000
_FETCH_CHUNK = 1024
_ALLOWED_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}
_READ_STATEMENTS = {"select", "with", "values"}


class QueryError(Exception):
    """A query failed; ``reason`` is the ScoreResult reason."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def check_sqlite_file(path: str | os.PathLike) -> None:
    """Raise ``ValueError`` unless ``path`` is a readable SQLite 3 database file.

    Reads the 16-byte header only; the data loader calls this for every ``db_path``.
    """
    try:
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as e:
        raise ValueError(f"cannot read SQL database {str(path)!r}: {e.strerror}") from None
    if header != SQLITE_HEADER:
        raise ValueError(
            f"{str(path)!r} is not an SQLite 3 database (its first bytes are not "
            "'SQLite format 3'); point db_path at the .sqlite file"
        )


def _pending_wal(path: str) -> bool:
    """True for a WAL-mode database whose -wal file holds data."""
    try:
        with open(path, "rb") as f:
            header = f.read(20)
        return header[18:20] == b"\x02\x02" and os.path.getsize(path + "-wal") > 0
    except OSError:
        return False


def _private_copy(path: str) -> str:
    """A checkpointed copy of a WAL database (with its -wal) in the temp folder."""
    st, wst = os.stat(path), os.stat(path + "-wal")
    key = f"{path}|{st.st_mtime_ns}|{st.st_size}|{wst.st_mtime_ns}|{wst.st_size}"
    folder = os.path.join(tempfile.gettempdir(), f"divrl-sql-copies-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    target = os.path.join(folder, hashlib.sha256(key.encode()).hexdigest()[:32] + ".sqlite")
    if os.path.exists(target):
        return target
    work = tempfile.mkdtemp(dir=folder)
    try:
        tmp = os.path.join(work, "db.sqlite")
        shutil.copyfile(path, tmp)
        shutil.copyfile(path + "-wal", tmp + "-wal")
        conn = sqlite3.connect(tmp)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("PRAGMA journal_mode=DELETE")
        finally:
            conn.close()
        os.replace(tmp, target)  # atomic: concurrent workers never see half a copy
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _authorizer(action: int, arg1: Any, arg2: Any, db_name: Any, trigger: Any) -> int:
    if action not in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() == "load_extension":
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _decode_replace(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _decode_ignore(raw: bytes) -> str:
    return raw.decode("utf-8", "ignore")


# How TEXT that is not valid UTF-8 (Spider's wta_1 has some) reads: "replace" puts U+FFFD
# in place of the bad bytes, "ignore" drops them (test-suite's connection), "strict" makes
# the query fail (sqlite3's default ``str``, BIRD's connection).
_TEXT_FACTORIES = {"replace": _decode_replace, "ignore": _decode_ignore, "strict": str}
_UNDECODABLE = "could not decode to utf-8"


def connect_readonly(db_path: str, text_errors: str = "replace") -> sqlite3.Connection:
    """A read-only, locked-down connection that never writes beside the database.

    ``text_errors`` (``replace``, ``ignore`` or ``strict``) says how TEXT that is not
    valid UTF-8 is read.
    """
    if text_errors not in _TEXT_FACTORIES:
        raise ValueError(f"text_errors={text_errors!r}; use one of {sorted(_TEXT_FACTORIES)}")
    path = os.path.abspath(db_path)
    if _pending_wal(path):
        path = _private_copy(path)
    uri = f"file:{quote(path)}?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    conn.text_factory = _TEXT_FACTORIES[text_errors]
    conn.execute("PRAGMA query_only = ON")
    if hasattr(conn, "setlimit"):
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.set_authorizer(_authorizer)
    return conn


def row_bytes(row: tuple) -> int:
    """Approximate memory held by one result row (the tuple and its values)."""
    return sys.getsizeof(row) + sum(sys.getsizeof(v) for v in row)


def run_query(
    db_path: str,
    sql: str,
    deadline: float,
    max_rows: int,
    max_bytes: int | None = None,
    *,
    text_errors: str = "replace",
) -> list[tuple]:
    """Execute one read-only statement with a wall-clock deadline, a row and a byte limit.

    ``text_errors`` is :func:`connect_readonly`'s; with ``strict`` a result holding TEXT
    that is not UTF-8 raises ``sql_error``.

    Raises :class:`QueryError` with reason ``timeout``, ``too_many_rows``, ``forbidden``
    or ``sql_error``. ``MemoryError`` is not caught: the caller decides (it is not the
    model's fault when the worker is short of memory).
    """
    from divrl.rewards.sql.statements import first_keyword

    word = first_keyword(sql)
    if word not in _READ_STATEMENTS:
        raise QueryError("forbidden", f"{word.upper() or 'empty'} statement: only queries run")
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError:
        raise QueryError("sql_error", "the query holds invalid text (a lone surrogate)") from None
    conn = connect_readonly(db_path, text_errors)
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    try:
        cur = conn.execute(sql)
        rows: list[tuple] = []
        size = 0
        while True:
            chunk = cur.fetchmany(_FETCH_CHUNK)
            if not chunk:
                return rows
            rows.extend(chunk)
            if len(rows) > max_rows:
                raise QueryError("too_many_rows", f"more than {max_rows} rows")
            if max_bytes is not None:
                size += sum(row_bytes(r) for r in chunk)
                if size > max_bytes:
                    raise QueryError("too_many_rows", f"result over {max_bytes} bytes")
    except sqlite3.Error as e:
        if time.monotonic() > deadline and "interrupt" in str(e).lower():
            raise QueryError("timeout", "query interrupted at the time limit") from None
        if _UNDECODABLE in str(e).lower():
            raise QueryError(
                "sql_error", "the result holds TEXT that is not valid UTF-8 (read strictly)"
            ) from None
        if "not authorized" in str(e).lower():
            raise QueryError("forbidden", f"{e} (only reading queries are allowed)") from None
        raise QueryError("sql_error", f"{type(e).__name__}: {e}") from None
    except (OverflowError, ValueError, sqlite3.Warning) as e:
        raise QueryError("sql_error", f"{type(e).__name__}: {e}") from None
    finally:
        conn.close()
