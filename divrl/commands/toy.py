"""``divrl toy``: build (or find in the cache) the toy world and measure its base model.

``divrl toy build`` generates the toy SQL databases and the data splits and copies the
shipped base model (seconds; a model for other settings is trained: minutes), and prints
where they are. ``--measure`` also samples the model and prints the measured properties
(Pass@k, the share of near-perfect train prompts, distinct solution styles: minutes on a
CPU; stored, so a second call prints them at once). ``divrl toy measure`` (re-)measures
with other sampling settings. ``--world`` picks any world of the registry
(:mod:`divrl.toy.worlds`): ``countdown`` (search traces; its documented numbers use
``--samples 32``) or one registered there. ``divrl toy presets`` writes a world's toy
presets from the method list at the scale the world declares (:mod:`divrl.toy.presets`).
``divrl toy new NAME`` writes a new world's module on the scaffold (a runnable stand-in
task, :mod:`divrl.toy.world_template`) and its presets, and prints its registration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from divrl.cli import positive_int, seed_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from divrl.toy.worlds import DEFAULT_WORLD, WORLDS, world_names

    worlds = "; ".join(f"{name!r}: {kind.help}" for name, kind in WORLDS.items())
    names = world_names()  # a world of an entry point counts
    sub = parser.add_subparsers(dest="toy_command", metavar="ACTION", required=True)
    for name, help_text in (
        ("build", "build the toy world (cached; --measure also samples its base model)"),
        ("measure", "sample and measure the base model of a built toy world again"),
    ):
        p = sub.add_parser(
            name, help=help_text, description=help_text, formatter_class=parser.formatter_class
        )
        p.add_argument("--cache-dir", help="default: $DIVRL_CACHE_DIR/toy or ~/.cache/divrl/toy")
        p.add_argument("--world", choices=names, default=DEFAULT_WORLD, help=worlds)
        p.add_argument("--seed", type=seed_int, default=0, help="generator and training seed")
        p.add_argument(
            "--size",
            default="full",
            help="a size the world declares (full, the default, trains in minutes when no "
            "shipped model matches; an unknown size is refused naming the world's sizes)",
        )
        p.add_argument(
            "--max-prompts", type=positive_int, default=256, help="prompts measured per split"
        )
        p.add_argument(
            "--samples", type=positive_int, default=16, help="samples per prompt (Pass@k)"
        )
        p.add_argument("--json", action="store_true", help="print the measurements as JSON")
        p.add_argument("--quiet", action="store_true", help="no progress bars")
        if name == "build":
            p.add_argument(
                "--measure",
                action="store_true",
                help="also sample the base model and print its measured properties (minutes "
                "on a CPU the first time; stored in the world)",
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
    _add_presets(sub, parser.formatter_class, names, worlds)
    _add_new(sub, parser.formatter_class)


def _add_new(sub, formatter_class) -> None:
    help_text = (
        "write a new world's module on the world scaffold (a runnable stand-in task to "
        "replace) and its presets, and print its registration"
    )
    p = sub.add_parser(
        "new", help=help_text, description=help_text, formatter_class=formatter_class
    )
    p.add_argument("name", help="the world's name: a lowercase identifier no world has yet")
    p.add_argument(
        "--dir",
        default=".",
        help="folder of the module NAME_world.py (divrl/toy of the checkout: the world is "
        "registered by a line in WORLDS; elsewhere it registers itself and a package's entry "
        "point names it)",
    )
    p.add_argument(
        "--presets-out",
        help="folder of its presets (default: configs/toy/NAME, as `divrl toy presets` writes)",
    )
    p.add_argument(
        "--configs", help="the full presets' folder (default: ./configs or the checkout's)"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the module and presets that exist (without it the command refuses and "
        "writes nothing)",
    )


def _add_presets(sub, formatter_class, names: list[str], worlds: str) -> None:
    help_text = (
        "write a world's toy presets from the method list, each extending the method's "
        "full preset at the scale the world declares"
    )
    p = sub.add_parser(
        "presets", help=help_text, description=help_text, formatter_class=formatter_class
    )
    p.add_argument("--world", choices=names, required=True, help=worlds)
    p.add_argument(
        "--methods",
        nargs="+",
        metavar="METHOD",
        help="methods (a name with configs/<name>.yaml, or a toy-only variant in configs/toy/); "
        "default: the methods the world declares, else every preset in configs/toy/",
    )
    p.add_argument("--out", help="folder to write (default: configs/<the world's presets folder>)")
    p.add_argument(
        "--configs", help="the full presets' folder (default: ./configs or the checkout's)"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace presets that exist and differ (without it the command refuses and writes "
        "nothing)",
    )


def write_presets(args: argparse.Namespace) -> int:
    """``divrl toy presets``: 2 and one line (naming the file when a preset exists and
    differs) on bad input; nothing is written then."""
    from divrl.toy.presets import PresetExists, generate_presets

    try:
        texts, skipped = _render(args)
        status = generate_presets(texts, overwrite=args.overwrite)
    except (PresetExists, ValueError, FileNotFoundError) as exc:
        print(f"divrl toy presets: {exc}", file=sys.stderr)
        return 2
    for path, what in status.items():
        print(f"{what:<9} {path}" + (" (other text, the same settings)" if what == "same" else ""))
    for method, why in skipped.items():
        print(f"{'skipped':<9} {method}: {why}")
    return 0


def _render(args: argparse.Namespace) -> tuple[dict, dict[str, str]]:
    from pathlib import Path

    from divrl.toy.presets import configs_root, render_presets
    from divrl.toy.worlds import WORLDS, world_presets, world_scaffold

    name = args.world
    scale = getattr(world_scaffold(name), "preset_scale", None)
    if scale is None:
        raise ValueError(
            f"world {name!r} declares no preset scale: set preset_scale (a "
            "divrl.toy.presets.PresetScale) on its WorldScaffold"
        )
    configs = Path(args.configs) if args.configs else configs_root()
    folder = world_presets(name)
    declared = WORLDS[name].methods
    methods = args.methods or (
        declared if declared is not None else sorted(p.stem for p in configs.glob("toy/*.yaml"))
    )
    if not methods:
        raise ValueError(f"world {name!r} declares no methods (methods=()): pass --methods")
    out = Path(args.out) if args.out else configs / folder
    skipped = {m: scale.not_generated[m] for m in methods if m in scale.not_generated}
    texts = render_presets(name, scale, methods, out=out, folder=folder, configs=configs)
    return texts, skipped


def _cache_dir_problem(cache_dir: str | None) -> str:
    """Why ``--cache-dir`` cannot hold worlds ("" when it can, or is not given)."""
    from pathlib import Path

    if cache_dir is None:
        return ""
    path = Path(cache_dir).expanduser()
    for folder in (path, *path.parents):
        if folder.exists():
            if not folder.is_dir():
                return f"{folder} is a file, not a folder: give a folder (or a new path)"
            return ""
    return ""


def run(args: argparse.Namespace) -> int:
    # idle OpenMP threads must not spin: on a shared CPU spinning makes 2 threads slower
    # than 1 (only effective when torch is not imported yet)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.toy_command == "presets":
        return write_presets(args)
    if args.toy_command == "new":
        return new_world(args)
    from divrl.toy.kit import model_source_label
    from divrl.toy.measure import load_measurements
    from divrl.toy.worlds import format_measurements, get_world, measure_world, ship_world

    name = args.world
    problem = _cache_dir_problem(args.cache_dir)
    if problem:
        print(f"divrl toy: --cache-dir {args.cache_dir}: {problem}", file=sys.stderr)
        return 2
    try:
        world = get_world(
            name,
            args.cache_dir,
            size=args.size,
            seed=args.seed,
            progress=not args.quiet,
            use_shipped=not getattr(args, "retrain", False),
        )
    except ValueError as exc:  # e.g. a size this world does not have
        print(f"divrl toy: --world {name}: {exc}", file=sys.stderr)
        return 2
    man = world.manifest
    print(f"toy world: {world.root}")
    print(
        f"  model: {world.model_dir} ({man['n_parameters']:,} parameters, SFT loss "
        f"{man['final_loss']:.3f}, built in {man['build_seconds']:.0f} s)"
    )
    print(f"  model source: {model_source_label(man['model_source'])}")
    for split, path in world.splits.items():
        print(f"  {split:<13} {path} ({man['splits'][split]} prompts)")
    if getattr(args, "ship", False):
        print(f"  shipped the model to {ship_world(name, world)}")
    build = args.toy_command == "build"
    if build and not args.measure:
        stored = load_measurements(world)
        if stored is None:
            print("  (not measured: `divrl toy build --measure` samples the model, minutes)")
        else:
            print()
            print(json.dumps(stored, indent=2) if args.json else format_measurements(name, stored))
        return 0
    # build --measure: the stored measurements unless taken with other settings
    stored, text = measure_world(
        name,
        world,
        n_samples=args.samples,
        max_prompts=args.max_prompts,
        progress=not args.quiet,
        reuse=build,
    )
    print()
    print(json.dumps(stored, indent=2) if args.json else text)
    return 0


def new_world(args: argparse.Namespace) -> int:
    """``divrl toy new``: the module, then the presets; 2 and one line on bad input, with
    nothing written."""
    from pathlib import Path

    from divrl.toy import world_template as tpl
    from divrl.toy.presets import PresetExists, configs_root, generate_presets, render_presets
    from divrl.toy.worlds import world_names

    name, folder = args.name, Path(args.dir)
    module = folder / f"{name}_world.py"
    try:
        tpl.check_world_name(name, world_names())
        if not folder.is_dir():
            raise ValueError(f"--dir {folder} is not a folder: create it or give another")
        if module.exists() and not args.overwrite:
            raise ValueError(f"{module} exists: pass --overwrite to replace it, or pick a name")
        configs = Path(args.configs) if args.configs else configs_root()
        out = Path(args.presets_out) if args.presets_out else configs / "toy" / name
        texts = render_presets(
            name, tpl.PRESET_SCALE, tpl.METHODS, out=out, folder=f"toy/{name}", configs=configs
        )
        status = generate_presets(texts, overwrite=args.overwrite)
    except (PresetExists, ValueError, FileNotFoundError) as exc:
        print(f"divrl toy new: {exc}", file=sys.stderr)
        return 2
    here = tpl.in_tree(folder)
    module.write_text(tpl.render_world_module(name, self_registering=not here))
    print(f"{'written':<9} {module}")
    for path, what in status.items():
        print(f"{what:<9} {path}")
    if here:
        print("\nregister it: add this line to WORLDS in divrl/toy/worlds.py\n")
        print(tpl.registration_line(name))
    else:
        print(
            "\nregister it: the module calls register_world when imported; for `divrl` "
            "to find it by name, name it in your package's pyproject.toml (then reinstall "
            "the package, e.g. `pip install -e .`):\n"
        )
        print(
            f'[project.entry-points."divrl.toy_worlds"]\n{name} = "{tpl.entry_point_module(module)}"'
        )
    print(f"\nthen: divrl toy build --world {name} --size tiny")
    return 0
