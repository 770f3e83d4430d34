"""The toy SQL world: SQLite databases, SQL questions in domain, held-out databases cross
domain, toy math out of domain, and a base model trained on sampled solutions of both.

Written on the world scaffold (:class:`divrl.toy.scaffold.WorldScaffold`; the cache,
build, manifest and loading are the scaffold's). ``WORLD`` is what the registry
(:mod:`divrl.toy.worlds`) names; :func:`ensure_toy_world` is its ``ensure``. A world lives
in ``<cache_dir>/<size>-seed<seed>-<hash>/`` (no world-name prefix, and no world name in
the key: the layout of the worlds built before there were several kinds, kept so that the
shipped model's key still matches), with the kit's layout (:mod:`divrl.toy.kit`):
``db/<db_id>.sqlite`` holds the train and held-out databases.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from divrl.data import Example
from divrl.toy import kit, toy_math, toy_sql
from divrl.toy.kit import (
    SplitSizes,
    ToyWorld,
    distinct_problems,
    math_row,
    math_sft_pair,
)
from divrl.toy.model import ToyModelConfig
from divrl.toy.scaffold import MeasureTarget, PresetScale, WorldScaffold
from divrl.toy.sft import SFTConfig
from divrl.toy.tokenizer import ANSWER_MARKER

__all__ = [
    "BUILD_VERSION",
    "PRETRAINED_DIR",
    "SIZES",
    "SPLITS",
    "TARGETS",
    "WORLD",
    "SQLWorld",
    "ToyWorldConfig",
    "build_world",
    "ensure_toy_world",
    "sft_corpus",
    "ship_model",
    "shipped_key",
    "world_key",
]

#: Bump when generated data or training would change for the same settings.
BUILD_VERSION = "2"
#: A shipped copy of a built base model (``divrl toy build --ship`` writes it); used instead
#: of training when its recorded world key matches the requested world.
PRETRAINED_DIR = Path(__file__).parent / "pretrained"
SPLITS = kit.CLASSIC_SPLITS


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


#: the SQL world's design targets for its base model (``divrl toy measure`` checks them)
TARGETS = (
    MeasureTarget("test", "pass@1", 0.2, 0.7),
    MeasureTarget("train", "all_correct_share", 0.05, 0.40),
    MeasureTarget("test", "distinct_styles", 2.0),
    MeasureTarget("test", "pass@16", 0.15, minus="pass@1"),
    MeasureTarget("ood_math", "pass@1", 0.05),  # non-trivial
)


class SQLWorld(WorldScaffold):
    """The toy SQL world on the scaffold (module docstring)."""

    name = "sql"
    build_version = BUILD_VERSION
    sizes = SIZES
    splits = SPLITS
    pretrained_dir = PRETRAINED_DIR
    targets = TARGETS
    #: configs/toy/*.yaml's scale (`divrl toy presets --world sql` writes it)
    #: its DAPO runs the DAPO paper's dynamic sampling and overlong shaping (20% of 80)
    preset_scale = PresetScale(
        max_prompt_length=48,
        max_new_tokens=80,
        lr=3e-4,
        method_settings={
            "dapo": {"algorithm.dynamic_sampling": True, "algorithm.overlong_buffer": 16}
        },
    )

    def key(self, seed: int, size: str, cfg: Any) -> str:
        # without the world's name: the key the shipped model was built with
        blob = {"version": BUILD_VERSION, "seed": seed, "size": size, "config": cfg.to_dict()}
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]

    def folder(self, seed: int, size: str, key: str) -> str:
        return f"{size}-seed{seed}-{key}"

    def generate(
        self, out: Path, final: Path, seed: int, cfg: Any
    ) -> tuple[dict[str, list[Example]], Any]:
        data = _generate_data(out, final, seed, cfg)
        return data.rows, data

    def train_model(
        self, model_dir: Path, seed: int, cfg: Any, generated: Any, progress: bool
    ) -> dict[str, Any]:
        """The corpus: fresh questions on the training databases (never the test prompts)
        and math problems (never the ood_math prompts), with sampled styles and errors."""
        corpus = sft_corpus(
            cfg, seed, generated.train_dbs, generated.held_out, generated.held_out_math
        )
        return self.train_on(model_dir, corpus, cfg, seed, progress)


WORLD = SQLWorld()


def world_key(seed: int, size: str, cfg: ToyWorldConfig) -> str:
    return WORLD.key(seed, size, cfg)


#: the SQL world for (``seed``, ``size``) from the cache, built first when it is not there
#: (:meth:`WorldScaffold.ensure`; sizes: :data:`SIZES`)
ensure_toy_world = WORLD.ensure


#: write a world into ``out``; rows point at databases under ``final`` (its home after
#: the rename): :meth:`WorldScaffold.build`
build_world = WORLD.build


def shipped_key(pretrained_dir: Path = PRETRAINED_DIR) -> str | None:
    """World key of the model shipped in ``pretrained_dir``, or None when none is shipped."""
    return kit.shipped_key(pretrained_dir)


def ship_model(world: ToyWorld, pretrained_dir: Path = PRETRAINED_DIR) -> Path:
    """Copy ``world``'s model into ``pretrained_dir`` (for maintainers: the copy is what
    later builds with the same settings use instead of training)."""
    return kit.ship_model(world, pretrained_dir)


@dataclass
class _GeneratedData:
    """What the data stage leaves for the model stage: the rows and the held-out prompts."""

    rows: dict[str, list[Example]]
    train_dbs: list[toy_sql.Database]
    held_out: set[str]
    held_out_math: set[str]


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
    return _GeneratedData(
        rows=rows,
        train_dbs=train_dbs,
        held_out={toy_sql.prompt_text(q) for q, _ in test_qs},
        held_out_math={toy_math.prompt_text(p) for p in math_ps},
    )


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
            pair = math_sft_pair(rng, cfg.math, held_out_math)
            out += [pair] if pair else []
        else:
            db = rng.choice(dbs)
            family = toy_sql.sample_family(rng, cfg.sql)
            q = toy_sql.sample_question(rng, db, family, rng.random() < cfg.sql.hard_share)
            if toy_sql.prompt_text(q) in held_out:
                continue
            query, _, _ = toy_sql.sample_response(q, db, rng, cfg.sql)
            out.append((toy_sql.prompt_text(q) + ANSWER_MARKER, query))
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
