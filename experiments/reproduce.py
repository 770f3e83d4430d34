"""Toy-scale reproduction of the DPH-RL and Lp-Reg papers' claims, side by side.

For every method (base, GRPO, DAPO, GRPO + reverse KL, DPH-F, DPH-JS, DPH-alpha, Lp-Reg,
entropy bonus, 80/20, KL-Cov, DPH-JS + Lp-Reg) and every seed, on a toy world chosen by name
(``--world``, default ``sql``; the stages are :mod:`divrl.pipeline`'s, shared with
``divrl demo``):

1. presample the DPH-RL reference store once per seed (``divrl presample``; shared by the
   DPH methods of that seed);
2. train with the method's toy preset ``configs/<world's presets>/<method>.yaml``
   (``configs/toy/`` for sql, ``configs/toy/countdown/`` for countdown), overriding only the
   seed, the output directory, the pinned toy world paths and (``--steps``) the number of
   steps, so every method gets the same rollout budget (``divrl train``);
3. evaluate the final checkpoint, and the base model, on every eval split of the world (for
   ``sql``: the in-domain test, cross-domain and out-of-domain math splits): ``--n`` samples at T = 1 plus one greedy response per
   prompt (``divrl eval``);
4. write a small per-run summary JSON (accuracy, Pass@k, styles, retention of base-solved
   prompts, the entropy curve from ``metrics.jsonl``, wall-clock) and rebuild the
   aggregated report (mean and spread over seeds, claims table).

Every stage is a ``divrl`` CLI subprocess with its log next to its outputs, so a run is
resumable: a finished run (its ``summary.json`` exists) is skipped, an interrupted training
continues with ``divrl train --resume`` from its last checkpoint, an interrupted eval is
re-scored with ``divrl eval --reuse`` when its samples were written and redone otherwise.

Usage (from the repository root)::

    .venv/bin/python -m experiments.reproduce                       # the full experiment
    .venv/bin/python -m experiments.reproduce --methods grpo dph_js --seeds 1 --steps 3 \\
        --toy-size tiny --n 4 --eval-prompts 8 --out runs/reproduce_smoke   # a smoke test
    .venv/bin/python -m experiments.reproduce --report-only           # rebuild the report
    .venv/bin/python -m experiments.reproduce --check --results DIR   # same digits again?

The work directory (``--out``, default ``runs/reproduce``) holds checkpoints and samples;
the per-run summaries (``--results``/summaries/*.json), the plots and the report (``--report``)
are small and meant to be committed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from divrl.pipeline import (
    authors_weight_summary,
    check_same_budget,
    divrl_command,
    eval_cli_args,
    final_checkpoint,
    open_world,
    preset_overrides,
    reference_samples,
    reference_store_stats,
    run_logged,
    short_batches,
    split_summary,
    training_curve,
)
from divrl.runs import RunDir
from divrl.toy.worlds import DEFAULT_WORLD, WORLDS, eval_splits, world_presets
from experiments import reproduce_compare as rc
from experiments import reproduce_report as rr
from experiments.records import ResultError
from experiments.reproduce_check import add_check_arguments, fingerprint, run_check
from experiments.reproduce_publish import (
    SUMMARIES,
    add_time,
    command_line,
    read_json,
    say,
    write_json,
    write_report,
)

REPO = Path(__file__).resolve().parents[1]
TRAINED = [m for m in rr.METHODS if m != "base"]
#: training curve points kept in a summary (metrics.jsonl is downsampled evenly)
CURVE_POINTS = 200


# --------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m experiments.reproduce",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--methods",
        nargs="+",
        default=None,
        choices=TRAINED,
        metavar="METHOD",
        help=f"methods to train ({', '.join(TRAINED)}; default: every one with a preset for "
        "the world); the base model is always evaluated (retention and the claims compare "
        "with it)",
    )
    p.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1 per method")
    p.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="start the seeds here: K .. K+N-1 (to add seeds to an experiment in parts)",
    )
    p.add_argument(
        "--steps", type=int, default=None, help="override train.total_steps (preset: 300)"
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="override checkpoint.save_every: how far an interrupted training falls back "
        "(preset: 50)",
    )
    p.add_argument("--out", default="runs/reproduce", help="work directory (checkpoints etc.)")
    p.add_argument(
        "--results",
        default="docs/results/toy_reproduction",
        help="directory for the committed per-run summaries (summaries/*.json) and plots",
    )
    p.add_argument(
        "--report", default="docs/results/toy_reproduction.md", help="the Markdown report"
    )
    p.add_argument(
        "--report-only", action="store_true", help="rebuild the report from --results only"
    )
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (one thread each)")
    p.add_argument(
        "--toy-size",
        default="full",
        help="toy world size of divrl.toy.SIZES (full; small; tiny: a seconds-long miniature "
        "for testing this script, whose model solves nothing, so the DPH methods get an "
        "empty reference store and are refused)",
    )
    p.add_argument(
        "--world",
        default=DEFAULT_WORLD,
        choices=list(WORLDS),
        help="the toy world (divrl.toy.WORLDS)",
    )
    p.add_argument("--world-dir", help="an already built world directory (wins over --toy-size)")
    p.add_argument("--n", type=int, default=16, help="eval samples per prompt at T = 1")
    p.add_argument("--eval-prompts", type=int, default=None, help="first N prompts per split (all)")
    p.add_argument("--eval-batch-size", type=int, default=32, help="prompts per generate call")
    p.add_argument("--threads", type=int, default=1, help="torch threads per subprocess")
    p.add_argument("--poll", type=float, default=60.0, help="seconds between progress lines")
    add_check_arguments(p)
    rc.add_compare_arguments(p)
    return _checked_args(p, p.parse_args(argv))


def _checked_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Refuse out-of-range numbers (argparse's one-line error) and fill the derived fields."""
    if args.seeds < 1 or args.jobs < 1 or args.n < 1 or args.threads < 1:
        p.error("--seeds, --jobs, --n and --threads must be >= 1")
    if args.first_seed < 0:
        p.error("--first-seed must be >= 0")
    args.seed_list = list(range(args.first_seed, args.first_seed + args.seeds))
    if args.steps is not None and args.steps < 1:
        p.error("--steps must be >= 1")
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        p.error("--checkpoint-every must be >= 1")
    if args.eval_prompts is not None and args.eval_prompts < 1:
        p.error("--eval-prompts must be >= 1")
    if args.methods is None:  # a world may lack a preset (countdown: no lp_reg_toy twin)
        presets = REPO / "configs" / world_presets(args.world)
        args.methods = [m for m in TRAINED if (presets / f"{m}.yaml").is_file()]
    args.methods = [m for m in TRAINED if m in set(args.methods)]  # report order, no repeats
    return args


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Paths:
    """Where a (method, seed) run keeps its files under the work directory."""

    out: Path
    method: str
    seed: int

    @property
    def root(self) -> Path:
        return self.out / "runs" / self.method / f"seed{self.seed}"

    @property
    def train(self) -> Path:
        return self.root / "train"

    @property
    def eval(self) -> Path:
        return self.root / "eval"

    @property
    def timing(self) -> Path:
        return self.root / "timing.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"


def store_dir(out: Path, seed: int) -> Path:
    return out / "presample" / f"seed{seed}" / "store"


# --------------------------------------------------------------------------- the experiment


class Experiment:
    """Runs the stages of every (method, seed) and writes the summaries and the report."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.results = Path(args.results).resolve()
        self.report = Path(args.report).resolve()
        self.configs = REPO / "configs" / world_presets(args.world)
        self.world = None
        self.cfgs: dict[str, Any] = {}

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        if self.args.world_dir:
            self.world = open_world(self.args.world, world_dir=self.args.world_dir)
        else:
            say(f"{self.args.world} world ({self.args.toy_size}): loading or building ...")
            self.world = open_world(self.args.world, size=self.args.toy_size)
        say(f"toy world: {self.world.root}")
        self.splits = eval_splits(self.world)
        from divrl.training.config import load_config

        for m in self.args.methods:
            self.cfgs[m] = load_config(self.configs / f"{m}.yaml", self.overrides(m, 0))
        try:
            check_same_budget(self.cfgs)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        rc.refuse_unlike_presets(self.cfgs, allow=self.args.allow_mismatch)
        steps = {c.train.total_steps for c in self.cfgs.values()}
        self.steps = steps.pop() if steps else self.args.steps
        self.max_new_tokens = next(iter(self.cfgs.values())).rollout.max_new_tokens
        self.settings = {
            **({"world_name": self.args.world} if self.args.world != DEFAULT_WORLD else {}),
            "world": self.world.root.name,
            "toy_size": self.world.size,
            "steps": self.steps,
            "n": self.args.n,
            "eval_prompts": self.args.eval_prompts,
            "max_new_tokens": self.max_new_tokens,
        }
        self._check_settings()

    def _check_settings(self) -> None:
        """Refuse to mix runs or summaries made with other settings."""
        recorded = read_json(self.out / "settings.json")
        if recorded is not None and recorded != self.settings:
            raise SystemExit(
                f"{self.out} holds runs made with other settings:\n  {recorded}\nnow:\n  "
                f"{self.settings}\nuse another --out (or delete it) to avoid mixing them"
            )
        write_json(self.out / "settings.json", self.settings)
        other = [
            p.name
            for p in sorted((self.results / SUMMARIES).glob("*.json"))
            if (read_json(p) or {}).get("settings") != self.settings
        ]
        if other:
            raise SystemExit(
                f"{self.results / SUMMARIES} holds summaries made with other settings "
                f"({', '.join(other)}): use another --results/--report to keep one report "
                "to one set of settings"
            )

    def overrides(self, method: str, seed: int) -> list[str]:
        paths = Paths(self.out, method, seed)
        o = [
            *preset_overrides(
                self.world, seed=seed, run_dir=paths.train, store=store_dir(self.out, seed)
            ),
            "logging.progress=false",  # progress comes from metrics.jsonl (a log file is no tty)
        ]
        if self.args.steps is not None:
            o.append(f"train.total_steps={self.args.steps}")
        if self.args.checkpoint_every is not None:
            o.append(f"checkpoint.save_every={self.args.checkpoint_every}")
        return o

    # ------------------------------------------------------------------ subprocesses

    def _run(
        self,
        cmd: list[str],
        log: Path,
        what: str,
        timing: tuple[Path, str, str | None],
        metrics: Path | None = None,
    ) -> float:
        """Run a divrl CLI subprocess into ``log``; progress lines from ``metrics``.

        Its wall-clock seconds are added to ``timing`` = (file, key, sub-key) whether it
        succeeds or fails, so a run's cost includes its interrupted attempts.
        """
        rc, seconds = run_logged(
            cmd,
            log,
            threads=self.args.threads,
            cwd=REPO,
            poll=self.args.poll,
            on_poll=lambda t: say(f"{what}: {self._progress(metrics)} ({t:.0f} s)"),
        )
        add_time(timing[0], timing[1], seconds, sub=timing[2])
        if rc != 0:
            tail = "\n".join(log.read_text().splitlines()[-15:])
            raise RuntimeError(f"{what} failed (exit {rc}); end of {log}:\n{tail}")
        return seconds

    def _progress(self, metrics: Path | None) -> str:
        if metrics is None or not metrics.is_file():
            return "running"
        lines = metrics.read_text().splitlines()
        if not lines:
            return "running"
        m = json.loads(lines[-1])
        return (
            f"step {m['step']}/{self.steps}, pass@1 {m.get('reward/pass@1', float('nan')):.3f}, "
            f"entropy {m.get('actor/entropy', float('nan')):.3f}, "
            f"{m.get('time/step', float('nan')):.1f} s/step"
        )

    # ------------------------------------------------------------------ stages

    def presample(self, seed: int) -> None:
        store = store_dir(self.out, seed)
        if reference_store_stats(store) is not None:
            say(f"presample seed {seed}: done, reusing {store}")
            return
        shutil.rmtree(store, ignore_errors=True)  # an interrupted attempt
        dph = next(m for m in self.args.methods if self.cfgs[m].uses_reference_samples)
        say(f"presample seed {seed}: sampling the reference store ({dph}'s preset) ...")
        secs = self._run(
            divrl_command(
                "presample", str(self.configs / f"{dph}.yaml"), *self.overrides(dph, seed)
            ),
            store.parent / "presample.log",
            f"presample seed {seed}",
            (store.parent / "timing.json", "presample_seconds", None),
        )
        stats = reference_store_stats(store) or {}
        say(
            f"presample seed {seed}: {secs:.0f} s, {stats.get('near_perfect')} of "
            f"{stats.get('prompts')} prompts near-perfect, {stats.get('reference_samples')} "
            "reference samples"
        )

    def check_store(self, seed: int, failed: bool) -> None:
        """Refuse a DPH run whose seed has no usable reference store (with the reason)."""
        samples = reference_samples(store_dir(self.out, seed))
        if failed or samples is None:
            raise RuntimeError(f"presampling seed {seed} failed: no reference store")
        if not samples:
            raise RuntimeError(
                f"the reference store of seed {seed} is empty: the base model solves no "
                "training prompt reliably enough for DPH-RL (a base model this weak cannot "
                "run the DPH methods)"
            )

    def final_checkpoint(self, paths: Paths) -> Path | None:
        return final_checkpoint(paths.train, self.steps)

    def train(self, paths: Paths) -> Path:
        what = f"train {paths.method} seed {paths.seed}"
        ckpt = self.final_checkpoint(paths)
        if ckpt is not None:
            say(f"{what}: done, reusing {ckpt}")
            return ckpt
        resume = RunDir(paths.train).latest() is not None
        if not resume and paths.train.exists():  # started, no checkpoint yet: start over
            shutil.rmtree(paths.train)
        say(f"{what}: {'resuming' if resume else 'starting'} ({self.steps} steps)")
        cmd = divrl_command(
            "train",
            str(self.configs / f"{paths.method}.yaml"),
            *self.overrides(paths.method, paths.seed),
        )
        secs = self._run(
            [*cmd, "--resume"] if resume else cmd,
            paths.root / "train.log",
            what,
            (paths.timing, "train_seconds", None),
            RunDir(paths.train).metrics_path,
        )
        ckpt = self.final_checkpoint(paths)
        if ckpt is None:
            raise RuntimeError(f"{what}: finished without a final checkpoint in {paths.train}")
        say(f"{what}: {secs:.0f} s (start-up and checkpoints included)")
        return ckpt

    def evaluate(self, paths: Paths, model: Path) -> None:
        from divrl.evaluation.runner import SAMPLES_FILE, SUMMARY_FILE

        for split in self.splits:
            what = f"eval {paths.method} seed {paths.seed} {split}"
            d = paths.eval / split
            if (d / SUMMARY_FILE).is_file():
                say(f"{what}: done, reusing")
                continue
            reuse = (d / SAMPLES_FILE).is_file()
            args = eval_cli_args(
                self.world,
                split,
                paths.eval,
                n=self.args.n,
                max_new_tokens=self.max_new_tokens,
                batch_size=self.args.eval_batch_size,
                seed=paths.seed,
            )
            if self.args.eval_prompts is not None:
                args += ["--limit", str(self.args.eval_prompts)]
            args += ["--reuse"] if reuse else ["--model", str(model)]
            say(f"{what}: {'re-scoring the samples (--reuse)' if reuse else 'sampling'} ...")
            self._run(
                divrl_command(*args),
                paths.root / "eval.log",
                what,
                (paths.timing, "eval_seconds", split),
            )

    def run_unit(self, method: str, seed: int) -> Path:
        """One (method, seed): train (not the base), evaluate, summarise. Returns the summary."""
        paths = Paths(self.out, method, seed)
        if paths.summary.is_file():
            say(f"{method} seed {seed}: finished earlier, skipped")
            self._publish(paths)
            return paths.summary
        model = self.world.model_dir if method == "base" else self.train(paths)
        self.evaluate(paths, model)
        summary = self.summarise(paths)
        write_json(paths.summary, summary)
        self._publish(paths)
        say(f"{method} seed {seed}: finished")
        return paths.summary

    def _publish(self, paths: Paths) -> None:
        dest = self.results / SUMMARIES / f"{paths.method}_seed{paths.seed}.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(paths.summary, dest)

    # ------------------------------------------------------------------ summaries

    def summarise(self, paths: Paths) -> dict[str, Any]:
        from divrl.evaluation.diversity import retention
        from divrl.evaluation.report_provenance import experiment_provenance
        from divrl.evaluation.runner import RESULTS_FILE, SUMMARY_FILE, read_jsonl

        base = Paths(self.out, "base", paths.seed)
        evals = {}
        for split in self.splits:
            ev = split_summary(read_json(paths.eval / split / SUMMARY_FILE))
            base_results = base.eval / split / RESULTS_FILE
            if paths.method != "base" and base_results.is_file():
                ev["retention"] = retention(
                    read_jsonl(base_results), read_jsonl(paths.eval / split / RESULTS_FILE)
                )
            evals[split] = ev
        timing = read_json(paths.timing, {})
        eval_secs = timing.get("eval_seconds", {})
        summary: dict[str, Any] = {
            "schema": rr.SCHEMA,
            "method": paths.method,
            "label": rr.METHODS[paths.method],
            "seed": paths.seed,
            "command": command_line(),
            "settings": self.settings,
            "eval": evals,
            "provenance": experiment_provenance(
                None if paths.method == "base" else paths.train, paths.eval, self.splits
            ),
            "wall_clock": {
                "train_seconds": timing.get("train_seconds"),
                "train_attempts": timing.get("train_attempts"),
                "eval_seconds": sum(eval_secs.values()) if eval_secs else None,
                "eval_seconds_per_split": eval_secs,
            },
        }
        if paths.method != "base":
            cfg = self.cfgs[paths.method]
            summary["config"] = {
                "preset": f"configs/{world_presets(self.args.world)}/{paths.method}.yaml",
                "overrides": self.overrides(paths.method, paths.seed),
                "prompts_per_step": cfg.train.prompts_per_step,
                "rollout_n": cfg.rollout.n,
                "data": rc.data_handling(cfg),  # compared before runs share a table
                **authors_weight_summary(cfg),
            }
            metrics_path = RunDir(paths.train).metrics_path
            summary["training"] = training_curve(metrics_path, CURVE_POINTS)
            summary["fingerprint"] = fingerprint(metrics_path)  # --check reruns these steps
            # from every logged step (the curve is downsampled); excludes start-up
            step_times = [
                json.loads(x).get("time/step")
                for x in metrics_path.read_text().splitlines()
                if x.strip()
            ]
            step_times = [t for t in step_times if t is not None]
            if cfg.algorithm.dynamic_sampling:  # steps trained on fewer groups than asked
                summary["dynamic_sampling"] = {"short_batches": short_batches(metrics_path)}
            summary["wall_clock"]["mean_step_seconds"] = (
                sum(step_times) / len(step_times) if step_times else None
            )
        return summary

    # ------------------------------------------------------------------ driver

    def run(self) -> int:
        self.setup()
        seeds = self.args.seed_list
        needs_store = [m for m in self.args.methods if self.cfgs[m].uses_reference_samples]
        first = [("presample", s) for s in seeds if needs_store] + [("base", s) for s in seeds]
        second = [(m, s) for s in seeds for m in self.args.methods]
        failures: list[str] = []
        failed_stores: set[int] = set()
        done = 0

        def task(kind: str, seed: int) -> None:
            if kind == "presample":
                self.presample(seed)
            else:
                if kind in needs_store:
                    self.check_store(seed, failed=seed in failed_stores)
                self.run_unit(kind, seed)

        total = len(first) + len(second)
        with ThreadPoolExecutor(max_workers=self.args.jobs) as pool:
            for batch in (first, second):  # presamples and base evals first: the rest need them
                futures = {pool.submit(task, k, s): (k, s) for k, s in batch}
                for fut in as_completed(futures):
                    kind, seed = futures[fut]
                    done += 1
                    try:
                        fut.result()
                    except Exception as exc:
                        failures.append(f"{kind} seed {seed}: {exc}")
                        if kind == "presample":
                            failed_stores.add(seed)
                        say(f"FAILED {kind} seed {seed}: {exc}")
                    say(f"progress: {done}/{total} tasks")
        self.write_report()
        if failures:
            say(f"{len(failures)} task(s) failed (rerun to retry; finished runs are skipped):")
            for f in failures:
                say(f"  {f}")
            return 1
        return 0

    def write_report(self) -> Path:
        missing = [
            f"{m} seed {s}"
            for s in self.args.seed_list
            for m in ["base", *self.args.methods]
            if not Paths(self.out, m, s).summary.is_file()
        ]
        return write_report(self.results, self.report, self.out, missing, self.args.allow_mismatch)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.report_only:
            results, report = Path(args.results).resolve(), Path(args.report).resolve()
            write_report(results, report, None, allow_mismatch=args.allow_mismatch)
            return 0
        import torch

        torch.set_num_threads(args.threads)
        if args.check:
            return run_check(args, lambda argv: Experiment(parse_args(argv)), say)
        return Experiment(args).run()
    except (ValueError, FileNotFoundError, ResultError) as exc:  # a bad --toy-size, a torn file
        print(f"experiments.reproduce: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
