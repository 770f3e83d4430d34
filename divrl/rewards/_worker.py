"""Entry point of a verifier worker process (see :mod:`divrl.rewards.pool`).

Protocol over two inherited pipe file descriptors: the worker sends ``"ready"`` once its
imports are done, then answers each ``(verifier_bytes, solution, ground_truth,
extra_info, timeout)`` with a :class:`ScoreResult`; ``None`` asks it to exit.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time
from multiprocessing.connection import Connection


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


def main(recv_fd: int, send_fd: int) -> None:
    recv = Connection(recv_fd, writable=False)
    send = Connection(send_fd, readable=False)
    # math-verify warns once per process that its own (signal) timeouts are off: they are
    # off on purpose, the parent kills this process at the time limit instead.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify  # noqa: F401  (preload: the first item should not pay the import)

    import divrl.rewards  # noqa: F401  (registers the built-in verifiers)
    from divrl.rewards.types import ScoreResult

    _limit_memory()
    verifiers: dict[bytes, object] = {}
    send.send("ready")
    while True:
        try:
            msg = pickle.loads(recv.recv_bytes())
        except (EOFError, OSError):
            return  # parent went away
        if msg is None:
            return
        vbytes, solution, ground_truth, extra_info, timeout = msg
        start = time.monotonic()
        try:
            verifier = verifiers.get(vbytes)
            if verifier is None:
                verifier = verifiers[vbytes] = pickle.loads(vbytes)
            # leave a margin so cooperative limits (SQLite) answer before the parent kills
            deadline = start + max(0.05, timeout - max(0.05, 0.1 * timeout))
            result = verifier.verify(solution, ground_truth, extra_info, deadline)
            if not isinstance(result, ScoreResult):
                result = ScoreResult(float(result), None, "correct" if result else "wrong")
        except RecursionError:
            result = ScoreResult(0.0, None, "unparsable", "too deeply nested")
        except MemoryError:
            result = ScoreResult(0.0, None, "error", "out of memory")
        except Exception as e:
            result = ScoreResult(0.0, None, "error", f"{type(e).__name__}: {e}"[:500])
        try:
            send.send(result)
        except (OSError, ValueError):
            return


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
