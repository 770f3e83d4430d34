"""Comparison profiles: how a predicted result must match the gold result.

=========  ==================================================================
profile    rule
=========  ==================================================================
``bird``   BIRD execution accuracy: ``set(pred) == set(gold)``; order and
           duplicates ignored; column order matters.
``spider`` Spider test-suite ``result_eq``: same row count, multiset of rows
           (ordered list when the gold's outermost query has ORDER BY); the
           prediction's columns may be any permutation of the gold's.
``sql``    multiset of rows, ordered when the gold's outermost query has
           ORDER BY; column order matters.
=========  ==================================================================

Values compare with Python's ``==`` as in both official evaluators (``1 == 1.0``,
``None == None``, floats exactly).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

COMPARE_MODES = ("set", "multiset", "spider")
_MAX_ASSIGNMENTS = 5040  # column mappings tried at most (7!), as test-suite bounds its search


@dataclass(frozen=True)
class SqlProfile:
    """How one benchmark scores SQL: comparison, order rule and time limits."""

    name: str
    compare: str  # one of COMPARE_MODES
    order_from_gold: bool  # compare order when the gold's outermost query has ORDER BY
    query_timeout: float  # seconds per predicted query; the gold gets twice this


PROFILES = {
    "bird": SqlProfile("bird", "set", order_from_gold=False, query_timeout=30.0),
    "spider": SqlProfile("spider", "spider", order_from_gold=True, query_timeout=30.0),
    "sql": SqlProfile("sql", "multiset", order_from_gold=True, query_timeout=5.0),
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


def rows_equal(pred: list[tuple], gold: list[tuple], mode: str, ordered: bool) -> bool:
    """Whether ``pred`` matches ``gold`` under ``mode`` (see the module table)."""
    if mode == "set":
        return set(pred) == set(gold)
    if mode == "multiset":
        return pred == gold if ordered else Counter(pred) == Counter(gold)
    if mode == "spider":
        return _spider_equal(pred, gold, ordered)
    raise ValueError(f"unknown SQL comparison {mode!r}; use one of {COMPARE_MODES}")


def _spider_equal(pred: list[tuple], gold: list[tuple], ordered: bool) -> bool:
    if not pred and not gold:
        return True
    if len(pred) != len(gold):
        return False
    width = len(gold[0])
    if any(len(r) != width for r in pred) or any(len(r) != width for r in gold):
        return False
    gold_cells = [Counter(r[i] for r in gold) for i in range(width)]
    # a column of pred may stand for gold column j only if it holds the same values
    options = []
    for i in range(width):
        col = Counter(r[i] for r in pred)
        options.append([j for j in range(width) if gold_cells[j] == col])
        if not options[-1]:
            return False
    gold_key = gold if ordered else Counter(gold)
    for perm in _assignments(options, _MAX_ASSIGNMENTS):
        moved = [_place(r, perm) for r in pred]
        if (moved if ordered else Counter(moved)) == gold_key:
            return True
    return False


def _assignments(options: list[list[int]], limit: int):
    """Column mappings (pred column i -> gold column perm[i]) allowed by ``options``."""
    width, used, perm = len(options), set(), []
    count = 0

    def walk(i: int):
        nonlocal count
        if count >= limit:
            return
        if i == width:
            count += 1
            yield tuple(perm)
            return
        for j in options[i]:
            if j not in used:
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
