"""The benchmark-profile registry (:mod:`divrl.profiles` is its public home): everything divrl knows about one kind of task, registered at once.

A profile is keyed by the rows' ``data_source`` (case-insensitive, with aliases) and
carries, each optional:

- ``verifier``: how a response is scored (a :class:`divrl.rewards.Verifier`, a subclass, or
  a function ``(solution_str, ground_truth, extra_info) -> float``), registered with
  :func:`divrl.rewards.register_verifier` under the profile's names;
- ``converter``: ``convert(src, split, *, template, limit, seed) -> list[Example]`` from the
  benchmark's official layout (``divrl data convert <name>``; a module path or a module);
- ``equivalence``: a factory of the :class:`divrl.evaluation.equivalence.AnswerEquivalence`
  that clusters its answers (Pass@k's distinct answers, maj@k);
- ``style``: ``(response_text, extracted_answer) -> label | None``, the solution-style
  classifier of the diversity measures;
- ``needs_database``: rows carry a SQLite database (``extra_info.db_path`` / ``db_id``),
  resolved and checked when the data is loaded.

A hook may be given as the object itself or as ``"module:attribute"`` (imported on first
use), so this module imports nothing above the rewards and a profile can name evaluation
code without the data layer importing it. Every built-in benchmark (math, gsm8k,
math_verify, bird, spider, sql and the toy worlds' sources) is one profile, registered in
:mod:`divrl.rewards.builtin_profiles`; the lookups consult only this registry. A data source
with a verifier but no profile (:func:`divrl.rewards.register_verifier` alone) is clustered
by exact string equality, has no style and needs no database.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from divrl.rewards.builtin_profiles import BUILTIN_PROFILES
from divrl.rewards.registry import find_source, register_verifier, registered_sources
from divrl.rewards.types import BenchmarkProfile

__all__ = [
    "BenchmarkProfile",
    "get_profile",
    "profile_hook",
    "profile_names",
    "register_profile",
    "update_profile",
]


_PROFILES: dict[str, BenchmarkProfile] = {}  # lower-cased name or alias -> profile
_REGISTERED: set[str] = set()  # keys claimed by register_profile (not by update_profile)


def register_profile(profile: BenchmarkProfile, *, replace: bool = False) -> BenchmarkProfile:
    """Register ``profile`` (and its verifier, when it has one) under its name and aliases.

    A name already claimed by another registration, or a verifier name already in
    :mod:`divrl.rewards`, is refused unless ``replace=True``: a silent overwrite would
    change how every row of that data source is scored or read. Hooks set earlier with
    :func:`update_profile` are kept where ``profile`` leaves them unset.
    """
    if not replace:
        taken = [k for k in profile.keys if k in _REGISTERED]
        if profile.verifier is not None:
            taken += [k for k in profile.keys if k in registered_sources()]
        if taken:
            raise ValueError(
                f"benchmark profile {profile.name!r}: {sorted(set(taken))} already registered "
                "(a profile or a verifier of that name): pick other names, or pass replace=True"
            )
    earlier = _PROFILES.get(profile.name.lower())
    if earlier is not None:
        kept = {
            f.name: getattr(earlier, f.name)
            for f in dataclasses.fields(profile)
            if f.name in ("converter", "equivalence", "style") and getattr(profile, f.name) is None
        }
        profile = dataclasses.replace(profile, **kept)
    if profile.verifier is not None:
        register_verifier(profile.name, *profile.aliases)(profile.verifier)
    for key in profile.keys:
        _PROFILES[key] = profile
        _REGISTERED.add(key)
    return profile


def update_profile(data_source: str, **hooks: Any) -> BenchmarkProfile:
    """Set ``hooks`` on ``data_source``'s profile (created, with no other hook, when it has
    none): how a module adds one hook to a benchmark registered elsewhere
    (:func:`divrl.evaluation.register_style`, :func:`divrl.evaluation.register_equivalence`)."""
    current = _PROFILES.get(data_source.lower()) or BenchmarkProfile(data_source)
    if "verifier" in hooks:
        raise ValueError("a verifier is registered with the profile (register_profile)")
    updated = dataclasses.replace(current, **hooks)
    for key in updated.keys:
        _PROFILES[key] = updated
    return updated


def get_profile(data_source: str) -> BenchmarkProfile | None:
    """The profile registered for ``data_source`` (or one of its aliases), or None (after
    the source finders had their chance: :func:`divrl.rewards.registry.find_source`)."""
    key = str(data_source).lower()
    if key not in _PROFILES:
        find_source(key)
    return _PROFILES.get(key)


def profile_names() -> list[str]:
    """The registered profiles' names (not their aliases), sorted."""
    return sorted({p.name for p in _PROFILES.values()})


def profile_hook(data_source: str, hook: str) -> Any:
    """``data_source``'s ``hook`` (``converter``, ``equivalence``, ``style``), imported when
    given as ``"module:attribute"``; None when the profile or the hook is not set."""
    profile = get_profile(data_source)
    target = getattr(profile, hook) if profile is not None else None
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


# the built-in benchmarks register with the registry itself, so that a lookup made through
# any module sees them and nothing imports this module back
for _profile in BUILTIN_PROFILES:
    register_profile(_profile)
