"""The built-in benchmarks, each one :class:`divrl.profiles.BenchmarkProfile`, registered
by the registry (:mod:`divrl.rewards.profiles`) when it is imported.

This table is the one place that says, per benchmark, which verifier scores it, which
converter reads its official layout, how its answers are clustered, how its solutions are
labelled by style and whether its rows carry a SQLite database. Hooks above the rewards
layer (converters, equivalences, style classifiers) are named as ``"module:attribute"``
and imported when first used, so importing the rewards imports none of them.

Toy math and toy SQL are scored by the same verifier objects as ``math`` and ``sql`` (one
answer cache each) but are profiles of their own because their style classifiers differ.
"""

from __future__ import annotations

from divrl.rewards.countdown_reward import CountdownVerifier
from divrl.rewards.math_reward import (
    GSM8K_SOURCES,
    MATH_SOURCES,
    MATH_VERIFY_SOURCES,
    MathVerifier,
)
from divrl.rewards.sparks_reward import SparksVerifier
from divrl.rewards.sql_reward import SqlVerifier
from divrl.rewards.types import BenchmarkProfile

__all__ = ["BUILTIN_PROFILES"]

_CONVERTERS = "divrl.data.converters."
_MATH_EQUIVALENCE = "divrl.evaluation.equivalence:MathEquivalence"
_SQL_EQUIVALENCE = "divrl.evaluation.equivalence:SqlResultEquivalence"
_SQL_STYLE = "divrl.evaluation.styles:sql_style"

_MATH = MathVerifier()
_PLAIN_SQL = SqlVerifier(profile="sql")


def _sql(name: str, aliases: tuple[str, ...], verifier: SqlVerifier, converter=None):
    return BenchmarkProfile(
        name,
        aliases,
        verifier=verifier,
        converter=converter,
        equivalence=_SQL_EQUIVALENCE,
        style=_SQL_STYLE,
        needs_database=True,
    )


#: every built-in benchmark, in registration order
BUILTIN_PROFILES: tuple[BenchmarkProfile, ...] = (
    BenchmarkProfile(
        MATH_SOURCES[0],
        MATH_SOURCES[1:],
        verifier=_MATH,
        converter=_CONVERTERS + "math",
        equivalence=_MATH_EQUIVALENCE,
        math_traces=True,
    ),
    BenchmarkProfile(
        GSM8K_SOURCES[0],
        GSM8K_SOURCES[1:],
        verifier=MathVerifier(profile="gsm8k"),
        converter=_CONVERTERS + "gsm8k",
        equivalence=_MATH_EQUIVALENCE,
        math_traces=True,
    ),
    BenchmarkProfile(
        MATH_VERIFY_SOURCES[0],
        MATH_VERIFY_SOURCES[1:],
        verifier=MathVerifier(profile="math_verify"),
        equivalence=_MATH_EQUIVALENCE,
        math_traces=True,
    ),
    _sql("bird", ("bird_dev",), SqlVerifier(profile="bird"), _CONVERTERS + "bird"),
    _sql("spider", ("spider_dev",), SqlVerifier(profile="spider"), _CONVERTERS + "spider"),
    _sql("sql", ("spider2", "synsql", "text2sql"), _PLAIN_SQL),
    _sql("toy_sql", (), _PLAIN_SQL),
    BenchmarkProfile(
        "toy_math",
        verifier=_MATH,
        equivalence=_MATH_EQUIVALENCE,
        math_traces=True,
        style="divrl.toy.styles:toy_math_style",
    ),
    BenchmarkProfile(
        "countdown",
        ("toy_countdown",),
        verifier=CountdownVerifier,
        style="divrl.toy.styles:countdown_style",
    ),
    BenchmarkProfile(
        "sparks",
        verifier=SparksVerifier,
        style="divrl.toy.styles:sparks_style",
    ),
)
