"""SQL answers: execution match on SQLite, judged the way each benchmark's evaluator judges.

The profile is chosen by ``data_source`` (``bird``/``bird_dev``: BIRD's ``evaluation.py``;
``spider``/``spider_dev``: Spider test-suite's ``eval_exec_match``; every other SQL source:
a multiset, ordered when the gold's outermost query has ORDER BY) and can be overridden per
row with ``extra_info["sql_compare"]`` (``set``, ``multiset`` or ``spider``) and
``extra_info["sql_order"]`` (``gold_text``: test-suite's text test; ``outer_parse``:
divrl's parse of the outermost query). See :mod:`divrl.rewards.sql.compare` and
docs/rewards.md.

Safety (:mod:`divrl.rewards.sql.database`): only SELECT/WITH/VALUES statements run, on a
connection opened with ``immutable=1`` (or a private copy for a WAL database with a
pending ``-wal``), ``PRAGMA query_only``, an authorizer that allows only reading, a
progress handler that interrupts at the deadline, row and byte limits, and SQLite's value
length limit lowered to 1 MB. More than one statement scores 0 (``multiple_statements``).
"""

from __future__ import annotations

import os
import time

from divrl.rewards.registry import Verifier
from divrl.rewards.sql.compare import (
    COMPARE_ALIASES,
    DEFAULT_ORDER_RULE,
    DISTINCT_RULES,
    ORDER_RULES,
    PROFILES,
    TEXT_ERRORS,
    gold_text_orders,
    normalise_like_test_suite,
    rows_equal,
)
from divrl.rewards.sql.database import (
    QueryError,
    check_sqlite_file,
    connect_readonly,
    row_bytes,
    run_query,
)
from divrl.rewards.sql.extract import extract_sql
from divrl.rewards.sql.gold_cache import ByteBoundedCache, default_cache_bytes
from divrl.rewards.sql.statements import outer_order_by, split_statements, strip_distinct
from divrl.rewards.types import ScoreResult

__all__ = [
    "QueryError",
    "SqlVerifier",
    "check_sqlite_file",
    "connect_readonly",
    "extract_sql",
    "first_statement",
    "run_query",
]


def first_statement(sql: str) -> str | None:
    """The first statement of ``sql`` (quotes and comments respected), or ``None``."""
    statements = split_statements(sql)
    return statements[0] if statements else None


def _printable(text: str) -> str:
    """``text`` with lone surrogates escaped, so results can be written as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class SqlVerifier(Verifier):
    """Execution match under a benchmark's profile; ``extra_info`` must carry ``db_path``.

    Args:
        profile: ``bird``, ``spider`` or ``sql`` (see :data:`divrl.rewards.sql.compare.PROFILES`).
        max_rows: a predicted query returning more rows scores 0 (``too_many_rows``).
        max_sql_chars: longer extracted SQL scores 0 without running (``too_long``).
        cache_bytes: gold-result cache budget in bytes per worker (default: 1/8 of the
            worker memory cap, or ``DIVRL_SQL_GOLD_CACHE_MB``).
        query_timeout: seconds per predicted query (default: the profile's); the gold gets
            twice this. The item's hard limit (``default_timeout``) covers both.
        max_result_bytes: a predicted result larger than this scores 0 (``too_many_rows``).
        order_rule: ``gold_text`` or ``outer_parse``: how row order is decided for every
            row (default: the comparison's own; ``extra_info["sql_order"]`` still wins).
        distinct: ``keep`` (default) or ``strip``: remove DISTINCT from both queries before
            running them, as test-suite does unless run with ``--keep_distinct``
            (``extra_info["sql_distinct"]`` still wins).
    """

    def __init__(
        self,
        profile: str = "sql",
        max_rows: int = 100_000,
        max_sql_chars: int = 20_000,
        cache_bytes: int | None = None,
        query_timeout: float | None = None,
        max_result_bytes: int = 256 * 1024 * 1024,
        order_rule: str | None = None,
        distinct: str = "keep",
    ):
        if profile not in PROFILES:
            raise ValueError(f"unknown SQL profile {profile!r}; use one of {sorted(PROFILES)}")
        if order_rule is not None and order_rule not in ORDER_RULES:
            raise ValueError(f"unknown order_rule {order_rule!r}; use one of {list(ORDER_RULES)}")
        self.order_rule = order_rule
        if distinct not in DISTINCT_RULES:
            raise ValueError(f"unknown distinct {distinct!r}; use one of {list(DISTINCT_RULES)}")
        self.distinct = distinct
        self.profile = PROFILES[profile]
        self.max_rows = max_rows
        self.max_sql_chars = max_sql_chars
        self.cache_bytes = cache_bytes
        self.query_timeout = float(query_timeout or self.profile.query_timeout)
        self.max_result_bytes = max_result_bytes
        self.default_timeout = 3 * self.query_timeout + 1.0
        self._gold_cache: ByteBoundedCache | None = None
        self._folders: dict[tuple[str, int], list[str]] = {}  # test-suite database listings

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_gold_cache"] = None  # caches stay in their process
        state["_folders"] = {}
        return state

    @property
    def gold_cache(self) -> ByteBoundedCache:
        if self._gold_cache is None:
            budget = self.cache_bytes if self.cache_bytes is not None else default_cache_bytes()
            self._gold_cache = ByteBoundedCache(budget)
        return self._gold_cache

    def check_inputs(self, ground_truth, extra_info):
        db_path = extra_info.get("db_path")
        if not db_path:
            raise ValueError("SQL scoring needs extra_info['db_path'] (an SQLite file)")
        if not os.path.isfile(db_path):
            raise ValueError(f"SQL database not found: extra_info['db_path'] = {db_path!r}")
        check_sqlite_file(db_path)
        mode = extra_info.get("sql_compare")
        if mode is not None and str(mode).lower() not in COMPARE_ALIASES:
            raise ValueError(
                f"extra_info['sql_compare'] = {mode!r}; use one of {sorted(COMPARE_ALIASES)}"
            )
        distinct = extra_info.get("sql_distinct")
        if distinct is not None and str(distinct).lower() not in DISTINCT_RULES:
            raise ValueError(
                f"extra_info['sql_distinct'] = {distinct!r}; use one of {list(DISTINCT_RULES)}"
            )
        databases = extra_info.get("sql_databases")
        if databases is not None and str(databases).lower() not in ("folder", "one"):
            raise ValueError(
                f"extra_info['sql_databases'] = {databases!r}; use 'folder' (every SQLite "
                "file beside db_path, test-suite's rule) or 'one'"
            )
        order = extra_info.get("sql_order")
        if order is not None and str(order).lower() not in ORDER_RULES:
            raise ValueError(f"extra_info['sql_order'] = {order!r}; use one of {list(ORDER_RULES)}")

    def extract(self, solution_str, extra_info):
        return extract_sql(solution_str[-200_000:])

    def quick(self, solution_str, ground_truth, extra_info):
        sql = self.extract(solution_str, extra_info)
        if sql is None:
            return ScoreResult(0.0, None, "no_answer")
        if len(sql) > self.max_sql_chars:
            return ScoreResult(0.0, _printable(sql[:200]), "too_long", f"{len(sql)} characters")
        statements = split_statements(sql)
        if not statements:
            return ScoreResult(0.0, _printable(sql), "no_answer", "only comments")
        if len(statements) > 1 and not self._strips_distinct(extra_info):
            detail = f"{len(statements)} statements; the evaluators run exactly one"
            return ScoreResult(0.0, _printable(sql), "multiple_statements", detail)
        return None

    def _strips_distinct(self, extra_info) -> bool:
        return str(extra_info.get("sql_distinct", self.distinct)).lower() == "strip"

    def verify(self, solution_str, ground_truth, extra_info, deadline):
        early = self.quick(solution_str, ground_truth, extra_info)
        if early is not None:
            return early
        sql = split_statements(self.extract(solution_str, extra_info))[0]
        db_path = str(extra_info["db_path"])
        mode = COMPARE_ALIASES[str(extra_info.get("sql_compare", self.profile.compare)).lower()]
        gold_sql, run_sql = str(ground_truth), sql
        if mode == "spider":
            gold_sql, run_sql = normalise_like_test_suite(gold_sql), normalise_like_test_suite(sql)
        if self._strips_distinct(extra_info):
            # test-suite's stripping re-joins the tokens of the FIRST statement only
            first_gold = split_statements(gold_sql)
            gold_sql = strip_distinct(first_gold[0] if first_gold else gold_sql)
            run_sql = strip_distinct(run_sql)
        ordered = self._ordered(mode, gold_sql, extra_info)
        for path in self._databases(db_path, mode, extra_info):
            failed = self._differs_on(path, gold_sql, run_sql, sql, mode, ordered, deadline)
            if failed is not None:
                return failed
        return ScoreResult(1.0, sql, "correct")

    def _differs_on(self, db_path, gold_sql, run_sql, sql, mode, ordered, deadline):
        """The failing result on one database, or None when the prediction matches there."""
        text_errors = TEXT_ERRORS[mode]
        gold = self._gold_rows(db_path, gold_sql, deadline, text_errors)
        if isinstance(gold, QueryError):
            return ScoreResult(0.0, _printable(sql), "gold_error", f"gold query: {gold.detail}")
        try:
            pred_deadline = min(deadline, time.monotonic() + self.query_timeout)
            pred = run_query(
                db_path,
                run_sql,
                pred_deadline,
                self.max_rows,
                self.max_result_bytes,
                text_errors=text_errors,
            )
        except QueryError as e:
            return ScoreResult(0.0, _printable(sql), e.reason, e.detail)
        except MemoryError:
            self.gold_cache.clear()  # free what we can; the pool decides about the item
            raise
        if rows_equal(pred, gold, mode, ordered):
            return None
        return ScoreResult(0.0, sql, "wrong")

    def _databases(self, db_path: str, mode: str, extra_info) -> list[str]:
        """``db_path``, then for test-suite's rule every other SQLite file beside it.

        test-suite runs both queries on every file whose name contains ``.sqlite`` in the
        database's folder (its distilled test-suite databases): the prediction must match
        on all. Files that are not SQLite databases (``-wal``, ``-journal``) are skipped.
        """
        default = "folder" if mode == "spider" else "one"
        if str(extra_info.get("sql_databases", default)).lower() == "one":
            return [db_path]
        folder = os.path.dirname(os.path.abspath(db_path))
        try:
            key = (folder, os.stat(folder).st_mtime_ns)
            names = sorted(os.listdir(folder)) if key not in self._folders else []
        except OSError:  # an unlistable folder: the one database that was given
            return [db_path]
        if key not in self._folders:
            found = []
            for name in names:
                path = os.path.join(folder, name)
                if ".sqlite" in name and os.path.isfile(path):
                    try:
                        check_sqlite_file(path)
                    except ValueError:
                        continue
                    found.append(path)
            if len(self._folders) > 1000:
                self._folders.clear()
            self._folders[key] = found
        here = os.path.abspath(db_path)
        return [db_path] + [p for p in self._folders[key] if p != here]

    def _ordered(self, mode: str, gold_sql: str, extra_info) -> bool:
        """Whether row order is compared: the row's ``sql_order``, the verifier's, the mode's."""
        if DEFAULT_ORDER_RULE[mode] is None:
            return False  # a set has no order
        rule = self.order_rule or DEFAULT_ORDER_RULE[mode]
        rule = str(extra_info.get("sql_order", rule)).lower()
        return gold_text_orders(gold_sql) if rule == "gold_text" else outer_order_by(gold_sql)

    def _gold_rows(self, db_path: str, gold_sql: str, deadline: float, text_errors: str):
        """Gold rows (or the gold's QueryError), computed once per database version."""
        st = os.stat(db_path)
        key = (os.path.abspath(db_path), st.st_mtime_ns, st.st_size, gold_sql, text_errors)
        cached = self.gold_cache.get(key)
        if cached is not None:
            return cached
        statements = split_statements(gold_sql)
        if len(statements) != 1:
            return QueryError("gold_error", f"the gold holds {len(statements)} statements")
        start = time.monotonic()
        gold_deadline = min(deadline, start + 2 * self.query_timeout)
        try:
            rows = run_query(
                db_path, statements[0], gold_deadline, 10 * self.max_rows, text_errors=text_errors
            )
        except QueryError as e:
            if e.reason == "timeout":
                if deadline < start + 2 * self.query_timeout:
                    return e  # cut by the item's limit, not its own: may finish next time
                e.detail = f"gold query over its {2 * self.query_timeout:g} s limit"
            self.gold_cache.put(key, e, 1024)
            return e
        except MemoryError:
            self.gold_cache.clear()
            raise
        self.gold_cache.put(key, rows, sum(row_bytes(r) for r in rows) + 64)
        return rows
