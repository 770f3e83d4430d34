import sqlite3

import pytest

from divrl.evaluation.equivalence import (
    ClusterRequest,
    ExactEquivalence,
    MathEquivalence,
    SqlResultEquivalence,
    cluster_answers,
    get_equivalence,
)
from divrl.evaluation.stats import cluster_correctness, maj_at_k
from divrl.evaluation.styles import solution_style, sql_shape


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "shop.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE item (id INTEGER, nm TEXT, pr INTEGER, shop INTEGER)")
    conn.execute("CREATE TABLE shop (id INTEGER, nm TEXT)")
    conn.executemany(
        "INSERT INTO item VALUES (?, ?, ?, ?)",
        [(1, "ba", 10, 1), (2, "de", 30, 1), (3, "fi", 50, 2), (4, "go", 70, 2)],
    )
    conn.executemany("INSERT INTO shop VALUES (?, ?)", [(1, "red"), (2, "blue")])
    conn.commit()
    conn.close()
    return str(path)


def test_math_clusters_equivalent_forms():
    req = ClusterRequest(["1/2", "0.5", None, "\\frac{1}{2}", "3", " 3 ", "1/3"], "math")
    (ids,) = MathEquivalence().cluster([req])
    assert ids[0] == ids[1] == ids[3]
    assert ids[2] == -1
    assert ids[4] == ids[5] != ids[0]
    assert ids[6] not in (ids[0], ids[4])
    assert sorted(set(ids) - {-1}) == [0, 1, 2]


def test_majority_of_equivalent_answers_wins():
    # "0.5" and "1/2" are one answer with two votes; "3" has two votes as strings agree
    answers = ["0.5", "1/2", "3", "3", "1/2"]
    correct = [True, True, False, False, True]
    (ids,) = cluster_answers([ClusterRequest(answers, "math")])
    ok = cluster_correctness(ids, correct)
    assert maj_at_k(ids, ok, 5) == 1.0
    # by string equality "3" and "1/2" would tie at two votes each
    (exact,) = ExactEquivalence().cluster([ClusterRequest(answers, "math")])
    assert maj_at_k(exact, cluster_correctness(exact, correct), 4) < 1.0


def test_sql_clusters_by_result_set(db):
    answers = [
        "SELECT nm FROM item WHERE pr > 20",
        "select nm from item where pr >= 30 order by pr desc",  # same rows, other order
        "SELECT a.nm FROM item a JOIN shop b ON a.shop=b.id WHERE b.nm='blue'",
        "SELECT nm FROM item WHERE shop IN (SELECT id FROM shop WHERE nm='blue')",
        "SELECT nm FROM nowhere",  # fails: does not vote
        "DELETE FROM item",  # refused by the read-only execution: does not vote
        None,
    ]
    (ids,) = SqlResultEquivalence().cluster([ClusterRequest(answers, "sql", {"db_path": db})])
    assert ids[0] == ids[1]
    assert ids[2] == ids[3] != ids[0]
    assert ids[4] == ids[5] == ids[6] == -1
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT COUNT(*) FROM item").fetchone() == (4,)
    with pytest.raises(ValueError, match="db_path"):
        SqlResultEquivalence().cluster([ClusterRequest(answers, "sql", {})])


def test_equivalence_lookup_follows_the_verifier():
    assert isinstance(get_equivalence("toy_sql"), SqlResultEquivalence)
    assert isinstance(get_equivalence("gsm8k"), MathEquivalence)


TOY_QUERIES = {
    "count(*)": "SELECT COUNT(*) FROM item WHERE pr>=30",
    "count(col)": "SELECT COUNT(nm) FROM item WHERE pr>=30",
    "order+limit": "SELECT nm FROM item ORDER BY pr DESC LIMIT 1",
    "scalar-subquery": "SELECT nm FROM item WHERE pr=(SELECT MAX(pr) FROM item)",
    "join": "SELECT a.nm FROM item a JOIN shop b ON a.shop=b.id WHERE b.nm<>'x'",
    "in-subquery": "SELECT nm FROM item WHERE shop NOT IN (SELECT id FROM shop WHERE nm='x')",
    "sum": "SELECT SUM(pr) FROM item WHERE qt<3",
    "cte+sum": "WITH s AS (SELECT pr FROM item WHERE qt<3) SELECT SUM(pr) FROM s",
    "from-subquery+sum": "SELECT SUM(pr) FROM (SELECT pr FROM item WHERE qt<3)",
    "exists-subquery": "SELECT * FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.id = t.id)",
    "avg+group-by+having+order": "SELECT d, AVG(x) FROM t GROUP BY d HAVING COUNT(*) > 2 ORDER BY 2",
    "union": "SELECT a FROM t UNION SELECT b FROM u",
    "plain": "SELECT nm FROM t",
    "unparsable": "SELEC nm FRM",
}


@pytest.mark.parametrize("label", sorted(TOY_QUERIES))
def test_sql_shape_hand_cases(label):
    assert sql_shape(TOY_QUERIES[label]) == label


def test_sql_shape_ignores_names_constants_and_case():
    assert sql_shape("select count(*) from u where b<=7") == "count(*)"
    # a scalar sub-query in a column does not make the outer query an aggregate
    assert sql_shape("SELECT nm, (SELECT MAX(x) FROM u) FROM t") == "scalar-subquery"
    assert sql_shape(None) is None


def test_solution_style_registry():
    import divrl.toy  # noqa: F401 - the toy world registers toy math's style

    assert solution_style("toy_sql", "...", "SELECT COUNT(nm) FROM t") == "count(col)"
    assert solution_style("toy_math", "4*9=36, 36+5=41. \\boxed{41}", "41") == "steps"
    assert solution_style("gsm8k", "so 41", "41") is None
