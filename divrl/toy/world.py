"""The old home of the SQL world and of the kit every world shares, kept so that old
imports work: the kit is :mod:`divrl.toy.kit`, the scaffold a world is written on
:mod:`divrl.toy.scaffold`, the SQL world :mod:`divrl.toy.sql_world`."""

from __future__ import annotations

from divrl.toy.kit import (
    SplitSizes,
    ToyWorld,
    build_in_cache,
    cached_world,
    copy_shipped_model,
    count_parameters,
    default_cache_dir,
    distinct_problems,
    encode_pairs,
    math_row,
    model_source_label,
    read_rows,
    shipped_or_trained,
    train_and_save,
    write_manifest,
)
from divrl.toy.sql_world import (
    BUILD_VERSION,
    PRETRAINED_DIR,
    SIZES,
    SPLITS,
    ToyWorldConfig,
    build_world,
    ensure_toy_world,
    sft_corpus,
    ship_model,
    shipped_key,
    world_key,
)

__all__ = [
    "BUILD_VERSION",
    "PRETRAINED_DIR",
    "SIZES",
    "SPLITS",
    "SplitSizes",
    "ToyWorld",
    "ToyWorldConfig",
    "build_in_cache",
    "build_world",
    "cached_world",
    "copy_shipped_model",
    "count_parameters",
    "default_cache_dir",
    "distinct_problems",
    "encode_pairs",
    "ensure_toy_world",
    "math_row",
    "model_source_label",
    "read_rows",
    "sft_corpus",
    "ship_model",
    "shipped_key",
    "shipped_or_trained",
    "train_and_save",
    "world_key",
    "write_manifest",
]
