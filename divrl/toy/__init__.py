"""The toy world: a synthetic SQL + math benchmark and a tiny base model built on a CPU."""

from divrl.toy.tokenizer import ANSWER_MARKER, build_tokenizer
from divrl.toy.world import SIZES, SPLITS, ToyWorld, ToyWorldConfig, ensure_toy_world, read_rows

__all__ = [
    "ANSWER_MARKER",
    "SIZES",
    "SPLITS",
    "ToyWorld",
    "ToyWorldConfig",
    "build_tokenizer",
    "ensure_toy_world",
    "read_rows",
]
