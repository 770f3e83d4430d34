"""SQL scoring under faults: WAL databases on read-only folders, non-SQLite paths, VACUUM,
lone surrogates, failing golds and a byte-bounded gold cache under a memory cap."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from divrl.rewards import ScoreRequest, compute_score_detailed, score_batch
from divrl.rewards.sql.database import check_sqlite_file, connect_readonly
from divrl.rewards.sql.gold_cache import ByteBoundedCache


def _wal_db(folder, pending: bool) -> str:
    """A WAL database; with ``pending`` its last transaction is still only in the -wal."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "w.sqlite")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t(a)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(10)])
    conn.commit()
    if pending:
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("INSERT INTO t VALUES (99)")
        conn.commit()
        shutil.copyfile(path, path + ".keep")
        shutil.copyfile(path + "-wal", path + "-wal.keep")
    conn.close()  # closing checkpoints and removes the -wal: put the copies back
    if pending:
        os.replace(path + ".keep", path)
        os.replace(path + "-wal.keep", path + "-wal")
    for extra in ("-shm",):
        if os.path.exists(path + extra):
            os.remove(path + extra)
    return path


@pytest.mark.parametrize("pending", [False, True])
def test_wal_database_scores_without_writing_beside_it(tmp_path, pending):
    path = _wal_db(tmp_path / "ro", pending)
    expected = 11 if pending else 10
    before = sorted(os.listdir(tmp_path / "ro"))
    os.chmod(tmp_path / "ro", 0o555)  # read-only folder (root ignores it: listing checked too)
    try:
        r = compute_score_detailed(
            "bird", f"SELECT COUNT(*) FROM t -- {expected}", f"SELECT {expected}", {"db_path": path}
        )
        assert (r.score, r.reason) == (1.0, "correct"), r
        g = compute_score_detailed("sql", "SELECT 1", "SELECT COUNT(*) FROM t", {"db_path": path})
        assert g.reason == "wrong"  # the gold ran (no gold_error / sql_error)
    finally:
        os.chmod(tmp_path / "ro", 0o755)
    assert sorted(os.listdir(tmp_path / "ro")) == before


def test_immutable_open_reads_a_pending_wal_through_a_private_copy(tmp_path):
    path = _wal_db(tmp_path / "d", pending=True)
    conn = connect_readonly(path)
    assert conn.execute("SELECT COUNT(*) FROM t").fetchone() == (11,)
    conn.close()
    assert not os.path.exists(path + "-shm")


def test_non_sqlite_db_path_is_a_configuration_error(tmp_path):
    fake = tmp_path / "passwd.sqlite"
    fake.write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(ValueError, match="not an SQLite 3 database"):
        check_sqlite_file(fake)
    with pytest.raises(ValueError, match="not an SQLite 3 database"):
        compute_score_detailed("sql", "SELECT 1", "SELECT 1", {"db_path": str(fake)})


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "x.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t(a)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    conn.commit()
    conn.close()
    return str(path)


@pytest.mark.parametrize("sql", ["VACUUM", "VACUUM INTO '/tmp/divrl-vacuum-copy.sqlite'"])
def test_vacuum_is_forbidden(db, sql):
    r = compute_score_detailed("sql", f"```sql\n{sql}\n```", "SELECT 1", {"db_path": db})
    assert (r.score, r.reason) == (0.0, "forbidden"), r
    assert not os.path.exists("/tmp/divrl-vacuum-copy.sqlite")


def test_lone_surrogate_is_the_models_failure(db):
    r = compute_score_detailed("sql", "```sql\nSELECT '\udcff'\n```", "SELECT 1", {"db_path": db})
    assert (r.score, r.reason) == (0.0, "sql_error"), r
    r.extracted.encode("utf-8")  # printable: a results file can be written


def test_gold_failure_is_gold_error_and_counted(db):
    batch = score_batch(
        [
            ScoreRequest("bird", "SELECT 1", "SELECT nope FROM t", {"db_path": db}),
            ScoreRequest("bird", "SELECT 1", "SELECT 1; SELECT 2", {"db_path": db}),
            ScoreRequest("bird", "SELECT 1", "SELECT 1", {"db_path": db}),
        ],
        max_workers=1,
    )
    assert [r.reason for r in batch.results] == ["gold_error", "gold_error", "correct"]
    assert batch.failures == {"gold_error": 2}
    assert "gold_error=2" in batch.summary()


def test_slow_correct_query_passes_under_the_bird_limit(db):
    slow = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000000) "
        "SELECT COUNT(*) FROM c"
    )
    start = time.monotonic()
    r = compute_score_detailed("bird", slow, "SELECT 3000000", {"db_path": db})
    assert r.reason == "correct", r
    # the same query under a 0.2 s per-query limit times out (the limit is real)
    r = compute_score_detailed("bird", slow, "SELECT 3000000", {"db_path": db}, timeout=0.3)
    assert r.reason == "timeout"
    assert time.monotonic() - start < 60


def test_per_row_compare_override(db):
    info = {"db_path": db}
    pred, gold = "SELECT a FROM t UNION ALL SELECT a FROM t", "SELECT a FROM t"
    assert compute_score_detailed("sql", pred, gold, info).score == 0.0
    assert compute_score_detailed("sql", pred, gold, {**info, "sql_compare": "set"}).score == 1.0
    with pytest.raises(ValueError, match="sql_compare"):
        compute_score_detailed("sql", pred, gold, {**info, "sql_compare": "fuzzy"})


def test_cache_is_bounded_by_bytes():
    cache = ByteBoundedCache(1000)
    for i in range(10):
        cache.put(i, "x", 300)
    assert cache.total_bytes <= 1000 and len(cache) == 3
    assert cache.get(9) == "x" and cache.get(0) is None
    assert not cache.put("huge", "y", 5000) and cache.get("huge") is None


def test_large_golds_under_a_memory_cap_keep_scoring_correct_answers(tmp_path):
    """Scaled down: 600 MB address space, golds of ~25 MB each; the cache (here 64 MB)
    must keep the worker alive so later correct answers still score 1."""
    db = tmp_path / "big.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t(a INTEGER, b TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"v{i}") for i in range(200_000)])
    conn.commit()
    conn.close()
    script = textwrap.dedent(
        f"""
        import resource, time
        resource.setrlimit(resource.RLIMIT_AS, (600 * 2**20, 600 * 2**20))
        from divrl.rewards.sql_reward import SqlVerifier
        v = SqlVerifier("bird", max_rows=1_000_000, cache_bytes=64 * 2**20)
        info = {{"db_path": {str(db)!r}}}
        for k in range(40):  # 40 distinct large golds: ~1 GB if all were kept
            gold = f"SELECT a, b, a + {{k}} FROM t"
            r = v.verify("SELECT 1", gold, info, time.monotonic() + 60)
            assert r.reason == "wrong", r
        assert v.gold_cache.total_bytes <= 64 * 2**20
        r = v.verify("SELECT COUNT(*) FROM t", "SELECT 200000", info, time.monotonic() + 60)
        print(r.reason)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "correct"


def test_slow_gold_is_gold_error_and_cached(db):
    from divrl.rewards.sql_reward import SqlVerifier

    v = SqlVerifier("sql", query_timeout=0.1)
    slow = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000000) "
        "SELECT COUNT(*) FROM c"
    )
    info = {"db_path": db}
    r = v.verify("SELECT 1", slow, info, time.monotonic() + 30)
    assert r.reason == "gold_error" and "limit" in r.detail, r
    start = time.monotonic()
    r = v.verify("SELECT 1", slow, info, time.monotonic() + 30)
    assert r.reason == "gold_error" and time.monotonic() - start < 0.1  # cached, not rerun


def test_memory_error_empties_the_cache_and_propagates(db, monkeypatch):
    from divrl.rewards import sql_reward
    from divrl.rewards.sql_reward import SqlVerifier

    v = SqlVerifier("sql")
    info = {"db_path": db}
    assert v.verify("SELECT 1", "SELECT 1", info, time.monotonic() + 5).reason == "correct"
    assert len(v.gold_cache) == 1

    def out_of_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(sql_reward, "run_query", out_of_memory)
    with pytest.raises(MemoryError):
        v.verify("SELECT 2", "SELECT 1", info, time.monotonic() + 5)
    assert len(v.gold_cache) == 0 and v.gold_cache.total_bytes == 0


@pytest.mark.parametrize(
    ("source", "query_s", "item_s"),
    [
        ("bird", 30.0, 91.0),
        ("bird_dev", 30.0, 91.0),
        ("spider", 30.0, 91.0),
        ("spider_dev", 30.0, 91.0),
        ("sql", 5.0, 16.0),
        ("toy_sql", 5.0, 16.0),
    ],
)
def test_sql_time_limits_are_the_documented_ones(source, query_s, item_s):
    # BIRD's evaluator gives each query meta_time_out = 30 s, Spider test-suite 30 s too;
    # docs/rewards.md states these numbers, so a change here must change the docs.
    from divrl.rewards.registry import get_verifier

    _, verifier = get_verifier(source)
    assert verifier.query_timeout == query_s
    assert verifier.default_timeout == item_s == 3 * query_s + 1.0


@pytest.mark.parametrize(("source", "item_s"), [("math", 5.0), ("gsm8k", 5.0), ("countdown", 2.0)])
def test_other_verifiers_time_limits_are_the_documented_ones(source, item_s):
    from divrl.rewards.registry import get_verifier

    assert get_verifier(source)[1].default_timeout == item_s
