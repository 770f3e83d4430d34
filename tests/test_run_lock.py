"""The run lock under a race: two takers of one stale lock, exactly one holds it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from divrl.runs import RunLock, RunLockedError


def _dead_pid() -> int:
    """The pid of a process that has exited (a run killed with -9 left its lock)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _race(path, takers: int) -> list[str]:
    """``takers`` threads acquire ``path`` at once; what each got."""
    barrier = threading.Barrier(takers)
    outcome = [""] * takers

    def take(i: int) -> None:
        barrier.wait()
        try:
            RunLock(path).acquire()
            outcome[i] = "held"
        except RunLockedError:
            outcome[i] = "refused"

    threads = [threading.Thread(target=take, args=(i,)) for i in range(takers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcome


@pytest.mark.parametrize("takers", [2, 4])
def test_one_taker_wins_a_stale_lock(tmp_path, monkeypatch, takers):
    real_is_stale = RunLock._is_stale

    def slow_is_stale(held: dict) -> bool:
        # widen the window between reading the stale lock and replacing it, so that
        # without the guard every taker reads the stale lock before any replaces it
        stale = real_is_stale(held)
        time.sleep(0.05)
        return stale

    monkeypatch.setattr(RunLock, "_is_stale", staticmethod(slow_is_stale))
    dead = _dead_pid()
    for attempt in range(3):
        run = tmp_path / f"run{attempt}"
        run.mkdir()
        lock = run / ".lock"
        lock.write_text(json.dumps({"pid": dead, "host": socket.gethostname(), "since": 0}))
        outcome = _race(lock, takers)
        assert sorted(outcome) == ["held"] + ["refused"] * (takers - 1), outcome
        assert json.loads(lock.read_text())["pid"] != dead
        assert sorted(p.name for p in run.iterdir()) == [".lock"]  # no guard file left
