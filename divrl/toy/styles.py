"""The toy world's solution styles, registered with ``divrl.evaluation.styles``.

Toy SQL needs no entry: it is scored by the SQL verifier, so its style is the one SQL
classifier's (:func:`divrl.evaluation.styles.sql_shape`; each generator style's label is
:data:`divrl.toy.toy_sql.STYLE_SHAPES`). Toy math's style is its method, ``steps`` /
``expr`` / ``direct`` (:func:`divrl.toy.toy_math.math_style`). Countdown's style is the
operator multiset of its answer attempt, e.g. ``+*``
(:func:`divrl.rewards.countdown_reward.operator_style`).
"""

from __future__ import annotations

from divrl.evaluation.styles import register_style
from divrl.toy.toy_math import math_style


def _toy_math_style(text: str, extracted: str | None) -> str | None:
    return math_style(text)


def _countdown_style(text: str, extracted: str | None) -> str | None:
    from divrl.rewards.countdown_reward import answer_attempt, operator_style

    return operator_style(extracted if extracted is not None else answer_attempt(text))


def register_toy_styles() -> None:
    """Register the toy worlds' style functions (idempotent; done on ``import divrl.toy``)."""
    register_style("toy_math", _toy_math_style)
    register_style("countdown", _countdown_style)
