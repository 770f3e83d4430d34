"""Benchmark profiles: everything divrl knows about one kind of task, registered at once.

The public home of the profile registry; the registry itself is
:mod:`divrl.rewards.profiles` (its docstring says what a profile carries), beside the
built-in table (:mod:`divrl.rewards.builtin_profiles`) and the verifiers, so that nothing
in the rewards imports this module back.
"""

from __future__ import annotations

from divrl.rewards.profiles import (
    BenchmarkProfile,
    get_profile,
    profile_hook,
    profile_names,
    register_profile,
    update_profile,
)

__all__ = [
    "BenchmarkProfile",
    "get_profile",
    "profile_hook",
    "profile_names",
    "register_profile",
    "update_profile",
]
