"""SQL answers: execution match on SQLite, as in the BIRD and Spider evaluators.

The predicted and the gold query run on ``extra_info["db_path"]``; the result rows are
compared as multisets, or as lists when the gold query contains ``ORDER BY``. Rows are
compared as tuples, so column order matters (as in BIRD).

Safety: the database is opened read-only (``mode=ro`` URI) with ``PRAGMA query_only``;
an authorizer allows only reading (SELECT, reads, functions other than
``load_extension``, recursive CTEs), so writes, ATTACH, PRAGMA and extension loading fail;
a progress handler interrupts a query at the item's deadline; at most ``max_rows`` rows
are fetched; only the first statement is executed; SQLite's string/blob length limit is
lowered so a single expression cannot allocate gigabytes.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections import Counter, OrderedDict
from typing import Any
from urllib.parse import quote

from divrl.rewards.registry import Verifier, register_verifier
from divrl.rewards.types import ScoreResult

_FENCE = "```"
_START = re.compile(r"\b(?:select|with)\b", re.IGNORECASE)
# bounded repetitions keep matching linear on adversarial text
_CTE = re.compile(
    r"with\s{1,100}(?:recursive\s{1,100})?[\w\"`\[\]]{1,200}\s{0,100}"
    r"(?:\([^()]{0,2000}\)\s{0,100})?as\s{0,100}\(",
    re.IGNORECASE,
)
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)
_MAX_VALUE_BYTES = 1_000_000
_MAX_SEMICOLONS = 64

_ALLOWED_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}


class QueryError(Exception):
    """A query failed; ``reason`` is the ScoreResult reason."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of each ``` fenced block; an unclosed last block runs to the end."""
    blocks = []
    pos = 0
    while True:
        start = text.find(_FENCE, pos)
        if start < 0:
            return blocks
        line_end = text.find("\n", start)
        if line_end < 0:
            line_end = len(text)
        lang = text[start + 3 : line_end].strip().lower()
        end = text.find(_FENCE, line_end)
        body = text[line_end + 1 : end if end >= 0 else len(text)]
        blocks.append((lang, body))
        if end < 0:
            return blocks
        pos = end + 3


def _last_statement(text: str) -> str | None:
    """The last SELECT/WITH statement in free text (paragraphs and ';' separate statements)."""
    regions = re.split(r";|\n\s*\n", text)
    for region in reversed(regions):
        starts = [m for m in _START.finditer(region) if _is_statement_start(region, m)]
        if not starts:
            continue
        upper = [m for m in starts if m.group(0).isupper()]
        return region[(upper or starts)[0].start() :].strip()
    return None


def _is_statement_start(region: str, m: re.Match) -> bool:
    if m.group(0).lower() == "with":
        return _CTE.match(region, m.start()) is not None
    return True


def extract_sql(solution_str: str) -> str | None:
    """The SQL in a completion: the last ```sql block, else the last SELECT/WITH statement."""
    blocks = _fenced_blocks(solution_str)
    for lang, body in reversed(blocks):
        if lang in ("sql", "sqlite") and body.strip():
            return first_statement(body)
    for lang, body in reversed(blocks):
        if not lang and _START.search(body):
            return first_statement(body)
    text = solution_str.replace(_FENCE, "\n\n")
    stmt = _last_statement(text)
    return first_statement(stmt) if stmt else None


def first_statement(sql: str) -> str | None:
    """The first complete statement of ``sql`` (without trailing text), or the whole text."""
    sql = sql.strip()
    pos = sql.find(";")
    # each check rescans the prefix: a bounded number keeps adversarial input linear
    for _ in range(_MAX_SEMICOLONS):
        if pos < 0:
            break
        if sqlite3.complete_statement(sql[: pos + 1]):
            return sql[: pos + 1].strip() or None
        pos = sql.find(";", pos + 1)
    return sql or None


def _authorizer(action: int, arg1: Any, arg2: Any, db_name: Any, trigger: Any) -> int:
    if action not in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() == "load_extension":
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def connect_readonly(db_path: str) -> sqlite3.Connection:
    """A read-only, locked-down connection to an existing SQLite file."""
    uri = f"file:{quote(os.path.abspath(db_path))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    conn.execute("PRAGMA query_only = ON")
    if hasattr(conn, "setlimit"):
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.set_authorizer(_authorizer)
    return conn


def run_query(db_path: str, sql: str, deadline: float, max_rows: int) -> list[tuple]:
    """Execute one read-only query with a wall-clock deadline and a row limit.

    Raises :class:`QueryError` with reason ``timeout``, ``too_many_rows`` or ``sql_error``.
    """
    conn = connect_readonly(db_path)
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    try:
        cur = conn.execute(sql)
        rows = cur.fetchmany(max_rows + 1)
        if len(rows) > max_rows:
            raise QueryError("too_many_rows", f"more than {max_rows} rows")
        return rows
    except sqlite3.Error as e:
        if time.monotonic() > deadline and "interrupt" in str(e).lower():
            raise QueryError("timeout", "query interrupted at the time limit") from None
        if "not authorized" in str(e).lower():
            raise QueryError("forbidden", f"{e} (only reading queries are allowed)") from None
        raise QueryError("sql_error", f"{type(e).__name__}: {e}") from None
    except (OverflowError, MemoryError, ValueError) as e:
        raise QueryError("sql_error", f"{type(e).__name__}: {e}") from None
    finally:
        conn.close()


def results_match(pred: list[tuple], gold: list[tuple], ordered: bool) -> bool:
    if ordered:
        return pred == gold
    return Counter(pred) == Counter(gold)


class SqlVerifier(Verifier):
    """Execution match; ``extra_info`` must carry ``db_path``."""

    default_timeout = 5.0

    def __init__(
        self, max_rows: int = 100_000, max_sql_chars: int = 20_000, cache_size: int = 4096
    ):
        self.max_rows = max_rows
        self.max_sql_chars = max_sql_chars
        self.cache_size = cache_size
        self._gold_cache: OrderedDict[tuple, list[tuple] | QueryError] = OrderedDict()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_gold_cache"] = OrderedDict()  # caches stay in their process
        return state

    def check_inputs(self, ground_truth, extra_info):
        db_path = extra_info.get("db_path")
        if not db_path:
            raise ValueError("SQL scoring needs extra_info['db_path'] (an SQLite file)")
        if not os.path.isfile(db_path):
            raise ValueError(f"SQL database not found: extra_info['db_path'] = {db_path!r}")

    def extract(self, solution_str, extra_info):
        return extract_sql(solution_str[-200_000:])

    def quick(self, solution_str, ground_truth, extra_info):
        sql = self.extract(solution_str, extra_info)
        if sql is None:
            return ScoreResult(0.0, None, "no_answer")
        if len(sql) > self.max_sql_chars:
            return ScoreResult(0.0, sql[:200], "too_long", f"{len(sql)} characters of SQL")
        return None

    def verify(self, solution_str, ground_truth, extra_info, deadline):
        early = self.quick(solution_str, ground_truth, extra_info)
        if early is not None:
            return early
        sql = self.extract(solution_str, extra_info)
        db_path = str(extra_info["db_path"])
        try:
            pred = run_query(db_path, sql, deadline, self.max_rows)
        except QueryError as e:
            return ScoreResult(0.0, sql, e.reason, e.detail)
        gold = self._gold_rows(db_path, str(ground_truth), deadline)
        if isinstance(gold, QueryError):
            reason = "timeout" if gold.reason == "timeout" else "gold_error"
            return ScoreResult(0.0, sql, reason, f"gold query: {gold.detail}")
        ok = results_match(pred, gold, ordered=bool(_ORDER_BY.search(str(ground_truth))))
        return ScoreResult(float(ok), sql, "correct" if ok else "wrong")

    def _gold_rows(self, db_path: str, gold_sql: str, deadline: float):
        st = os.stat(db_path)
        key = (os.path.abspath(db_path), st.st_mtime_ns, st.st_size, gold_sql)
        if key in self._gold_cache:
            self._gold_cache.move_to_end(key)
            return self._gold_cache[key]
        try:
            rows: list[tuple] | QueryError = run_query(
                db_path, first_statement(gold_sql) or "", deadline, self.max_rows
            )
        except QueryError as e:
            if e.reason == "timeout":
                return e  # not cached: it may finish with a fresh budget
            rows = e
        self._gold_cache[key] = rows
        if len(self._gold_cache) > self.cache_size:
            self._gold_cache.popitem(last=False)
        return rows


register_verifier(
    "sql",
    "bird",
    "bird_dev",
    "spider",
    "spider_dev",
    "spider2",
    "synsql",
    "text2sql",
    "toy_sql",
)(SqlVerifier)
