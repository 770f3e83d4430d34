"""Hypothesis fuzzing: no exception escapes a verifier and every call returns in time."""

import hashlib
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from divrl.rewards import compute_score, compute_score_detailed

LIMIT = 1.0
SLACK = 3.0  # scheduling on a loaded 2-core machine; a killed worker is re-forked in ms


@pytest.fixture(autouse=True, scope="module")
def warm_pool():
    """Start the worker pool first, so the timings below measure scoring, not start-up."""
    compute_score("math", "\\boxed{\\sqrt{4}}", "2")


MATH_PIECES = [
    "\\boxed{",
    "}",
    "{",
    "\\frac{",
    "}{",
    "^",
    "9",
    "\\sqrt{",
    "\\{",
    "\\}",
    "(",
    ")",
    "[",
    ",",
    "=",
    ".",
    "-",
    "x",
    "\\infty",
    "<answer>",
    "</answer>",
    "\\fbox",
    "$",
    "\\left(",
    "\\right)",
    "!",
    "e",
    "\\text{",
]
SQL_PIECES = [
    "SELECT ",
    "WITH ",
    "RECURSIVE ",
    "c(x) AS (",
    "FROM t",
    " a, t b",
    " UNION ALL ",
    "DROP TABLE t",
    "DELETE FROM t",
    "ATTACH ':memory:' AS x",
    "PRAGMA writable_schema=1",
    ";",
    "'",
    '"',
    "(",
    ")",
    "```sql\n",
    "```",
    "\n\n",
    "COUNT(*)",
    " WHERE ",
    "x+1",
    "1",
    "*",
    "--",
    "/*",
    "zeroblob(1000000000)",
    "load_extension('x')",
]


def texts(pieces):
    return st.one_of(
        st.text(max_size=200),
        st.lists(st.sampled_from(pieces), max_size=40).map("".join),
        st.lists(st.one_of(st.sampled_from(pieces), st.text(max_size=5)), max_size=30).map("".join),
    )


FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


# boxed piece soup: extraction succeeds, so these reach math-verify in a worker
BOXED = st.lists(st.sampled_from(MATH_PIECES), min_size=1, max_size=25).map(
    lambda parts: "\\boxed{" + "".join(parts) + "}"
)


@FUZZ
@given(
    solution=st.one_of(texts(MATH_PIECES), BOXED),
    gold=st.sampled_from(["3", "\\frac{1}{2}", "\\{1, 2\\}", "x"]),
)
def test_fuzz_math(solution, gold):
    start = time.monotonic()
    r = compute_score_detailed("math", solution, gold, timeout=LIMIT)
    assert 0.0 <= r.score <= 1.0
    assert r.reason
    assert time.monotonic() - start < LIMIT + SLACK


@pytest.fixture(scope="module")
def fuzz_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "f.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x INTEGER, y TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, str(i)) for i in range(300)])
    conn.commit()
    conn.close()
    return str(path)


@FUZZ
@given(solution=texts(SQL_PIECES))
def test_fuzz_sql(fuzz_db, solution):
    before = hashlib.sha256(Path(fuzz_db).read_bytes()).digest()
    start = time.monotonic()
    r = compute_score_detailed(
        "sql", solution, "SELECT COUNT(*) FROM t", {"db_path": fuzz_db}, timeout=LIMIT
    )
    assert 0.0 <= r.score <= 1.0
    assert time.monotonic() - start < LIMIT + SLACK
    assert hashlib.sha256(Path(fuzz_db).read_bytes()).digest() == before


N = 1_000_000
LONG_INPUTS = {
    "fences": "```sql\n" * (N // 7),
    "unclosed-boxes": "\\boxed{" * (N // 7),
    "open-braces": "\\boxed{" + "{" * N,
    "ctes": "with x as (" * (N // 11),
    "quoted-semicolons": "SELECT '" + ";" * N,
    "selects": "SELECT " * (N // 7),
    "answer-tags": "<answer>" * (N // 8),
    "digits": "9" * N,
}


@pytest.mark.parametrize("name", list(LONG_INPUTS), ids=list(LONG_INPUTS))
def test_in_process_extraction_stays_linear(name, tmp_path):
    """The cheap path runs in the caller's process without a time limit: it must be linear."""
    from divrl.rewards import get_verifier

    text = LONG_INPUTS[name]
    for source in ("math", "sql"):
        _, verifier = get_verifier(source)
        start = time.monotonic()
        verifier.quick(text, "3", {"db_path": str(tmp_path / "unused.sqlite")})
        assert time.monotonic() - start < 3.0, source
