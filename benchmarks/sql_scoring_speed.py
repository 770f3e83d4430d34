"""Per-call SQL scoring time on the shipped fixture set (docs/rewards.md, "Speed").

Usage: ``PYTHONPATH=. python -m benchmarks.sql_scoring_speed [--repeats 10]``; runs with
any divrl checkout first on ``PYTHONPATH`` (only the public API is used), so the same
command measures an older version.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from divrl.data import fixture_path, load_examples
from divrl.rewards import compute_score_detailed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=10, help="passes over the fixture set")
    args = parser.parse_args()
    examples = {e.id: e for e in load_examples(fixture_path("sql.jsonl"))}
    pairs = []
    for line in fixture_path("sql_completions.jsonl").read_text().splitlines():
        row = json.loads(line)
        for text in row["completions"]:
            pairs.append((examples[row["id"]], text))
    first = pairs[0][0]
    compute_score_detailed(first.data_source, "SELECT 1", "SELECT 1", first.extra_info)  # warm
    times = []
    for _ in range(args.repeats):
        for ex, text in pairs:
            start = time.perf_counter()
            compute_score_detailed(ex.data_source, text, ex.ground_truth, ex.extra_info)
            times.append(time.perf_counter() - start)
    times.sort()
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    print(
        f"{len(times)} calls: median {statistics.median(times) * 1e3:.2f} ms, "
        f"p99 {p99 * 1e3:.2f} ms, mean {statistics.fmean(times) * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
