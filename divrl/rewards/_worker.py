"""Entry points of the verifier processes (see :mod:`divrl.rewards.pool`).

``python -m divrl.rewards._worker --spawner FD``: the *spawner* imports the verifiers
once, then forks a ready worker each time the pool asks (a byte ``F`` on the control
socket), and hands the worker's socket back with its pid (SCM_RIGHTS). Forking from a
single-threaded process that has already imported math-verify makes a replacement
worker cost milliseconds instead of an interpreter start.

``python -m divrl.rewards._worker RECV_FD SEND_FD``: a stand-alone worker on two pipes
(the fallback when no spawner can run).

Worker protocol: it sends ``"ready"``, then answers each pickled ``(verifier_bytes,
solution, ground_truth, extra_info, timeout)`` with a :class:`ScoreResult`; ``None`` asks
it to exit; end of file (the pool's process died) makes it exit too. A worker that runs out
of memory answers ``worker_error`` and exits (its heap may be unusable); the pool replaces
it and retries the item once.

Lifetime: workers must not outlive the caller, even when it is killed with SIGKILL while a
worker is deep in C code (``9^9^9^9`` holds the GIL, so no watchdog thread could run). On
Linux every worker asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``):
a forked worker's parent is the single-threaded spawner, which exits as soon as the caller's
end of its control socket closes; a stand-alone worker's parent is the caller itself.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time
from multiprocessing.connection import Connection


def _setup() -> None:
    # math-verify warns once per process that its own (signal) timeouts are off: they are
    # off on purpose, the pool kills the worker at the time limit instead.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify  # noqa: F401  (preload: the first item should not pay the import)
    import sqlglot  # noqa: F401  (SQL: the gold's outer ORDER BY is decided by parsing)

    import divrl.rewards  # noqa: F401  (registers the built-in verifiers)
    from divrl.rewards.math_reward import math_verify_score

    # math-verify builds its parsers on first use (~0.3 s): do it once here, so that
    # workers forked from the spawner start warm
    math_verify_score("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}")


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when ``parent_pid`` (its parent) exits; Linux only.

    The parent may already be gone when this runs (then we were re-parented): exit at once.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)


def _limit_memory() -> None:
    from divrl.rewards.pool import DEFAULT_WORKER_MEMORY_MB

    mb = int(os.environ.get("DIVRL_REWARD_WORKER_MEMORY_MB", DEFAULT_WORKER_MEMORY_MB))
    if mb <= 0:
        return
    try:
        import resource

        limit = mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass  # not on this platform: the time limit still applies


def serve(recv: Connection, send: Connection) -> None:
    """The worker loop."""
    from divrl.rewards.types import ScoreResult

    _limit_memory()
    verifiers: dict[bytes, object] = {}
    send.send("ready")
    while True:
        try:
            msg = pickle.loads(recv.recv_bytes())
        except (EOFError, OSError):
            return  # the pool's process went away
        if msg is None:
            return
        vbytes, solution, ground_truth, extra_info, timeout = msg
        start = time.monotonic()
        try:
            verifier = verifiers.get(vbytes)
            if verifier is None:
                verifier = verifiers[vbytes] = pickle.loads(vbytes)
            # leave a margin so cooperative limits (SQLite) answer before the pool kills
            deadline = start + max(0.05, timeout - max(0.05, 0.1 * timeout))
            result = verifier.verify(solution, ground_truth, extra_info, deadline)
            if not isinstance(result, ScoreResult):
                result = ScoreResult(float(result), None, "correct" if result else "wrong")
        except RecursionError:
            result = ScoreResult(0.0, None, "unparsable", "too deeply nested")
        except MemoryError:
            result = None
        except Exception as e:
            result = ScoreResult(0.0, None, "error", f"{type(e).__name__}: {e}"[:500])
        if result is None:  # after MemoryError: report it, then let the pool replace us
            result = ScoreResult(0.0, None, "worker_error", "the worker ran out of memory")
            with _suppress_send_errors():
                send.send(result)
            return
        try:
            send.send(result)
        except (OSError, ValueError):
            return


def _suppress_send_errors():
    import contextlib

    return contextlib.suppress(OSError, ValueError, MemoryError)


def spawner(ctl_fd: int) -> None:
    """Fork ready workers on request; exits when the pool's end of ``ctl_fd`` closes."""
    import signal
    import socket
    import struct

    ctl = socket.socket(fileno=ctl_fd)
    _setup()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps exited workers
    ctl.sendall(b"R")
    while True:
        try:
            request = ctl.recv(1)
        except OSError:
            return
        if not request:
            return
        ours, theirs = socket.socketpair()
        spawner_pid = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                die_with_parent(spawner_pid)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                ctl.close()
                ours.close()
                conn = Connection(theirs.detach())
                serve(conn, conn)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        try:
            socket.send_fds(ctl, [struct.pack("q", pid)], [ours.fileno()])
        except OSError:
            return
        finally:
            ours.close()


def main(argv: list[str]) -> None:
    import signal

    # A Ctrl-C at the terminal reaches the whole process group: the parent decides (it
    # stops and closes the pool, which ends the spawner and its workers); here it would
    # only print a second traceback under the parent's one line.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.environ.get("DIVRL_REWARD_PARENT_PID")
    if parent:  # set by the pool when the parent-death signal is safe to use (main thread)
        die_with_parent(int(parent))
    if argv[0] == "--spawner":
        spawner(int(argv[1]))
    else:
        _setup()
        serve(Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False))


if __name__ == "__main__":
    main(sys.argv[1:])
