"""The toy worlds: synthetic benchmarks and tiny base models built on a CPU.

Importing the package is cheap: everything (the world builder, the model, the registry) is
loaded on first use. The toy sources' benchmark profiles (verifier, equivalence, solution
style) are built in (:mod:`divrl.rewards.builtin_profiles`).
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the submodule that defines it (imported on first access)
_LAZY = {
    "ANSWER_MARKER": "divrl.toy.tokenizer",
    "build_tokenizer": "divrl.toy.tokenizer",
    "SIZES": "divrl.toy.sql_world",
    "SPLITS": "divrl.toy.sql_world",
    "ToyWorld": "divrl.toy.kit",
    "ToyWorldConfig": "divrl.toy.sql_world",
    "ensure_toy_world": "divrl.toy.sql_world",
    "read_rows": "divrl.toy.kit",
    "WorldScaffold": "divrl.toy.scaffold",
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
