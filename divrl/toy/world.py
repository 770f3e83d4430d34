"""Build and cache the toy world: databases, data splits and the supervised base model.

``ensure_toy_world()`` is the entry point. A world lives in
``<cache_dir>/<size>-seed<seed>-<hash>/`` where the hash covers every generator, model and
training setting, so changing any of them builds a new world and a second call with the
same settings returns the cached one at once. A world is built in a temporary directory
next to its final place and renamed into it, so an interrupted build leaves nothing that
looks finished.

Layout::

    world.json          manifest: seed, size, settings, timings, final SFT loss
    db/<db_id>.sqlite   the toy SQL databases (train and held-out schemas)
    data/<split>.jsonl  train, test, cross_domain, ood_math (verl rows)
    model/              the base model and its tokenizer (``from_pretrained``-loadable)
"""

from __future__ import annotations

import dataclasses
import hashlib
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

from divrl.data import Example, write_examples
from divrl.toy import toy_math, toy_sql
from divrl.toy.model import ToyModelConfig, build_model
from divrl.toy.sft import SFTConfig, train_sft
from divrl.toy.tokenizer import ANSWER_MARKER, build_tokenizer

#: Bump when generated data or training would change for the same settings.
BUILD_VERSION = "2"
#: A shipped copy of a built base model (``divrl toy build --ship`` writes it); used instead
#: of training when its recorded world key matches the requested world.
PRETRAINED_DIR = Path(__file__).parent / "pretrained"
_SHIPPED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "sft_stats.json",
)
SPLITS = ("train", "test", "cross_domain", "ood_math")


@dataclass(frozen=True)
class SplitSizes:
    """The prompts of each split, as every world kind has them (``train``, ``test`` in
    domain, ``cross_domain``, ``ood_math``). A world's key hashes its config with sorted
    keys, so where these fields sit in a subclass does not change it."""

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
class ToyWorldConfig(SplitSizes):
    """Everything that determines a toy world besides the seed (SQL splits: the held-out
    databases are the cross-domain ones)."""

    sql: toy_sql.ToySQLConfig = field(default_factory=toy_sql.ToySQLConfig)
    math: toy_math.ToyMathConfig = field(default_factory=toy_math.ToyMathConfig)
    model: ToyModelConfig = field(default_factory=ToyModelConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    sft_math_share: float = field(
        default=0.3, metadata={"help": "share of math problems in the supervised corpus"}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.sft_math_share <= 1.0:
            raise ValueError("sft_math_share must be in [0, 1]")


SIZES: dict[str, ToyWorldConfig] = {
    "full": ToyWorldConfig(),
    # seconds-long: for tests that need a world that loads, generates and scores
    "tiny": ToyWorldConfig(
        sql=toy_sql.ToySQLConfig(n_train_dbs=4, n_cross_dbs=2, rows=12, parents=3),
        model=ToyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64),
        sft=SFTConfig(steps=30, batch_size=16, lr=3e-3, warmup_steps=3, threads=1),
        n_train=64,
        n_test=16,
        n_cross=16,
        n_math=16,
    ),
    # tens of seconds: a model that already earns some reward (for learning-signal tests)
    "small": ToyWorldConfig(
        sql=toy_sql.ToySQLConfig(n_train_dbs=4, n_cross_dbs=2, rows=12, parents=3),
        model=ToyModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128),
        sft=SFTConfig(steps=150, batch_size=32, lr=1e-2, warmup_steps=5, threads=1),
        n_train=128,
        n_test=32,
        n_cross=32,
        n_math=32,
    ),
}


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
            splits={s: root / "data" / f"{s}.jsonl" for s in SPLITS},
            seed=manifest["seed"],
            size=manifest["size"],
        )

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads((self.root / "world.json").read_text())


def default_cache_dir() -> Path:
    env = os.environ.get("DIVRL_CACHE_DIR")
    return Path(env) / "toy" if env else Path.home() / ".cache" / "divrl" / "toy"


def world_key(seed: int, size: str, cfg: ToyWorldConfig) -> str:
    blob = json.dumps(
        {"version": BUILD_VERSION, "seed": seed, "size": size, "config": cfg.to_dict()},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def ensure_toy_world(
    cache_dir: str | Path | None = None,
    *,
    seed: int = 0,
    size: str = "full",
    progress: bool = True,
    use_shipped: bool = True,
) -> ToyWorld:
    """Return the toy world for (``seed``, ``size``), building it first if it is not cached.

    ``size="full"`` trains the base model of the benchmark (minutes on 2 CPU cores);
    ``size="tiny"`` builds a seconds-long miniature for tests (its model generates text
    but is rarely right); ``size="small"`` (tens of seconds) one whose model is right on
    some SQL prompts, for tests that need a learning signal. The cache directory defaults
    to ``$DIVRL_CACHE_DIR/toy`` or ``~/.cache/divrl/toy``. With ``use_shipped`` the model
    shipped in ``divrl/toy/pretrained`` is copied instead of trained when it was built with
    exactly these settings (the data is always generated).
    """
    if size not in SIZES:
        raise ValueError(f"unknown toy world size {size!r}; choose one of {sorted(SIZES)}")
    cfg = SIZES[size]
    name = f"{size}-seed{seed}-{world_key(seed, size, cfg)}"
    return cached_world(
        cache_dir,
        name,
        lambda tmp, final: build_world(
            tmp, final, seed=seed, size=size, cfg=cfg, progress=progress, use_shipped=use_shipped
        ),
    )


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


@dataclass
class _GeneratedData:
    """What the data stage leaves for the model stage: the rows and the held-out prompts."""

    rows: dict[str, list[Example]]
    train_dbs: list[toy_sql.Database]
    held_out: set[str]
    held_out_math: set[str]


def build_world(
    out: Path,
    final: Path,
    *,
    seed: int,
    size: str,
    cfg: ToyWorldConfig,
    progress: bool = True,
    use_shipped: bool = True,
) -> None:
    """Write a world into ``out``; rows point at databases under ``final`` (its home after
    the rename)."""
    start = time.time()
    for sub in ("db", "data", "model"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    data = _generate_data(out, final, seed, cfg)
    timings = {"data_seconds": time.time() - start}
    key = world_key(seed, size, cfg)
    stats = shipped_or_trained(
        out / "model",
        key,
        PRETRAINED_DIR if use_shipped else None,
        lambda: _train_base_model(out / "model", seed, cfg, data, progress),
    )
    counts = {name: len(r) for name, r in data.rows.items()}
    write_manifest(out, "sql", seed, size, key, BUILD_VERSION, cfg, counts, timings, stats, start)


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


def _generate_data(out: Path, final: Path, seed: int, cfg: ToyWorldConfig) -> _GeneratedData:
    """The databases (``out/db``) and the split files (``out/data``)."""
    train_schemas, cross_schemas = toy_sql.make_schemas(cfg.sql, seed)
    train_dbs = [toy_sql.make_database(s, cfg.sql, seed) for s in train_schemas]
    cross_dbs = [toy_sql.make_database(s, cfg.sql, seed) for s in cross_schemas]
    for db in train_dbs + cross_dbs:
        toy_sql.write_sqlite(db, out / "db" / f"{db.schema.db_id}.sqlite")

    rng = random.Random(f"toy-world-splits-{seed}")
    split_qs = toy_sql.sample_questions(
        rng, train_dbs, cfg.n_train + cfg.n_test, cfg.sql, cfg.sql.hard_share
    )
    # drawn together (distinct texts) and then shuffled, so that families whose question
    # space is small (argmax, join) are spread over both splits
    rng.shuffle(split_qs)
    train_qs, test_qs = split_qs[: cfg.n_train], split_qs[cfg.n_train :]
    cross_qs = toy_sql.sample_questions(
        rng, cross_dbs, cfg.n_cross, cfg.sql, cfg.sql.cross_hard_share
    )
    math_ps = distinct_problems(rng, cfg.n_math, exclude=set())
    rows = {
        "train": [_sql_row(q, i, "train", final) for i, (q, _) in enumerate(train_qs)],
        "test": [_sql_row(q, i, "test", final) for i, (q, _) in enumerate(test_qs)],
        "cross_domain": [
            _sql_row(q, i, "cross_domain", final) for i, (q, _) in enumerate(cross_qs)
        ],
        "ood_math": [math_row(p, i) for i, p in enumerate(math_ps)],
    }
    for name, examples in rows.items():
        write_examples(examples, out / "data" / f"{name}.jsonl")
    return _GeneratedData(
        rows=rows,
        train_dbs=train_dbs,
        held_out={toy_sql.prompt_text(q) for q, _ in test_qs},
        held_out_math={toy_math.prompt_text(p) for p in math_ps},
    )


def _train_base_model(
    model_dir: Path, seed: int, cfg: ToyWorldConfig, data: _GeneratedData, progress: bool
) -> dict[str, Any]:
    """Train the base model on the supervised corpus into ``model_dir``; its SFT stats.

    The corpus: fresh questions on the training databases (never the test prompts) and
    math problems (never the ood_math prompts), with sampled styles and errors.
    """
    tokenizer = build_tokenizer(cfg.model.max_length)
    corpus = sft_corpus(cfg, seed, data.train_dbs, data.held_out, data.held_out_math)
    return train_and_save(model_dir, tokenizer, corpus, cfg.model, cfg.sft, seed, progress)


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


def shipped_key(pretrained_dir: Path = PRETRAINED_DIR) -> str | None:
    """World key of the model shipped in ``pretrained_dir``, or None when none is shipped."""
    path = pretrained_dir / "world_key.txt"
    return path.read_text().strip() if path.exists() else None


def copy_shipped_model(pretrained_dir: Path, model_dir: Path) -> dict[str, Any]:
    """Copy a shipped base model into ``model_dir``; its SFT stats, marked with where the
    model came from."""
    for name in _SHIPPED_FILES:
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


def ship_model(world: ToyWorld, pretrained_dir: Path = PRETRAINED_DIR) -> Path:
    """Copy ``world``'s model into ``pretrained_dir`` (for maintainers: the copy is what
    later builds with the same settings use instead of training)."""
    pretrained_dir.mkdir(exist_ok=True)
    for name in _SHIPPED_FILES:
        shutil.copy2(world.model_dir / name, pretrained_dir / name)
    (pretrained_dir / "world_key.txt").write_text(world.manifest["key"] + "\n")
    return pretrained_dir


def count_parameters(model_dir: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118


def sft_corpus(
    cfg: ToyWorldConfig,
    seed: int,
    dbs: list[toy_sql.Database],
    held_out: set[str],
    held_out_math: set[str],
) -> list[tuple[str, str]]:
    """(prompt, response) pairs for ``steps * batch_size`` supervised examples."""
    rng = random.Random(f"toy-world-sft-{seed}")
    out: list[tuple[str, str]] = []
    n = cfg.sft.steps * cfg.sft.batch_size
    while len(out) < n:
        if rng.random() < cfg.sft_math_share:
            p = toy_math.sample_problem(rng)
            if toy_math.prompt_text(p) in held_out_math:
                continue
            text, _, _ = toy_math.sample_response(p, rng, cfg.math)
            out.append((toy_math.prompt_text(p) + ANSWER_MARKER, text))
        else:
            db = rng.choice(dbs)
            family = toy_sql.sample_family(rng, cfg.sql)
            q = toy_sql.sample_question(rng, db, family, rng.random() < cfg.sql.hard_share)
            if toy_sql.prompt_text(q) in held_out:
                continue
            query, _, _ = toy_sql.sample_response(q, db, rng, cfg.sql)
            out.append((toy_sql.prompt_text(q) + ANSWER_MARKER, query))
    return out


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


def distinct_problems(rng: random.Random, n: int, exclude: set[str]) -> list[toy_math.MathProblem]:
    seen, out = set(exclude), []
    while len(out) < n:
        p = toy_math.sample_problem(rng)
        if toy_math.prompt_text(p) not in seen:
            seen.add(toy_math.prompt_text(p))
            out.append(p)
    return out


def _sql_row(q: toy_sql.Question, index: int, split: str, root: Path) -> Example:
    return Example(
        id=f"{split}-{index}",
        prompt=toy_sql.prompt_text(q) + ANSWER_MARKER,
        data_source="toy_sql",
        ground_truth=toy_sql.gold_query(q),
        extra_info={
            "index": index,
            "split": split,
            "db_id": q.db.db_id,
            "db_path": str(root / "db" / f"{q.db.db_id}.sqlite"),
            "family": q.family,
            "hard": q.hard,
        },
    )


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
