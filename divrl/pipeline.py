"""The stages ``divrl demo`` and ``experiments/reproduce.py`` share.

A toy experiment is: find (or build) a world by name, presample DPH-RL's reference store,
train each method from its toy preset (``configs/toy/<method>.yaml``, only paths, seed and
scale overridden), evaluate the base model and every final checkpoint on each eval split
of the world, summarise, report. This module holds those stages; the demo (in-process,
three methods, one seed) and the reproduction (``divrl`` subprocesses, many methods and
seeds, resumable) keep only their own choices.

It sits at the top layer (it uses ``divrl.toy``, ``divrl.training`` and
``divrl.evaluation``); only commands and experiments import it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from divrl.runs import RunDir

__all__ = [
    "CITED_SERIES",
    "Clock",
    "check_same_budget",
    "configs_dir",
    "divrl_command",
    "eval_cli_args",
    "eval_command",
    "evaluate_splits",
    "final_checkpoint",
    "open_world",
    "preset_overrides",
    "reference_samples",
    "reference_store_stats",
    "run_logged",
    "run_parallel",
    "split_summary",
    "start_logged",
    "training_curve",
]


# --------------------------------------------------------------------------- world


def open_world(
    name: str,
    *,
    size: str = "full",
    world_dir: str | Path | None = None,
    seed: int = 0,
    progress: bool = True,
):
    """The world ``name`` (``divrl.toy.WORLDS``): the built directory ``world_dir`` if
    given, else the cached (or freshly built) world of ``size`` and ``seed``."""
    from divrl.toy.worlds import get_world, load_world

    if world_dir is not None:
        return load_world(world_dir, name)
    return get_world(name, size=size, seed=seed, progress=progress)


def configs_dir(arg: str | Path | None = None, world: str | None = None) -> Path:
    """The toy presets: ``arg``, else world ``world``'s preset folder (``configs/toy`` for
    the default world, ``configs/toy/countdown`` for countdown: its traces need a longer
    response limit) of the working directory or of this checkout."""
    if arg:
        return Path(arg)
    from divrl.toy.worlds import DEFAULT_WORLD, world_presets

    sub = world_presets(world or DEFAULT_WORLD)
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        if (root / "configs" / sub).is_dir():
            return root / "configs" / sub
    raise FileNotFoundError(
        f"configs/{sub} not found: run from the divrl checkout or pass the presets' directory"
    )


# --------------------------------------------------------------------------- training


def preset_overrides(world, *, seed: int, run_dir: Path, store: Path) -> list[str]:
    """What every toy experiment changes in a preset: the world's paths, the seed, where
    the run and the DPH reference store go (no TensorBoard)."""
    return [
        f"model.path={world.model_dir}",
        f"data.train_path={world.splits['train']}",
        *([f"data.db_dir={world.db_dir}"] if world.db_dir is not None else []),
        f"train.seed={seed}",
        f"logging.output_dir={run_dir}",
        f"reference.store={store}",
        "logging.tensorboard=false",
    ]


def check_same_budget(cfgs: dict[str, Any]) -> None:
    """Refuse presets whose rollout budget (steps, prompts per step, samples) differs."""
    steps = {c.train.total_steps for c in cfgs.values()}
    budgets = {(c.train.prompts_per_step, c.rollout.n) for c in cfgs.values()}
    if len(steps) > 1 or len(budgets) > 1:
        raise ValueError(
            f"the presets differ in steps {steps} or (prompts per step, samples) {budgets}: "
            "the rollout budget would not be the same for every method"
        )


def final_checkpoint(run_dir: Path, steps: int) -> Path | None:
    """The model saved at the last step of a training run, or None when it is not there."""
    ckpt = RunDir(run_dir).checkpoint(steps)
    return ckpt.model_dir if ckpt.has_model() else None


def reference_store_stats(store: Path) -> dict[str, Any] | None:
    """The split statistics in a reference store's manifest (None: not presampled)."""
    from divrl.data.store_checks import read_manifest  # pyarrow: only when asked
    from divrl.data.store_files import MANIFEST

    manifest = Path(store) / MANIFEST
    if not manifest.is_file():
        return None
    return read_manifest(manifest).get("stats", {})  # a damaged one: an error naming it


def reference_samples(store: Path) -> int | None:
    """Samples in a presampled DPH-RL reference store (None: not presampled)."""
    stats = reference_store_stats(store)
    return None if stats is None else int(stats.get("reference_samples") or 0)


# --------------------------------------------------------------------------- subprocesses


def divrl_command(*args: str) -> list[str]:
    """A ``divrl`` CLI call in this interpreter."""
    return [sys.executable, "-m", "divrl.cli", *args]


def start_logged(cmd: Sequence[str], log: Path, *, threads: int = 1, cwd: Path | None = None):
    """Start ``cmd`` on ``threads`` torch threads, its output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("a") as f:
        f.write(f"\n$ {shlex.join(cmd)}\n")
        f.flush()
        return subprocess.Popen(list(cmd), stdout=f, stderr=subprocess.STDOUT, cwd=cwd, env=env)


def run_logged(
    cmd: Sequence[str],
    log: Path,
    *,
    threads: int = 1,
    cwd: Path | None = None,
    poll: float = 60.0,
    on_poll: Callable[[float], None] | None = None,
) -> tuple[int, float]:
    """Run ``cmd`` (see :func:`start_logged`) to the end; (exit code, wall-clock seconds).

    ``on_poll(seconds so far)`` is called every ``poll`` seconds while it runs.
    """
    t0 = time.perf_counter()
    proc = start_logged(cmd, log, threads=threads, cwd=cwd)
    while True:
        try:
            return proc.wait(timeout=poll), time.perf_counter() - t0
        except subprocess.TimeoutExpired:
            if on_poll is not None:
                on_poll(time.perf_counter() - t0)


def _count_lines(path: Path) -> int:
    try:
        with path.open() as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


def _flatten(tasks: list[tuple]) -> list[tuple]:
    """Every task of ``tasks`` and, after each, the follow-ups of its 5th element."""
    out = []
    for task in tasks:
        out.append(task)
        out.extend(_flatten(list(task[4]) if len(task) > 4 else []))
    return out


def run_parallel(tasks: list[tuple], jobs: int, logs: Path) -> None:
    """Run ``divrl`` subprocesses, at most ``jobs`` at a time, one progress bar each.

    ``tasks``: (name, divrl arguments, file whose line count is the progress, total[,
    follow-ups]). The follow-ups, tasks of the same shape, start when their task succeeds,
    ahead of the tasks still queued: a model's evaluation can then run while other models
    still train instead of waiting for the slowest training. Each subprocess runs on one
    torch thread; its output goes to ``logs/<name>.log``.
    """
    from tqdm.auto import tqdm

    pending = list(tasks)
    live = sys.stderr.isatty()  # in a log file, a line per bar per second is noise
    bars = {
        task[0]: tqdm(total=task[3], desc=task[0], position=i, dynamic_ncols=True, leave=True)
        for i, task in enumerate(_flatten(tasks))
    }
    running: dict[str, tuple[subprocess.Popen, tuple, Path]] = {}
    failed: list[str] = []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                task = pending.pop(0)
                name, argv = task[0], task[1]
                log = logs / f"{name.replace(' ', '_')}.log"
                log.unlink(missing_ok=True)
                proc = start_logged(divrl_command(*argv), log, threads=1)
                running[name] = (proc, task, log)
                bars[name].reset(total=bars[name].total)  # its clock starts now, not at launch
            # a quarter second: a follow-up waits at most that long for its core, and a
            # polled line count costs microseconds
            time.sleep(0.25)
            for name, (proc, task, log) in list(running.items()):
                done = min(_count_lines(task[2]), bars[name].total)
                if done != bars[name].n:  # a redraw at most every mininterval
                    bars[name].update(done - bars[name].n)
                elif live:  # the clock of a slow step ticks on a terminal only
                    bars[name].refresh()
                rc = proc.poll()
                if rc is not None:
                    del running[name]
                    # its last lines, then its clock stops at its end, not at the stage's
                    bars[name].update(min(_count_lines(task[2]), bars[name].total) - bars[name].n)
                    bars[name].close()
                    if rc != 0:
                        failed.append(f"{name} (exit {rc}, log {log})")
                    elif len(task) > 4:
                        pending[:0] = list(task[4])
    finally:
        for proc, _, _ in running.values():
            proc.terminate()
        for bar in bars.values():
            bar.close()
    if failed:
        raise RuntimeError("failed: " + "; ".join(failed))


# --------------------------------------------------------------------------- evaluation


def evaluate_splits(
    model_path: Path,
    world,
    eval_dir: Path,
    cfg,
    splits: Sequence[str],
    say: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """Evaluate one model in this process on each split into ``eval_dir/<split>``;
    a split whose ``summary.json`` exists is reused. ``cfg``: an ``EvalConfig``."""
    from divrl.evaluation.runner import SUMMARY_FILE, evaluate, load_model

    summaries: dict[str, dict[str, Any]] = {}
    model = tokenizer = None
    for split in splits:
        done = eval_dir / split / SUMMARY_FILE
        if done.is_file():
            summaries[split] = json.loads(done.read_text())
            say(f"  {split}: reusing {eval_dir / split}")
            continue
        if model is None:
            model, tokenizer = load_model(model_path)
        say(f"  {split}")
        summaries[split] = evaluate(
            model_path,
            world.splits[split],
            eval_dir / split,
            cfg,
            db_dir=world.db_dir,
            model=model,
            tokenizer=tokenizer,
        )
    return summaries


def eval_command(model: Path, world, splits: Sequence[str], out: Path, cfg) -> list[str]:
    """``divrl eval`` arguments that compute what :func:`evaluate_splits` computes in this
    process (``model`` on each split into ``out/<split>``, ``cfg`` an ``EvalConfig``), for a
    subprocess that can run beside others."""
    argv = ["eval", "--model", str(model), "--out", str(out)]
    for split in splits:
        argv += ["--data", f"{split}={world.splits[split]}"]
    argv += [
        "--n", str(cfg.n),
        "--temperature", repr(cfg.temperature),
        "--top-p", repr(cfg.top_p),
        "--top-k", str(cfg.top_k),
        "--max-new-tokens", str(cfg.max_new_tokens),
        "--batch-size", str(cfg.batch_size),
        "--template", cfg.template,
        "--seed", str(cfg.seed),
        "--n-boot", str(cfg.n_boot),
        "--engine", cfg.engine,
        "--no-progress",
    ]  # fmt: skip
    if cfg.limit is not None:
        argv += ["--limit", str(cfg.limit)]
    for key in cfg.group_by:
        argv += ["--group-by", key]
    for stop in cfg.stop:
        argv += ["--stop", stop]
    if not cfg.greedy:
        argv.append("--no-greedy")
    if world.db_dir is not None:
        argv += ["--db-dir", str(world.db_dir)]
    for key, value in cfg.engine_options.items():  # values read back as YAML: JSON is YAML
        argv += ["--engine-option", f"{key}={json.dumps(value)}"]
    return argv


def eval_cli_args(
    world, split: str, out: Path, *, n: int, max_new_tokens: int, batch_size: int, seed: int
) -> list[str]:
    """``divrl eval`` arguments for one split of the world (model or ``--reuse`` to add)."""
    return [
        "eval",
        "--data", f"{split}={world.splits[split]}",
        "--out", str(out),
        "--n", str(n),
        "--max-new-tokens", str(max_new_tokens),
        "--batch-size", str(batch_size),
        "--seed", str(seed),
        "--group-by", "hard",
        "--no-progress",
    ]  # fmt: skip


# --------------------------------------------------------------------------- summaries


def split_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The numbers a per-run summary keeps of one split's ``divrl eval`` summary."""
    div = summary["diversity"]
    return {
        "n_prompts": summary["n_prompts"],
        "n_samples": summary["n_samples_per_prompt"],
        "greedy": summary.get("greedy_accuracy"),
        "pass@k": summary["pass@k"],
        "maj@k": summary["maj@k"],
        "share_one_style": div["share_one_style"],
        "share_3plus_styles": div["share_3plus_styles"],
        "mean_distinct_styles": div["mean_distinct_styles"],
        "style_counts": div["style_counts"],
        "mean_nll_per_token": summary["tokens"]["mean_nll_per_token"],
        "groups": {
            g: {"n_prompts": v["n_prompts"], "pass@k": v["pass@k"]}
            for g, v in summary.get("groups", {}).items()
        },
        "retention": None,
    }


#: per-step series a results reading cites, kept in a run's training curve (None where a
#: run does not log them): DPH-RL's eta (the rehearsal controller's), its weight against
#: the rollout stream and whether it sat at a bound, the reference responses' mean log
#: likelihood ratio (minus the loss of likelihood), Lp-Reg's mean proxy mass Z
CITED_SERIES = {
    "eta": "dph/eta",
    "effective_eta": "dph/effective_eta",
    "eta_at_bound": "dph/eta_at_bound",
    "log_u_mean": "dph/log_u_mean",
    "lp_reg_mean_z": "lp_reg/mean_z",
}


def training_curve(metrics: Path, points: int = 200) -> dict[str, list]:
    """The training curves of a run's ``metrics.jsonl``, downsampled evenly to at most
    ``points`` steps (the last step always kept)."""
    rows = [json.loads(x) for x in Path(metrics).read_text().splitlines() if x.strip()]
    if len(rows) > points:
        idx = sorted({round(i * (len(rows) - 1) / (points - 1)) for i in range(points)})
        rows = [rows[i] for i in idx]
    return {
        "step": [r["step"] for r in rows],
        "entropy": [r.get("actor/entropy") for r in rows],
        "pass1": [r.get("reward/pass@1") for r in rows],
        "seconds_per_step": [r.get("time/step") for r in rows],
        # Lp-Reg only (None elsewhere): how many tokens it selected and regularised
        "lp_reg_selected": [r.get("lp_reg/num_selected") for r in rows],
        "lp_reg_regularized": [r.get("lp_reg/num_regularized") for r in rows],
        **{name: [r.get(key) for r in rows] for name, key in CITED_SERIES.items()},
    }


class Clock:
    """Wall-clock seconds per stage."""

    def __init__(self, say: Callable[[str], None] = print) -> None:
        self.start = time.perf_counter()
        self.stages: dict[str, float] = {}
        self.say = say

    def run(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, timed and announced as stage ``name``."""
        t0 = time.perf_counter()
        self.say(f"{name} ...")
        out = fn(*args, **kwargs)
        self.stages[name] = time.perf_counter() - t0
        self.say(f"{name}: {self.stages[name]:.0f} s")
        return out

    @property
    def total(self) -> float:
        return time.perf_counter() - self.start


def authors_weight_summary(config: Any) -> dict[str, Any]:
    """What a run summary records of the ``authors`` weighting (empty for a run without
    it): the GPU count it assumes, the batch's effective eta and the authors' per-step
    weights (:func:`divrl.algorithms.authors_step_etas`)."""
    from divrl.algorithms import authors_effective_eta, authors_step_etas
    from divrl.training.authors_config import authors_layout

    algo = config.algorithm
    if not config.uses_reference_samples or algo.divergence_weighting != "authors":
        return {}
    layout = authors_layout(config)
    return {
        "authors_gpus": algo.authors_gpus,
        "authors_effective_eta": authors_effective_eta(algo.divergence_coef, layout),
        "authors_step_etas": authors_step_etas(algo.divergence_coef, layout),
        "batch_assembly": config.train.batch_assembly,
    }


def short_batches(metrics: Path) -> int:
    """Steps of ``metrics.jsonl`` whose dynamic sampling ran out of rounds before the batch
    was full (``dapo/short_batch``)."""
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    return sum(1 for r in rows if r.get("dapo/short_batch", 0) > 0)
