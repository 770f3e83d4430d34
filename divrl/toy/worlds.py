"""The toy-world registry: a world chosen by name (``--world sql``).

A world is anything with the attributes of :class:`World`: ``model_dir`` (the base model),
``splits`` (split name -> verl-schema JSONL; ``train`` is the RL training split and every
other key an eval split: ``test`` in domain, ``cross_domain``, ``ood_*`` out of domain),
``db_dir`` (SQLite databases, or None), ``root``, ``seed`` and ``size``.

Each kind also names its toy presets' folder (``presets``, relative to ``configs/``): the
demo and the reproduction train a world's methods from ``configs/<presets>/<method>.yaml``,
so response lengths and thresholds fit that world.

A world kind registers two functions by dotted path, imported only when used (so a kind's
dependencies never load for another):

- ``build(cache_dir, *, seed, size, progress, use_shipped) -> World``: find the world in the
  cache or build it (raises ``ValueError`` for an unknown size);
- ``load(root) -> World``: open an already built world directory.

Adding a kind is one line in :data:`WORLDS`.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "DEFAULT_WORLD",
    "WORLDS",
    "World",
    "WorldKind",
    "eval_splits",
    "get_world",
    "load_world",
    "world_presets",
]


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
    """Where a world kind's builder and loader live (``"module:function"``)."""

    build: str
    load: str
    help: str = ""
    #: the world's toy presets, relative to ``configs/`` (``toy/<method>.yaml`` for sql)
    presets: str = "toy"


#: world name -> its kind; the first is the default
WORLDS: dict[str, WorldKind] = {
    "sql": WorldKind(
        "divrl.toy.world:ensure_toy_world",
        "divrl.toy.world:ToyWorld.load",
        "toy SQL in domain, held-out databases cross domain, toy math out of domain",
    ),
    "countdown": WorldKind(
        "divrl.toy.countdown_world:ensure_countdown_world",
        "divrl.toy.world:ToyWorld.load",
        "countdown arithmetic with search traces in domain, larger targets cross domain, "
        "toy math out of domain",
        presets="toy/countdown",
    ),
}
DEFAULT_WORLD = "sql"


def _resolve(target: str) -> Any:
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _kind(name: str) -> WorldKind:
    try:
        return WORLDS[name]
    except KeyError:
        raise ValueError(f"unknown world {name!r}; choose one of {sorted(WORLDS)}") from None


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


def world_presets(name: str) -> str:
    """The folder of world ``name``'s toy presets, relative to ``configs/``."""
    return _kind(name).presets


def eval_splits(world: World) -> list[str]:
    """The world's eval splits, in its order (every split but ``train``)."""
    return [s for s in world.splits if s != "train"]
