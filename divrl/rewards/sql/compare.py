"""Comparison profiles: how a predicted result must match the gold result.

=========  ==================================================================
profile    rule
=========  ==================================================================
``bird``   BIRD ``evaluation.py``: ``set(pred) == set(gold)``; order and
           duplicates ignored; column order matters; TEXT that is not UTF-8
           fails the comparison (BIRD reads results with sqlite3's default
           ``str`` decoding, which raises on it).
``spider`` Spider test-suite ``exec_eval.eval_exec_match``: spaced ``> =``,
           ``< =``, ``! =`` and ``YEAR(CURDATE())`` rewritten in both queries;
           row order compared when the gold's text (lower-cased) contains
           ``order by``; then ``result_eq``: same row count, the rows'
           unordered contents (sorted by ``str(value) + str(type)``) match,
           and some permutation of the prediction's columns gives the gold
           rows (as a list when order matters, else as a multiset); TEXT that
           is not UTF-8 is decoded with the bad bytes dropped.
``sql``    multiset of rows, ordered when the gold's OUTERMOST query has
           ORDER BY (parsed); column order matters; bad UTF-8 replaced.
=========  ==================================================================

Values compare with Python's ``==`` as in both official evaluators (``1 == 1.0``,
``None == None``, floats exactly).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

COMPARE_MODES = ("set", "multiset", "spider")
ORDER_RULES = ("gold_text", "outer_parse")
DISTINCT_RULES = ("keep", "strip")
# column mappings tried at most; identical predicted columns count once, so only results
# with many distinct columns of equal contents reach it (test-suite has no bound)
_MAX_ASSIGNMENTS = 40320


@dataclass(frozen=True)
class SqlProfile:
    """How one benchmark scores SQL: comparison and time limits."""

    name: str
    compare: str  # one of COMPARE_MODES
    query_timeout: float  # seconds per predicted query; the gold gets twice this


PROFILES = {
    "bird": SqlProfile("bird", "set", query_timeout=30.0),
    "spider": SqlProfile("spider", "spider", query_timeout=30.0),
    "sql": SqlProfile("sql", "multiset", query_timeout=5.0),
}
# per-row overrides accepted in extra_info["sql_compare"]
COMPARE_ALIASES = {
    "set": "set",
    "bird": "set",
    "multiset": "multiset",
    "sql": "multiset",
    "spider": "spider",
    "test_suite": "spider",
}
# how each comparison decides whether row order matters, unless extra_info["sql_order"]
# names a rule: test-suite's text test for spider, divrl's parse for the plain profile
DEFAULT_ORDER_RULE = {"set": None, "spider": "gold_text", "multiset": "outer_parse"}
# how TEXT that is not UTF-8 is read: as each evaluator's sqlite3 connection reads it
TEXT_ERRORS = {"set": "strict", "spider": "ignore", "multiset": "replace"}

_CUR_YEAR = re.compile(r"YEAR\s*\(\s*CURDATE\s*\(\s*\)\s*\)\s*", re.IGNORECASE)


def normalise_like_test_suite(sql: str) -> str:
    """The rewrites test-suite applies to both queries before running them.

    ``> =``, ``< =`` and ``! =`` lose their space (a plain text replacement, string
    literals included, as test-suite's ``postprocess``) and ``YEAR(CURDATE())`` becomes
    ``2020`` (its ``replace_cur_year``).
    """
    sql = sql.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")
    return _CUR_YEAR.sub("2020", sql)


def gold_text_orders(gold_sql: str) -> bool:
    """test-suite's rule: order matters when ``order by`` occurs anywhere in the gold's text.

    Subqueries, window clauses and string literals count; ``ORDER  BY`` with two spaces
    or a line break between the words does not.
    """
    return "order by" in gold_sql.lower()


def rows_equal(pred: list[tuple], gold: list[tuple], mode: str, ordered: bool) -> bool:
    """Whether ``pred`` matches ``gold`` under ``mode`` (see the module table)."""
    if mode == "set":
        return set(pred) == set(gold)
    if mode == "multiset":
        return pred == gold if ordered else Counter(pred) == Counter(gold)
    if mode == "spider":
        return _spider_equal(pred, gold, ordered)
    raise ValueError(f"unknown SQL comparison {mode!r}; use one of {COMPARE_MODES}")


def _unordered_row(row: tuple) -> tuple:
    # the sort key of test-suite's quick rejection: 1 and 1.0 sort differently, so a row
    # holding both an int and a float can be rejected although the values are equal
    return tuple(sorted(row, key=lambda v: str(v) + str(type(v))))


def _same_unordered_rows(pred: list[tuple], gold: list[tuple], ordered: bool) -> bool:
    p = [_unordered_row(r) for r in pred]
    g = [_unordered_row(r) for r in gold]
    return p == g if ordered else set(p) == set(g)


def _spider_equal(pred: list[tuple], gold: list[tuple], ordered: bool) -> bool:
    if not pred and not gold:
        return True
    if len(pred) != len(gold):
        return False
    width = len(gold[0])
    if len(pred[0]) != width:
        return False
    if not _same_unordered_rows(pred, gold, ordered):
        return False
    gold_cells = [Counter(r[i] for r in gold) for i in range(width)]
    # a necessary condition for gold column j to come from pred column i: equal values
    pred_columns = [tuple(r[i] for r in pred) for i in range(width)]
    options = []
    for i in range(width):
        col = Counter(pred_columns[i])
        options.append([j for j in range(width) if gold_cells[j] == col])
        if not options[-1]:
            return False
    gold_key = gold if ordered else Counter(gold)
    for perm in _assignments(options, pred_columns, _MAX_ASSIGNMENTS):
        moved = [_place(r, perm) for r in pred]
        if (moved if ordered else Counter(moved)) == gold_key:
            return True
    return False


def _assignments(options: list[list[int]], columns: list[tuple], limit: int):
    """Column mappings (pred column i -> gold column perm[i]) allowed by ``options``.

    Two predicted columns with the same contents give the same rows whichever gold
    column each takes, so a mapping is only tried with such twins in increasing order.
    """
    width, used, perm = len(options), set(), []
    twin_of = [next(k for k in range(i + 1) if columns[k] == columns[i]) for i in range(width)]
    count = 0

    def walk(i: int):
        nonlocal count
        if count >= limit:
            return
        if i == width:
            count += 1
            yield tuple(perm)
            return
        floor = -1
        if twin_of[i] != i:
            floor = max(perm[k] for k in range(i) if twin_of[k] == twin_of[i])
        for j in options[i]:
            if j not in used and j > floor:
                used.add(j)
                perm.append(j)
                yield from walk(i + 1)
                perm.pop()
                used.discard(j)

    yield from walk(0)


def _place(row: tuple, perm: tuple[int, ...]) -> tuple:
    out = [None] * len(row)
    for i, j in enumerate(perm):
        out[j] = row[i]
    return tuple(out)
