import hashlib
import sqlite3
import time
from pathlib import Path

import pytest

from divrl.rewards import compute_score, compute_score_detailed, extract_sql
from divrl.rewards.sql_reward import first_statement, run_query

LIMIT = 1.0
SLACK = 3.0  # scheduling on a loaded 2-core machine; a killed worker is re-forked in ms


@pytest.fixture(autouse=True, scope="module")
def warm_pool():
    """Start the worker pool first, so the timings below measure scoring, not start-up."""
    compute_score("math", "\\boxed{\\sqrt{4}}", "2")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("sql") / "t.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, n INTEGER)")
    conn.executemany(
        "INSERT INTO t VALUES (?, ?, ?)", [(i, f"x{i % 3}", i % 4) for i in range(1, 101)]
    )
    conn.commit()
    conn.close()
    return str(path)


def digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("SELECT COUNT(*) FROM t", "SELECT COUNT(*) FROM t"),
        ("```sql\nSELECT 1;\n```\nthen\n```sql\nSELECT 2;\n```", "SELECT 2;"),
        ("```sqlite\nselect 3\n```", "select 3"),
        ("```\nSELECT 4\n```", "SELECT 4"),
        (
            "The query is: SELECT a FROM t WHERE b IN (SELECT c FROM u)",
            "SELECT a FROM t WHERE b IN (SELECT c FROM u)",
        ),
        ("SELECT a FROM t UNION SELECT b FROM u", "SELECT a FROM t UNION SELECT b FROM u"),
        ("SELECT 1; DROP TABLE t;", "SELECT 1; DROP TABLE t;"),  # all statements kept: scored 0
        ("```sql\nSELECT 1; DROP TABLE t;\n```", "SELECT 1; DROP TABLE t;"),
        ("First SELECT 1;\n\nFinally:\nSELECT 2\n\nThis returns two.", "SELECT 2"),
        ("WITH c AS (SELECT 1 AS x) SELECT x FROM c", "WITH c AS (SELECT 1 AS x) SELECT x FROM c"),
        ("I solved it with care: SELECT 5", "SELECT 5"),
        ("```sql\nSELECT 'a;b' FROM t; DELETE FROM t;\n```", "SELECT 'a;b' FROM t; DELETE FROM t;"),
        ("no query here", None),
        ("```sql\nSELECT 6 FROM t", "SELECT 6 FROM t"),
    ],
)
def test_extract_sql(text, expected):
    assert extract_sql(text) == expected


def test_first_statement_respects_quotes():
    assert first_statement("SELECT ';' ; SELECT 2") == "SELECT ';'"


def test_bare_query_and_fenced_query(db):
    extra = {"db_path": db}
    assert compute_score("sql", "SELECT COUNT(*) FROM t", "SELECT COUNT(*) FROM t", extra) == 1.0
    assert compute_score("toy_sql", "SELECT COUNT(id) FROM t", "SELECT COUNT(*) FROM t", extra) == 1
    fenced = "Here:\n```sql\nSELECT count(*) FROM t WHERE n >= 0;\n```"
    assert compute_score("bird", fenced, "SELECT COUNT(*) FROM t", extra) == 1.0
    r = compute_score_detailed("spider", "SELECT COUNT(*) FROM t WHERE n = 1", "SELECT 100", extra)
    assert (r.score, r.reason) == (0.0, "wrong")


def test_multiset_vs_order(db):
    extra = {"db_path": db}
    gold = "SELECT name FROM t WHERE id <= 6"
    # same multiset in another order: correct without ORDER BY in the gold
    assert compute_score("sql", "SELECT name FROM t WHERE id <= 6 ORDER BY name", gold, extra) == 1
    # a set is not a multiset: duplicates matter
    assert compute_score("sql", "SELECT DISTINCT name FROM t WHERE id <= 6", gold, extra) == 0
    ordered = "SELECT id FROM t WHERE id <= 5 ORDER BY id DESC"
    assert compute_score("sql", "SELECT id FROM t WHERE id <= 5 ORDER BY id", ordered, extra) == 0
    assert compute_score("sql", ordered, ordered, extra) == 1
    # column order matters (rows are compared as tuples)
    assert compute_score("sql", "SELECT n, id FROM t", "SELECT id, n FROM t", extra) == 0


def test_sql_error_and_gold_error(db):
    extra = {"db_path": db}
    r = compute_score_detailed("sql", "SELECT nope FROM t", "SELECT 1", extra)
    assert (r.score, r.reason) == (0.0, "sql_error") and "nope" in r.detail
    r = compute_score_detailed("sql", "SELECT 1", "SELECT broken FROM", extra)
    assert (r.score, r.reason) == (0.0, "gold_error")


def test_missing_database_is_a_configuration_error(tmp_path):
    with pytest.raises(ValueError, match="db_path"):
        compute_score("sql", "SELECT 1", "SELECT 1", {})
    with pytest.raises(ValueError, match="not found"):
        compute_score("sql", "SELECT 1", "SELECT 1", {"db_path": str(tmp_path / "none.db")})


def test_row_limit(db):
    with pytest.raises(Exception, match="more than 10 rows"):
        run_query(db, "SELECT * FROM t", time.monotonic() + 5, max_rows=10)
    assert len(run_query(db, "SELECT * FROM t LIMIT 10", time.monotonic() + 5, max_rows=10)) == 10


ADVERSARIAL = {
    "drop": "```sql\nDROP TABLE t;\n```",
    "delete": "```sql\nDELETE FROM t;\n```",
    "update": "```sql\nUPDATE t SET n = 0;\n```",
    "insert": "```sql\nINSERT INTO t VALUES (1000, 'z', 1);\n```",
    "attach": "```sql\nATTACH DATABASE ':memory:' AS evil;\n```",
    "pragma-writable-schema": "```sql\nPRAGMA writable_schema = ON;\n```",
    "pragma-function": "```sql\nSELECT * FROM pragma_table_info('t');\n```",
    "load-extension": "```sql\nSELECT load_extension('/tmp/evil.so');\n```",
    "vacuum-into": "```sql\nVACUUM INTO '/tmp/divrl_copy.sqlite';\n```",
    "create-in-cte": "```sql\nWITH x AS (SELECT 1) CREATE TABLE y(a);\n```",
    "recursive-cte": (
        "```sql\nWITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
        "SELECT COUNT(*) FROM c;\n```"
    ),
    # 100^5 rows: ~0.8 s per 1e8 on a fast core, so far past the limit on any CPU
    "cross-join-1e10": "SELECT COUNT(*) FROM t a, t b, t c, t d, t e",
    "huge-blob": "SELECT length(zeroblob(2000000000))",
    "huge-string": "SELECT length(printf('%.*c', 2000000000, 'x'))",
}


@pytest.mark.parametrize("attack", list(ADVERSARIAL), ids=list(ADVERSARIAL))
def test_adversarial_queries_leave_db_identical_and_score_zero(db, attack):
    before = digest(db)
    start = time.monotonic()
    r = compute_score_detailed(
        "sql", ADVERSARIAL[attack], "SELECT COUNT(*) FROM t", {"db_path": db}, timeout=LIMIT
    )
    elapsed = time.monotonic() - start
    assert r.score == 0.0
    assert r.reason in ("forbidden", "sql_error", "timeout"), r
    assert r.extracted is not None  # the query really reached SQLite
    assert elapsed < LIMIT + SLACK
    assert digest(db) == before
    # the database still answers normally
    assert compute_score("sql", "SELECT COUNT(*) FROM t", "SELECT 100", {"db_path": db}) == 1.0


def test_several_statements_score_zero_and_none_runs(db):
    before = digest(db)
    solution = "```sql\nSELECT COUNT(*) FROM t; DELETE FROM t;\n```"
    r = compute_score_detailed("sql", solution, "SELECT 100", {"db_path": db})
    assert (r.score, r.reason) == (0.0, "multiple_statements")
    assert r.extracted == "SELECT COUNT(*) FROM t; DELETE FROM t;"
    assert digest(db) == before


def test_endless_queries_stop_at_the_limit(db):
    compute_score("sql", "SELECT 1", "SELECT 1", {"db_path": db})  # a ready worker
    for attack in ("recursive-cte", "cross-join-1e10"):
        start = time.monotonic()
        r = compute_score_detailed(
            "sql", ADVERSARIAL[attack], "SELECT 1", {"db_path": db}, timeout=LIMIT
        )
        assert r.reason == "timeout"
        # SQLite's progress handler stops the query itself: no worker is killed
        assert time.monotonic() - start < LIMIT + 1.0


def test_writes_are_refused_by_the_connection_itself(db):
    for sql in ("DROP TABLE t", "DELETE FROM t", "ATTACH ':memory:' AS x", "PRAGMA user_version=3"):
        with pytest.raises(
            Exception, match=r"not authorized|only reading|readonly|only queries run"
        ):
            run_query(db, sql, time.monotonic() + 5, max_rows=10)


@pytest.mark.parametrize(
    "text, expected",
    [
        # the forms issue 13 found broken before
        ("<answer>SELECT a FROM t</answer>", "SELECT a FROM t"),
        ("<solution>SELECT a FROM t;</solution> done", "SELECT a FROM t;"),
        ("<sql>\nSELECT a FROM t\n</sql>", "SELECT a FROM t"),
        ("SELECT a FROM t\nThis query will select the names you asked for.", "SELECT a FROM t"),
        ("SELECT a FROM t WHERE b = ';' AND c = 1", "SELECT a FROM t WHERE b = ';' AND c = 1"),
        ("SELECT a\nFROM t\n\nWHERE b > 1\n\nThat is all.", "SELECT a\nFROM t\n\nWHERE b > 1"),
        ("Use `SELECT COUNT(*) FROM t` for that.", "SELECT COUNT(*) FROM t"),
        (
            "<think>```sql\nSELECT draft FROM t\n```</think>Final: SELECT final FROM t;",
            "SELECT final FROM t;",
        ),
        ("<think>I would run SELECT a FROM t</think>", "SELECT a FROM t"),
        ("I will select rows with SELECT a FROM t.", "SELECT a FROM t"),
        (
            "SELECT a FROM t -- ; not the end\nWHERE b = 1",
            "SELECT a FROM t -- ; not the end\nWHERE b = 1",
        ),
        ("SELECT a FROM t; SELECT 1", "SELECT a FROM t; SELECT 1"),
        ("Draft: SELECT 1;\n\nFinal:\nSELECT 2;", "SELECT 2;"),
    ],
)
def test_extraction_forms(text, expected):
    assert extract_sql(text) == expected
