"""Build and cache the countdown toy world: data splits and a base model that searches.

Written on the world scaffold (:class:`divrl.toy.scaffold.WorldScaffold`: the cache,
build, manifest and loading are the scaffold's); ``WORLD`` is what the registry names and
``ensure_countdown_world()`` its ``ensure``. A world lives in
``<cache_dir>/countdown-<size>-seed<seed>-<hash>/`` (the kit's layout, no databases); the
hash covers every generator, model and training setting.

Splits (verl rows): ``train`` (RL prompts) and ``test`` (in domain: 4 numbers, targets
``target_min..target_max``), ``cross_domain`` (the same numbers, larger targets, never a
target in SFT or RL) and ``ood_math`` (the toy math problems, 15% of the SFT corpus).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from divrl.data import Example
from divrl.rewards.countdown_reward import format_ground_truth
from divrl.toy import countdown, kit, toy_math
from divrl.toy.kit import SplitSizes, ToyWorld, distinct_problems, math_row, math_sft_pair
from divrl.toy.model import ToyModelConfig
from divrl.toy.scaffold import PresetScale, WorldScaffold
from divrl.toy.sft import SFTConfig
from divrl.toy.tokenizer import ANSWER_MARKER

#: Bump when generated data or training would change for the same settings.
BUILD_VERSION = "1"
#: The shipped seed-0 ``full`` base model (``divrl toy build --world countdown --ship``).
PRETRAINED_DIR = Path(__file__).parent / "pretrained_countdown"


@dataclass(frozen=True)
class CountdownWorldConfig(SplitSizes):
    """Everything that determines a countdown world besides the seed (cross domain: the
    same numbers with larger targets)."""

    countdown: countdown.CountdownConfig = field(default_factory=countdown.CountdownConfig)
    math: toy_math.ToyMathConfig = field(default_factory=toy_math.ToyMathConfig)
    model: ToyModelConfig = field(
        default_factory=lambda: ToyModelConfig(
            hidden_size=96, num_layers=4, num_heads=4, intermediate_size=256, max_length=128
        )
    )
    sft: SFTConfig = field(
        default_factory=lambda: SFTConfig(steps=600, batch_size=128, lr=3e-3, threads=1)
    )
    sft_math_share: float = field(
        default=0.15, metadata={"help": "share of toy math problems in the supervised corpus"}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.sft_math_share < 1.0:
            raise ValueError("sft_math_share must be in [0, 1)")


SIZES: dict[str, CountdownWorldConfig] = {
    "full": CountdownWorldConfig(),
    # seconds-long: loads, generates traces, rarely right (for tests of the plumbing)
    "tiny": CountdownWorldConfig(
        model=ToyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64),
        sft=SFTConfig(steps=30, batch_size=16, lr=3e-3, warmup_steps=3, threads=1),
        n_train=64,
        n_test=16,
        n_cross=16,
        n_math=16,
    ),
}


class CountdownWorld(WorldScaffold):
    """The countdown world on the scaffold (module docstring)."""

    name = "countdown"
    build_version = BUILD_VERSION
    sizes = SIZES
    pretrained_dir = PRETRAINED_DIR
    #: configs/toy/countdown/*.yaml's scale: prompts have ~12 tokens, traces of up to 6
    #: attempts fit 112 (context 128); lr 1e-4 (at 3e-4 GRPO's training reward fell 0.16 ->
    #: 0.07 in 44 steps, docs/toy_world.md); near-perfect = >= 2 of 8 (none of the first 64
    #: train prompts is 8/8 for the base), and the presampled correct responses are kept
    preset_scale = PresetScale(
        max_prompt_length=24,
        max_new_tokens=112,
        lr=1e-4,
        reference_threshold=2,
        keep_presampled=True,
        # its DAPO runs the DAPO paper's dynamic sampling and overlong shaping (20% of 112)
        method_settings={
            "dapo": {"algorithm.dynamic_sampling": True, "algorithm.overlong_buffer": 22}
        },
        not_generated={"lp_reg_toy": "no countdown twin (docs/toy_world.md)"},
    )
    pieces = countdown.PIECES
    #: adds the entropy and the distinct solutions (:mod:`divrl.toy.countdown_measure`)
    measure_with = "divrl.toy.countdown_measure:measure_world"
    format_with = "divrl.toy.countdown_measure:format_countdown_measurements"

    def generate(
        self, out: Path, final: Path, seed: int, cfg: Any
    ) -> tuple[dict[str, list[Example]], Any]:
        return make_splits(cfg, seed)

    def train_model(
        self, model_dir: Path, seed: int, cfg: Any, generated: Any, progress: bool
    ) -> dict[str, Any]:
        corpus = sft_corpus(cfg, seed, generated)
        solved = sum("ok" in r[-3:] for _, r in corpus) / len(corpus)
        return self.train_on(model_dir, corpus, cfg, seed, progress, sft_solved_share=solved)


WORLD = CountdownWorld()


def world_key(seed: int, size: str, cfg: CountdownWorldConfig) -> str:
    return WORLD.key(seed, size, cfg)


#: the countdown world for (``seed``, ``size``) from the cache, built first when it is not
#: there (:meth:`WorldScaffold.ensure`; ``full``'s seed-0 model ships in
#: ``pretrained_countdown``)
ensure_countdown_world = WORLD.ensure


def make_splits(cfg: CountdownWorldConfig, seed: int) -> tuple[dict[str, list[Example]], set[str]]:
    """The four splits' rows and the set of held-out prompt texts (test and math)."""
    rng = random.Random(f"countdown-world-splits-{seed}")
    seen: set[str] = set()

    def distinct(n: int, cross: bool) -> list[countdown.Problem]:
        out: list[countdown.Problem] = []
        while len(out) < n:
            p = countdown.sample_problem(rng, cfg.countdown, cross=cross)
            if countdown.prompt_text(p) not in seen:
                seen.add(countdown.prompt_text(p))
                out.append(p)
        return out

    train, test = distinct(cfg.n_train, False), distinct(cfg.n_test, False)
    cross = distinct(cfg.n_cross, True)
    math_ps = distinct_problems(rng, cfg.n_math, exclude=set())
    rows = {
        "train": [_row(p, i, "train") for i, p in enumerate(train)],
        "test": [_row(p, i, "test") for i, p in enumerate(test)],
        "cross_domain": [_row(p, i, "cross_domain") for i, p in enumerate(cross)],
        "ood_math": [math_row(p, i) for i, p in enumerate(math_ps)],
    }
    held_out = {countdown.prompt_text(p) for p in test} | {toy_math.prompt_text(p) for p in math_ps}
    return rows, held_out


def build_countdown_world(out: Path, **settings: Any) -> None:
    """Write a world into ``out`` (data, model, ``world.json``): :meth:`WorldScaffold.build`
    with ``out`` as its final place (no row names a file of the world)."""
    WORLD.build(out, out, **settings)


def sft_corpus(cfg: CountdownWorldConfig, seed: int, held_out: set[str]) -> list[tuple[str, str]]:
    """(prompt, response) pairs: fresh in-domain problems with sampled search traces, and
    toy math problems (``sft_math_share``); never a test or ood_math prompt, never a
    cross-domain target."""
    rng = random.Random(f"countdown-world-sft-{seed}")
    out: list[tuple[str, str]] = []
    while len(out) < cfg.sft.steps * cfg.sft.batch_size:
        if rng.random() < cfg.sft_math_share:
            pair = math_sft_pair(rng, cfg.math, held_out)
            out += [pair] if pair else []
        else:
            p = countdown.sample_problem(rng, cfg.countdown)
            if countdown.prompt_text(p) in held_out:
                continue
            trace, _ = countdown.sample_trace(rng, p, cfg.countdown)
            out.append((countdown.prompt_text(p) + ANSWER_MARKER, trace))
    return out


def shipped_key() -> str | None:
    """World key of the shipped countdown model, or None when none is shipped."""
    return kit.shipped_key(PRETRAINED_DIR)


def ship_model(world: ToyWorld) -> Path:
    """Copy ``world``'s model into :data:`PRETRAINED_DIR` (maintainers)."""
    return kit.ship_model(world, PRETRAINED_DIR)


def _row(p: countdown.Problem, index: int, split: str) -> Example:
    return Example(
        id=f"{split}-{index}",
        prompt=countdown.prompt_text(p) + ANSWER_MARKER,
        data_source="countdown",
        ground_truth=format_ground_truth(p.numbers, p.target),
        extra_info={
            "index": index,
            "split": split,
            "family": f"{len(p.numbers)}numbers",
            "hard": len(countdown.solutions(p)) <= 2,
        },
    )
