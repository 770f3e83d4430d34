"""Shared helpers: repeated timing, peak memory of a child process, JSON/Markdown output,
and the driver of the pass-memory benchmarks (one case per variant, each in a fresh
process, tabled against a baseline variant)."""

from __future__ import annotations

import argparse
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


def measured_pass(warm_up: Callable[[], Any], run: Callable[[], Any]) -> tuple[Any, float, float]:
    """``(run's result, pass peak GB, peak before GB)``: ``warm_up`` first (a short pass that
    loads every kernel's code, which would otherwise count as the measured pass's memory),
    then the peak RSS during ``run`` minus the RSS just before it, and the process's own
    peak before ``run`` minus that RSS (while it stays below the pass's figure, the pass's
    peak is the process's peak)."""
    warm_up()
    before, peak_before = rss_bytes(), peak_rss_bytes()
    result = run()
    peak = peak_rss_bytes()
    return result, (peak - before) / 1e9, (peak_before - before) / 1e9


def pass_memory_parser(
    description: str, *, rows: int, rows_help: str, prompt: int, response: int, dtype: str,
    variants: str,
) -> argparse.ArgumentParser:  # fmt: skip
    """The arguments every pass-memory benchmark takes, with its own defaults; the case is
    :func:`pass_memory_case` of them."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--rows", type=int, default=rows, help=rows_help)
    ap.add_argument("--prompt", type=int, default=prompt, help="prompt tokens per sequence")
    ap.add_argument("--response", type=int, default=response, help="response tokens per sequence")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default=dtype)
    ap.add_argument("--variants", default=variants, help="comma-separated variants to run")
    return ap


def pass_memory_case(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """The case a child measures: the shared arguments' values and ``extra``."""
    keys = ("vocab", "rows", "prompt", "response", "dtype")
    return {**{k: getattr(args, k) for k in keys}, **extra}


def run_pass_memory(
    module: str,
    case: dict[str, Any],
    variants: str,
    *,
    known: tuple[str, ...],
    baseline: str,
    ratio_header: str,
    columns: dict[str, Callable[[dict[str, Any]], Any]],
    name: str,
    timeout: float = 600,
) -> int:
    """Run ``module``'s child once per variant of ``variants`` (comma-separated, each one of
    ``known``) in a fresh process, then write ``name``'s results: a row per variant with
    ``columns`` (header -> the cell from the child's result) and the pass peak over the
    ``baseline`` variant's (``ratio_header``)."""
    results = {}
    for variant in variants.split(","):
        if variant not in known:
            raise SystemExit(f"--variants: {variant!r} is not one of {', '.join(known)}")
        results[variant] = run_child(module, {**case, "variant": variant}, timeout=timeout)
        print(variant, results[variant], flush=True)
    base = results.get(baseline, {}).get("pass_peak_gb")
    rows = [
        [
            variant,
            *(cell(r) for cell in columns.values()),
            f"{r['pass_peak_gb'] / base:.3f}" if base else "",
        ]
        for variant, r in results.items()
    ]
    table = markdown_table(["variant", *columns, ratio_header], rows)
    write_results(name, {"case": case, "results": results}, table)
    return 0
