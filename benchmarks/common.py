"""Shared helpers: repeated timing, peak memory of a child process, JSON/Markdown output."""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

RESULTS_DIR = Path(os.environ.get("DIVRL_BENCH_DIR", "benchmarks/results"))


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timed(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def summary(values: list[float]) -> dict[str, float]:
    """Median with spread (min, max) of repeated measurements."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def spread(s: dict[str, float], digits: int = 3) -> str:
    """A :func:`summary` as ``median [min, max]``, for a table cell."""
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}, {s['max']:.{digits}f}]"


def run_child(module: str, args: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    """Run ``python -m module`` with JSON args on stdin in a fresh process; parse its JSON.

    A fresh process per case makes the peak-RSS reading belong to that case alone.
    """
    proc = subprocess.run(
        [sys.executable, "-m", module, "--child"],
        input=json.dumps(args),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_avg_1m": os.getloadavg()[0],
    }


def write_results(name: str, payload: dict[str, Any], table: str) -> Path:
    """Write ``<name>.json`` (with the machine) and ``<name>.md``; print the table."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "machine": machine(), **payload}
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2))
    (RESULTS_DIR / f"{name}.md").write_text(table)
    print(table)
    print(f"wrote {path}")
    return path


def entry_point(
    main: Callable[[], int], child: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> None:
    """``python -m benchmarks.<name>``: run ``main``; with ``--child`` (see :func:`run_child`),
    run one case from the JSON on stdin and print its JSON result."""
    if child is not None and sys.argv[1:] == ["--child"]:
        print(json.dumps(child(json.loads(sys.stdin.read()))))
        sys.exit(0)
    sys.exit(main())


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
