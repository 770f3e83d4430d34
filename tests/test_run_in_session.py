"""The helper the launcher tests run torchrun with: a timeout kills the ranks too."""

import os
import sys
import time
from pathlib import Path

import pytest

CHILD = """
import subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1], "w").write(str(rank.pid))
time.sleep(120)
"""


def test_a_timeout_kills_the_whole_session_and_fails(tmp_path, run_in_session):
    pid_file = tmp_path / "rank.pid"
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="ran past 3 s"):
        run_in_session([sys.executable, "-c", CHILD, str(pid_file)], timeout=3)
    # killing the launcher alone would leave the rank holding the pipes for its 120 s
    assert time.monotonic() - t0 < 60
    rank = int(pid_file.read_text())
    for _ in range(50):  # the kill is delivered at once; reaping by init may take a moment
        try:
            os.kill(rank, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{rank}/stat").read_text().split()[2] == "Z":
            return
        time.sleep(0.1)
    pytest.fail(f"the grandchild {rank} outlived the timeout")


def test_a_finished_process_is_returned_as_subprocess_run_would(run_in_session):
    done = run_in_session([sys.executable, "-c", "print('out'); exit(3)"], timeout=60)
    assert (done.returncode, done.stdout) == (3, "out\n")
