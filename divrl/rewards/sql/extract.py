"""Finding the SQL a completion answers with.

Rules, first that finds something (see docs/rewards.md):

1. ``<think>...</think>`` is set aside; it is searched only when nothing is found outside.
2. The last ``<answer>``/``<solution>``/``<sql>`` tag (an unclosed last tag runs to the
   end); its content is searched with the rules below.
3. The last fenced block tagged ``sql``/``sqlite``; else the last fenced block whose first
   statement starts like a query.
4. The last inline-code span (single backticks) that starts with SELECT/WITH.
5. Bare SQL: a statement starting at SELECT/WITH and ending at its ``;`` (string literals
   and comments respected) or, without ``;``, at the first line that reads as prose;
   statements chained on the same or the next line (``SELECT 1; DROP t``) stay together so
   the verifier sees every statement. Upper-case keywords are preferred over lower-case
   ones, and a keyword at the start of a line over one inside a sentence.
"""

from __future__ import annotations

import re

from divrl.rewards.sql.statements import first_keyword, first_separator

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
_TAG = re.compile(r"<(answer|solution|sql)>(.*?)(?:</\1>|\Z)", re.IGNORECASE | re.DOTALL)
_FENCE = re.compile(r"```([^\n`]*)\n?(.*?)(?:```|\Z)", re.DOTALL)
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_START = re.compile(r"\b(select|with)\b", re.IGNORECASE)
# bounded repetitions keep matching linear on adversarial text
_CTE = re.compile(
    r"with\s{1,100}(?:recursive\s{1,100})?[\w\"`\[\]]{1,200}\s{0,100}"
    r"(?:\([^()]{0,2000}\)\s{0,100})?as\s{0,100}(?:not\s{1,20})?(?:materialized\s{1,20})?\(",
    re.IGNORECASE,
)
_QUERY_WORDS = {"select", "with", "values"}
_MAX_BARE_TEXT = 100_000  # bare SQL is looked for in the last this many characters
_MAX_CANDIDATES = 200  # SELECT/WITH positions considered (the last ones)
_MAX_STATEMENT = 50_000  # characters one statement may span
_STATEMENT_WORDS = _QUERY_WORDS | {
    "insert", "update", "delete", "drop", "create", "alter", "pragma", "attach", "detach",
    "vacuum", "replace", "begin", "commit", "rollback", "reindex", "analyze", "explain",
}  # fmt: skip
_CONTINUATION_WORDS = {
    "from", "where", "join", "inner", "left", "right", "full", "cross", "natural", "outer",
    "on", "and", "or", "not", "group", "order", "having", "limit", "offset", "union",
    "intersect", "except", "select", "case", "when", "then", "else", "end", "in", "between",
    "like", "is", "exists", "by", "asc", "desc", "using", "window", "over", "partition",
    "as", "all", "distinct", "values", "glob", "collate", "escape", "null",
}  # fmt: skip
_OPEN_ENDINGS = (",", "(", "=", "<", ">", "+", "-", "*", "/", "|", "select", "from",
                 "where", "and", "or", "on", "by", "join", "as", "not", "in", "distinct")  # fmt: skip


def split_think(text: str) -> tuple[str, str]:
    """(text outside ``<think>`` blocks, text inside them)."""
    close = text.rfind(_THINK_CLOSE)
    if close >= 0:
        thoughts, visible = text[:close], text[close + len(_THINK_CLOSE) :]
        return visible.replace(_THINK_OPEN, " "), thoughts.replace(_THINK_OPEN, " ")
    opened = text.find(_THINK_OPEN)
    if opened >= 0:  # an unclosed think block: the rest is still thinking
        return text[:opened], text[opened + len(_THINK_OPEN) :]
    return text, ""


def extract_sql(text: str) -> str | None:
    """The SQL a completion answers with (possibly several statements), or ``None``."""
    visible, thoughts = split_think(text)
    found = _extract(visible)
    if found is None and thoughts.strip():
        found = _extract(thoughts)
    return found


def _extract(text: str) -> str | None:
    tags = list(_TAG.finditer(text))
    for tag in reversed(tags):
        found = _extract_plain(tag.group(2))
        if found is not None:
            return found
    return _extract_plain(text)


def _extract_plain(text: str) -> str | None:
    blocks = [(m.group(1).strip().lower(), m.group(2)) for m in _FENCE.finditer(text)]
    for lang, body in reversed(blocks):
        if lang in ("sql", "sqlite") and body.strip():
            return body.strip()
    for _lang, body in reversed(blocks):
        if first_keyword(body) in _QUERY_WORDS:
            return body.strip()
    outside = _FENCE.sub("\n\n", text)
    for m in reversed(list(_INLINE.finditer(outside))):
        if first_keyword(m.group(1)) in _QUERY_WORDS:
            return m.group(1).strip()
    return bare_sql(outside.replace("`", " "))


def _is_start(text: str, m: re.Match) -> bool:
    if m.group(1).lower() == "with":
        return _CTE.match(text, m.start()) is not None
    return True


def _strength(text: str, start: int, word: str) -> int:
    line_start = text.rfind("\n", 0, start) + 1
    at_line_start = not text[line_start:start].strip() or text[line_start:start].rstrip()[-1:] in (
        ":",
        ">",
    )
    return 2 * word.isupper() + at_line_start


def bare_sql(text: str) -> str | None:
    """The best SQL statement (chain) written as plain text, or ``None``."""
    text = text[-_MAX_BARE_TEXT:]
    starts = [m for m in _START.finditer(text)][-_MAX_CANDIDATES:]
    candidates: list[tuple[int, int, int]] = []  # (strength, start, end)
    for m in starts:
        if not _is_start(text, m):
            continue
        strength = _strength(text, m.start(), m.group(1))
        if candidates and m.start() < candidates[-1][2]:
            # inside the previous candidate: a subquery, unless it is the real query
            # after a prose "select" (then it is stronger and replaces it)
            if strength <= candidates[-1][0]:
                continue
            candidates.pop()
        candidates.append((strength, m.start(), _block_end(text, m.start())))
    if not candidates:
        return None
    best = max(c[0] for c in candidates)
    _, start, end = [c for c in candidates if c[0] == best][-1]
    sql = text[start:end].strip()
    if sql.endswith(".") and first_separator(sql) < 0 and sql.count("'") % 2 == 0:
        sql = sql[:-1].rstrip()  # the sentence's full stop
    return sql or None


def _block_end(text: str, start: int) -> int:
    """End of the statement chain starting at ``start``."""
    end = _statement_end(text, start)
    while end < len(text) and text[end - 1 : end] == ";":
        if not re.match(r"[ \t]*(?:\n[ \t]*)?[A-Za-z(]", text[end : end + 200]):
            break
        after = end + re.match(r"\s*", text[end : end + 200]).end()
        if first_keyword(text[after : after + 40]) not in _STATEMENT_WORDS:
            break
        end = _statement_end(text, after)
    return end


def _statement_end(text: str, start: int) -> int:
    """Index after the ``;`` ending the statement at ``start``, or where the SQL text stops."""
    window = text[start : start + _MAX_STATEMENT]
    semi = first_separator(window)
    segment = window[: semi + 1] if semi >= 0 else window
    lines = segment.split("\n")
    end = len(lines[0])
    state = _SqlState(lines[0])
    pending = 0  # length of blank lines not yet known to be inside the statement
    for line in lines[1:]:
        if not line.strip():
            pending += len(line) + 1
            continue
        if not state.continues(line):
            return start + end
        end += pending + len(line) + 1
        pending = 0
        state.add(line)
    return start + (end if semi < 0 or pending else len(segment))


class _SqlState:
    """Running facts about the SQL lines kept so far (open parentheses, quotes, last line)."""

    def __init__(self, first_line: str):
        self.depth = 0
        self.quotes = 0
        self.last = ""
        self.add(first_line)

    def add(self, line: str) -> None:
        self.depth += line.count("(") - line.count(")")
        self.quotes += line.count("'")
        self.last = line

    def continues(self, line: str) -> bool:
        """Whether ``line`` continues the SQL (else it reads as prose)."""
        if self.depth > 0 or self.quotes % 2:
            return True
        stripped = line.strip()
        if line[:1] in (" ", "\t") or not stripped[:1].isalpha():
            return not stripped.startswith(("#", "*", "```")) or stripped.startswith("*/")
        word = re.match(r"[A-Za-z_]+", stripped).group(0).lower()
        if word in _CONTINUATION_WORDS:
            return True
        return self.last.rstrip().lower().endswith(_OPEN_ENDINGS)
