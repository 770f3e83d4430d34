"""``divrl eval --model PATH --data SPLIT.jsonl --out DIR``: Pass@k, maj@k, diversity.

For each eval set: ``n`` samples per prompt plus one greedy response, scored; writes
``DIR/<set>/samples.jsonl`` (the generations), ``results.jsonl`` (per prompt: scores,
extracted answers, styles, answer clusters), ``summary.json``, and ``DIR/summary.json``
with every set. ``--reuse`` re-scores and re-summarises the samples already in ``DIR``
without loading the model. See docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from divrl.cli import (
    finite_float,
    non_negative_int,
    positive_float,
    positive_int,
    seed_int,
)
from divrl.fileio import atomic_write_text

DEFAULT_MAX_NEW_TOKENS = 256
# prompt tokens left free when capping --max-new-tokens by the context (the toy presets'
# data.max_prompt_length)
PROMPT_ROOM = 48
# eval-set names become folder names under --out (and appear in reports): no separators,
# no "..", nothing that HTML or a shell would read specially
SET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from divrl.rollout import engine_summaries

    _add_config_arguments(parser)
    parser.add_argument(
        "--model",
        help="model directory, checkpoint (step_N/) or training run directory (newest "
        "checkpoint), or a verl checkpoint folder (its newest step, a global_step_N folder "
        "or its actor/); 'toy' = the toy base model (not needed with --reuse)",
    )
    parser.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="eval set (JSONL/Parquet, verl schema); repeat for several; NAME defaults to the "
        "file stem; 'toy' = the eval splits of the toy SQL world (every split but train)",
    )
    parser.add_argument("--out", help="output directory (required without --config)")
    parser.add_argument(
        "--reuse", action="store_true", help="re-score existing samples in --out, no sampling"
    )
    parser.add_argument("--n", type=positive_int, default=16, help="samples per prompt")
    parser.add_argument(
        "--temperature", type=positive_float, default=1.0, help="sampling temperature"
    )
    parser.add_argument(
        "--top-p", type=finite_float, default=1.0, help="nucleus threshold (1 = off)"
    )
    parser.add_argument("--top-k", type=non_negative_int, default=0, help="top-k (0 = off)")
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=None,
        help=f"response length limit in tokens (default: {DEFAULT_MAX_NEW_TOKENS}, at most the "
        f"model's context minus {PROMPT_ROOM} tokens of prompt: 80 for the toy model, whose "
        "context is 128)",
    )
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--no-greedy", action="store_true", help="skip the greedy response")
    parser.add_argument(
        "--batch-size", type=positive_int, default=16, help="prompts per generate call"
    )
    parser.add_argument(
        "--engine",
        default="auto",
        help=f"rollout engine, a registered name: {engine_summaries()}",
    )
    parser.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the engine (repeatable; YAML values), e.g. "
        "gpu_memory_utilization=0.8 for vllm; an option the engine does not take is an error",
    )
    parser.add_argument(
        "--template", help="prompt template (divrl.data); default data.template or plain"
    )
    parser.add_argument("--db-dir", help="SQLite databases of SQL eval sets")
    parser.add_argument(
        "--limit", type=positive_int, help="evaluate only the first N prompts per set"
    )
    parser.add_argument("--seed", type=seed_int, default=0, help="seed of sampling and bootstrap")
    parser.add_argument("--n-boot", type=positive_int, default=1000, help="bootstrap replicates")
    parser.add_argument(
        "--group-by",
        action="append",
        default=[],
        metavar="KEY",
        help="also summarise per value of this extra_info key (repeatable, e.g. hard)",
    )
    parser.add_argument(
        "--toy-size",
        default="full",
        help="size of the toy world for 'toy' (default full; the world declares its sizes and "
        "an unknown one is refused naming them)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config CONFIG [KEY=VALUE ...]`` and ``--base-model`` (:func:`apply_config`)."""
    parser.add_argument(
        "--config",
        help="a divrl train config (YAML): evaluate its run (the newest checkpoint under its "
        "logging.output_dir) with its data.template and data.db_dir on its data.eval_paths "
        "(or --data), writing to <logging.output_dir>/eval unless --out; an option given "
        "here wins over the config",
    )
    parser.add_argument(
        "--base-model",
        action="store_true",
        help="with --config: evaluate the config's model.path (the model before training) "
        "instead of its run, writing to <logging.output_dir>/eval unless --out",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="with --config: dotted overrides of the config, as for divrl train",
    )


def _data_sets(specs: list[str], toy_size: str) -> list[tuple[str, str]]:
    sets: list[tuple[str, str]] = []
    for spec in specs:
        if spec == "toy":
            from divrl.toy import ensure_toy_world
            from divrl.toy.worlds import eval_splits

            world = ensure_toy_world(size=toy_size)
            sets += [(s, str(world.splits[s])) for s in eval_splits(world)]
            continue
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = Path(spec).stem, spec
        sets.append((check_set_name(name), path))
    names = [n for n, _ in sets]
    if len(set(names)) != len(names):
        raise ValueError(f"eval set names must differ, got {names}; use NAME=PATH")
    return sets


def check_set_name(name: str) -> str:
    """``name`` when it is a safe eval-set name (see :data:`SET_NAME`), else ValueError."""
    if not SET_NAME.match(name) or ".." in name:
        raise ValueError(
            f"eval set name {name!r} is not allowed: use letters, digits and _ . + - (not "
            "starting with one of them, no '..'), e.g. --data my_set=PATH"
        )
    return name


def default_max_new_tokens(model) -> int:
    """:data:`DEFAULT_MAX_NEW_TOKENS`, capped by the model's context (minus prompt room).

    ``model``: a model (its ``config.max_position_embeddings``) or the context length."""
    context = (
        model
        if isinstance(model, int)
        else getattr(getattr(model, "config", None), "max_position_embeddings", None)
    )
    if not isinstance(context, int):
        return DEFAULT_MAX_NEW_TOKENS
    return max(1, min(DEFAULT_MAX_NEW_TOKENS, context - PROMPT_ROOM))


# The diversity columns of ``divrl eval``'s table: (header, summary key, explanation).
DIVERSITY_COLUMNS = (
    (
        "styles",
        "mean_distinct_styles",
        "distinct solution styles per prompt (the profile's "
        "style classifier; '-' where the data source has none)",
    ),
    (
        "traces",
        "mean_trace_clusters",
        "clusters of similar reasoning traces per prompt "
        "(word-bigram Jaccard, numbers masked): the styles of a source without a classifier",
    ),
    (
        "answers",
        "mean_answer_clusters",
        "distinct final answers per prompt (the clusters maj@k votes with)",
    ),
    (
        "dist-2",
        "distinct_2",
        "distinct word bigrams / all bigrams of a prompt's samples (higher = less repetition)",
    ),
    (
        "self-BLEU",
        "self_bleu",
        "BLEU-4 of each sample against the prompt's other samples "
        "(1 = identical samples; lower = more diverse)",
    ),
)


def print_summary_table(summaries: dict[str, dict], title: str = "evaluation") -> None:
    """A compact table: greedy accuracy, Pass@k (P@1 = mean sampled accuracy), maj@n and the
    unscorable samples (no verdict; Pass@k counts them as not correct) and the diversity
    of the samples per set (:data:`DIVERSITY_COLUMNS`, explained under it).

    On a terminal it fits the terminal; otherwise (a log file, a pipe) it is printed at its
    natural width, never cut.
    """
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=10_000)

    table = Table(title=title)
    first = next(iter(summaries.values()))
    ks = first["ks"]
    diversity = [header for header, _, _ in DIVERSITY_COLUMNS]
    columns = ["set", "prompts", "greedy", *[f"P@{k}" for k in ks], f"maj@{ks[-1]}", "unscorable"]
    for col in [*columns, *diversity]:
        table.add_column(col, justify="right" if col != "set" else "left")
    for name, s in summaries.items():
        greedy = s.get("greedy_accuracy")
        measures = s.get("diversity", {})
        table.add_row(
            name,
            str(s["n_prompts"]),
            "-" if greedy is None else f"{greedy:.3f}",
            *[f"{s['pass@k'].get(str(k), float('nan')):.3f}" for k in ks],
            f"{s['maj@k'][str(s['ks'][-1])]:.3f}",
            str(s.get("unscorable", "-")),  # summaries of older versions lack it
            *[_measure(measures.get(key)) for _, key, _ in DIVERSITY_COLUMNS],
        )
    console.print(table)
    console.print(
        "  unscorable: samples without a verdict (verifier timeout or crash), counted as not "
        "correct in P@k",
        highlight=False,
    )
    for header, _, meaning in DIVERSITY_COLUMNS:
        console.print(f"  {header}: {meaning}", highlight=False)


def _measure(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def engine_option_mapping(specs: list[str]) -> dict:
    """``["KEY=VALUE", ...]`` (``--engine-option``) as a mapping; values read as YAML."""
    import yaml

    options = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--engine-option {spec!r} must look like KEY=VALUE")
        try:
            options[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError as exc:
            reason = " ".join(str(getattr(exc, "problem", None) or exc).split())
            raise ValueError(
                f"--engine-option {spec!r}: the value is not YAML ({reason}); quote it, e.g. "
                f"{key.strip()}='\"{value}\"', or write the value the option takes"
            ) from exc
    return options


def _eval_config(args: argparse.Namespace, context: int | None):
    from divrl.evaluation.runner import EvalConfig

    max_new_tokens = args.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = (
            DEFAULT_MAX_NEW_TOKENS if context is None else default_max_new_tokens(context)
        )
    return EvalConfig(
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_new_tokens=max_new_tokens,
        stop=tuple(args.stop),
        greedy=not args.no_greedy,
        batch_size=args.batch_size,
        template=args.template,
        seed=args.seed,
        limit=args.limit,
        n_boot=args.n_boot,
        group_by=tuple(args.group_by),
        engine=args.engine,
        engine_options=engine_option_mapping(args.engine_option),
    )


def _load(args: argparse.Namespace):
    """(model or None, tokenizer, context length, model path as given, resolved path),
    after checking that the model exists; no transformers model for an engine that loads
    its own copy (vllm)."""
    from divrl.evaluation.runner import load_for_engine, resolve_model_path
    from divrl.rollout.model_source import check_model_source

    if not args.model:
        raise ValueError("--model is required (unless --reuse)")
    model_path = args.model
    if model_path == "toy":
        from divrl.toy import ensure_toy_world

        model_path = str(ensure_toy_world(size=args.toy_size).model_dir)
    resolved = check_model_source(resolve_model_path(model_path))
    print(f"[divrl eval] model: {resolved}, engine: {args.engine}", file=sys.stderr)
    model, tokenizer, context = load_for_engine(resolved, args.engine)
    return model, tokenizer, context, model_path, resolved


def run(args: argparse.Namespace) -> int:
    """Input errors propagate to divrl.cli's handler (one paragraph, exit code 2)."""
    from divrl.cli import UsageError
    from divrl.rollout import EngineError

    try:
        return _run(args)
    except ValueError as exc:  # the evaluation's input checks (names, data, settings, engine)
        if type(exc) not in (ValueError, EngineError):
            raise
        raise UsageError(str(exc)) from exc


def apply_config(args: argparse.Namespace) -> None:
    """Fill what ``args`` leaves unset from ``--config`` (and its overrides): the model (the
    run folder), the eval sets, the template, the databases and the output folder; without
    ``--config`` only ``--out`` is checked."""
    if args.config is None:
        if args.base_model:
            raise ValueError("--base-model needs --config CONFIG (whose model.path it evaluates)")
        if args.overrides:
            raise ValueError(
                f"KEY=VALUE overrides ({args.overrides[0]}) need --config CONFIG; without a "
                "config give the settings as options (divrl eval --help)"
            )
        if args.out is None:
            raise ValueError("give --out DIR (or --config CONFIG to write under its run folder)")
        args.template = args.template or "plain"
        return
    from divrl.training.config import load_config

    config = load_config(args.config, args.overrides)
    run_dir = Path(config.logging.output_dir)
    if args.base_model and args.model is not None:
        raise ValueError("give --base-model or --model, not both")
    if args.base_model and not args.reuse:
        if config.model.path is None:
            raise ValueError(f"--base-model: {args.config} sets no model.path")
        args.model = config.model.path
    elif args.model is None and not args.reuse:
        if not run_dir.is_dir():
            raise ValueError(
                f"--config {args.config}: its run folder {run_dir} does not exist yet; train "
                f"it first (divrl train {args.config}) or give --model"
            )
        args.model = str(run_dir)
    if not args.data and not args.reuse:
        args.data = [f"{name}={path}" for name, path in config.data.eval_paths.items()]
        if not args.data:
            raise ValueError(
                f"--config {args.config} names no eval sets: set data.eval_paths "
                "({name: path}) in it or give --data [NAME=]PATH"
            )
    args.template = args.template or config.data.template
    args.db_dir = args.db_dir or config.data.db_dir
    args.out = args.out or str(run_dir / "eval")


def _run(args: argparse.Namespace) -> int:
    from divrl.evaluation.runner import SAMPLES_FILE, evaluate

    apply_config(args)
    out = Path(args.out)
    if args.reuse and not args.data:
        sets = [(p.parent.name, None) for p in sorted(out.glob(f"*/{SAMPLES_FILE}"))]
        if not sets:
            raise FileNotFoundError(f"--reuse: no */{SAMPLES_FILE} under {out}")
    else:
        sets = _data_sets(args.data, args.toy_size)
        if not sets:
            raise ValueError("give at least one --data set")
    model = tokenizer = model_path = engine = context = None
    # every setting (engine name and options included) is checked before the model loads
    cfg = _eval_config(args, None)
    if not args.reuse:
        from divrl.evaluation.runner import make_engine
        from divrl.rollout import check_engine_installed

        check_engine_installed(args.engine)
        model, tokenizer, context, model_path, resolved = _load(args)
        cfg = _eval_config(args, context)
    if not args.reuse:  # one engine for every set (vLLM takes its GPU memory once)
        engine = make_engine(cfg, model, tokenizer, resolved, context)
    summaries = {}
    for name, path in sets:
        print(f"[divrl eval] {name}: {path or out / name}", file=sys.stderr)
        summaries[name] = evaluate(
            model_path,
            path,
            out / name,
            cfg,
            reuse=args.reuse,
            db_dir=args.db_dir,
            model=model,
            tokenizer=tokenizer,
            engine=engine,
            progress=not args.no_progress,
        )
    combined_path = out / "summary.json"
    combined = json.loads(combined_path.read_text()) if combined_path.is_file() else {}
    combined.update(summaries)
    atomic_write_text(combined_path, json.dumps(combined, indent=2) + "\n")
    print_summary_table(summaries, title=f"divrl eval: {args.model or out}")
    print(f"summaries in {combined_path}")
    return 0
