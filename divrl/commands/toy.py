"""``divrl toy``: build (or find in the cache) the toy world and measure its base model.

``divrl toy build`` generates the toy SQL databases, the data splits and the supervised
base model, then samples the model and prints the measured properties (Pass@k, the share
of near-perfect train prompts, distinct solution styles). A second call returns the cached
world and its stored measurements at once. ``divrl toy measure`` re-measures with other
sampling settings. ``--world countdown`` does the same for the countdown world (search
traces; :mod:`divrl.toy.countdown_world`); its documented numbers use ``--samples 32``.
"""

from __future__ import annotations

import argparse
import json
import os


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="toy_command", metavar="ACTION", required=True)
    for name, help_text in (
        ("build", "build the toy world (cached) and print its measured properties"),
        ("measure", "sample and measure the base model of a built toy world again"),
    ):
        p = sub.add_parser(
            name, help=help_text, description=help_text, formatter_class=parser.formatter_class
        )
        p.add_argument("--cache-dir", help="default: $DIVRL_CACHE_DIR/toy or ~/.cache/divrl/toy")
        p.add_argument(
            "--world",
            choices=("sql", "countdown"),
            default="sql",
            help="'sql': toy SQL + math (divrl.toy.world); 'countdown': countdown arithmetic "
            "with search traces (divrl.toy.countdown_world)",
        )
        p.add_argument("--seed", type=int, default=0, help="generator and training seed")
        p.add_argument(
            "--size", default="full", help="'full' (minutes) or 'tiny' (seconds, for tests)"
        )
        p.add_argument("--max-prompts", type=int, default=256, help="prompts measured per split")
        p.add_argument("--samples", type=int, default=16, help="samples per prompt (Pass@k)")
        p.add_argument("--json", action="store_true", help="print the measurements as JSON")
        p.add_argument("--quiet", action="store_true", help="no progress bars")
        if name == "build":
            p.add_argument(
                "--no-measure", action="store_true", help="build only, do not sample the model"
            )
            p.add_argument(
                "--ship",
                action="store_true",
                help="(maintainers) copy the built model into divrl/toy/pretrained so that "
                "builds with the same settings copy it instead of training",
            )
            p.add_argument(
                "--retrain",
                action="store_true",
                help="train even when a shipped model matches (to check that it reproduces; "
                "use a fresh --cache-dir, a cached world is returned as it is)",
            )


def run(args: argparse.Namespace) -> int:
    # idle OpenMP threads must not spin: on a shared CPU spinning makes 2 threads slower
    # than 1 (only effective when torch is not imported yet)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from divrl.toy import SIZES, ensure_toy_world
    from divrl.toy.measure import (
        MeasureConfig,
        format_measurements,
        load_measurements,
        measure_base_model,
    )

    world_name = getattr(args, "world", "sql")
    if world_name == "countdown":
        from divrl.toy.countdown_world import SIZES as CD_SIZES
        from divrl.toy.countdown_world import ensure_countdown_world

        if args.size not in CD_SIZES:
            raise SystemExit(f"divrl toy: unknown --size {args.size!r} for countdown")
        world = ensure_countdown_world(
            args.cache_dir,
            size=args.size,
            seed=args.seed,
            progress=not args.quiet,
            use_shipped=not getattr(args, "retrain", False),
        )
    elif args.size not in SIZES:
        raise SystemExit(f"divrl toy: unknown --size {args.size!r}; choose from {sorted(SIZES)}")
    else:
        world = ensure_toy_world(
            args.cache_dir,
            seed=args.seed,
            size=args.size,
            progress=not args.quiet,
            use_shipped=not getattr(args, "retrain", False),
        )
    man = world.manifest
    print(f"toy world: {world.root}")
    print(
        f"  model: {world.model_dir} ({man['n_parameters']:,} parameters, SFT loss "
        f"{man['final_loss']:.3f}, built in {man['build_seconds']:.0f} s)"
    )
    print(f"  model source: {man['model_source']}")
    for split, path in world.splits.items():
        print(f"  {split:<13} {path} ({man['splits'][split]} prompts)")
    if getattr(args, "ship", False):
        if world_name == "countdown":
            from divrl.toy.countdown_world import ship_model
        else:
            from divrl.toy.world import ship_model

        print(f"  shipped the model to {ship_model(world)}")
    if args.toy_command == "build" and args.no_measure:
        return 0
    if world_name == "countdown":
        return _measure_countdown(args, world)
    cfg = MeasureConfig(n_samples=args.samples, max_prompts=args.max_prompts)
    stored = load_measurements(world) if args.toy_command == "build" else None
    if stored is None or stored.get("config") != cfg.__dict__:
        stored = measure_base_model(world, cfg, progress=not args.quiet)
    print()
    print(json.dumps(stored, indent=2) if args.json else format_measurements(stored))
    return 0


def _measure_countdown(args: argparse.Namespace, world) -> int:
    """Measure (or read the stored measurements of) a countdown world's base model."""
    from divrl.toy.countdown_measure import (
        CountdownMeasureConfig,
        format_countdown_measurements,
        measure_countdown_model,
    )
    from divrl.toy.measure import load_measurements

    cfg = CountdownMeasureConfig(n_samples=args.samples, max_prompts=args.max_prompts)
    stored = load_measurements(world) if args.toy_command == "build" else None
    wanted = {**cfg.__dict__, "splits": list(cfg.splits)}
    if stored is None or stored.get("config") != wanted:
        stored = measure_countdown_model(world, cfg, progress=not args.quiet)
    print()
    print(json.dumps(stored, indent=2) if args.json else format_countdown_measurements(stored))
    return 0
