"""Agreement of divrl's SQL verdicts with the official evaluators' rules.

Each (gold, prediction) pair is labelled by a small re-implementation of the official rule,
run on the prediction's SQL itself: BIRD ``evaluation.py`` (``set(pred) == set(gold)`` on
``fetchall()`` with sqlite3's default strict text decoding; any exception fails), Spider
test-suite ``eval_exec_match`` (spaced operators and ``YEAR(CURDATE())`` rewritten, order
from the text ``order by`` in the gold, text read with bad bytes dropped, ``result_eq``
with its unordered-row rejection and column permutations), and the plain profile
(multiset / list, order from the hand label of the gold's outermost ORDER BY). divrl must
reach the same verdict on the prediction wrapped in an extraction form: every form for the
hand-written ``PAIRS``, one form in turn for the pairs built from ``FAMILIES`` (at least
150 distinct pairs per profile; the file stays fast).
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from itertools import permutations

import pytest

from divrl.rewards import ScoreRequest, score_batch

# (gold, prediction, whether the gold's outermost query orders its rows: hand label)
PAIRS = [
    ("SELECT title FROM proj", "SELECT DISTINCT title FROM proj", False),
    ("SELECT DISTINCT title FROM proj", "SELECT title FROM proj", False),
    ("SELECT COUNT(DISTINCT title) FROM proj", "SELECT COUNT(title) FROM proj", False),
    (
        "SELECT name FROM emp WHERE id IN (SELECT emp_id FROM proj)",
        "SELECT e.name FROM emp e JOIN proj p ON e.id = p.emp_id",
        False,
    ),
    (
        "SELECT DISTINCT e.name FROM emp e JOIN proj p ON e.id = p.emp_id",
        "SELECT name FROM emp WHERE id IN (SELECT emp_id FROM proj)",
        False,
    ),
    (
        "SELECT name FROM emp ORDER BY salary, id",
        "SELECT name FROM emp ORDER BY salary DESC, id",
        True,
    ),
    ("SELECT name FROM emp ORDER BY salary, id", "SELECT name FROM emp", True),
    ("SELECT name FROM emp ORDER BY salary, id", "SELECT name FROM emp ORDER BY salary, id", True),
    (
        "SELECT name FROM (SELECT name, salary FROM emp ORDER BY salary DESC)",
        "SELECT name FROM emp",
        False,
    ),
    (
        "SELECT name, RANK() OVER (ORDER BY salary) FROM emp",
        "SELECT name, RANK() OVER (ORDER BY salary) AS r FROM emp ORDER BY name",
        False,
    ),
    ("SELECT 'order by', COUNT(*) FROM emp", "SELECT 'order by' AS x, COUNT(*) FROM emp", False),
    (
        "SELECT salary FROM emp ORDER BY salary",
        "SELECT salary FROM emp ORDER BY salary, name DESC",
        True,
    ),
    (
        "SELECT name, salary FROM emp ORDER BY salary, id",
        "SELECT name, salary FROM emp ORDER BY salary, name",
        True,
    ),
    ("SELECT name, salary FROM emp", "SELECT salary, name FROM emp", False),
    (
        "SELECT dept_id, COUNT(*) FROM emp GROUP BY dept_id",
        "SELECT COUNT(*), dept_id FROM emp GROUP BY dept_id",
        False,
    ),
    ("SELECT name AS n FROM emp", "SELECT e.name FROM emp AS e", False),
    ("SELECT 1", "SELECT 1.0", False),
    ("SELECT COUNT(*) FROM emp", "SELECT SUM(1.0) FROM emp", False),
    ("SELECT AVG(salary) FROM emp", "SELECT SUM(salary) / COUNT(*) FROM emp", False),
    ("SELECT 0.1 + 0.2", "SELECT 0.3", False),
    ("SELECT bonus FROM emp", "SELECT bonus FROM emp WHERE bonus IS NOT NULL", False),
    ("SELECT bonus FROM emp WHERE id = 2", "SELECT NULL", False),
    ("SELECT name FROM emp WHERE id > 100", "SELECT name FROM dept WHERE id > 100", False),
    ("SELECT name FROM emp WHERE id > 100", "SELECT id, name FROM emp WHERE 0", False),
    ("SELECT name FROM emp WHERE id > 100", "SELECT name FROM emp WHERE id = 1", False),
    (
        "SELECT name FROM emp WHERE name = 'Ann'",
        "SELECT name FROM emp WHERE name LIKE 'ann'",
        False,
    ),
    (
        "SELECT d.name, COUNT(e.id) FROM dept d LEFT JOIN emp e ON e.dept_id = d.id GROUP BY d.id",
        "SELECT d.name, COUNT(*) FROM dept d LEFT JOIN emp e ON e.dept_id = d.id GROUP BY d.id",
        False,
    ),
    (
        "SELECT 200000",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000) "
        "SELECT COUNT(*) FROM c",
        False,
    ),
    ("SELECT MAX(salary) FROM emp", "SELECT MIN(salary) FROM emp", False),
    ("SELECT t FROM bad", "SELECT t FROM bad", False),
    ("SELECT t FROM bad", "SELECT t FROM bad WHERE t = 'ok'", False),
    (
        "SELECT name FROM emp UNION SELECT name FROM dept ORDER BY 1",
        "SELECT name FROM dept UNION SELECT name FROM emp ORDER BY name",
        True,
    ),
    (
        "SELECT name FROM emp ORDER BY salary DESC LIMIT 1",
        "SELECT name FROM emp WHERE salary = (SELECT MAX(salary) FROM emp)",
        True,
    ),
    ("SELECT 1", "SELEC 1", False),
    ("SELECT name FROM emp", "SELECT nme FROM emp", False),
    ("SELECT COUNT(*) FROM emp", "SELECT COUNT(*) FROM emp; SELECT 1", False),
    (
        "SELECT COUNT(*) FROM emp WHERE salary > 150",
        "WITH s AS (SELECT * FROM emp WHERE salary > 150) SELECT COUNT(*) FROM s",
        False,
    ),
    ("SELECT UPPER(name) FROM emp WHERE id = 1", "SELECT 'ANN'", False),
    ("SELECT 1", "SELECT '1'", False),
    ("SELECT id, id FROM emp", "SELECT id, id FROM emp", False),
    ("SELECT title FROM proj ORDER BY title", "SELECT title FROM proj ORDER BY title DESC", True),
    # test-suite decides order by the text "order by" in the gold: a line break or two
    # spaces between the words leave the rows unordered, a subquery's ORDER BY orders them
    (
        "SELECT name FROM emp ORDER\nBY salary",
        "SELECT name FROM emp ORDER BY salary DESC",
        True,
    ),
    ("SELECT name FROM emp ORDER  BY name", "SELECT name FROM emp ORDER BY name DESC", True),
    (
        "SELECT title FROM proj WHERE title IN (SELECT title FROM proj ORDER BY title LIMIT 2)",
        "SELECT title FROM proj WHERE title IN ('X', 'Y') ORDER BY title DESC",
        False,
    ),
    (
        "SELECT id FROM emp WHERE name <> 'order by' AND id < 4",
        "SELECT id FROM emp WHERE id < 4 ORDER BY id DESC",
        False,
    ),
    # spaced comparison operators: test-suite joins them in both queries before running
    (
        "SELECT name FROM emp WHERE salary >= 200",
        "SELECT name FROM emp WHERE salary > = 200",
        False,
    ),
    (
        "SELECT name FROM emp WHERE salary <= 150",
        "SELECT name FROM emp WHERE salary < = 150",
        False,
    ),
    (
        "SELECT COUNT(*) FROM emp WHERE bonus != 10",
        "SELECT COUNT(*) FROM emp WHERE bonus ! = 10",
        False,
    ),
    ("SELECT COUNT(*) FROM emp WHERE salary > = 200", "SELECT 2", False),
    ("SELECT 20", "SELECT YEAR(CURDATE()) - 2000", False),
    # TEXT that is not UTF-8: test-suite drops the bad bytes; BIRD's sqlite3 read fails
    ("SELECT t FROM bad WHERE t <> 'ok'", "SELECT 'AB'", False),
    ("SELECT t FROM bad WHERE t <> 'ok'", "SELECT t FROM bad WHERE t <> 'ok'", False),
    ("SELECT COUNT(*) FROM bad", "SELECT COUNT(*) FROM bad WHERE LENGTH(t) > 0", False),
    ("SELECT 'ok'", "SELECT t FROM bad ORDER BY t DESC LIMIT 1", True),
    # test-suite's quick rejection sorts each row by str(value) + str(type): an int and a
    # float in one row can sort differently, so equal rows are rejected
    ("SELECT 1, 1.5", "SELECT 1.0, 1.5", False),
    ("SELECT 1, 1.5", "SELECT 1, 1.5", False),
    ("SELECT 2, 10", "SELECT 2.0, 10", False),
]

# Families of queries over the same question: every ordered (gold, prediction) pair inside
# a family is a case. Each entry: (SQL, whether its outermost query orders its rows: hand
# label, used when it is the gold). Every entry runs, so each can be a gold.
FAMILIES = {
    "duplicates_distinct": [
        ("SELECT title FROM proj", False),
        ("SELECT DISTINCT title FROM proj", False),
        ("SELECT title FROM proj GROUP BY title", False),
        ("SELECT title FROM proj ORDER BY title", True),
        ("SELECT DISTINCT title FROM proj ORDER BY title DESC", True),
        ("SELECT emp_id, title FROM proj", False),
    ],
    "join_fan_out": [
        ("SELECT e.name FROM emp e JOIN proj p ON e.id = p.emp_id", False),
        ("SELECT DISTINCT e.name FROM emp e JOIN proj p ON e.id = p.emp_id", False),
        (
            "SELECT name FROM emp WHERE EXISTS (SELECT 1 FROM proj WHERE proj.emp_id = emp.id)",
            False,
        ),
        ("SELECT e.name FROM emp e LEFT JOIN proj p ON e.id = p.emp_id", False),
        ("SELECT e.name FROM emp e JOIN proj p ON e.id = p.emp_id ORDER BY e.name", True),
        ("SELECT e.name FROM proj p JOIN emp e ON e.id = p.emp_id GROUP BY p.title", False),
    ],
    "outer_inner_order_ties": [
        ("SELECT name FROM emp ORDER BY salary", True),
        ("SELECT name FROM emp ORDER BY salary, name", True),
        ("SELECT name FROM (SELECT name FROM emp ORDER BY salary)", False),
        ("SELECT name FROM emp ORDER BY salary DESC", True),
        ("SELECT name FROM emp ORDER BY salary LIMIT 3", True),
        ("SELECT name FROM emp WHERE id IN (SELECT id FROM emp ORDER BY salary LIMIT 3)", False),
    ],
    "column_order_aliases": [
        ("SELECT name, salary FROM emp", False),
        ("SELECT name AS n, salary AS s FROM emp", False),
        ("SELECT e.salary, e.name FROM emp AS e", False),
        ("SELECT name, CAST(salary AS INTEGER) FROM emp", False),
        ("SELECT name, salary, id FROM emp", False),
        ("SELECT name, salary FROM emp ORDER BY salary DESC, name", True),
    ],
    "int_float_text": [
        ("SELECT COUNT(*) FROM emp WHERE bonus IS NULL", False),
        ("SELECT 2.0", False),
        ("SELECT COUNT(*) - COUNT(bonus) FROM emp", False),
        ("SELECT SUM(bonus IS NULL) FROM emp", False),
        ("SELECT '2'", False),
        ("SELECT COUNT(bonus) FROM emp", False),
        ("SELECT TOTAL(bonus IS NULL) FROM emp", False),
    ],
    "nulls": [
        ("SELECT bonus FROM emp", False),
        ("SELECT COALESCE(bonus, 0) FROM emp", False),
        ("SELECT DISTINCT bonus FROM emp", False),
        ("SELECT bonus FROM emp ORDER BY bonus", True),
        ("SELECT bonus FROM emp ORDER BY bonus DESC", True),
        ("SELECT MAX(bonus) FROM emp WHERE bonus IS NULL", False),
    ],
    "empty_results": [
        ("SELECT name FROM emp WHERE salary > 1000", False),
        ("SELECT name, id FROM emp WHERE salary > 1000", False),
        ("SELECT name FROM emp WHERE 0 ORDER BY name", True),
        ("SELECT NULL FROM emp WHERE salary > 1000", False),
        ("SELECT name FROM emp WHERE salary > 250", False),
        ("SELECT MAX(salary) FROM emp WHERE salary > 1000", False),
    ],
    "bad_utf8_and_case": [
        ("SELECT t FROM bad", False),
        ("SELECT t FROM bad ORDER BY t", True),
        ("SELECT DISTINCT t FROM bad", False),
        ("SELECT t FROM bad WHERE t <> 'ok'", False),
        ("SELECT UPPER(t) FROM bad", False),
        ("SELECT LOWER(name) FROM emp WHERE name LIKE 'a%'", False),
    ],
}

# predictions that cannot be golds: several statements, slow-but-correct, errors
EXTRA_PAIRS = [
    ("SELECT COUNT(*) FROM emp", "SELECT COUNT(*) FROM emp;SELECT COUNT(*) FROM emp", False),
    ("SELECT name FROM emp", "SELECT name FROM emp; DROP TABLE emp", False),
    ("SELECT name FROM emp", "SELECT name FROM emp; -- the names", False),
    ("SELECT 1", "SELECT 1; SELECT 2", False),
    (
        "SELECT 100000",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000) "
        "SELECT MAX(x) FROM c",
        False,
    ),
    (
        "SELECT 46656",
        "SELECT COUNT(*) FROM emp a, emp b, emp c, emp d, emp e, emp f",
        False,
    ),
    ("SELECT name FROM emp", "SELECT name FROM emp WHERE", False),
    ("SELECT name FROM emp", "SELECT name FROM nowhere", False),
    ("SELECT COUNT(*) FROM bad", "SELECT COUNT(t) FROM bad", False),
    ("SELECT t FROM bad WHERE t = 'ok'", "SELECT 'ok'", False),
]


def family_pairs() -> list[tuple[str, str, bool]]:
    """Every ordered (gold, prediction) pair inside each family, then ``EXTRA_PAIRS``."""
    pairs = [
        (gold, pred, ordered)
        for family in FAMILIES.values()
        for gold, ordered in family
        for pred, _ in family
        if pred != gold
    ]
    return pairs + EXTRA_PAIRS


# how a model may write its answer: each prediction of PAIRS is scored in every form, each
# of family_pairs() in one form (in turn), which keeps the file fast
FORMS = {
    "fenced": "Let me work it out.\n```sql\n{sql}\n```",
    "plain_fence": "```\n{sql}\n```\nDone.",
    "answer_tag": "Reasoning...\n<answer>{sql}</answer>",
    "solution_fenced": "<solution>\n```sql\n{sql}\n```\n</solution>",
    "bare": "The query is:\n{sql};\nThis will select what was asked.",
    "inline": "Final answer: `{sql}`",
    "think_draft": "<think>```sql\nSELECT 'draft' FROM emp\n```</think>\n```sql\n{sql}\n```",
}


def _blank_line_form(sql: str) -> str | None:
    if " FROM " not in sql or ";" in sql:
        return None
    return "SQL:\n" + sql.replace(" FROM ", "\n\nFROM ", 1) + "\n\nIt selects the rows."


def build_db(path) -> str:
    """The agreement database: duplicates, NULLs, floats, mixed case, invalid UTF-8."""
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE emp(id INTEGER, name TEXT, dept_id INTEGER, salary REAL, bonus INTEGER);
        INSERT INTO emp VALUES (1,'Ann',1,100.0,10),(2,'bob',1,200.5,NULL),(3,'Cid',2,100.0,5),
            (4,'Dee',2,300.0,NULL),(5,'Eve',3,200.5,10),(6,'ann',1,150.0,0);
        CREATE TABLE dept(id INTEGER, name TEXT);
        INSERT INTO dept VALUES (1,'Sales'),(2,'R&D'),(3,'Ops'),(4,'Empty');
        CREATE TABLE proj(emp_id INTEGER, title TEXT);
        INSERT INTO proj VALUES (1,'X'),(1,'Y'),(2,'X'),(3,'Z'),(3,'Z');
        CREATE TABLE bad(t TEXT);
        INSERT INTO bad VALUES (CAST(x'41ff42' AS TEXT)), ('ok');
        """
    )
    conn.commit()
    conn.close()
    return str(path)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return build_db(tmp_path_factory.mktemp("agree") / "agree.sqlite")


# how each evaluator's connection reads TEXT (None: sqlite3's default, strict UTF-8)
_TEXT_FACTORY = {
    "bird": None,
    "spider": lambda b: b.decode(errors="ignore"),
    "sql": lambda b: b.decode("utf-8", "replace"),
}


def _fetch(db: str, sql: str, profile: str) -> list[tuple] | None:
    conn = sqlite3.connect(db)
    if _TEXT_FACTORY[profile] is not None:
        conn.text_factory = _TEXT_FACTORY[profile]
    try:
        return conn.execute(sql).fetchall()  # sqlite3 refuses several statements, as they do
    except Exception:
        return None
    finally:
        conn.close()


def _test_suite_rewrite(sql: str) -> str:
    """test-suite's postprocess (spaced operators) and replace_cur_year, from their text."""
    sql = sql.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")
    return re.sub(r"YEAR\s*\(\s*CURDATE\s*\(\s*\)\s*\)\s*", "2020", sql, flags=re.I)


def _test_suite_result_eq(r1: list[tuple], r2: list[tuple], order_matters: bool) -> bool:
    """Spider test-suite's ``result_eq`` (r1 the gold), written from its logic."""
    if not r1 and not r2:
        return True
    if len(r1) != len(r2) or len(r1[0]) != len(r2[0]):
        return False

    def unordered(rows):
        return [tuple(sorted(row, key=lambda v: str(v) + str(type(v)))) for row in rows]

    u1, u2 = unordered(r1), unordered(r2)
    if (u1 != u2) if order_matters else (set(u1) != set(u2)):
        return False
    width = len(r1[0])
    for perm in permutations(range(width)):
        moved = [tuple(row[perm[i]] for i in range(width)) for row in r2]
        if order_matters and moved == r1:
            return True
        if not order_matters and Counter(moved) == Counter(r1):
            return True
    return False


def official_label(profile: str, db: str, gold: str, pred: str, ordered: bool) -> bool:
    """The verdict of the profile's official rule; ``ordered`` is for the plain profile."""
    if profile == "spider":
        gold, pred = _test_suite_rewrite(gold), _test_suite_rewrite(pred)
    g, p = _fetch(db, gold, profile), _fetch(db, pred, profile)
    if g is None:
        # BIRD scores 0 when the gold fails (its read of bad UTF-8); the others must run it
        assert profile == "bird" or gold.startswith("SELECT COUNT(*) FROM emp WHERE salary > ="), (
            gold
        )
        return False
    if p is None:
        return False
    if profile == "bird":
        return set(p) == set(g)
    if profile == "spider":
        return _test_suite_result_eq(g, p, "order by" in gold.lower())
    return p == g if ordered else Counter(p) == Counter(g)


def _cases():
    for gold, pred, ordered in PAIRS:
        for form, template in FORMS.items():
            if form == "inline" and "\n" in pred:
                continue
            yield gold, pred, ordered, form, template.format(sql=pred)
        blank = _blank_line_form(pred)
        if blank is not None:
            yield gold, pred, ordered, "blank_line", blank
    names = list(FORMS)
    for i, (gold, pred, ordered) in enumerate(family_pairs()):
        form = names[i % len(names)]
        yield gold, pred, ordered, form, FORMS[form].format(sql=pred)


def distinct_pairs() -> set[tuple[str, str]]:
    return {(gold, pred) for gold, pred, *_ in _cases()}


@pytest.mark.parametrize("profile", ["bird", "spider", "sql"])
def test_divrl_agrees_with_the_official_rule(db, profile):
    cases = list(_cases())
    assert len(distinct_pairs()) >= 150  # issue 13: at least 150 SQL pairs per profile
    by_pair = {(g, p, o): official_label(profile, db, g, p, o) for g, p, o, _, _ in cases}
    labels = [by_pair[g, p, o] for g, p, o, _, _ in cases]
    batch = score_batch(
        [ScoreRequest(profile, text, g, {"db_path": db}) for g, _, _, _, text in cases],
        max_workers=2,
    )
    disagreements = [
        (form, pred, gold, label, r.reason, r.extracted)
        for (gold, pred, _, form, _), label, r in zip(cases, labels, batch.results, strict=True)
        if (r.score == 1.0) != label
    ]
    agreement = 1 - len(disagreements) / len(cases)
    assert agreement >= 0.99, disagreements
    # the pairs exercise both verdicts in every profile
    assert 0 < sum(labels) < len(labels)


def test_the_three_profiles_really_differ(db):
    """Hand-checked verdicts on pairs where the official rules disagree with each other."""

    def verdicts(gold, pred):
        return tuple(official_label(p, db, gold, pred, False) for p in ("bird", "spider", "sql"))

    assert verdicts("SELECT title FROM proj", "SELECT DISTINCT title FROM proj") == (
        True,
        False,
        False,
    )
    assert verdicts("SELECT name, salary FROM emp", "SELECT salary, name FROM emp") == (
        False,
        True,
        False,
    )
    assert verdicts("SELECT 1", "SELECT 1.0") == (True, True, True)
