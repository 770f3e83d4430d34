"""The typed options of a registered component (a policy loss, an advantage estimator).

A component declares its scalar options as a frozen dataclass subclassing :class:`Options`,
each field made with :func:`option` (its default, help text and numeric bounds); the bounds
are checked once, when the options are built, and the message names the component::

    @dataclass(frozen=True)
    class MyOptions(Options):
        KIND: ClassVar[str] = "advantage estimator"
        NAME: ClassVar[str] = "mine"
        k: int = option(4, "responses per draw", 1)

A new component in its own module imports these two names from here (they are public).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = ["Options", "option"]


def option(
    default: Any,
    help: str,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    choices: tuple[str, ...] = (),
) -> Any:
    """A dataclass field with its help text, numeric bounds (``None`` = unbounded) and, for a
    text option, its valid values (``choices``)."""
    bounds = (low, high, low_open, high_open)
    return field(default=default, metadata={"help": help, "bounds": bounds, "choices": choices})


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    left = "(" if low_open else "["
    right = ")" if high_open else "]"
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    return f"{left}{lo}, {hi}{right}"


def _outside(value: float, low, high, low_open: bool, high_open: bool) -> bool:
    if low is not None and (value <= low if low_open else value < low):
        return True
    return high is not None and (value >= high if high_open else value > high)


@dataclass(frozen=True)
class Options:
    """Base class: every field's bounds and choices checked when the options are built.

    Subclasses set ``KIND`` (what the component is, e.g. ``"policy loss"``) and the
    component's registered name (``label()`` returns it; ``NAME`` by default).
    """

    KIND: ClassVar[str] = "component"
    NAME: ClassVar[str] = ""

    @classmethod
    def label(cls) -> str:
        """``<kind> '<name>'``, the prefix of every message about these options."""
        return f"{cls.KIND} {cls.NAME!r}"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            choices = f.metadata.get("choices", ())
            if choices and value not in choices:
                raise ValueError(
                    f"{self.label()}: {f.name}={value!r} is not one of {', '.join(choices)} "
                    f"({f.metadata['help']})"
                )
            low, high, low_open, high_open = f.metadata.get("bounds", (None,) * 4)
            if value is None or isinstance(value, (bool, str)):
                continue
            if _outside(float(value), low, high, low_open, high_open):
                interval = _interval(low, high, low_open, high_open)
                raise ValueError(
                    f"{self.label()}: {f.name}={value} must be in {interval} ({f.metadata['help']})"
                )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def build(cls, **overrides: Any) -> Options:
        """The validated options: the defaults with ``overrides`` applied (``ValueError``
        naming the component and its options on a key it does not declare)."""
        unknown = sorted(set(overrides) - set(cls.names()))
        if unknown:
            raise ValueError(
                f"{cls.label()} has no option {unknown[0]!r}; its options: "
                + (", ".join(cls.names()) or "none")
            )
        try:
            return cls(**overrides)
        except TypeError as exc:
            raise ValueError(f"{cls.label()}: {exc}") from exc
