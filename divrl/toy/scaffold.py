"""The world scaffold: a toy world is one subclass of :class:`WorldScaffold`.

A world declares what it is (its ``name``, ``build_version``, ``sizes``, ``splits``, where
its shipped model lives, the measurement ``targets`` its base model is designed to meet,
its tokenizer ``pieces``, and where its own measurement lives when it has one) and writes
two methods, ``generate`` (the rows of each split) and ``train_model`` (the
supervised base model). The scaffold does the rest the same way for every world: the
cache key and folder, the build in a temporary folder renamed into place, the rows written
as ``data/<split>.jsonl``, the shipped model copied when its key matches, ``world.json``,
loading, measuring and shipping. One line registers it
(``WorldKind.scaffolded("<module>:WORLD", help, presets=...)`` in :mod:`divrl.toy.worlds`),
and every command that chooses a world finds it there.

The SQL world (:mod:`divrl.toy.sql_world`) and the countdown world
(:mod:`divrl.toy.countdown_world`) are written on it; docs/architecture.md, "How to add",
lists what a new world needs.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from divrl.data import Example, write_examples
from divrl.toy import kit
from divrl.toy.kit import MeasureTarget
from divrl.toy.presets import PresetScale
from divrl.toy.tokenizer import build_tokenizer

__all__ = ["MeasureTarget", "PresetScale", "WorldScaffold"]


class WorldScaffold:
    """One toy world kind. Subclass it, set the class attributes, write :meth:`generate`
    and :meth:`train_model`, and register an instance (module docstring)."""

    #: the world's registry name: its manifest's ``world`` and its cache folders' prefix
    name: str = ""
    #: bump when the generated data or the training would change for the same settings
    build_version: str = "1"
    #: size name -> the config that determines the world besides the seed (a dataclass with
    #: ``to_dict()``, hashed into the key); ``full`` is the default size
    sizes: Mapping[str, Any] = {}
    #: the splits :meth:`generate` returns, in order: ``train`` is the RL training split,
    #: every other one an eval split (``test`` in domain, ``cross_domain``, ``ood_*``, ...)
    splits: tuple[str, ...] = kit.CLASSIC_SPLITS
    #: where ``divrl toy build --ship`` copies the base model and later builds with the
    #: same key find it (None: the world never ships a model)
    pretrained_dir: Path | None = None
    #: what ``divrl toy measure`` checks the base model against (empty: the table only)
    targets: tuple[MeasureTarget, ...] = ()
    #: the scale of the world's toy presets, which ``divrl toy presets`` writes from the
    #: method list (lengths, learning rate, batch sizes; None: the command refuses)
    preset_scale: PresetScale | None = None
    #: the world's own tokenizer pieces (besides the shared toy ones), for :meth:`train_on`
    pieces: tuple[str, ...] = ()
    #: where ``divrl toy measure`` finds the world's measurement (``"module:function"``,
    #: imported when used; the default: Pass@k, near-perfect share and styles of every split)
    measure_with: str = "divrl.toy.measure:measure_world"
    #: where its printer is (``"module:function"`` taking the measurements), for a world
    #: with measures of its own; None: :mod:`divrl.toy.measure`'s, with :attr:`targets`
    format_with: str | None = None

    # --------------------------------------------------------- what a world writes

    def generate(
        self, out: Path, final: Path, seed: int, cfg: Any
    ) -> tuple[dict[str, list[Example]], Any]:
        """The rows of each split of :attr:`splits` (the scaffold writes them) and whatever
        :meth:`train_model` needs (held-out prompts, databases, ...). Files of the world's
        own (databases under ``out/db``) are written here; a row that names one uses its
        path under ``final``, the world's folder after the rename."""
        raise NotImplementedError(f"world {self.name!r}: write generate()")

    def train_model(
        self, model_dir: Path, seed: int, cfg: Any, generated: Any, progress: bool
    ) -> dict[str, Any]:
        """Train the base model into ``model_dir`` (:meth:`train_on` does the supervised
        training on a corpus); its SFT stats. ``generated`` is :meth:`generate`'s second
        value. Not called when a shipped model with the same key is copied."""
        raise NotImplementedError(f"world {self.name!r}: write train_model()")

    # --------------------------------------------------------- what the scaffold does

    def train_on(
        self,
        model_dir: Path,
        corpus: list[tuple[str, str]],
        cfg: Any,
        seed: int,
        progress: bool,
        **extra_stats: Any,
    ) -> dict[str, Any]:
        """What :meth:`train_model` usually ends with: a fresh base model (``cfg.model``)
        trained on ``corpus`` (``cfg.sft``) with the world's tokenizer (:attr:`pieces`),
        saved in ``model_dir``; its SFT stats with ``extra_stats``."""
        tokenizer = build_tokenizer(cfg.model.max_length, extra_pieces=self.pieces)
        return kit.train_and_save(
            model_dir, tokenizer, corpus, cfg.model, cfg.sft, seed, progress, **extra_stats
        )

    def config(self, size: str) -> Any:
        """The config of ``size`` (ValueError naming the world's sizes)."""
        if size not in self.sizes:
            raise ValueError(
                f"unknown {self.name} world size {size!r}; choose one of {sorted(self.sizes)}"
            )
        return self.sizes[size]

    def key(self, seed: int, size: str, cfg: Any) -> str:
        """The hash of everything that determines the world (its cache key)."""
        blob = {
            "world": self.name,
            "version": self.build_version,
            "seed": seed,
            "size": size,
            "config": cfg.to_dict(),
        }
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]

    def folder(self, seed: int, size: str, key: str) -> str:
        """The world's folder name in the cache."""
        return f"{self.name}-{size}-seed{seed}-{key}"

    def ensure(
        self,
        cache_dir: str | Path | None = None,
        *,
        seed: int = 0,
        size: str = "full",
        progress: bool = True,
        use_shipped: bool = True,
    ) -> kit.ToyWorld:
        """The world for (``seed``, ``size``) from the cache (``$DIVRL_CACHE_DIR/toy`` or
        ``~/.cache/divrl/toy`` by default), built first when it is not there. With
        ``use_shipped`` a shipped model built with exactly these settings is copied
        instead of trained (the data is always generated)."""
        cfg = self.config(size)
        name = self.folder(seed, size, self.key(seed, size, cfg))
        return kit.cached_world(
            cache_dir,
            name,
            lambda tmp, final: self.build(
                tmp,
                final,
                seed=seed,
                size=size,
                cfg=cfg,
                progress=progress,
                use_shipped=use_shipped,
            ),
        )

    def build(
        self,
        out: Path,
        final: Path,
        *,
        seed: int,
        size: str,
        cfg: Any,
        progress: bool = True,
        use_shipped: bool = True,
    ) -> None:
        """Write the world into ``out`` (renamed to ``final`` afterwards): the data, the
        base model (shipped or trained), ``world.json``."""
        start = time.time()
        for sub in ("db", "data", "model"):
            (out / sub).mkdir(parents=True, exist_ok=True)
        rows, generated = self.generate(out, final, seed, cfg)
        if list(rows) != list(self.splits):
            raise ValueError(
                f"world {self.name!r}: generate() returned the splits {list(rows)}, but the "
                f"world declares {list(self.splits)} (its splits attribute): make them agree"
            )
        for split, examples in rows.items():
            write_examples(examples, out / "data" / f"{split}.jsonl")
        timings = {"data_seconds": time.time() - start}
        key = self.key(seed, size, cfg)
        stats = kit.shipped_or_trained(
            out / "model",
            key,
            self.pretrained_dir if use_shipped else None,
            lambda: self.train_model(out / "model", seed, cfg, generated, progress),
        )
        counts = {split: len(r) for split, r in rows.items()}
        kit.write_manifest(
            out, self.name, seed, size, key, self.build_version, cfg, counts, timings, stats, start
        )

    def load(self, root: str | Path) -> kit.ToyWorld:
        """An already built world folder."""
        return kit.ToyWorld.load(root)

    def measure(
        self, world: kit.ToyWorld, *, n_samples: int, max_prompts: int, progress: bool, reuse: bool
    ) -> dict[str, Any]:
        """``divrl toy measure``: the function :attr:`measure_with` names."""
        return _imported(self.measure_with)(
            world, n_samples=n_samples, max_prompts=max_prompts, progress=progress, reuse=reuse
        )

    def format(self, measured: dict[str, Any]) -> str:
        """The measurements as text: :attr:`format_with`'s, else with the world's
        :attr:`targets` checked."""
        if self.format_with is not None:
            return _imported(self.format_with)(measured)
        from divrl.toy.measure import format_measurements

        return format_measurements(measured, self.targets)

    def ship(self, world: kit.ToyWorld) -> Path:
        """``divrl toy build --ship``: copy the base model into :attr:`pretrained_dir`."""
        if self.pretrained_dir is None:
            raise ValueError(f"world {self.name!r} ships no model (its pretrained_dir is None)")
        return kit.ship_model(world, self.pretrained_dir)


def _imported(target: str) -> Any:
    """The function ``"module:function"`` names (its module imported now: a world's
    measurement needs the evaluation stack, which building a world does not)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
