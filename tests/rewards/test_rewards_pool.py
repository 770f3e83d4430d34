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


def _function_tasks(fn, items):
    from divrl.rewards import FunctionVerifier

    vbytes = pickled_verifier(FunctionVerifier(fn))
    return [(vbytes, s, g, extra) for s, g, extra in items]


def test_out_of_memory_worker_is_replaced_and_the_item_retried(tmp_path):
    from pool_helpers import always_out_of_memory, out_of_memory_once

    pool = WorkerPool()
    try:
        marker = str(tmp_path / "marker")
        tasks = _function_tasks(out_of_memory_once, [("7", "7", {"marker": marker})])
        results: dict[int, ScoreResult] = {}
        pool.run(tasks, [30.0], 1, results.__setitem__)
        assert results[0].reason == "correct" and results[0].score == 1.0
        assert pool.n_killed == 1  # the worker that ran out of memory was replaced

        tasks = _function_tasks(always_out_of_memory, [("7", "7", {})] * 2)
        results = {}
        pool.run(tasks, [30.0, 30.0], 1, results.__setitem__)
        assert [r.reason for r in results.values()] == ["worker_error", "worker_error"]
        assert all("twice" in r.detail for r in results.values())
        assert pool.n_killed == 1 + 4  # one try plus one retry per item
    finally:
        pool.shutdown()


CALLER = r"""
import divrl.rewards.pool as pool
from divrl.rewards import ScoreRequest, score_batch
pool.get_pool()._use_spawner = {use_spawner}
items = [ScoreRequest("math", "\\boxed{9^{9^{9^{9}}}}", "1")] * 2
print("busy", flush=True)
score_batch(items, max_workers=2, timeout=300)  # both items hang in C code
"""


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.add(child)
            stack.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


import pytest  # noqa: E402


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc (Linux)")
@pytest.mark.parametrize("standalone", [False, True], ids=["spawner", "standalone"])
def test_workers_die_with_a_caller_killed_by_sigkill(tmp_path, standalone):
    import subprocess
    import sys

    script = CALLER.replace("{use_spawner}", str(not standalone))
    caller = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        text=True,
    )
    try:
        assert caller.stdout.readline().strip() == "busy"
        deadline = time.monotonic() + 120
        workers: set[int] = set()
        while time.monotonic() < deadline:  # wait until two workers are at work
            workers = _descendants(caller.pid)
            if len(workers) >= (2 if standalone else 3):
                break
            time.sleep(0.2)
        time.sleep(2.0)  # both items are now deep in math-verify
        workers = _descendants(caller.pid)
        assert len(workers) >= 2
        caller.kill()
        caller.wait(10)
        time.sleep(5.0)
        assert [pid for pid in workers if _alive(pid)] == []
    finally:
        if caller.poll() is None:
            caller.kill()
