"""Per-call latency of compute_score on the math fixtures (median and p99).

Run from a checkout: ``PYTHONPATH=$PWD OMP_NUM_THREADS=1 python scripts/bench_math_reward.py``.
Every completion of divrl/data/fixtures/math_completions.jsonl plus the toy-math shapes is
scored ``--repeats`` times, one compute_score call each, after a warm-up call.
"""

import argparse
import json
import statistics
import time

from divrl.data import fixture_path, load_examples
from divrl.rewards import compute_score


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    gold = {ex.id: ex.ground_truth for ex in load_examples(fixture_path("math.jsonl"))}
    items = []
    for line in fixture_path("math_completions.jsonl").read_text().splitlines():
        row = json.loads(line)
        items += [(c, gold[row["id"]]) for c in row["completions"]]
    items += [("4*9=36, 36+5=41. \\boxed{41}", "41"), ("\\boxed{41}", "42"), ("41", "41")]
    compute_score("math", "\\boxed{\\sqrt{4}}", "2")  # start the pool
    times = []
    for _ in range(args.repeats):
        for completion, answer in items:
            start = time.perf_counter()
            compute_score("math", completion, answer)
            times.append(time.perf_counter() - start)
    times.sort()
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    print(
        f"{len(times)} calls: median {statistics.median(times) * 1e3:.2f} ms, "
        f"p99 {p99 * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
