"""The toy worlds' solution-style classifiers, named by their benchmark profiles.

The ``toy_math``, ``countdown`` and ``sparks`` profiles (:mod:`divrl.rewards.builtin_profiles`) name
these functions as ``"divrl.toy.styles:..."``, so the evaluation imports them only when it
labels those sources. Toy SQL needs none here: its profile uses the one SQL classifier
(:func:`divrl.evaluation.styles.sql_shape`; each generator style's label is
:data:`divrl.toy.toy_sql.STYLE_SHAPES`). Toy math's style is its method, ``steps`` /
``expr`` / ``direct`` (:func:`divrl.toy.toy_math.math_style`). Countdown's style is the
operator multiset of its answer attempt, e.g. ``+*``
(:func:`divrl.rewards.countdown_reward.operator_style`).
"""

from __future__ import annotations

from divrl.toy.toy_math import math_style

__all__ = ["countdown_style", "sparks_style", "toy_math_style"]


def toy_math_style(text: str, extracted: str | None) -> str | None:
    """Toy math's style: the method of the response (steps, one expression or direct)."""
    return math_style(text)


def countdown_style(text: str, extracted: str | None) -> str | None:
    """Countdown's style: the operator multiset of the answer attempt."""
    from divrl.rewards.countdown_reward import answer_attempt, operator_style

    return operator_style(extracted if extracted is not None else answer_attempt(text))


def sparks_style(text: str, extracted: str | None) -> str | None:
    """The sparks world's style: ``check`` when the response takes the spark move, else
    ``direct``."""
    from divrl.rewards.sparks_reward import has_spark

    return "check" if has_spark(text) else "direct"
