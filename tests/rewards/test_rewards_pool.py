import os
import signal
import time

from divrl.rewards import ScoreResult, get_verifier
from divrl.rewards.pool import WorkerPool, pickled_verifier


def run(pool, items, timeout=1.5, workers=1):
    vbytes = pickled_verifier(get_verifier("math")[1])
    tasks = [(vbytes, s, g, {}) for s, g in items]
    results: dict[int, ScoreResult] = {}
    pool.run(tasks, [timeout] * len(tasks), workers, results.__setitem__)
    return [results[i] for i in range(len(tasks))]


ITEMS = [("\\boxed{\\sqrt{4}}", "2"), ("\\boxed{9^{9^{9^{9}}}}", "1"), ("\\boxed{\\sqrt{9}}", "3")]


def test_spawner_replaces_a_killed_worker_quickly():
    pool = WorkerPool()
    try:
        run(pool, ITEMS[:1])  # start the spawner and one worker
        start = time.monotonic()
        results = run(pool, ITEMS)
        elapsed = time.monotonic() - start
        assert [r.reason for r in results] == ["correct", "timeout", "correct"]
        assert pool.n_killed == 1 and pool._spawner is not None
        # the item after the kill did not wait for an interpreter start
        assert elapsed < 1.5 + 1.5
    finally:
        pool.shutdown()


def test_standalone_workers_and_spawner_loss():
    pool = WorkerPool()
    try:
        run(pool, ITEMS[:1])
        # the spawner dies: the pool falls back to stand-alone worker processes
        os.kill(pool._spawner.proc.pid, signal.SIGKILL)
        pool._spawner.proc.wait(5)
        results = run(pool, ITEMS, workers=2)
        assert [r.reason for r in results] == ["correct", "timeout", "correct"]
        assert pool._spawner is None and not pool._use_spawner
        assert any(w.proc is not None for w in pool._idle)  # a stand-alone worker
    finally:
        pool.shutdown()
    assert pool._idle == []


def test_worker_killed_from_outside_is_reported_and_replaced():
    pool = WorkerPool()
    try:
        run(pool, ITEMS[:1])
        victim = pool._idle[0]
        os.kill(victim.pid, signal.SIGKILL)
        results = run(pool, [("\\boxed{\\sqrt{16}}", "4"), ("\\boxed{\\sqrt{25}}", "5")])
        # the dead worker's item is lost (worker_crashed) or, if the death was noticed
        # before sending, retried; either way the batch completes and later items score
        assert results[-1].reason == "correct"
        assert results[0].reason in ("correct", "worker_crashed")
    finally:
        pool.shutdown()
