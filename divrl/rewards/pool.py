"""A long-lived pool of verifier worker processes with a hard per-item time limit.

Why not ``concurrent.futures``: a stuck task (math-verify on ``9^9^9^9`` never returns to
the interpreter) would hold its worker forever. Here each worker serves one item at a
time over its own pipe; when an item overruns its limit the worker is killed and a fresh
one is started in the background, and the other items carry on.

Processes are started with ``subprocess`` (``python -m divrl.rewards._worker``), not
``multiprocessing``: that works from daemonic processes (e.g. a ``multiprocessing.Pool``
reward worker), never re-imports the caller's ``__main__``, and never forks the caller
(which may hold CUDA or threads). One *spawner* process imports the verifiers once and
forks workers on request, so a replacement worker is ready in milliseconds; where that is
not possible, stand-alone worker subprocesses are used (each an interpreter start plus
the math-verify import). The pool is created lazily, reused across calls, grows to the
largest ``max_workers`` asked for and is shut down at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from divrl.rewards.types import ScoreResult

logger = logging.getLogger(__name__)

# Worker address-space limit: a runaway expression fails with MemoryError instead of
# taking the machine's memory. Override with DIVRL_REWARD_WORKER_MEMORY_MB (0 = none).
DEFAULT_WORKER_MEMORY_MB = 4096
_WORKER_FAILURES = frozenset({"worker_error", "worker_crashed"})
_START_TIMEOUT = 120.0  # seconds for a worker to import its modules on a loaded machine


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    # PR_SET_PDEATHSIG fires when the *thread* that started the child exits: only ask for
    # it from the main thread, which lives as long as the process. (Forked workers always
    # get it: their parent is the single-threaded spawner.)
    env.pop("DIVRL_REWARD_PARENT_PID", None)
    if threading.current_thread() is threading.main_thread():
        env["DIVRL_REWARD_PARENT_PID"] = str(os.getpid())
    return env


class _Spawner:
    """A process that has imported the verifiers and forks ready workers on request."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "divrl.rewards._worker", "--spawner", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=_child_env(),
            close_fds=True,
        )
        theirs.close()
        self.sock = ours
        self.ready = False
        self.lock = threading.Lock()

    def fork(self) -> tuple[int, int]:
        """(pid, socket fd) of a new worker; raises ``OSError`` if the spawner is gone."""
        with self.lock:
            if not self.ready:
                self.sock.settimeout(_START_TIMEOUT)
                if self.sock.recv(1) != b"R":
                    raise OSError("the verifier spawner did not start")
                self.ready = True
            self.sock.sendall(b"F")
            msg, fds, _, _ = socket.recv_fds(self.sock, 8, 1)
            if len(msg) != 8 or len(fds) != 1:
                raise OSError("the verifier spawner did not return a worker")
            return struct.unpack("q", msg)[0], fds[0]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()  # the spawner exits on end of file
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        with contextlib.suppress(OSError):
            self.proc.kill()


class _Worker:
    """One verifier process: forked by the spawner, or a stand-alone subprocess."""

    def __init__(self, spawner: _Spawner | None) -> None:
        self.started = time.monotonic()
        self.ready = False
        self.failure: ScoreResult | None = None  # how it failed, when it did
        self.proc: subprocess.Popen | None = None
        if spawner is not None:
            self.pid, fd = spawner.fork()
            self.send_conn = self.recv_conn = Connection(fd)
            return
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "divrl.rewards._worker", str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w),
            stdin=subprocess.DEVNULL,
            env=_child_env(),
            close_fds=True,
        )
        self.pid = self.proc.pid
        os.close(to_child_r)
        os.close(from_child_w)
        self.send_conn = Connection(to_child_w, readable=False)
        self.recv_conn = Connection(from_child_r, writable=False)

    def kill(self) -> None:
        # No wait: tearing down a process that holds gigabytes takes a while and the caller
        # should not pay for it (the spawner's children are reaped by the kernel; a
        # stand-alone worker by subprocess on a later poll).
        with contextlib.suppress(OSError):
            if self.proc is not None:
                self.proc.kill()
                self.proc.poll()
            else:
                os.kill(self.pid, signal.SIGKILL)
        self.close()

    def close(self) -> None:
        for conn in (self.send_conn, self.recv_conn):
            with contextlib.suppress(OSError):
                conn.close()


class WorkerPool:
    """Workers are checked out by one call at a time, so concurrent callers (threads) are safe."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._n_total = 0
        self._cond = threading.Condition()
        self._closed = False
        self.pid = os.getpid()
        self.n_killed = 0
        self.n_started = 0
        self._spawner: _Spawner | None = None
        self._use_spawner = hasattr(socket, "send_fds") and hasattr(os, "fork")

    # -- checkout -------------------------------------------------------------------------
    def _checkout(self, n: int) -> list[_Worker]:
        """Take up to ``n`` workers (at least one).

        New workers are started while the pool is smaller than ``max(n, default_workers())``,
        so that concurrent single-item callers (threads) do not queue behind one worker.
        """
        limit = max(n, default_workers())
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the verifier pool is shut down")
                workers = self._idle[:n]
                del self._idle[: len(workers)]
                while len(workers) < n and self._n_total < limit:
                    workers.append(self._new_worker())
                if workers:
                    return workers
                self._cond.wait()

    def _checkin(self, workers: Sequence[_Worker]) -> None:
        with self._cond:
            self._idle.extend(workers)
            self._cond.notify_all()

    def _new_worker(self) -> _Worker:
        worker = None
        if self._use_spawner:
            try:
                if self._spawner is None:
                    self._spawner = _Spawner()
                worker = _Worker(self._spawner)
            except OSError as e:
                # e.g. the spawner was killed: start stand-alone workers from now on
                logger.warning("verifier spawner unavailable (%s); starting workers directly", e)
                self._use_spawner = False
                if self._spawner is not None:
                    self._spawner.close()
                    self._spawner = None
        if worker is None:
            worker = _Worker(None)
        self._n_total += 1
        self.n_started += 1
        return worker

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        with self._cond:
            self._n_total -= 1
            self.n_killed += 1
            return self._new_worker()

    # -- running --------------------------------------------------------------------------
    def run(
        self,
        tasks: Sequence[tuple[Any, ...]],
        timeouts: Sequence[float],
        max_workers: int,
        on_done: Callable[[int, ScoreResult], None],
    ) -> None:
        """Run ``tasks`` (``(verifier_bytes, solution, ground_truth, extra_info)``).

        ``on_done(i, result)`` is called once per task, in completion order. A task that
        overruns ``timeouts[i]`` seconds (counted from when a ready worker received it)
        gets ``ScoreResult(0, None, "timeout")`` and its worker is replaced. A task whose
        worker dies or runs out of memory is retried once on a fresh worker; the second
        failure is its result (``worker_crashed`` / ``worker_error``).
        """
        if not tasks:
            return
        workers = self._checkout(max(1, min(max_workers, len(tasks))))
        pending = deque(range(len(tasks)))
        retried: set[int] = set()  # items already given a second worker
        busy: dict[int, tuple[_Worker, int, float]] = {}  # fd -> (worker, task, deadline)
        starting: dict[int, _Worker] = {}  # fd -> worker that has not said "ready"
        free: list[_Worker] = []
        for w in workers:
            if w.ready:
                free.append(w)
            else:
                starting[w.recv_conn.fileno()] = w
        try:
            while pending or busy:
                while free and pending:
                    self._send(free, pending, busy, starting, tasks, timeouts, on_done)
                if not (pending or busy):
                    break
                now = time.monotonic()
                wait_for = [w.recv_conn for w, _, _ in busy.values()]
                wait_for += [w.recv_conn for w in starting.values()]
                if not wait_for:  # cannot happen: every lost worker is replaced
                    raise RuntimeError("verifier pool has no workers left")
                horizon = [d - now for _, _, d in busy.values()]
                horizon += [w.started + _START_TIMEOUT - now for w in starting.values()]
                ready = wait(wait_for, timeout=max(0.0, min(horizon)) if horizon else None)
                for conn in ready:
                    if conn.fileno() in starting:
                        self._on_started(starting.pop(conn.fileno()), free)
                        continue
                    w, i, _ = busy.pop(conn.fileno())
                    result = self._answer_of(w, starting, free)
                    if result is None and i not in retried:
                        # the worker died or ran out of memory: not the model's fault, so
                        # the item gets one more try on a fresh worker
                        retried.add(i)
                        pending.appendleft(i)
                    elif result is None:
                        on_done(i, w.failure)
                    else:
                        on_done(i, result)
                now = time.monotonic()
                for fd, (w, i, deadline) in list(busy.items()):
                    if now >= deadline:
                        del busy[fd]
                        self._start_replacement(w, starting)
                        on_done(i, ScoreResult(0.0, None, "timeout", "killed at the time limit"))
                for w in list(starting.values()):
                    if now >= w.started + _START_TIMEOUT:
                        raise RuntimeError(
                            f"a verifier worker did not start within {_START_TIMEOUT:.0f}s"
                        )
        finally:
            # Busy workers at this point are mid-task (an exception interrupted us): kill them.
            for w, _, _ in busy.values():
                self._start_replacement(w, starting)
            self._checkin(free + list(starting.values()))

    def _send(self, free, pending, busy, starting, tasks, timeouts, on_done) -> None:
        """Send the next pending task to a free worker (see :meth:`run` for the state)."""
        w = free.pop()
        i = pending.popleft()
        try:
            # pickling happens before any byte is written: a failure leaves the pipe clean
            # and the worker usable
            payload = pickle.dumps((*tasks[i], timeouts[i]))
        except Exception as e:
            free.append(w)
            on_done(i, ScoreResult(0.0, None, "error", f"cannot send item: {e}"))
            return
        try:
            w.send_conn.send_bytes(payload)
        except OSError:
            pending.appendleft(i)
            self._start_replacement(w, starting)
            return
        busy[w.recv_conn.fileno()] = (w, i, time.monotonic() + timeouts[i])

    def _on_started(self, w: _Worker, free: list[_Worker]) -> None:
        """A starting worker spoke: it is ready, or it failed to start (an error)."""
        try:
            msg = w.recv_conn.recv()
        except (EOFError, OSError):
            msg = None
        if msg != "ready":
            w.kill()
            with self._cond:
                self._n_total -= 1
            raise RuntimeError("a verifier worker failed to start (see its stderr above)")
        w.ready = True
        free.append(w)

    def _answer_of(
        self, w: _Worker, starting: dict[int, _Worker], free: list[_Worker]
    ) -> ScoreResult | None:
        """The busy worker's result, or None when the worker failed (``w.failure`` says how;
        it is then replaced)."""
        try:
            result = w.recv_conn.recv()
        except (EOFError, OSError):
            result = ScoreResult(0.0, None, "worker_crashed", "worker exited")
        if result.reason not in _WORKER_FAILURES:
            free.append(w)
            return result
        w.failure = ScoreResult(0.0, None, result.reason, f"{result.detail} (twice)")
        self._start_replacement(w, starting)
        return None

    def _start_replacement(self, worker: _Worker, starting: dict[int, _Worker]) -> None:
        new = self._replace(worker)
        starting[new.recv_conn.fileno()] = new

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            workers, self._idle = self._idle, []
            self._cond.notify_all()
        for w in workers:
            with contextlib.suppress(OSError):
                w.send_conn.send(None)
        deadline = time.monotonic() + 2.0
        for w in workers:
            if w.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.proc.wait(timeout=max(0.01, deadline - time.monotonic()))
            w.kill()
        if self._spawner is not None:
            self._spawner.close()
            self._spawner = None


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool() -> WorkerPool:
    """The process-wide pool, created on first use (and again in a forked child)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            _POOL = WorkerPool()
        return _POOL


def shutdown_pool() -> None:
    """Stop the process-wide pool's workers (also registered to run at exit)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None and pool.pid == os.getpid():
        pool.shutdown()


atexit.register(shutdown_pool)

_PICKLED: dict[int, tuple[Any, bytes]] = {}


def pickled_verifier(verifier: Any) -> bytes:
    """Pickle a verifier once; workers cache the unpickled object by these bytes."""
    entry = _PICKLED.get(id(verifier))
    if entry is None or entry[0] is not verifier:
        entry = (verifier, pickle.dumps(verifier))
        _PICKLED[id(verifier)] = entry
    return entry[1]
