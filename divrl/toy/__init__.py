"""The toy worlds: synthetic benchmarks and tiny base models built on a CPU.

Importing the package is cheap: it registers the toy world's solution styles with
``divrl.evaluation.styles`` (so ``divrl eval`` labels toy math by its method) and loads
everything else (the world builder, the model, the registry) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from divrl.toy.styles import register_toy_styles

register_toy_styles()

# public name -> the submodule that defines it (imported on first access)
_LAZY = {
    "ANSWER_MARKER": "divrl.toy.tokenizer",
    "build_tokenizer": "divrl.toy.tokenizer",
    "SIZES": "divrl.toy.world",
    "SPLITS": "divrl.toy.world",
    "ToyWorld": "divrl.toy.world",
    "ToyWorldConfig": "divrl.toy.world",
    "ensure_toy_world": "divrl.toy.world",
    "read_rows": "divrl.toy.world",
    "WORLDS": "divrl.toy.worlds",
    "World": "divrl.toy.worlds",
    "get_world": "divrl.toy.worlds",
    "load_world": "divrl.toy.worlds",
    "DEFAULT_WORLD": "divrl.toy.worlds",
    "eval_splits": "divrl.toy.worlds",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'divrl.toy' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
