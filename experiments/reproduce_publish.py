"""The reproduction's files: per-run summaries in, the report and its plots out.

``write_report`` rebuilds the Markdown report from the committed per-run summaries alone
(``python -m experiments.reproduce --report-only``); the JSON helpers write atomically so
an interrupted run never leaves half a file.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from divrl.fileio import atomic_write_text
from experiments import reproduce_report as rr
from experiments.records import read_result, write_result
from experiments.reproduce_compare import footnote, like_for_like, mark_rows
from experiments.reproduce_plots import plot_entropy, plot_pass_at_k
from experiments.results_commits import commits_section, read_commits

TITLE = "Toy-scale reproduction of the DPH-RL and Lp-Reg claims"
#: sub-directory of --results for the per-run summaries (not "runs": .gitignore ignores runs/)
SUMMARIES = "summaries"


_print_lock = threading.Lock()


def say(text: str) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    with _print_lock:
        print(f"[reproduce {stamp}] {text}", flush=True)


def read_json(path: Path, default: Any = None) -> Any:
    """The JSON in ``path`` (``default`` when absent); a torn file is one line naming it
    (:class:`experiments.records.ResultError`)."""
    return read_result(path, default)


def write_json(path: Path, data: Any) -> None:
    write_result(path, data, indent=2)


def add_time(path: Path, key: str, seconds: float, sub: str | None = None) -> None:
    timing = read_json(path, {})
    if sub is None:
        timing[key] = timing.get(key, 0.0) + seconds
        timing[f"{key.removesuffix('_seconds')}_attempts"] = (
            timing.get(f"{key.removesuffix('_seconds')}_attempts", 0) + 1
        )
    else:
        timing.setdefault(key, {})[sub] = timing.get(key, {}).get(sub, 0.0) + seconds
    write_json(path, timing)


def command_line() -> str:
    """This script's command line, as run from the repository root."""
    return shlex.join(["python", "-m", "experiments.reproduce", *sys.argv[1:]])


def write_report(
    results: Path,
    report: Path,
    out: Path | None,
    missing: list[str] | None = None,
    allow_mismatch: bool = False,
) -> Path:
    """Rebuild the report from ``results``/summaries/*.json (and presample timings in
    ``out``); summaries that are not like for like are refused, or with ``allow_mismatch``
    marked (:mod:`experiments.reproduce_compare`)."""
    summaries = rr.load_summaries(results / SUMMARIES)
    marks = like_for_like(summaries, allow=allow_mismatch, where=results / SUMMARIES)
    for line in (x for lines in marks.values() for x in lines):
        say(f"not like for like (rows marked ⚠): {line}")
    presample_file = results / "presample_seconds.json"
    presample = read_json(presample_file, {})
    if out is not None:
        for t in sorted((out / "presample").glob("seed*/timing.json")):
            presample[t.parent.name.removeprefix("seed")] = read_json(t)["presample_seconds"]
        if presample:
            write_json(presample_file, presample)
    groups = rr.by_method(summaries)
    plots = {}
    rel = os.path.relpath(results, report.parent)
    if plot_entropy(groups, results / "entropy.png"):
        plots["entropy"] = f"{rel}/entropy.png"
    if plot_pass_at_k(groups, results / "pass_at_k.png"):
        plots["pass_at_k"] = f"{rel}/pass_at_k.png"
    settings = sorted({json.dumps(s["settings"], sort_keys=True) for s in summaries})
    seeds = {m: sorted(r["seed"] for r in rs) for m, rs in groups.items()}
    commands = sorted({s.get("command", "?") for s in summaries})
    if not summaries:
        md = rr.build_markdown([], title=TITLE, preamble=[f"Written by `{command_line()}`.", ""])
        report.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(report, md)
        say(f"report (no finished runs): {report}")
        return report
    preamble = [
        f"Written by `{command_line()}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC from "
        f"{len(summaries)} per-run summaries in `{rel}/{SUMMARIES}/` (every number below "
        "comes from them). The runs were made by:",
        "",
        *[f"    {c}" for c in commands],
        "",
        "Settings: " + "; ".join(f"`{s}`" for s in settings) if settings else "",
        "",
        "Runs per method (seeds): "
        + ", ".join(f"{rr.METHODS.get(m, m)} {v}" for m, v in seeds.items())
        + ".",
        "",
    ]
    reading = report.with_name(f"{report.stem}_reading.md")
    if reading.is_file():  # written by hand from the generated tables, kept across rebuilds
        preamble += [
            f"What these tables say, claim by claim, and what was tried: [{reading.name}]"
            f"({reading.name}) (written by hand from the numbers below).",
            "",
        ]
    preamble += footnote(marks)
    if missing:
        preamble += [
            "**Not finished** (failed or not run yet; see the work directory's logs): "
            + ", ".join(missing)
            + ".",
            "",
        ]
    md = rr.build_markdown(
        summaries,
        title=TITLE,
        preamble=preamble,
        presample_seconds=presample,
        plots=plots,
    )
    made = commits_section(summaries, read_commits(results))
    md += f"\n{made}" if made else ""
    md = mark_rows(md, marks)
    report.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(report, md)
    say(f"report: {report}")
    return report
