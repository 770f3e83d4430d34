import sqlite3
import threading
import time

import pytest

from divrl.rewards import (
    BatchScores,
    ScoreRequest,
    ScoreResult,
    compute_score,
    compute_score_detailed,
    is_correct,
    register_verifier,
    registered_sources,
    score_batch,
)
from divrl.rewards.pool import get_pool


@register_verifier("test_exact", "test_exact_alias", isolate=False)
def exact_in_process(solution_str, ground_truth, extra_info):
    return float(solution_str.strip() == ground_truth.strip())


@register_verifier("test_exact_isolated")
def exact_isolated(solution_str, ground_truth, extra_info):
    return ScoreResult(float(solution_str == ground_truth), solution_str, "correct")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("batch") / "toy.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (a INTEGER)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(12)])
    conn.commit()
    conn.close()
    return str(path)


def test_unknown_data_source_lists_registered_names():
    with pytest.raises(ValueError, match="unknown data_source 'nope'") as info:
        compute_score("nope", "1", "1")
    assert {"math", "sql", "gsm8k", "bird", "spider", "toy_math", "toy_sql"} <= set(
        registered_sources()
    )
    for name in registered_sources():  # the message names every registered source
        assert name in info.value.args[0]


def test_registered_functions_in_and_out_of_process():
    assert compute_score("test_exact", " a ", "a") == 1.0
    assert compute_score("TEST_EXACT_ALIAS", "a", "b") == 0.0
    r = compute_score_detailed("test_exact_isolated", "x", "x")
    assert (r.score, r.extracted) == (1.0, "x")


def test_batch_keeps_order_and_counts(db):
    items = []
    for i in range(40):
        items.append(ScoreRequest("math", f"\\boxed{{{i}}}", str(i if i % 2 else -1)))
        items.append(
            {
                "data_source": "toy_sql",
                "solution_str": f"SELECT COUNT(*) FROM t WHERE a < {i % 13}",
                "ground_truth": "SELECT 12",
                "extra_info": {"db_path": db},
            }
        )
    items.append(ScoreRequest("math", "no answer", "3"))
    items.append(ScoreRequest("sql", "SELECT nope", "SELECT 1", {"db_path": db}))
    batch = score_batch(items, max_workers=2)
    assert isinstance(batch, BatchScores)
    expected = []
    for i in range(40):
        expected += [float(i % 2 == 1), float(i % 13 == 12)]
    assert batch.scores == [*expected, 0.0, 0.0]
    assert batch.failures == {"no_answer": 1, "sql_error": 1}
    assert batch.n_failures == 2
    assert batch.elapsed > 0
    assert "mean score" in batch.summary()


def test_batch_rejects_bad_items_before_work(db):
    with pytest.raises(ValueError, match="item 1 lacks 'ground_truth'"):
        score_batch([ScoreRequest("math", "1", "1"), {"data_source": "math", "solution_str": "1"}])
    with pytest.raises(ValueError, match="item 0: SQL database not found"):
        score_batch([ScoreRequest("sql", "SELECT 1", "SELECT 1", {"db_path": "/nonexistent.db"})])


def test_one_hanging_item_does_not_block_the_rest():
    limit = 1.5
    # \sqrt answers need math-verify: every item goes to a worker
    items = [ScoreRequest("math", f"\\boxed{{\\sqrt{{{i * i}}}}}", str(i)) for i in range(30)]
    items.insert(3, ScoreRequest("math", "\\boxed{9^{9^{9^{9}}}}", "1"))
    score_batch([ScoreRequest("math", "\\boxed{\\sqrt{4}}", "2")] * 2, max_workers=2)  # warm
    start = time.monotonic()
    batch = score_batch(items, max_workers=2, timeout=limit)
    elapsed = time.monotonic() - start
    assert batch.results[3].reason == "timeout"
    assert batch.results[3].extracted == "9^{9^{9^{9}}}"
    others = batch.results[:3] + batch.results[4:]
    assert all(r.score == 1.0 for r in others), [r for r in others if r.score != 1.0]
    # the other worker kept going while the stuck one ran into its limit
    assert elapsed < limit + 8.0


def test_unpicklable_item_fails_alone():
    items = [
        ScoreRequest("math", "\\boxed{\\sqrt{4}}", "2"),
        ScoreRequest("math", "\\boxed{\\sqrt{4}}", "2", {"bad": lambda: 0}),
        ScoreRequest("math", "\\boxed{\\sqrt{9}}", "3"),
    ]
    batch = score_batch(items, max_workers=1)
    assert batch.scores == [1.0, 0.0, 1.0]
    assert batch.results[1].reason == "error" and "cannot send" in batch.results[1].detail


def test_pool_is_reused_across_calls():
    items = [ScoreRequest("math", "\\boxed{\\sqrt{4}}", "2")] * 8
    batch = score_batch(items, max_workers=2)
    assert batch.n_isolated == 8  # these really ran in workers
    pool = get_pool()
    started = pool.n_started
    for _ in range(20):
        assert compute_score("math", "\\boxed{\\sqrt{9}}", "3") == 1.0
    assert score_batch(items, max_workers=2).scores == [1.0] * 8
    assert get_pool() is pool and pool.n_started == started


def test_concurrent_callers_from_threads(db):
    errors, scores = [], []

    def work(k):
        try:
            for _ in range(5):
                scores.append(
                    compute_score("sql", "SELECT 12", "SELECT COUNT(*) FROM t", {"db_path": db})
                )
                scores.append(compute_score("math", f"\\boxed{{\\sqrt{{{k * k}}}}}", str(k)))
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and scores == [1.0] * 40


def test_thousand_toy_completions_are_fast(db):
    # an answer phrase, not a box: each one goes to a worker (the quick path decides boxes)
    math_items = [
        ScoreRequest("toy_math", f"Q:1+2={i % 5}. Answer: {i % 5}", "3") for i in range(500)
    ]
    sql_items = [
        ScoreRequest(
            "toy_sql", f"SELECT COUNT(*) FROM t WHERE a < {i % 13}", "SELECT 12", {"db_path": db}
        )
        for i in range(500)
    ]
    start = time.monotonic()
    batch = score_batch(math_items + sql_items)
    elapsed = time.monotonic() - start
    assert len(batch.results) == 1000
    assert sum(batch.scores[:500]) == 100 and sum(batch.scores[500:]) == 38
    assert batch.failures == {}
    assert elapsed < 30.0


def test_is_correct_means_full_credit():
    """One convention for training Pass@1, the DPH split and evaluation: full credit only."""
    assert is_correct(1.0) and is_correct(1.0 - 1e-7)
    assert not is_correct(0.999) and not is_correct(0.5) and not is_correct(0.0)
