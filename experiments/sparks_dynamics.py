"""Spark dynamics on the sparks world: train methods, read the spark move from samples.

For each (method, seed): ``divrl train configs/toy/sparks/<method>.yaml`` (seed, output
directory and, with ``--steps``, the step count overridden; checkpoints every 25 steps),
then every checkpoint and the base model are sampled on the first ``--prompts`` prompts of
the ``test`` split (``--n`` samples each, T = 1) and measured by
:func:`divrl.toy.sparks_measure.spark_stats` (the spark move's frequency and probability
at its decision point, on easy and hard prompts: independent of Lp-Reg's selection); the
final model is also measured on ``test`` and ``hard`` with ``--final-n`` samples for
Pass@k. One JSON per run in ``--out``, written atomically, with the settings it was made
with (``--steps``, ``--prompts``, ``--n``, ``--final-n``, ``--set``): a finished run is
skipped when they are all the same and refused (one line naming the file) when any differs;
an interrupted training resumes (``divrl train --resume``), one killed before its first
checkpoint starts again (``--overwrite``: nothing to keep). Every error is one line
(exit 2): a torn JSON names the file, a failed training quotes ``divrl train``'s line and
names its log.

Usage (from the repository root)::

    python -m experiments.sparks_dynamics run --methods grpo_math lp_reg --seeds 0 1 2 \\
        --out /tmp/sparks                     # train + measure (resumable)
    python -m experiments.sparks_dynamics run --methods lp_reg_toy --seeds 0 \\
        --set algorithm.loss_options.beta=4.0 --out /tmp/sparks_beta4  # a preset override
    python -m experiments.sparks_dynamics report --out /tmp/sparks \\
        --report docs/results/sparks_world.md  # tables (per method: mean over seeds)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from divrl.fileio import atomic_write_text
from divrl.runs import RunDir
from divrl.toy.sparks_measure import SparksMeasureConfig, measure_sparks_model
from divrl.toy.sparks_world import ensure_sparks_world
from experiments.records import ResultError, read_result, refuse_other_settings, write_result

REPO = Path(__file__).resolve().parents[1]
METHODS = {
    "grpo_math": "GRPO on-policy = Lp-Reg without its regulariser",
    "lp_reg": "Lp-Reg (on-policy)",
    "lp_reg_toy": "Lp-Reg, rho 0.1 (toy variant)",
    "entropy_bonus": "GRPO + entropy bonus",
    "high_entropy_8020": "80/20",
    "kl_cov": "KL-Cov",
    "clip_cov": "Clip-Cov",
}


def measure_checkpoint(model_dir: Path, world, prompts: int, n: int, seed: int) -> dict[str, Any]:
    """Spark stats and entropy of one model on the first ``prompts`` test prompts."""
    cfg = SparksMeasureConfig(n_samples=n, max_prompts=prompts, seed=seed, splits=("test",))
    return _compact(measure_sparks_model(model_dir, world.splits, cfg)["splits"]["test"])


def _compact(stats: dict[str, Any]) -> dict[str, Any]:
    keep = ("pass@1", "entropy", "sparks")
    return {k: stats[k] for k in keep}


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Everything a run's JSON depends on besides its method and seed; a finished run is
    reused only when all of it is the same."""
    return {
        "steps": args.steps,
        "prompts": args.prompts,
        "n": args.n,
        "final_n": args.final_n,
        "overrides": list(args.set),
    }


def train(method: str, seed: int, args: argparse.Namespace, world, run_dir: Path) -> None:
    """``divrl train`` the run into ``run_dir``: resumed from its last checkpoint, or
    started again when a kill came before its first checkpoint (nothing to keep). A
    failure (e.g. a resumed run whose settings differ) is a :class:`ResultError` with
    ``divrl train``'s own line and the log's path."""
    cmd = [
        sys.executable,
        "-m",
        "divrl.cli",
        "train",
        str(REPO / "configs/toy/sparks" / f"{method}.yaml"),
        f"train.seed={seed}",
        f"logging.output_dir={run_dir}",
        "logging.progress=false",
        "logging.tensorboard=false",
        f"model.path={world.model_dir}",
        f"data.train_path={world.splits['train']}",
    ]
    if args.steps:
        cmd.append(f"train.total_steps={args.steps}")
    cmd += args.set
    run = RunDir(run_dir)
    if run.latest() is not None:
        cmd.append("--resume")
    elif run.run_files():
        cmd.append("--overwrite")
    log_path = Path(args.out) / f"{method}_seed{seed}.train.log"
    with open(log_path, "a") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO).returncode
    if rc != 0:
        lines = [x for x in log_path.read_text(errors="replace").splitlines() if x.strip()]
        said = [x for x in lines if x.startswith("divrl train: ")]
        reason = (said or lines or ["no output"])[-1]
        raise ResultError(
            f"training {method} seed {seed} failed (exit {rc}): {reason} (log: {log_path})"
        )


def run_one(method: str, seed: int, args: argparse.Namespace, world) -> Path:
    out = Path(args.out) / f"{method}_seed{seed}.json"
    wanted = settings(args)
    if out.exists():
        saved = read_result(out)
        refuse_other_settings(
            out,
            saved.get("settings") if isinstance(saved, dict) else None,
            wanted,
            "use another --out for other settings, or move the file away to measure again",
        )
        return out
    run_dir = Path(args.out) / "runs" / f"{method}_seed{seed}"
    train(method, seed, args, world, run_dir)
    curve = [json.loads(x) for x in RunDir(run_dir).metrics_path.read_text().splitlines() if x]
    points = {0: measure_checkpoint(world.model_dir, world, args.prompts, args.n, seed)}
    for ckpt in RunDir(run_dir).checkpoints():
        points[ckpt.step] = measure_checkpoint(ckpt.model_dir, world, args.prompts, args.n, seed)
    final = RunDir(run_dir).final_model()
    cfg = SparksMeasureConfig(n_samples=args.final_n, seed=seed, splits=("test", "hard"))
    end = measure_sparks_model(final, world.splits, cfg)["splits"]
    record = {
        "method": method,
        "seed": seed,
        "steps": curve[-1]["step"],
        "overrides": list(args.set),
        "settings": wanted,
        "curve": {
            k: [r.get(m) for r in curve]
            for k, m in (
                ("step", "step"),
                ("entropy", "actor/entropy"),
                ("pass1", "reward/pass@1"),
                ("seconds", "time/step"),
                ("lp_reg_regularized", "lp_reg/num_regularized"),
                ("lp_reg_selected", "lp_reg/num_selected"),
                ("length", "response/length"),
            )
        },
        "checkpoints": {str(k): v for k, v in sorted(points.items())},
        "final": {s: {k: v for k, v in st.items() if k != "examples"} for s, st in end.items()},
    }
    write_result(out, record)
    return out


def _mean_sd(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None and np.isfinite(x)]
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{np.mean(xs):.3f} ± {np.std(xs, ddof=1):.3f}"


def _num(x: float | None) -> str:
    """Three decimals; ``-`` for a number the run did not measure (Pass@16 needs
    ``--final-n`` >= 16)."""
    return "-" if x is None else f"{x:.3f}"


def _small(x: float) -> str:
    """Three decimals, four below 0.01 (an extinguished spark is not 0.000)."""
    return f"{x:.4f}" if abs(x) < 0.01 else f"{x:.3f}"


def _window(curve: list[float | None], lo: int, hi: int) -> float | None:
    xs = [x for x in curve[lo:hi] if x is not None]
    return float(np.mean(xs)) if xs else None


def _by_method(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(records, key=lambda r: (list(METHODS).index(r["method"]), r["seed"])):
        by.setdefault(r["method"], []).append(r)
    return by


def _entropy_tables(by: dict[str, list[dict[str, Any]]], steps: list[int]) -> list[str]:
    lines = ["### Entropy (per token, training rollouts)", ""]
    lines += [
        "Mean of steps 1-10 and of the last 10 steps, then the mean over 5 steps around each "
    ]
    lines += ["checkpoint step (mean over seeds).", ""]
    lines += [
        "| method | seeds | start | end | end / start | "
        + " | ".join(f"~{s}" for s in steps)
        + " |"
    ]
    lines += ["|---|---|---|---|---|" + "---|" * len(steps)]
    for m, rs in by.items():
        start = [_window(r["curve"]["entropy"], 0, 10) for r in rs]
        end = [_window(r["curve"]["entropy"], -10, None) for r in rs]
        ratio = [e / s for s, e in zip(start, end, strict=True) if s and e is not None]
        at = []
        for s in steps:
            xs = [_window(r["curve"]["entropy"], max(0, s - 3), s + 2) for r in rs]
            xs = [x for x in xs if x is not None]
            at.append(f"{np.mean(xs):.3f}" if xs else "-")
        lines.append(
            f"| {METHODS[m]} | {len(rs)} | {_mean_sd(start)} | {_mean_sd(end)} | "
            f"{_mean_sd(ratio)} | " + " | ".join(at) + " |"
        )
    return lines


def _spark_table(by: dict[str, list[dict[str, Any]]], steps: list[int]) -> list[str]:
    lines = ["", "### The spark move over training (test split: probability / frequency)", ""]
    lines += ["Mean over seeds of the spark token's probability at the decision point and the "]
    lines += ["share of samples that check, 128 test prompts x 8 samples per checkpoint.", ""]
    lines += ["| method (prompts) | " + " | ".join(f"step {s}" for s in steps) + " |"]
    lines += ["|---|" + "---|" * len(steps)]
    for group in ("hard", "easy"):
        for m, rs in by.items():
            cells = []
            for s in steps:
                pts = [r["checkpoints"].get(str(s), {}).get("sparks", {}).get(group) for r in rs]
                pts = [p for p in pts if p]
                cells.append(
                    f"{_small(np.mean([p['spark_prob'] for p in pts]))} / "
                    f"{_small(np.mean([p['spark_freq'] for p in pts]))}"
                    if pts
                    else "-"
                )
            lines.append(f"| {METHODS[m]} ({group}) | " + " | ".join(cells) + " |")
    return lines


def _pooled_checks(stats: list[dict[str, Any]]) -> str:
    """Checks right / checks taken, summed over seeds (an accuracy from a handful of checks
    is no accuracy)."""
    taken = [round(h["spark_freq"] * h["samples"]) for h in stats if "samples" in h]
    right = [round((h["spark_acc"] or 0.0) * t) for h, t in zip(stats, taken, strict=False)]
    return f"{sum(right)} / {sum(taken)}" if len(taken) == len(stats) else "-"


def _final_table(by: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = ["", "### At the end (final checkpoint, 256 prompts x 16 samples, unbiased Pass@k)", ""]
    ks = (1, 4, 16)
    head = [f"{s} pass@{k}" for s in ("test", "hard") for k in ks]
    lines += [
        "| method | " + " | ".join(head) + " | hard: check freq | hard: checks right / taken |"
    ]
    lines += ["|---|" + "---|" * (len(head) + 2)]
    for m, rs in by.items():
        cells = [
            _mean_sd([r["final"][s].get(f"pass@{k}") for r in rs])
            for s in ("test", "hard")
            for k in ks
        ]
        hard = [r["final"]["hard"]["sparks"]["hard"] for r in rs]
        cells.append(_mean_sd([h["spark_freq"] for h in hard]))
        cells.append(_pooled_checks(hard))
        lines.append(f"| {METHODS[m]} | " + " | ".join(cells) + " |")
    return lines


def _lp_reg_table(by: dict[str, list[dict[str, Any]]]) -> list[str]:
    rows = [r for m in ("lp_reg", "lp_reg_toy") for r in by.get(m, [])]
    if not rows:
        return []
    lines = ["", "### What Lp-Reg selected and regularised (per step, from metrics.jsonl)", ""]
    lines += [
        "| method | seed | steps | selected: mean (max) | regularised: mean (max) | steps with any |"
    ]
    lines += ["|---|---|---|---|---|---|"]
    for r in rows:
        sel = [x for x in r["curve"]["lp_reg_selected"] if x is not None] or [0.0]
        reg = [x for x in r["curve"]["lp_reg_regularized"] if x is not None] or [0.0]
        lines.append(
            f"| {METHODS[r['method']]} | {r['seed']} | {len(reg)} | {np.mean(sel):.2f} "
            f"({max(sel):.0f}) | {np.mean(reg):.3f} ({max(reg):.0f}) | {sum(x > 0 for x in reg)} |"
        )
    return lines


def _per_seed_table(by: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = ["", "### Per seed", ""]
    lines += [
        "Spark probability at the decision point (test split, hard prompts) at steps 0, 25, 50 "
        "and the end, on easy prompts at the end; final Pass@k; the training entropy (per "
        "token) at step 1, over the last 10 steps and its minimum; training seconds "
        "(`time/step` summed).",
        "",
    ]
    lines += [
        "| method | seed | spark p, hard: step 0 / 25 / 50 / end | spark p, easy: end | "
        "hard pass@1 | hard pass@16 | test pass@1 | entropy: step 1 / last 10 / min | training s |"
    ]
    lines += ["|---|---|---|---|---|---|---|---|---|"]
    for m, rs in by.items():
        for r in rs:
            pts = r["checkpoints"]
            end = str(max(int(k) for k in pts))

            def p(step: str, group: str = "hard", pts=pts) -> str:
                x = pts.get(step, {}).get("sparks", {}).get(group, {}).get("spark_prob")
                return "-" if x is None else _small(x)

            ent = [x for x in r["curve"]["entropy"] if x is not None]
            secs = sum(x for x in r["curve"].get("seconds", []) if x is not None)
            fin = r["final"]
            lines.append(
                f"| {METHODS[m]} | {r['seed']} | {p('0')} / {p('25')} / {p('50')} / {p(end)} | "
                f"{p(end, 'easy')} | {_num(fin['hard'].get('pass@1'))} | "
                f"{_num(fin['hard'].get('pass@16'))} | "
                f"{_num(fin['test'].get('pass@1'))} | {ent[0]:.4f} / {np.mean(ent[-10:]):.4f} / "
                f"{min(ent):.4f} | {secs:.0f} |"
            )
    return lines


#: checkpoint steps the tables show when a run has more than seven
SHOWN_STEPS = (0, 25, 50, 100, 150, 200, 300)


def _shown(steps: list[int]) -> list[int]:
    if len(steps) <= 7:
        return steps
    return sorted({s for s in steps if s in SHOWN_STEPS} | {steps[-1]})


def report(records: list[dict[str, Any]]) -> str:
    """Markdown tables: entropy, the spark move over checkpoints, Pass@k at the end, what
    Lp-Reg regularised, per seed (mean ± sd over seeds, sd with n - 1)."""
    by = _by_method(records)
    steps = _shown(sorted({int(s) for r in records for s in r["checkpoints"]}))
    lines = _entropy_tables(by, [s for s in steps if s > 0])
    lines += _spark_table(by, steps) + _final_table(by) + _lp_reg_table(by)
    lines += _per_seed_table(by)
    changed = [r for rs in by.values() for r in rs if r.get("overrides")]
    if changed:
        lines += ["", "Runs trained with overrides of their preset:", ""]
        lines += [
            f"- {METHODS[r['method']]} seed {r['seed']}: `{' '.join(r['overrides'])}`"
            for r in changed
        ]
    return "\n".join(lines) + "\n"


def _positive(text: str) -> int:
    value = int(text) if text.strip().lstrip("-").isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= 1")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.sparks_dynamics")
    p.add_argument("command", choices=("run", "report"))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=_positive, default=None, help="override train.total_steps")
    p.add_argument("--out", required=True, help="work directory (runs and one JSON per run)")
    p.add_argument("--cache-dir", default=None, help="toy world cache")
    p.add_argument("--prompts", type=_positive, default=128, help="test prompts per checkpoint")
    p.add_argument("--n", type=_positive, default=8, help="samples per prompt per checkpoint")
    p.add_argument("--final-n", type=_positive, default=16, help="samples per prompt at the end")
    p.add_argument("--report", default=None, help="write the report's tables here")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for the trainings (repeatable; recorded in each run's JSON; "
        "a finished run in --out with other overrides is refused)",
    )
    args = p.parse_args(argv)
    try:
        return _command(args)
    except ResultError as exc:
        print(f"experiments.sparks_dynamics: {exc}", file=sys.stderr)
        return 2


def _command(args: argparse.Namespace) -> int:
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.command == "run":
        world = ensure_sparks_world(args.cache_dir, progress=False)
        for seed in args.seeds:
            for method in args.methods:
                print(f"{method} seed {seed}: {run_one(method, seed, args, world)}", flush=True)
        return 0
    records = [read_result(f) for f in sorted(Path(args.out).glob("*_seed*.json"))]
    text = report(records)
    if args.report:
        atomic_write_text(args.report, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
