"""The toy-world kit: what every world kind shares (the built-world object, the cache,
the manifest, the supervised base model, shipped models, row helpers).

A world kind is written on :class:`divrl.toy.scaffold.WorldScaffold`, which calls these;
the SQL world (:mod:`divrl.toy.sql_world`) and the countdown world
(:mod:`divrl.toy.countdown_world`) are two. Every world has the same layout::

    world.json          manifest: world, seed, size, key, settings, split sizes, timings, SFT stats
    db/                 SQLite databases (empty for a world without databases)
    data/<split>.jsonl  the world's splits (verl rows); ``train`` is the RL training split
    model/              the base model and its tokenizer (``from_pretrained``-loadable)

A world is built in a temporary directory next to its final place and renamed into it, so
an interrupted build leaves nothing that looks finished.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from divrl.data import Example
from divrl.toy import toy_math
from divrl.toy.model import ToyModelConfig, build_model
from divrl.toy.sft import SFTConfig, train_sft
from divrl.toy.tokenizer import ANSWER_MARKER

__all__ = [
    "CLASSIC_SPLITS",
    "SHIPPED_FILES",
    "MeasureTarget",
    "SplitSizes",
    "ToyWorld",
    "build_in_cache",
    "cached_world",
    "copy_shipped_model",
    "count_parameters",
    "default_cache_dir",
    "distinct_problems",
    "encode_pairs",
    "math_row",
    "math_sft_pair",
    "model_source_label",
    "read_rows",
    "ship_model",
    "shipped_key",
    "shipped_or_trained",
    "train_and_save",
    "write_manifest",
]

#: the splits of a manifest that does not list its own (written before worlds declared them)
CLASSIC_SPLITS = ("train", "test", "cross_domain", "ood_math")
#: the files of a shipped base model (``divrl toy build --ship`` copies them)
SHIPPED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "sft_stats.json",
)


@dataclass(frozen=True)
class MeasureTarget:
    """A design target of a world's base model, checked by ``divrl toy measure``: the
    statistic ``stat`` of split ``split`` (minus ``minus`` of the same split, when given)
    lies in ``[low, high]``."""

    split: str
    stat: str
    low: float
    high: float = float("inf")
    minus: str | None = None

    @property
    def label(self) -> str:
        return f"{self.split} {self.stat}" + (f" - {self.minus}" if self.minus else "")

    def check(self, measured: dict[str, Any]) -> tuple[str, float, str, bool]:
        """(label, value, wanted, ok) on ``divrl toy measure``'s measurements."""
        stats = measured["splits"][self.split]
        value = stats.get(self.stat, float("nan"))
        if self.minus is not None:
            value -= stats.get(self.minus, float("nan"))
        want = f">= {self.low}" if self.high == float("inf") else f"in [{self.low}, {self.high}]"
        return self.label, value, want, self.low <= value <= self.high


@dataclass(frozen=True)
class SplitSizes:
    """The prompts of the classic splits (``train``, ``test`` in domain, ``cross_domain``,
    ``ood_math``), for a world config that has them (SQL, countdown; a world with other
    splits declares its own sizes). A world's key hashes its config with sorted keys, so
    where these fields sit in a subclass does not change it."""

    n_train: int = field(default=1024, metadata={"help": "RL training prompts"})
    n_test: int = field(default=256, metadata={"help": "in-domain test prompts"})
    n_cross: int = field(default=256, metadata={"help": "cross-domain prompts"})
    n_math: int = field(default=256, metadata={"help": "out-of-domain math prompts"})

    def __post_init__(self) -> None:
        if min(self.n_train, self.n_test, self.n_cross, self.n_math) < 1:
            raise ValueError("every split needs at least one prompt")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ToyWorld:
    """A built toy world (paths are absolute)."""

    root: Path
    model_dir: Path
    data_dir: Path
    db_dir: Path
    splits: dict[str, Path]
    seed: int
    size: str

    @classmethod
    def load(cls, root: str | Path) -> ToyWorld:
        root = Path(root).resolve()
        manifest = json.loads((root / "world.json").read_text())
        return cls(
            root=root,
            model_dir=root / "model",
            data_dir=root / "data",
            db_dir=root / "db",
            # the world's own splits, in its order (world.json records their sizes)
            splits={
                s: root / "data" / f"{s}.jsonl" for s in manifest.get("splits", CLASSIC_SPLITS)
            },
            seed=manifest["seed"],
            size=manifest["size"],
        )

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads((self.root / "world.json").read_text())


def default_cache_dir() -> Path:
    env = os.environ.get("DIVRL_CACHE_DIR")
    return Path(env) / "toy" if env else Path.home() / ".cache" / "divrl" / "toy"


def cached_world(
    cache_dir: str | Path | None, name: str, build: Callable[[Path, Path], Any]
) -> ToyWorld:
    """The world ``<cache_dir>/<name>``: loaded when built, else ``build(tmp, final)`` in
    a temporary directory first (:func:`build_in_cache`). ``cache_dir`` defaults to
    ``$DIVRL_CACHE_DIR/toy`` or ``~/.cache/divrl/toy``."""
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    final = (cache / name).resolve()
    if (final / "world.json").exists():
        return ToyWorld.load(final)
    return build_in_cache(final, lambda tmp: build(tmp, final))


def build_in_cache(final: Path, build: Callable[[Path], Any]) -> ToyWorld:
    """Run ``build(tmp)`` in a temporary directory beside ``final`` and rename it into
    place, so that an interrupted build leaves nothing that looks finished; every world
    kind is cached this way."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build(tmp)
        try:
            tmp.rename(final)
        except OSError:
            # another process finished the same world first; theirs is identical
            if not (final / "world.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ToyWorld.load(final)


def shipped_or_trained(
    model_dir: Path, key: str, pretrained_dir: Path | None, train: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """The base model's SFT stats: copied from ``pretrained_dir`` when the model shipped
    there was built for world ``key`` (None: always train), else ``train()``'s."""
    if pretrained_dir is not None and shipped_key(pretrained_dir) == key:
        return copy_shipped_model(pretrained_dir, model_dir)
    return train()


def write_manifest(
    out: Path,
    world: str,
    seed: int,
    size: str,
    key: str,
    build_version: str,
    cfg: Any,
    splits: dict[str, int],
    timings: dict[str, float],
    stats: dict[str, Any],
    start: float,
) -> None:
    """``world.json``: what was built (every world kind writes the same fields)."""
    manifest = {
        "world": world,
        "seed": seed,
        "size": size,
        "key": key,
        "build_version": build_version,
        "config": cfg.to_dict(),
        "n_parameters": count_parameters(out / "model"),
        "splits": splits,
        "answer_marker": ANSWER_MARKER,
        **timings,
        **stats,
        "build_seconds": time.time() - start,
    }
    (out / "world.json").write_text(json.dumps(manifest, indent=2) + "\n")


def train_and_save(
    model_dir: Path,
    tokenizer: Any,
    corpus: list[tuple[str, str]],
    model_cfg: ToyModelConfig,
    sft_cfg: SFTConfig,
    seed: int,
    progress: bool,
    **extra_stats: Any,
) -> dict[str, Any]:
    """Supervised training of a fresh base model on ``corpus`` into ``model_dir`` (model,
    tokenizer, ``sft_stats.json``: the SFT stats with ``extra_stats``); the stats."""
    pairs = encode_pairs(tokenizer, corpus, model_cfg.max_length)
    model = build_model(model_cfg, tokenizer, seed)
    stats = train_sft(model, pairs, sft_cfg, tokenizer.pad_token_id, seed, progress=progress)
    stats["model_source"] = "trained"
    stats["sft_examples"] = len(pairs)
    stats.update(extra_stats)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (model_dir / "sft_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def shipped_key(pretrained_dir: Path) -> str | None:
    """World key of the model shipped in ``pretrained_dir``, or None when none is shipped."""
    path = pretrained_dir / "world_key.txt"
    return path.read_text().strip() if path.exists() else None


def copy_shipped_model(pretrained_dir: Path, model_dir: Path) -> dict[str, Any]:
    """Copy a shipped base model into ``model_dir``; its SFT stats, marked with where the
    model came from."""
    for name in SHIPPED_FILES:
        shutil.copy2(pretrained_dir / name, model_dir / name)
    stats = json.loads((pretrained_dir / "sft_stats.json").read_text())
    # by its place in the package, not this checkout's absolute path: the cache is shared
    # by every checkout and virtual environment of the user
    stats["model_source"] = f"shipped with divrl (divrl/toy/{pretrained_dir.name})"
    return stats


def model_source_label(source: str) -> str:
    """A manifest's ``model_source`` as shown: caches built by older versions recorded the
    absolute path of the checkout that built them, shown by its place in the package."""
    p = Path(source)
    if p.is_absolute() and p.parent.name == "toy" and p.parent.parent.name == "divrl":
        return f"shipped with divrl (divrl/toy/{p.name})"
    return source


def ship_model(world: ToyWorld, pretrained_dir: Path) -> Path:
    """Copy ``world``'s model into ``pretrained_dir`` (for maintainers: the copy is what
    later builds with the same settings use instead of training)."""
    pretrained_dir.mkdir(exist_ok=True)
    for name in SHIPPED_FILES:
        shutil.copy2(world.model_dir / name, pretrained_dir / name)
    (pretrained_dir / "world_key.txt").write_text(world.manifest["key"] + "\n")
    return pretrained_dir


def count_parameters(model_dir: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118


def encode_pairs(
    tokenizer, corpus: list[tuple[str, str]], max_length: int
) -> list[tuple[list[int], list[int]]]:
    """Token ids of (prompt, response + eos); prompt and response are encoded separately,
    exactly as a sampler that appends a response to the encoded prompt sees them."""
    prompts = tokenizer([p for p, _ in corpus])["input_ids"]
    responses = tokenizer([r for _, r in corpus])["input_ids"]
    pairs = [(p, [*r, tokenizer.eos_token_id]) for p, r in zip(prompts, responses, strict=True)]
    longest = max(len(p) + len(r) for p, r in pairs)
    if longest > max_length:
        raise ValueError(f"an SFT example has {longest} tokens > max_length {max_length}")
    return pairs


def math_sft_pair(
    rng: random.Random, math_cfg: toy_math.ToyMathConfig, held_out: set[str]
) -> tuple[str, str] | None:
    """A supervised (prompt, sampled worked solution) pair of a fresh toy math problem, or
    None when the problem is a held-out prompt (the worlds' corpora mix these in)."""
    p = toy_math.sample_problem(rng)
    if toy_math.prompt_text(p) in held_out:
        return None
    text, _, _ = toy_math.sample_response(p, rng, math_cfg)
    return toy_math.prompt_text(p) + ANSWER_MARKER, text


def distinct_problems(rng: random.Random, n: int, exclude: set[str]) -> list[toy_math.MathProblem]:
    seen, out = set(exclude), []
    while len(out) < n:
        p = toy_math.sample_problem(rng)
        if toy_math.prompt_text(p) not in seen:
            seen.add(toy_math.prompt_text(p))
            out.append(p)
    return out


def math_row(p: toy_math.MathProblem, index: int) -> Example:
    return Example(
        id=f"ood_math-{index}",
        prompt=toy_math.prompt_text(p) + ANSWER_MARKER,
        data_source="toy_math",
        ground_truth=str(p.answer),
        extra_info={"index": index, "split": "ood_math", "family": p.template, "hard": False},
    )


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
