"""The official evaluators' own quirks, each checked on its own: the spider profile's order
rule, operator rewrite and text decoding, BIRD's strict text reading, and the named option
that brings back divrl's parse of the outermost ORDER BY."""

import sqlite3

import pytest

from divrl.rewards import compute_score_detailed
from divrl.rewards.sql.compare import gold_text_orders, normalise_like_test_suite, rows_equal
from divrl.rewards.sql_reward import SqlVerifier


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("official") / "o.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE emp(id INTEGER, name TEXT, salary REAL);
        INSERT INTO emp VALUES (1,'Ann',100.0),(2,'Bob',300.0),(3,'Cid',200.0);
        CREATE TABLE bad(t TEXT);
        INSERT INTO bad VALUES (CAST(x'41ff42' AS TEXT)), ('ok');
        """
    )
    conn.commit()
    conn.close()
    return str(path)


def score(source, sql, gold, db, **extra):
    return compute_score_detailed(source, f"```sql\n{sql}\n```", gold, {"db_path": db, **extra})


def test_spider_orders_rows_by_the_gold_text_like_test_suite(db):
    reversed_names = "SELECT name FROM emp ORDER BY salary DESC"
    # a line break between ORDER and BY: test-suite's text test finds no "order by"
    assert score("spider", reversed_names, "SELECT name FROM emp ORDER\nBY salary", db).score == 1
    # "order by" inside a string literal of the gold: test-suite compares order
    gold = "SELECT name FROM emp WHERE name <> 'order by' ORDER  BY id"
    assert score("spider", "SELECT name FROM emp ORDER BY id DESC", gold, db).score == 0
    assert gold_text_orders("SELECT x FROM (SELECT x FROM t ORDER BY x)")
    assert not gold_text_orders("SELECT x FROM t ORDER\tBY x")


def test_divrls_outer_parse_is_a_named_option(db):
    gold = "SELECT name FROM emp ORDER\nBY salary"
    reversed_names = "SELECT name FROM emp ORDER BY salary DESC"
    parsed = score("spider", reversed_names, gold, db, sql_order="outer_parse")
    assert (parsed.score, parsed.reason) == (0.0, "wrong")
    strict = SqlVerifier(profile="spider", order_rule="outer_parse")
    text = f"```sql\n{reversed_names}\n```"
    extra = {"db_path": db}
    assert strict.verify(text, gold, extra, deadline=1e18).score == 0
    # the plain profile keeps the parse by default and takes the text rule when asked
    literal = "SELECT id FROM emp WHERE name <> 'order by'"
    desc = "SELECT id FROM emp ORDER BY id DESC"
    assert score("sql", desc, literal, db).score == 1
    assert score("sql", desc, literal, db, sql_order="gold_text").score == 0


def test_bad_order_options_are_refused_with_the_field_named(db):
    with pytest.raises(ValueError, match=r"extra_info\['sql_order'\]"):
        score("spider", "SELECT 1", "SELECT 1", db, sql_order="sometimes")
    with pytest.raises(ValueError, match="order_rule"):
        SqlVerifier(order_rule="sometimes")


def test_spider_joins_spaced_operators_and_bird_does_not(db):
    gold = "SELECT name FROM emp WHERE salary >= 200"
    for spaced in ("salary > = 200", "NOT salary < = 150", "salary ! = 100 AND salary > 150"):
        sql = f"SELECT name FROM emp WHERE {spaced}"
        assert score("spider", sql, gold, db).score == 1, spaced
        assert score("bird", sql, gold, db).reason == "sql_error", spaced
    assert normalise_like_test_suite("SELECT YEAR(CURDATE()) - 1") == "SELECT 2020- 1"


def test_text_that_is_not_utf8(db):
    gold = "SELECT t FROM bad WHERE t <> 'ok'"
    # test-suite drops the bad byte: 'A\xffB' reads as 'AB'
    assert score("spider", "SELECT 'AB'", gold, db).score == 1
    # BIRD's sqlite3 read fails: on the prediction (the model's) or on the gold (not its)
    pred_fails = score("bird", gold, "SELECT 'AB'", db)
    assert (pred_fails.score, pred_fails.reason) == (0.0, "sql_error")
    assert "UTF-8" in pred_fails.detail
    gold_fails = score("bird", gold, gold, db)
    assert (gold_fails.score, gold_fails.reason) == (0.0, "gold_error")
    # the plain profile replaces it, the same way on both sides
    assert score("sql", gold, gold, db).score == 1
    assert score("sql", "SELECT 'AB'", gold, db).score == 0


def test_test_suites_quick_rejection_of_mixed_int_float_rows():
    # sorted by str(value) + str(type): (1, 1.5) -> (1.5, 1) but (1.0, 1.5) -> (1.0, 1.5)
    assert not rows_equal([(1.0, 1.5)], [(1, 1.5)], "spider", ordered=False)
    assert rows_equal([(1.0, 1.5)], [(1, 1.5)], "set", ordered=False)
    assert rows_equal([(1.5, 1)], [(1, 1.5)], "spider", ordered=False)


def test_wide_results_with_twin_columns_find_their_permutation():
    gold = [tuple([7] * 11 + [i]) for i in range(4)]
    pred = [tuple([i] + [7] * 11) for i in range(4)]
    assert rows_equal(pred, gold, "spider", ordered=True)
    assert not rows_equal(pred[::-1], gold, "spider", ordered=True)


def test_test_suites_distinct_stripping_is_an_option(db):
    gold, pred = "SELECT COUNT(salary) FROM emp", "SELECT COUNT(DISTINCT salary > 150) FROM emp"
    # kept by default (test-suite run with --keep_distinct): 2 values against 3
    assert score("spider", pred, gold, db).score == 0
    # stripped from both queries, as test-suite's default does: COUNT( salary > 150) is 3
    assert score("spider", pred, gold, db, sql_distinct="strip").score == 1
    strip = SqlVerifier(profile="spider", distinct="strip")
    assert strip.verify(f"```sql\n{pred}\n```", gold, {"db_path": db}, 1e18).score == 1
    with pytest.raises(ValueError, match=r"extra_info\['sql_distinct'\]"):
        score("spider", pred, gold, db, sql_distinct="sometimes")
    with pytest.raises(ValueError, match="distinct"):
        SqlVerifier(distinct="sometimes")


def test_spider_checks_every_test_suite_database_beside_db_path(tmp_path):
    folder = tmp_path / "concert"
    folder.mkdir()
    for name, rows in (("concert.sqlite", "(1),(2)"), ("concert_v2.sqlite", "(1),(0)")):
        conn = sqlite3.connect(folder / name)
        conn.executescript(f"CREATE TABLE t(x INTEGER); INSERT INTO t VALUES {rows};")
        conn.close()
    (folder / "concert.sqlite.notes").write_text("not a database: skipped")
    db = str(folder / "concert.sqlite")
    gold, pred = "SELECT x FROM t WHERE x < 3", "SELECT x FROM t WHERE x IN (1, 2)"
    # equal on concert.sqlite, different on the distilled variant: test-suite says wrong
    assert score("spider", pred, gold, db).score == 0
    assert score("spider", pred, gold, db, sql_databases="one").score == 1
    assert score("bird", pred, gold, db).score == 1  # BIRD runs on the one database
    assert score("spider", "SELECT x FROM t WHERE x < 3", gold, db).score == 1
    with pytest.raises(ValueError, match=r"extra_info\['sql_databases'\]"):
        score("spider", pred, gold, db, sql_databases="all")


def test_distinct_stripping_keeps_only_the_first_statement_like_test_suite(db):
    # test-suite's stripping re-joins the tokens of sqlparse's first statement only
    gold = "SELECT COUNT(*) FROM emp"
    chained = "SELECT COUNT(*) FROM emp; DELETE FROM emp"
    assert score("spider", chained, gold, db).reason == "multiple_statements"
    stripped = score("spider", chained, gold, db, sql_distinct="strip")
    assert (stripped.score, stripped.extracted) == (1.0, "SELECT COUNT(*) FROM emp")
    assert score("spider", "SELECT COUNT(*) FROM emp", gold, db).score == 1  # nothing deleted
