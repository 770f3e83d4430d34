"""The toy-world registry: a world chosen by name (``--world sql``).

A world is anything with the attributes of :class:`World`: ``model_dir`` (the base model),
``splits`` (split name -> verl-schema JSONL; ``train`` is the RL training split and every
other key an eval split: ``test`` in domain, ``cross_domain``, ``ood_*`` out of domain),
``db_dir`` (SQLite databases, or None), ``root``, ``seed`` and ``size``.

Each kind also names its toy presets' folder (``presets``, relative to ``configs/``): the
demo and the reproduction train a world's methods from ``configs/<presets>/<method>.yaml``,
so response lengths and thresholds fit that world.

A world written on the scaffold (:class:`divrl.toy.scaffold.WorldScaffold`: one module
declaring its sizes, splits, shipped model and measurement targets) is registered with one
line, ``WorldKind.scaffolded("<module>:WORLD", help, presets=...)``. Otherwise a world kind
names its functions by dotted path (``"module:function"``, imported only when used, so a
kind's dependencies never load for another) or passes them directly:

- ``build(cache_dir, *, seed, size, progress, use_shipped) -> World``: find the world in the
  cache or build it (raises ``ValueError`` for an unknown size);
- ``load(root) -> World``: open an already built world directory;
- ``measure(world, *, n_samples, max_prompts, progress, reuse) -> dict`` and
  ``format(measurements) -> str``: ``divrl toy build --measure`` / ``divrl toy measure``;
- ``ship(world) -> Path`` (optional): ``divrl toy build --ship``.

Every command that chooses a world (``divrl toy``, ``divrl train`` with ``model.toy_world``,
``divrl demo``, the reproduction) looks it up here: a kind added with
:func:`register_world` is available to all of them. A world of another package (or of a
test) declares its module under the ``divrl.toy_worlds`` entry point group (``name =
"package.module"``; the module calls :func:`register_world` at import), so that a fresh
``divrl`` process (the demo's and the reproduction's subprocesses) finds it by name.

A world whose rows are scored by a verifier of its own registers that verifier's profile
in its module and declares the rows' data sources (``data_sources``): the lookup of an
unknown data source (:func:`divrl.rewards.get_verifier`, :func:`divrl.profiles.get_profile`)
then imports the module of the world that declares it, through the source finder this
module adds to the rewards (:func:`find_world_source`). The rewards, a lower layer, never
import a world: this module hands them the finder when it is imported, as every ``divrl``
command does (``divrl.commands``).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from divrl.rewards.registry import register_source_finder

#: a function, or where it lives: ``"module:function"`` (imported on first use)
Target = str | Callable[..., Any]

__all__ = [
    "DEFAULT_WORLD",
    "ENTRY_POINT_GROUP",
    "WORLDS",
    "World",
    "WorldKind",
    "eval_splits",
    "find_world_source",
    "format_measurements",
    "get_world",
    "import_world",
    "load_world",
    "measure_world",
    "register_world",
    "ship_world",
    "world_names",
    "world_presets",
    "world_scaffold",
]

ENTRY_POINT_GROUP = "divrl.toy_worlds"


class World(Protocol):
    """What the pipeline, the demo and the reproduction use of a built world."""

    root: Path
    model_dir: Path
    db_dir: Path | None
    splits: dict[str, Path]
    seed: int
    size: str


@dataclass(frozen=True)
class WorldKind:
    """A world kind's functions (see the module's docstring for their signatures)."""

    build: Target
    load: Target
    help: str = ""
    #: the world's toy presets, relative to ``configs/`` (``toy/<method>.yaml`` for sql)
    presets: str = "toy"
    measure: Target = "divrl.toy.measure:measure_world"
    format: Target = "divrl.toy.measure:format_measurements"
    ship: Target | None = None
    #: the world's :class:`~divrl.toy.scaffold.WorldScaffold` instance (or where it lives),
    #: for a world written on the scaffold: its declared sizes, splits and targets
    scaffold: Target | None = None
    #: the methods whose presets the world ships in its folder (None: every method the
    #: demo and the reproduction train; tests/toy/test_countdown.py checks either)
    methods: tuple[str, ...] | None = None
    #: the data sources of the world's rows whose benchmark profile (verifier) the world's
    #: module registers: a lookup of one of them imports that module (the module docstring)
    data_sources: tuple[str, ...] = ()

    @classmethod
    def scaffolded(
        cls,
        world: str,
        help: str,
        *,
        presets: str,
        methods: tuple[str, ...] | None = None,
        data_sources: tuple[str, ...] = (),
    ) -> WorldKind:
        """The kind of a world written on :class:`divrl.toy.scaffold.WorldScaffold`:
        ``world`` is where its instance lives (``"module:WORLD"``, imported on first use)."""
        return cls(
            build=f"{world}.ensure",
            load=f"{world}.load",
            help=help,
            presets=presets,
            measure=f"{world}.measure",
            format=f"{world}.format",
            ship=f"{world}.ship",
            scaffold=world,
            methods=methods,
            data_sources=data_sources,
        )


#: world name -> its kind; the first is the default
WORLDS: dict[str, WorldKind] = {
    "sql": WorldKind.scaffolded(
        "divrl.toy.sql_world:WORLD",
        "toy SQL in domain, held-out databases cross domain, toy math out of domain",
        presets="toy",
    ),
    "countdown": WorldKind.scaffolded(
        "divrl.toy.countdown_world:WORLD",
        "countdown arithmetic with search traces in domain, larger targets cross domain, "
        "toy math out of domain",
        presets="toy/countdown",
    ),
    "sparks": WorldKind.scaffolded(
        "divrl.toy.sparks_world:WORLD",
        "the largest of twelve digits: a habitual glance that skips the last three and a rare "
        "check (the spark move) that alone solves the hard problems",
        presets="toy/sparks",
        methods=(
            "clip_cov",
            "entropy_bonus",
            "grpo_math",
            "high_entropy_8020",
            "kl_cov",
            "lp_reg",
            "lp_reg_toy",
        ),
    ),
}
DEFAULT_WORLD = "sql"


def register_world(name: str, kind: WorldKind, *, replace: bool = False) -> None:
    """Add world ``name`` (``replace=True`` to swap an existing one: a silent overwrite
    would change what every command builds under that name)."""
    if name in WORLDS and not replace and WORLDS[name] != kind:
        raise ValueError(f"world {name!r} is already registered: pick another name")
    WORLDS[name] = kind


def _resolve(target: Target) -> Any:
    if not isinstance(target, str):  # the function (or the scaffold instance) itself
        return target
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _entry_points() -> dict[str, str]:
    """World name -> the module its ``divrl.toy_worlds`` entry point names."""
    from importlib.metadata import entry_points

    return {
        ep.name: ep.value.partition(":")[0].strip() for ep in entry_points(group=ENTRY_POINT_GROUP)
    }


def _load_entry_point(name: str, module: str) -> None:
    """Import ``module``, where world ``name``'s entry point says it registers itself.

    Raises:
        ValueError: the module fails to import (one line naming it and the error).
    """
    try:
        importlib.import_module(module)
    except Exception as exc:  # any error of another package's module, reported in one line
        detail = " ".join(str(exc).split()) or "no message"
        raise ValueError(
            f"world {name!r}: its module {module!r} (entry point in group "
            f"{ENTRY_POINT_GROUP}) failed to import: {type(exc).__name__}: {detail}"
        ) from exc


def world_names() -> list[str]:
    """The registered worlds and those of the ``divrl.toy_worlds`` entry points, sorted."""
    return sorted(set(WORLDS) | set(_entry_points()))


def _kind(name: str) -> WorldKind:
    if name not in WORLDS:
        module = _entry_points().get(name)
        if module is not None:
            _load_entry_point(name, module)
    try:
        return WORLDS[name]
    except KeyError:
        raise ValueError(f"unknown world {name!r}; choose one of {world_names()}") from None


def find_world_source(data_source: str) -> None:
    """Import the module of every world that declares ``data_source`` (``data_sources``),
    so that its profile registers; the worlds of entry points not yet loaded are imported
    first, since what they declare is only known once they are. The rewards call this on
    a lookup's miss (:func:`divrl.rewards.registry.register_source_finder`)."""
    for name, module in _entry_points().items():
        if name not in WORLDS:
            _load_entry_point(name, module)
    for name, kind in list(WORLDS.items()):
        if data_source.lower() in {s.lower() for s in kind.data_sources}:
            import_world(name)


def get_world(
    name: str = DEFAULT_WORLD,
    cache_dir: str | Path | None = None,
    *,
    size: str = "full",
    seed: int = 0,
    progress: bool = True,
    use_shipped: bool = True,
) -> World:
    """The world ``name`` at ``size`` and ``seed``: from the cache, or built first."""
    build = _resolve(_kind(name).build)
    return build(cache_dir, seed=seed, size=size, progress=progress, use_shipped=use_shipped)


def load_world(root: str | Path, name: str | None = None) -> World:
    """An already built world directory; its kind is ``name``, else the one its
    ``world.json`` records (``"world"``), else the default."""
    if name is None:
        manifest = Path(root) / "world.json"
        recorded = json.loads(manifest.read_text()).get("world") if manifest.is_file() else None
        name = recorded or DEFAULT_WORLD
    return _resolve(_kind(name).load)(root)


def measure_world(
    name: str, world: World, *, n_samples: int, max_prompts: int, progress: bool, reuse: bool
) -> tuple[dict[str, Any], str]:
    """World ``name``'s base-model measurements and their text (stored ones when ``reuse``
    and they were taken with these settings)."""
    kind = _kind(name)
    measured = _resolve(kind.measure)(
        world, n_samples=n_samples, max_prompts=max_prompts, progress=progress, reuse=reuse
    )
    return measured, format_measurements(name, measured)


def format_measurements(name: str, measured: dict[str, Any]) -> str:
    """World ``name``'s measurements as text."""
    return _resolve(_kind(name).format)(measured)


def ship_world(name: str, world: World) -> Path:
    """Copy ``world``'s base model where later builds of kind ``name`` find it."""
    ship = _kind(name).ship
    if ship is None:
        raise ValueError(f"world {name!r} has no shipped model (its kind sets no ship)")
    return _resolve(ship)(world)


def world_scaffold(name: str) -> Any:
    """World ``name``'s scaffold (its declared ``sizes``, ``splits``, ``targets``), or None
    for a world not written on :class:`divrl.toy.scaffold.WorldScaffold`."""
    target = _kind(name).scaffold
    return None if target is None else _resolve(target)


def import_world(name: str) -> None:
    """Import the module that defines world ``name`` (its scaffold's, else its builder's),
    so that what it registers at import (a benchmark profile for its rows' data source)
    is registered in this process too: ``divrl train`` and ``presample`` call this for
    ``model.toy_world`` even when the paths are given, as the demo's subprocesses do."""
    kind = _kind(name)
    target = kind.scaffold if kind.scaffold is not None else kind.build
    if isinstance(target, str):
        importlib.import_module(target.partition(":")[0])


def world_presets(name: str) -> str:
    """The folder of world ``name``'s toy presets, relative to ``configs/``."""
    return _kind(name).presets


def eval_splits(world: World) -> list[str]:
    """The world's eval splits, in its order (every split but ``train``)."""
    return [s for s in world.splits if s != "train"]


register_source_finder(find_world_source)
