"""Build and cache the sparks world: data splits and a base model with a rare, valuable check.

Written on the world scaffold (:class:`divrl.toy.scaffold.WorldScaffold`: the cache,
build, manifest and loading are the scaffold's); ``WORLD`` is what the registry names and
``ensure_sparks_world()`` its ``ensure``. A world lives in
``<cache_dir>/sparks-<size>-seed<seed>-<hash>/``; the hash covers every generator, model
and training setting.

Splits (verl rows): ``train`` (RL prompts, easy and hard as drawn), ``test`` (in domain,
drawn the same way) and ``hard`` (only problems whose largest number lies beyond the
glance: only the spark move can solve them). No test or hard prompt is in train or the
supervised corpus.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from divrl.data import Example
from divrl.rewards.sparks_reward import format_ground_truth
from divrl.toy import kit, sparks
from divrl.toy.kit import ToyWorld
from divrl.toy.model import ToyModelConfig
from divrl.toy.scaffold import PresetScale, WorldScaffold
from divrl.toy.sft import SFTConfig
from divrl.toy.tokenizer import ANSWER_MARKER

#: Bump when generated data or training would change for the same settings.
BUILD_VERSION = "4"
#: The shipped seed-0 ``full`` base model (``divrl toy build --world sparks --ship``).
PRETRAINED_DIR = Path(__file__).parent / "pretrained_sparks"
SPLITS = ("train", "test", "hard")


@dataclass(frozen=True)
class SparksWorldConfig:
    """Everything that determines a sparks world besides the seed."""

    sparks: sparks.SparksConfig = field(default_factory=sparks.SparksConfig)
    model: ToyModelConfig = field(
        default_factory=lambda: ToyModelConfig(
            hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_length=128
        )
    )
    sft: SFTConfig = field(
        default_factory=lambda: SFTConfig(steps=1600, batch_size=64, lr=3e-3, threads=1)
    )
    n_train: int = field(default=1024, metadata={"help": "RL training prompts"})
    n_test: int = field(default=256, metadata={"help": "in-domain test prompts"})
    n_hard: int = field(default=256, metadata={"help": "hard-only test prompts"})

    def __post_init__(self) -> None:
        if min(self.n_train, self.n_test, self.n_hard) < 1:
            raise ValueError("every split needs at least one prompt")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SIZES: dict[str, SparksWorldConfig] = {
    "full": SparksWorldConfig(),
    # seconds-long: loads, generates, scores (for tests of the plumbing)
    "tiny": SparksWorldConfig(
        model=ToyModelConfig(
            hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_length=128
        ),
        sft=SFTConfig(steps=40, batch_size=32, lr=1e-2, warmup_steps=3, threads=1),
        n_train=64,
        n_test=16,
        n_hard=16,
    ),
}


class SparksWorld(WorldScaffold):
    """The sparks world on the scaffold (module docstring)."""

    name = "sparks"
    build_version = BUILD_VERSION
    sizes = SIZES
    splits = SPLITS
    pretrained_dir = PRETRAINED_DIR
    #: configs/toy/sparks/*.yaml's scale: prompts have 25 tokens, the longest trace 88;
    #: every method on-policy with the whole step in one micro-batch, a checkpoint every
    #: 25 steps for the spark measurement; Lp-Reg's authors' micro-batches hold a whole
    #: virtual GPU's 32 rows (docs/sparks_world.md)
    preset_scale = PresetScale(
        max_prompt_length=32,
        max_new_tokens=96,
        lr=3e-4,
        total_steps=150,
        micro_batch_size=256,
        on_policy=True,
        lp_reg_micro_batch_tokens=4096,
        extra={"checkpoint.save_every": 25, "checkpoint.keep_last": 100},
        not_generated={
            "lp_reg_toy": "written by hand: rho 0.1 over the whole step (docs/sparks_world.md)"
        },
    )
    pieces = sparks.PIECES
    #: the spark measures (:mod:`divrl.toy.sparks_measure`) with Pass@k and entropy
    measure_with = "divrl.toy.sparks_measure:measure_world"
    format_with = "divrl.toy.sparks_measure:format_sparks_measurements"

    def generate(
        self, out: Path, final: Path, seed: int, cfg: Any
    ) -> tuple[dict[str, list[Example]], Any]:
        return make_splits(cfg, seed)

    def train_model(
        self, model_dir: Path, seed: int, cfg: Any, generated: Any, progress: bool
    ) -> dict[str, Any]:
        corpus, spark_share = sft_corpus(cfg, seed, generated)
        return self.train_on(model_dir, corpus, cfg, seed, progress, sft_spark_share=spark_share)


WORLD = SparksWorld()


def world_key(seed: int, size: str, cfg: SparksWorldConfig) -> str:
    return WORLD.key(seed, size, cfg)


#: the sparks world for (``seed``, ``size``) from the cache, built first when it is not
#: there (:meth:`WorldScaffold.ensure`; ``full``'s seed-0 model ships in
#: ``pretrained_sparks``)
ensure_sparks_world = WORLD.ensure


def make_splits(cfg: SparksWorldConfig, seed: int) -> tuple[dict[str, list[Example]], set[str]]:
    """The three splits' rows and the held-out prompt texts (test and hard)."""
    rng = random.Random(f"sparks-world-splits-{seed}")
    seen: set[str] = set()

    def distinct(n: int, hard: bool | None) -> list[sparks.Problem]:
        out: list[sparks.Problem] = []
        while len(out) < n:
            p = sparks.sample_problem(rng, cfg.sparks, hard=hard)
            if sparks.prompt_text(p) not in seen:
                seen.add(sparks.prompt_text(p))
                out.append(p)
        return out

    test, hard = distinct(cfg.n_test, None), distinct(cfg.n_hard, True)
    train = distinct(cfg.n_train, None)
    rows = {
        "train": [_row(p, i, "train", cfg) for i, p in enumerate(train)],
        "test": [_row(p, i, "test", cfg) for i, p in enumerate(test)],
        "hard": [_row(p, i, "hard", cfg) for i, p in enumerate(hard)],
    }
    return rows, {sparks.prompt_text(p) for p in test + hard}


def sft_corpus(
    cfg: SparksWorldConfig, seed: int, held_out: set[str]
) -> tuple[list[tuple[str, str]], float]:
    """(prompt, response) pairs drawn fresh (never a test or hard prompt), and the share
    of them that take the spark move."""
    rng = random.Random(f"sparks-world-sft-{seed}")
    out: list[tuple[str, str]] = []
    sparked = 0
    while len(out) < cfg.sft.steps * cfg.sft.batch_size:
        p = sparks.sample_problem(rng, cfg.sparks)
        if sparks.prompt_text(p) in held_out:
            continue
        trace, spark = sparks.sample_trace(rng, p, cfg.sparks)
        sparked += spark
        out.append((sparks.prompt_text(p) + ANSWER_MARKER, trace))
    return out, sparked / len(out)


def shipped_key() -> str | None:
    """World key of the shipped sparks model, or None when none is shipped."""
    return kit.shipped_key(PRETRAINED_DIR)


def ship_model(world: ToyWorld) -> Path:
    """Copy ``world``'s model into :data:`PRETRAINED_DIR` (maintainers)."""
    return kit.ship_model(world, PRETRAINED_DIR)


def _row(p: sparks.Problem, index: int, split: str, cfg: SparksWorldConfig) -> Example:
    hard = sparks.is_hard(p, cfg.sparks)
    return Example(
        id=f"{split}-{index}",
        prompt=sparks.prompt_text(p) + ANSWER_MARKER,
        data_source="sparks",
        ground_truth=format_ground_truth(p.numbers, cfg.sparks.glance),
        extra_info={"index": index, "split": split, "family": "max", "hard": hard},
    )
