"""Re-check committed reproduction summaries: the same command must give the same digits.

Each trained run's summary stores a fingerprint: every metric of its first
:data:`FINGERPRINT_STEPS` steps as ``metrics.jsonl`` wrote them (wall-clock keys left
out). ``python -m experiments.reproduce --check --results DIR`` reruns those steps of seed
``--first-seed`` (0) of every method in ``DIR/summaries`` (or of ``--methods``), in fresh
``divrl`` processes on ``--threads`` torch threads (1, as the runs), on the world and
settings the summaries record, and compares every value bit for bit. A summary written
before fingerprints were stored is compared on what its training curve kept of those
steps (``actor/entropy`` and ``reward/pass@1`` at full precision, when the curve has every
step). Any difference fails the check (exit 1) with the step, metric and both values; what
changes the digits (threads, CPU, engine, torch version) is in docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from divrl.pipeline import CITED_SERIES
from divrl.runs import RunDir
from divrl.training.metrics import TIME_KEYS

#: steps of a run kept as its fingerprint (and rerun by --check)
FINGERPRINT_STEPS = 3
#: training-curve lists of a summary -> the metrics.jsonl key they hold (what a summary
#: without a fingerprint is checked on)
CURVE_KEYS = {"entropy": "actor/entropy", "pass1": "reward/pass@1", **CITED_SERIES}

#: (method, seed, steps, work dir) -> the rerun's metrics rows, steps 1..steps
Rerun = Callable[[str, int, int], list[dict[str, Any]]]


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--check",
        action="store_true",
        help="rerun the first steps of seed --first-seed of every method in --results "
        "(or --methods) and compare their metrics bit for bit with the summaries' "
        "fingerprints; exit 1 on any difference",
    )
    p.add_argument(
        "--check-steps",
        type=int,
        default=FINGERPRINT_STEPS,
        help="steps --check reruns (at most what a summary's fingerprint holds)",
    )


def metric_rows(metrics: Path, steps: int | None = None) -> list[dict[str, Any]]:
    """``metrics.jsonl``'s rows (the first ``steps``), wall-clock keys left out."""
    lines = [x for x in Path(metrics).read_text().splitlines() if x.strip()]
    rows = [json.loads(x) for x in lines[:steps]]
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]


def fingerprint(metrics: Path, steps: int = FINGERPRINT_STEPS) -> dict[str, Any]:
    """What a summary stores to re-check its run: every metric of the first ``steps``."""
    rows = metric_rows(metrics, steps)
    return {"steps": len(rows), "metrics": rows}


def expected_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows a rerun must give: the stored fingerprint, else the leading steps 1, 2, ...
    of the training curve (entropy and Pass@1 only); [] when neither is there."""
    stored = summary.get("fingerprint")
    if stored:
        return list(stored["metrics"])
    curve = summary.get("training") or {}
    rows = []
    for i, step in enumerate(curve.get("step", [])):
        if step != i + 1:  # the curve was downsampled from here on
            break
        row = {"step": step}
        for name, key in CURVE_KEYS.items():
            if curve.get(name) and curve[name][i] is not None:
                row[key] = curve[name][i]
        rows.append(row)
    return rows


def _same(a: Any, b: Any) -> bool:
    """Equal in every bit (floats as JSON wrote them; NaN equals NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare(expected: list[dict[str, Any]], got: list[dict[str, Any]]) -> list[str]:
    """One line per difference between the expected rows and the rerun's (same steps):
    a value that differs in any bit, a metric the rerun did not log, a missing step."""
    problems = []
    by_step = {r.get("step"): r for r in got}
    for want in expected:
        step = want.get("step")
        have = by_step.get(step)
        if have is None:
            problems.append(f"step {step}: not logged by the rerun")
            continue
        for key, value in want.items():
            if key == "step":
                continue
            if key not in have:
                problems.append(f"step {step} {key}: {value!r} in the summary, not logged now")
            elif not _same(value, have[key]):
                diff = ""
                if isinstance(value, int | float) and isinstance(have[key], int | float):
                    diff = f" (difference {have[key] - value:.3g})"
                problems.append(
                    f"step {step} {key}: {value!r} in the summary, {have[key]!r} now{diff}"
                )
    return problems


def check_summaries(
    summaries: list[dict[str, Any]], steps: int, rerun: Rerun, say: Callable[[str], None]
) -> int:
    """Rerun and compare each summary; 0 when every value matched, 1 otherwise."""
    failed = checked = 0
    for s in summaries:
        name = f"{s['method']} seed {s['seed']}"
        want = expected_rows(s)[:steps]
        if not want:
            say(f"{name}: no fingerprint and no per-step curve: nothing to re-check")
            continue
        problems = compare(want, rerun(s["method"], s["seed"], len(want)))
        values = sum(len(r) - 1 for r in want)
        checked += 1
        if problems:
            failed += 1
            say(
                f"MISMATCH {name}: {len(problems)} of {values} values differ in steps 1-{len(want)}:"
            )
            for line in problems[:20]:
                say(f"  {line}")
        else:
            say(f"{name}: steps 1-{len(want)} equal bit for bit ({values} values)")
    if not checked:
        say("nothing was re-checked: no summary holds a fingerprint or a per-step curve")
        return 1
    if failed:
        print(
            f"experiments.reproduce --check: {failed} of {checked} runs did NOT give the "
            "summaries' digits (docs/reliability.md: what changes them)",
            file=sys.stderr,
        )
        return 1
    say(f"all {checked} re-checked runs gave the summaries' digits")
    return 0


def _check_settings(summaries: list[dict[str, Any]], results: Path) -> dict[str, Any]:
    settings = [s["settings"] for s in summaries]
    if any(x != settings[0] for x in settings):
        raise ValueError(f"{results}: summaries made with different settings: check one set")
    return settings[0]


def run_check(args: argparse.Namespace, make_experiment: Callable, say) -> int:
    """``--check``: rerun seed ``args.first_seed``'s first ``--check-steps`` steps of each
    method's summary under ``args.results`` in ``args.out``/check and compare.

    Raises:
        ValueError: nothing to re-check, or a rerun that could not repeat the runs (another
            world, a schedule that depends on the number of steps); one line, exit 2.
    """
    results = Path(args.results).resolve()
    paths = sorted((results / "summaries").glob("*.json"))
    summaries = [json.loads(p.read_text()) for p in paths]
    summaries = [
        s for s in summaries if s.get("method") in args.methods and s.get("seed") == args.first_seed
    ]
    if not summaries or args.check_steps < 1:
        raise ValueError(
            f"{results}/summaries: no trained run of seed {args.first_seed} among "
            f"{', '.join(args.methods)} to re-check (and --check-steps must be >= 1)"
        )
    settings = _check_settings(summaries, results)
    steps = min(args.check_steps, max(len(expected_rows(s)) for s in summaries))
    out = Path(args.out).resolve() / "check"
    argv = [
        *("--world", settings.get("world_name", "sql"), "--toy-size", settings["toy_size"]),
        *("--methods", *sorted({s["method"] for s in summaries}), "--seeds", "1"),
        *("--first-seed", str(args.first_seed), "--steps", str(steps), "--out", str(out)),
        *("--results", str(out / "results"), "--report", str(out / "report.md")),
        *("--threads", str(args.threads), "--poll", str(args.poll)),
    ]
    (out / "settings.json").unlink(missing_ok=True)  # a scratch folder: any steps may rerun
    exp = make_experiment(argv)
    exp.setup()
    if exp.world.root.name != settings["world"]:
        raise ValueError(
            f"the world built here ({exp.world.root.name}) is not the summaries' "
            f"({settings['world']}): the rerun would not be the same experiment"
        )
    for method, cfg in exp.cfgs.items():
        if cfg.optim.schedule != "constant" or cfg.optim.warmup_steps:
            raise ValueError(
                f"{method}: its learning-rate schedule depends on train.total_steps: a "
                "rerun of the first steps alone would not repeat them"
            )
    if any(cfg.uses_reference_samples for cfg in exp.cfgs.values()):
        exp.presample(args.first_seed)

    def rerun(method: str, seed: int, n: int) -> list[dict[str, Any]]:
        from experiments.reproduce import Paths

        paths = Paths(exp.out, method, seed)
        shutil.rmtree(paths.root, ignore_errors=True)  # a fresh process, from step 0
        exp.train(paths)
        return metric_rows(RunDir(paths.train).metrics_path, n)

    return check_summaries(summaries, steps, rerun, say)
