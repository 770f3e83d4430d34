"""``make bench``: every benchmark in turn (or those named: ``python -m benchmarks.run_all
rollout logits``), then one combined Markdown table.

Each benchmark writes ``benchmarks/results/<name>.json`` and ``.md``; this script writes
``benchmarks/results/summary.md`` from them. Sizes are chosen to finish in under 20
minutes on 2 CPU cores; pass a benchmark's own flags by running it directly
(``python -m benchmarks.<name> --help``).
"""

from __future__ import annotations

import sys
import time

from benchmarks import (
    bucketing,
    fsdp,
    fsdp_trainer,
    logits,
    lp_reg_diagnostics,
    rollout,
    rollout_is,
    step_time,
    trl_compare,
)
from benchmarks.common import RESULTS_DIR, machine

BENCHMARKS = {
    "step_time": (step_time.main, ["--steps", "2", "--repeats", "2"]),
    "trl_compare": (trl_compare.main, ["--steps", "3", "--repeats", "2"]),
    "rollout": (rollout.main, ["--repeats", "3"]),
    "logits": (logits.main, ["--lengths", "1024", "4096", "8192", "--repeats", "2"]),
    "bucketing": (bucketing.main, ["--steps", "3", "--repeats", "2"]),
    "fsdp": (fsdp.main, ["--steps", "3"]),
    "fsdp_trainer": (fsdp_trainer.main, ["--steps", "2"]),
    "lp_reg_diagnostics": (lp_reg_diagnostics.main, ["--repeats", "20"]),
    "rollout_is": (rollout_is.main, ["--steps", "2", "--repeats", "2"]),
}


def main(argv: list[str] | None = None) -> int:
    names = (sys.argv[1:] if argv is None else argv) or list(BENCHMARKS)
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; valid: {', '.join(BENCHMARKS)}")
    parts = [f"# divrl benchmarks\n\nMachine: `{machine()}`\n"]
    for name, (fn, args) in BENCHMARKS.items():
        if name not in names:  # keep the last results of the benchmarks not run now
            if (RESULTS_DIR / f"{name}.md").is_file():
                parts.append(
                    f"## {name} (earlier run)\n\n{(RESULTS_DIR / f'{name}.md').read_text()}"
                )
            continue
        start = time.perf_counter()
        print(f"== {name} {' '.join(args)}", flush=True)
        fn(args)
        elapsed = time.perf_counter() - start
        table = (RESULTS_DIR / f"{name}.md").read_text()
        parts.append(
            f"## {name} (`python -m benchmarks.{name} {' '.join(args)}`, {elapsed:.0f} s)\n\n{table}"
        )
    (RESULTS_DIR / "summary.md").write_text("\n".join(parts))
    print(f"wrote {RESULTS_DIR / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
