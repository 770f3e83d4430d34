"""Benchmark profiles: everything divrl knows about one kind of task, registered at once.

The public home of the profile registry; the registry itself is
:mod:`divrl.rewards.profiles` (its docstring says what a profile carries), beside the
built-in table (:mod:`divrl.rewards.builtin_profiles`) and the verifiers, so that nothing
in the rewards imports this module back.
"""

from __future__ import annotations

from typing import Any

from divrl.rewards import profiles as _registry

__all__ = list(_registry.__all__)


def __getattr__(name: str) -> Any:
    # every public name of the registry, read from it (one list of names: its __all__)
    if name in __all__:
        return getattr(_registry, name)
    raise AttributeError(f"module 'divrl.profiles' has no attribute {name!r}")
