"""Registry mapping ``data_source`` names to verifiers.

A verifier is split in two so that the common case stays cheap and the rare pathological
case cannot hang the caller:

- :meth:`Verifier.quick` runs in the calling process and must be fast and bounded
  (extraction plus trivial comparisons). It returns a result when it can decide, else
  ``None``.
- :meth:`Verifier.verify` does the real work (math-verify, SQL execution) and runs in a
  worker process that is killed when it overruns its time limit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from divrl.rewards.types import ScoreResult


class Verifier:
    """Base class for a verifier. Subclasses must be picklable (they travel to workers)."""

    #: default hard time limit per item, seconds
    default_timeout: float = 5.0

    def quick(
        self, solution_str: str, ground_truth: str, extra_info: dict[str, Any]
    ) -> ScoreResult | None:
        """Decide cheaply in the caller's process, or return ``None`` to go to a worker."""
        return None

    def extract(self, solution_str: str, extra_info: dict[str, Any]) -> str | None:
        """The answer in a completion (bounded time); used to report what timed out."""
        return None

    def check_inputs(self, ground_truth: str, extra_info: dict[str, Any]) -> None:
        """Raise ``ValueError`` for configuration errors (not model errors) before scoring."""

    def verify(
        self, solution_str: str, ground_truth: str, extra_info: dict[str, Any], deadline: float
    ) -> ScoreResult:
        """Full verification; ``deadline`` is a ``time.monotonic()`` value to stay under."""
        raise NotImplementedError


class FunctionVerifier(Verifier):
    """Wraps ``fn(solution_str, ground_truth, extra_info) -> float | ScoreResult``."""

    def __init__(self, fn: Callable[..., float | ScoreResult], isolate: bool = True):
        self.fn = fn
        self.isolate = isolate

    def _call(self, solution_str: str, ground_truth: str, extra_info: dict[str, Any]):
        out = self.fn(solution_str, ground_truth, extra_info)
        if isinstance(out, ScoreResult):
            return out
        score = float(out)
        return ScoreResult(score, None, "correct" if score > 0 else "wrong")

    def quick(self, solution_str, ground_truth, extra_info):
        return None if self.isolate else self._call(solution_str, ground_truth, extra_info)

    def verify(self, solution_str, ground_truth, extra_info, deadline):
        return self._call(solution_str, ground_truth, extra_info)


_REGISTRY: dict[str, Verifier] = {}
_CANONICAL: dict[str, str] = {}  # lower-cased name or alias -> canonical name
_FINDERS: list[Callable[[str], object]] = []
_SOUGHT: set[str] = set()  # lower-cased data sources the finders were asked for


def register_source_finder(finder: Callable[[str], object]) -> None:
    """Add ``finder``, called with a lower-cased data source that no verifier or profile
    is registered for; it imports the module that registers one, if it knows it.

    The way a layer above the rewards makes its own data sources known on demand without
    the rewards importing it: the toy worlds add one (:mod:`divrl.toy.worlds`), which
    imports the module of the world that declares the source, so a world's verifier can
    live in the world's module and still score its rows in any ``divrl`` process.
    """
    if finder not in _FINDERS:
        _FINDERS.append(finder)
    _SOUGHT.clear()  # a new finder may know a source the others did not


def find_source(data_source: str) -> None:
    """Ask the finders once per process for ``data_source`` (a lookup's miss)."""
    key = str(data_source).lower()
    if key in _SOUGHT:
        return
    _SOUGHT.add(key)  # first: a module a finder imports may look the source up itself
    for finder in list(_FINDERS):
        finder(key)


def register_verifier(name: str, *aliases: str, isolate: bool = True):
    """Decorator registering a verifier under ``name`` and ``aliases`` (case-insensitive).

    Accepts a :class:`Verifier` subclass (instantiated with no arguments), a ``Verifier``
    instance, or a plain function ``fn(solution_str, ground_truth, extra_info) -> float``.
    Plain functions run in a worker process with a hard time limit unless
    ``isolate=False``; they must then be importable by module name (not defined in
    ``__main__`` of an interactive session).

    Example::

        @register_verifier("exact", "exact_match")
        def exact(solution_str, ground_truth, extra_info):
            return float(solution_str.strip() == ground_truth.strip())
    """

    def decorator(obj):
        if isinstance(obj, Verifier):
            verifier = obj
        elif isinstance(obj, type) and issubclass(obj, Verifier):
            verifier = obj()
        elif callable(obj):
            verifier = FunctionVerifier(obj, isolate=isolate)
        else:
            raise TypeError(f"cannot register {obj!r} as a verifier")
        for key in (name, *aliases):
            _CANONICAL[key.lower()] = name
        _REGISTRY[name] = verifier
        return obj

    return decorator


def registered_sources() -> list[str]:
    """All registered names and aliases, sorted."""
    return sorted(_CANONICAL)


def get_verifier(data_source: str) -> tuple[str, Verifier]:
    """Return ``(canonical name, verifier)`` for a data source; ``ValueError`` if unknown."""
    key = str(data_source).lower()
    if key not in _CANONICAL:
        find_source(key)
    if key not in _CANONICAL:
        raise ValueError(
            f"unknown data_source {data_source!r}; registered: {', '.join(registered_sources())}. "
            "Register a new one with divrl.rewards.register_verifier."
        )
    name = _CANONICAL[key]
    return name, _REGISTRY[name]
