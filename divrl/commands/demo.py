"""``divrl demo`` (``make demo``): a toy world end to end, GRPO vs DPH-JS vs Lp-Reg.

From nothing: builds (or loads the cached) toy base model of the world ``--world`` (default
``sql``; see ``divrl.toy.WORLDS``), presamples DPH-RL's reference
store, trains GRPO, DPH-JS and Lp-Reg for a short budget with the toy presets
(``configs/toy/*.yaml``, only scale overridden), evaluates the three and the base model on
every eval split of the world (for ``sql``: in domain ``test``, cross domain on held-out
databases, out of domain math), prints the comparison table and writes a report
(``OUT/report/report.md``). The stages are :mod:`divrl.pipeline`'s, shared with
``experiments/reproduce.py``; this module holds the demo's own choices.

Every stage whose output already exists is reused (and said so), so a second run only
re-prints; ``--fresh`` starts over. The numbers printed are whatever was measured: with a
short budget they are noisy, and the intervals in the report say how noisy.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from divrl.cli import positive_int, seed_int
from divrl.fileio import atomic_write_text
from divrl.pipeline import (
    Clock,
    configs_dir,
    eval_command,
    evaluate_splits,
    final_checkpoint,
    open_world,
    preset_overrides,
    reference_samples,
    run_parallel,
)
from divrl.runs import RunDir
from divrl.toy.worlds import DEFAULT_WORLD, WORLDS, eval_splits, world_names

#: method name (configs/toy/<name>.yaml) -> label in tables
METHODS = {"grpo": "GRPO", "dph_js": "DPH-JS", "lp_reg": "Lp-Reg"}
#: the first piece where a toy SQL style departs from the majority one: CTE, join (aliased
#: columns), IN sub-query, scalar sub-query, COUNT(column)
TOY_SPARKS = ("WITH s AS (", "a.nm", " IN (", "=(SELECT ", "COUNT(nm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/demo", help="output directory (runs/demo)")
    parser.add_argument(
        "--size", default="full", help="toy world size, one the world declares (default full)"
    )
    parser.add_argument("--steps", type=positive_int, default=40, help="RL steps per method (40)")
    parser.add_argument(
        "--train-prompts",
        type=int,
        default=256,
        help="training prompts used (data.limit; also what presampling covers) (256)",
    )
    parser.add_argument(
        "--eval-prompts", type=positive_int, default=64, help="prompts per eval set (64)"
    )
    parser.add_argument("--n", type=positive_int, default=8, help="eval samples per prompt (8)")
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated, from {', '.join(METHODS)} (default: all)",
    )
    parser.add_argument("--seed", type=seed_int, default=0, help="training seed")
    parser.add_argument("--fresh", action="store_true", help="delete --out first")
    parser.add_argument(
        "--spark-words",
        default=None,
        help="comma-separated words whose probability the report compares between the base "
        "model and each final checkpoint ('' = skip); default for the sql world: the toy SQL "
        "styles' opening pieces, the toy analogue of Lp-Reg's 'wait' / 'however'",
    )
    parser.add_argument(
        "--world",
        default=DEFAULT_WORLD,
        help=f"toy world, one of {', '.join(WORLDS)} (default {DEFAULT_WORLD})",
    )
    parser.add_argument(
        "--world-dir", help="use this already built world directory instead of --size's"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="trainings and evaluations run at the same time, each in its own process on one "
        "thread, a model's evaluation as soon as its training ends (default: every training "
        "and the base model's evaluation at once; 1: in this process, one after the other)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1: the toy model gains nothing from more, and on a "
        "busy machine 2 threads measured several times slower than 1)",
    )
    parser.add_argument(
        "--configs",
        default=None,
        help="directory of the toy presets (default: the world's preset folder of this checkout: configs/toy for sql, configs/toy/countdown for countdown)",
    )


def _argv(args: argparse.Namespace) -> list[str]:
    """The demo's settings as a command line (for the report's provenance line)."""
    argv = ["--out", args.out]
    if args.world != DEFAULT_WORLD:
        argv += ["--world", args.world]
    argv += ["--world-dir", args.world_dir] if args.world_dir else ["--size", args.size]
    for flag in ("steps", "train_prompts", "eval_prompts", "n", "methods", "seed", "jobs"):
        argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.spark_words is not None:
        argv += ["--spark-words", args.spark_words]
    return argv


def _spark_words(args: argparse.Namespace) -> list[str]:
    if args.spark_words is None:
        return list(TOY_SPARKS) if args.world == "sql" else []
    return [w for w in args.spark_words.split(",") if w]


def _say(text: str) -> None:
    print(f"[divrl demo] {text}", file=sys.stderr, flush=True)


def demo_overrides(method: str, args: argparse.Namespace, out: Path, world) -> list[str]:
    """What the demo changes in a toy preset: paths, steps, prompts, seed, checkpoints."""
    return [
        *preset_overrides(world, seed=args.seed, run_dir=out / method, store=out / "dph_reference"),
        f"train.total_steps={args.steps}",
        f"data.limit={args.train_prompts}",
        # one generate call per batch instead of one per prompt: same distribution, and on a
        # CPU several times faster for the toy model
        "rollout.seeded=false",
        "checkpoint.save_every=0",
        "checkpoint.keep_last=1",
    ]


def _config(configs: Path, method: str, args: argparse.Namespace, out: Path, world):
    from divrl.training.config import load_config

    return load_config(configs / f"{method}.yaml", demo_overrides(method, args, out, world))


def _train(config, steps: int) -> Path:
    from divrl.training.trainer import Trainer

    run_dir = Path(config.logging.output_dir)
    if run_dir.exists():  # an unfinished earlier attempt: start it over
        shutil.rmtree(run_dir)
    Trainer(config).train()
    ckpt = final_checkpoint(run_dir, steps)
    if ckpt is None:
        raise RuntimeError(f"training finished without a final checkpoint in {run_dir}")
    return ckpt


def _eval_config(args: argparse.Namespace, max_new_tokens: int):
    from divrl.evaluation.runner import EvalConfig

    return EvalConfig(
        n=args.n,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        batch_size=32,
        limit=args.eval_prompts,
        group_by=("hard",),
        seed=args.seed,
    )


def _print_table(models, splits) -> None:
    """The headline: per model and split, greedy / P@1 / P@n (n = the largest k) / the
    mean number of distinct solution styles per prompt among its n samples (diversity:
    GRPO's collapse shows as this falling towards 1)."""
    from rich.console import Console
    from rich.table import Table

    n = next(m.summaries[s]["ks"][-1] for m in models for s in splits if s in m.summaries)
    table = Table(title=f"divrl demo: greedy / P@1 / P@{n} / styles per prompt (in domain = test)")
    table.add_column("model", no_wrap=True)
    for split in splits:
        table.add_column(split, justify="right", no_wrap=True)
    for m in models:
        cells = []
        for split in splits:
            s = m.summaries.get(split)
            if s is None:
                cells.append("-")
                continue
            greedy = s.get("greedy_accuracy")
            styles = s.get("diversity", {}).get("mean_distinct_styles")
            cells.append(
                ("-" if greedy is None else f"{greedy:.2f}")
                + f" / {s['pass@k']['1']:.2f} / {s['pass@k'][str(s['ks'][-1])]:.2f}"
                + (" / -" if styles is None else f" / {styles:.1f}")
            )
        table.add_row(m.name, *cells)
    Console(width=200).print(table)


def _check_args(args: argparse.Namespace) -> tuple[list[str], Path]:
    """The methods and the presets' directory; ValueError/FileNotFoundError when invalid."""
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ValueError(f"--methods: unknown {unknown}; choose from {list(METHODS)}")
    jobs = 1 if args.jobs is None else args.jobs
    if min(args.steps, args.train_prompts, args.eval_prompts, args.n, jobs) < 1:
        raise ValueError("--steps, --train-prompts, --eval-prompts, --n, --jobs must be >= 1")
    if args.world not in world_names():  # a world of an entry point counts
        raise ValueError(f"--world: unknown {args.world!r}; choose from {world_names()}")
    return methods, configs_dir(args.configs, args.world)


def default_jobs(methods: list[str]) -> int:
    """Processes at once when ``--jobs`` is not given: every training and the base model's
    evaluation. Started in waves of one per core, three equal trainings on two cores take
    two trainings' time with a core idle through the second; all at once they take one and
    a half, the cores shared, and each evaluation fills a core as its training ends."""
    return len(methods) + 1


def _presample(cfgs: dict[str, Any], methods: list[str], clock: Clock) -> list[str]:
    """Presample the DPH reference store once (reused when there); the methods that can
    run (the DPH ones are dropped when the store is empty)."""
    needs_store = [c for c in cfgs.values() if c.uses_reference_samples]
    if not needs_store:
        return methods
    store = needs_store[0].reference_store
    if reference_samples(store) is not None:
        _say(f"presample: reusing {store}")
    else:
        from divrl.training.presample import presample

        manifest = clock.run("presample (DPH reference store)", presample, needs_store[0])
        stats = manifest["stats"]
        _say(
            f"presample: {stats['near_perfect']} of {stats['prompts']} prompts near-perfect, "
            f"{stats['reference_samples']} reference samples"
        )
    if reference_samples(store) == 0:
        dropped = [m for m, c in cfgs.items() if c.uses_reference_samples]
        _say(
            f"skipping {', '.join(dropped)}: the base model solves no training prompt "
            "reliably enough for a reference sample (an empty DPH-RL store)"
        )
        methods = [m for m in methods if m not in dropped]
    return methods


def _evaluated(out: Path, name: str, splits) -> bool:
    from divrl.evaluation.runner import SUMMARY_FILE

    return all((out / name / "eval" / s / SUMMARY_FILE).is_file() for s in splits)


def _eval_task(name: str, model: Path, world, out: Path, eval_cfg, splits) -> tuple:
    """A :func:`run_parallel` task evaluating ``model`` in a ``divrl eval`` subprocess (its
    bar completes when the combined ``summary.json`` is written)."""
    eval_dir = out / name / "eval"
    argv = eval_command(model, world, splits, eval_dir, eval_cfg)
    return (f"evaluate {name}", argv, eval_dir / "summary.json", 1)


def _evaluate_all(
    models: dict[str, Path], world, out: Path, eval_cfg, splits, args, clock, fresh=()
):
    """Evaluate every model not evaluated yet: ``--jobs`` at a time in subprocesses (the
    same numbers as in this process: the same settings and seed), else here in turn.
    ``fresh``: the models evaluated by this run already (beside the trainings)."""
    todo = {n: p for n, p in models.items() if not _evaluated(out, n, splits)}
    for name in models.keys() - todo.keys() - set(fresh):
        _say(f"evaluate {name}: reusing {out / name / 'eval'}")
    if args.jobs > 1 and len(todo) > 1:
        tasks = [_eval_task(n, p, world, out, eval_cfg, splits) for n, p in todo.items()]
        label = f"evaluate {', '.join(todo)} ({args.jobs} at a time)"
        clock.run(label, run_parallel, tasks, args.jobs, out / "logs")
        return
    for name, path in todo.items():
        clock.run(
            f"evaluate {name}", evaluate_splits, path, world, out / name / "eval", eval_cfg,
            splits, _say,
        )  # fmt: skip


def _train_task(m: str, args, configs: Path, out: Path, world, then: tuple = ()) -> tuple:
    """A :func:`run_parallel` task training method ``m`` in a ``divrl train`` subprocess
    (its bar follows ``metrics.jsonl``), ``then`` started when it succeeds."""
    argv = [
        "train",
        str(configs / f"{m}.yaml"),
        *demo_overrides(m, args, out, world),
        "logging.progress=false",
    ]
    return (f"train {m}", argv, RunDir(out / m).metrics_path, args.steps, then)


def _evals_beside_training(methods, args, out: Path, world, eval_cfg, splits):
    """(beside, then) for :func:`_train_all` with ``--jobs`` > 1: the base model's
    evaluation when it is not there yet, and each method to train followed by the
    evaluation of its final checkpoint."""
    if args.jobs <= 1:
        return (), {}
    beside = ()
    if not _evaluated(out, "base", splits):
        beside = (_eval_task("base", world.model_dir, world, out, eval_cfg, splits),)
    then = {}
    for m in methods:
        if final_checkpoint(out / m, args.steps) is None:
            model = RunDir(out / m).checkpoint(args.steps).model_dir
            then[m] = (_eval_task(m, model, world, out, eval_cfg, splits),)
    return beside, then


def _train_all(
    methods: list[str],
    cfgs: dict[str, Any],
    args,
    configs: Path,
    out: Path,
    world,
    clock,
    beside: tuple = (),
    then: dict[str, tuple] | None = None,
) -> dict[str, Path]:
    """Train the methods without a final checkpoint (with ``--jobs`` > 1: in parallel
    subprocesses, each followed by its ``then[method]`` tasks, with the ``beside`` tasks
    after them: a core the trainings leave idle runs them); every method's final checkpoint."""
    todo = []
    for m in methods:
        ckpt = final_checkpoint(out / m, args.steps)
        if ckpt is not None:
            _say(f"train {m}: reusing {ckpt}")
        else:
            todo.append(m)
    then = then or {}
    if todo and args.jobs > 1:
        for m in todo:  # unfinished earlier attempts start over
            shutil.rmtree(out / m, ignore_errors=True)
        tasks = [_train_task(m, args, configs, out, world, then.get(m, ())) for m in todo]
        tasks += list(beside)
        label = f"train {', '.join(todo)} ({args.steps} steps, {args.jobs} at a time)"
        extra = [t[0] for t in beside] + [f[0] for m in todo for f in then.get(m, ())]
        if extra:
            label += " + " + ", ".join(extra)
        clock.run(label, run_parallel, tasks, args.jobs, out / "logs")
    else:
        for m in todo:
            clock.run(f"train {m} ({args.steps} steps)", _train, cfgs[m], args.steps)
    checkpoints: dict[str, Path] = {}
    for m in methods:
        ckpt = final_checkpoint(out / m, args.steps)
        if ckpt is None:
            raise RuntimeError(f"train {m}: no final checkpoint in {out / m}")
        checkpoints[m] = ckpt
    return checkpoints


def _print_summary(args, cfgs, clock: Clock, report: Path, models, splits) -> None:
    _print_table(models, splits)
    print(
        f"P@1 / P@{args.n}: unbiased Pass@k from {args.n} samples at T=1 on {args.eval_prompts} "
        f"prompts per set; greedy: temperature 0; styles: distinct solution styles per "
        f"prompt among the {args.n} samples. Training: {args.steps} steps x "
        f"{next(iter(cfgs.values())).train.prompts_per_step} prompts per method."
    )
    for name, secs in clock.stages.items():
        print(f"  {name}: {secs:.0f} s")
    print(f"total: {clock.total / 60:.1f} min")
    print(f"report: {report}")


def run(args: argparse.Namespace) -> int:
    try:
        methods, configs = _check_args(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"divrl demo: {exc}", file=sys.stderr)
        return 2
    if args.jobs is None:
        args.jobs = default_jobs(methods)
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out).resolve()
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(_say)
    try:
        if args.world_dir:
            world = open_world(args.world, world_dir=args.world_dir)
        else:
            world = clock.run(
                f"{args.world} world ({args.size})", open_world, args.world, size=args.size
            )
    except (ValueError, FileNotFoundError) as exc:
        print(f"divrl demo: {exc}", file=sys.stderr)
        return 2
    _say(f"toy world: {world.root}")
    cfgs = {m: _config(configs, m, args, out, world) for m in methods}
    max_new_tokens = next(iter(cfgs.values())).rollout.max_new_tokens
    methods = _presample(cfgs, methods, clock)
    splits = eval_splits(world)
    eval_cfg = _eval_config(args, max_new_tokens)
    beside, then = _evals_beside_training(methods, args, out, world, eval_cfg, splits)
    checkpoints = _train_all(methods, cfgs, args, configs, out, world, clock, beside, then)
    models = {"base": world.model_dir, **checkpoints}
    fresh = (["base"] if beside else []) + list(then)
    _evaluate_all(models, world, out, eval_cfg, splits, args, clock, fresh)

    from divrl.evaluation.report import build_report, load_model_eval

    base = load_model_eval(out / "base", "base")
    runs = [load_model_eval(out / m, METHODS[m]) for m in methods]
    report = clock.run(
        "report",
        build_report,
        runs,
        base,
        out / "report",
        title="divrl demo: GRPO vs DPH-JS vs Lp-Reg on the "
        + ("toy world" if args.world == DEFAULT_WORLD else f"{args.world} toy world"),
        command="divrl demo " + shlex.join(_argv(args)),
        spark_words=_spark_words(args),
        spark_split="test",
    )
    timings: dict[str, Any] = {"stages_seconds": clock.stages, "total_seconds": clock.total}
    atomic_write_text(out / "demo_timings.json", json.dumps(timings, indent=2) + "\n")
    _print_summary(args, cfgs, clock, report, [base, *runs], splits)
    return 0
