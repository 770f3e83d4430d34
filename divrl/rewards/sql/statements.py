"""Splitting SQL text into statements with string literals and comments respected."""

from __future__ import annotations

import re

# one token that can hide a ';': a quoted string/identifier or a comment (unclosed ones
# run to the end of the text, as SQLite reads them); or a statement separator
_TOKEN = re.compile(
    r"'(?:[^']|'')*(?:'|$)"
    r'|"(?:[^"]|"")*(?:"|$)'
    r"|`[^`]*(?:`|$)"
    r"|\[[^\]]*(?:\]|$)"
    r"|--[^\n]*"
    r"|/\*.*?(?:\*/|$)"
    r"|;",
    re.DOTALL,
)
_COMMENT = re.compile(r"--[^\n]*|/\*.*?(?:\*/|$)", re.DOTALL)


def split_statements(sql: str) -> list[str]:
    """The statements of ``sql`` (without their ``;``), empty or comment-only ones dropped.

    Example: ``split_statements("SELECT ';' ; -- done")`` is ``["SELECT ';'"]``.
    """
    pieces, start = [], 0
    for m in _TOKEN.finditer(sql):
        if m.group(0) == ";":
            pieces.append(sql[start : m.start()])
            start = m.end()
    pieces.append(sql[start:])
    return [p.strip() for p in pieces if not is_blank(p)]


def first_separator(sql: str, start: int = 0) -> int:
    """Index of the first top-level ``;`` at or after ``start`` (quotes respected), or -1."""
    for m in _TOKEN.finditer(sql, start):
        if m.group(0) == ";":
            return m.start()
    return -1


def is_blank(sql: str) -> bool:
    """True when ``sql`` holds only whitespace and comments."""
    return not _COMMENT.sub("", sql).strip()


def strip_comments(sql: str) -> str:
    """``sql`` with its comments removed (strings kept intact)."""
    out, pos = [], 0
    for m in _TOKEN.finditer(sql):
        tok = m.group(0)
        if tok.startswith("--") or tok.startswith("/*"):
            out.append(sql[pos : m.start()])
            out.append(" ")
            pos = m.end()
    out.append(sql[pos:])
    return "".join(out)


_DISTINCT = re.compile(r"\bdistinct\b", re.IGNORECASE)


def strip_distinct(sql: str) -> str:
    """``sql`` without its DISTINCT keywords (quoted text and comments left as they are).

    What test-suite's default (without ``--keep_distinct``) does to both queries:
    ``COUNT(DISTINCT x)`` becomes ``COUNT( x)``.
    """
    out, pos = [], 0
    for m in _TOKEN.finditer(sql):
        out.append(_DISTINCT.sub("", sql[pos : m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_DISTINCT.sub("", sql[pos:]))
    return "".join(out)


def first_keyword(sql: str) -> str:
    """The first word of ``sql`` after comments, lower-cased ('' when there is none)."""
    m = re.match(r"\s*\(*\s*([A-Za-z_]+)", strip_comments(sql))
    return m.group(1).lower() if m else ""


_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


def _outer_order_by_scan(sql: str) -> bool:
    """Fallback without a parser: ORDER BY at parenthesis depth 0, outside strings."""
    depth, pos, flat = 0, 0, []
    for m in _TOKEN.finditer(sql):
        flat.append(sql[pos : m.start()])
        flat.append(" ")
        pos = m.end()
    flat.append(sql[pos:])
    text = "".join(flat)
    top = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        top.append(ch if depth == 0 and ch != ")" else " ")
    return bool(_ORDER_BY.search("".join(top)))


_ORDER_CACHE: dict[str, bool] = {}


def outer_order_by(sql: str) -> bool:
    """Whether the OUTERMOST query of ``sql`` has ORDER BY (decided by parsing with sqlglot).

    ``ORDER BY`` only inside a subquery, a window ``OVER (ORDER BY ..)``, a string literal
    or a comment does not count. Falls back to a parenthesis-depth scan when sqlglot cannot
    parse the query.
    """
    cached = _ORDER_CACHE.get(sql)
    if cached is not None:
        return cached
    try:
        import sqlglot
        from sqlglot import exp

        tree = sqlglot.parse_one(sql, read="sqlite")
        while isinstance(tree, exp.Subquery):
            if tree.args.get("order"):
                break
            tree = tree.this
        result = bool(tree.args.get("order"))
    except Exception:  # sqlglot raises several error types on odd SQL
        result = _outer_order_by_scan(sql)
    if len(_ORDER_CACHE) > 10_000:
        _ORDER_CACHE.clear()
    _ORDER_CACHE[sql] = result
    return result
