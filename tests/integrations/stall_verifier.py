"""A stand-in verifier for the unscorable tests: ``stall`` never finishes, anything else is
compared with the ground truth. Light on purpose: the pool's worker imports it inside the
item's 0.2 s time limit."""

import time

from divrl.rewards import ScoreResult, Verifier, register_verifier


class StallVerifier(Verifier):
    default_timeout = 0.2  # the pool kills the worker after this many seconds

    def verify(self, solution_str, ground_truth, extra_info, deadline):
        if solution_str == "stall":
            time.sleep(60)
        ok = solution_str == ground_truth
        return ScoreResult(float(ok), solution_str, "correct" if ok else "wrong")


register_verifier("stall_test")(StallVerifier())
