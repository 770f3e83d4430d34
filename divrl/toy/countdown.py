"""Countdown problems and the supervised search traces of the countdown toy world.

A problem gives ``n_numbers`` distinct numbers and a target reachable in two steps from
three of them (``CD: 3 7 9 5 -> 42``). The supervised response is a *search*: attempts
drawn at random, each written out step by step with its verdict, until one reaches the
target or the attempt budget is spent::

    7+9=16,16*3=48 no; 9*5=45,45-3=42 ok

The attempts draw their operators with uneven weights (``op_weights``: ``-`` is rare), so
the targets whose every solution needs a subtraction are reached only through a rarely
chosen attempt; the budget (``min_attempts`` .. ``max_attempts``) makes the search fail
often enough that one sample is right on a minority of prompts while many samples cover
most of them. Verification, canonical solutions and styles live in
:mod:`divrl.rewards.countdown_reward`.
"""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass, field

from divrl.rewards.countdown_reward import NO_MARK, OK_MARK, apply, canonical_expression

#: every prompt starts with this (a tokenizer piece)
PROMPT_PREFIX = "CD: "
TARGET_ARROW = " -> "
#: tokenizer pieces of this world (besides the shared toy ones)
PIECES: tuple[str, ...] = (PROMPT_PREFIX, TARGET_ARROW, NO_MARK, OK_MARK)


@dataclass(frozen=True)
class CountdownConfig:
    """How countdown problems and their supervised traces are drawn."""

    n_numbers: int = field(default=4, metadata={"help": "numbers given per in-domain problem"})
    max_number: int = field(default=9, metadata={"help": "numbers are drawn from 1..max_number"})
    target_min: int = field(default=10, metadata={"help": "smallest in-domain target"})
    target_max: int = field(default=60, metadata={"help": "largest in-domain target"})
    cross_target_min: int = field(
        default=61, metadata={"help": "smallest cross-domain target (held out of SFT and RL)"}
    )
    cross_target_max: int = field(default=150, metadata={"help": "largest cross-domain target"})
    op_weights: tuple[float, float, float] = field(
        default=(0.45, 0.15, 0.40),
        metadata={"help": "weights of + - * when the supervised search draws an operator"},
    )
    min_attempts: int = field(default=4, metadata={"help": "smallest attempt budget of a trace"})
    max_attempts: int = field(default=6, metadata={"help": "largest attempt budget of a trace"})

    def __post_init__(self) -> None:
        if self.n_numbers < 3 or self.n_numbers > self.max_number:
            raise ValueError("n_numbers must be in [3, max_number] (attempts use three numbers)")
        if not 0 < self.target_min <= self.target_max:
            raise ValueError("need 0 < target_min <= target_max")
        if not self.target_max < self.cross_target_min <= self.cross_target_max:
            raise ValueError("cross-domain targets must lie above the in-domain ones")
        if len(self.op_weights) != 3 or min(self.op_weights) <= 0:
            raise ValueError("op_weights needs three positive weights (+ - *)")
        if not 1 <= self.min_attempts <= self.max_attempts:
            raise ValueError("need 1 <= min_attempts <= max_attempts")


@dataclass(frozen=True)
class Problem:
    """Numbers (in prompt order) and the target."""

    numbers: tuple[int, ...]
    target: int


def prompt_text(p: Problem) -> str:
    """``CD: 3 7 9 5 -> 42`` (the answer marker is appended by the world)."""
    return f"{PROMPT_PREFIX}{' '.join(str(n) for n in p.numbers)}{TARGET_ARROW}{p.target}"


def _step(op: str, a: int, b: int) -> tuple[int, int, int]:
    """(left, right, value) with the larger operand first for ``-`` (no negatives)."""
    if op == "-" and a < b:
        a, b = b, a
    return a, b, apply(op, a, b)


def all_attempts(numbers: tuple[int, ...]) -> dict[str, int]:
    """Every two-step attempt on three of ``numbers`` -> its value (as written by traces)."""
    out: dict[str, int] = {}
    for x, y, z in itertools.permutations(numbers, 3):
        for op1, op2 in itertools.product("+-*", repeat=2):
            a, b, v1 = _step(op1, x, y)
            for first, second in ((v1, z), (z, v1)):
                c, d, v2 = _step(op2, first, second)
                out[f"{a}{op1}{b}={v1},{c}{op2}{d}={v2}"] = v2
    return out


def solutions(p: Problem) -> set[str]:
    """Canonical expressions of every two-step solution of ``p``."""
    return {
        canonical_expression(a) or a for a, v in all_attempts(p.numbers).items() if v == p.target
    }


def sample_problem(rng: random.Random, cfg: CountdownConfig, cross: bool = False) -> Problem:
    """Distinct numbers and the value of a uniformly drawn canonical expression on three of
    them, redrawn until it lies in the split's target range."""
    lo, hi = (
        (cfg.cross_target_min, cfg.cross_target_max) if cross else (cfg.target_min, cfg.target_max)
    )
    while True:
        numbers = tuple(rng.sample(range(1, cfg.max_number + 1), cfg.n_numbers))
        values = [v for v in canonical_values(tuple(sorted(numbers))) if lo <= v <= hi]
        if values:
            return Problem(numbers, rng.choice(values))


@functools.lru_cache(maxsize=4096)
def canonical_values(numbers: tuple[int, ...]) -> tuple[int, ...]:
    """The value of each distinct canonical two-step expression on ``numbers`` (sorted, so
    that a draw from it is uniform over canonical expressions and reproducible)."""
    by_canon: dict[str, int] = {}
    for attempt, value in all_attempts(numbers).items():
        by_canon.setdefault(canonical_expression(attempt) or attempt, value)
    return tuple(v for _, v in sorted(by_canon.items()))


def sample_attempt(rng: random.Random, numbers: tuple[int, ...], cfg: CountdownConfig) -> str:
    """One attempt of the supervised search: three numbers in random order, operators drawn
    with ``op_weights``, the commutative steps in a random operand order."""
    x, y, z = rng.sample(numbers, 3)
    op1, op2 = rng.choices("+-*", weights=cfg.op_weights, k=2)
    a, b, v1 = _step(op1, x, y)
    first, second = (v1, z) if rng.random() < 0.5 else (z, v1)
    c, d, v2 = _step(op2, first, second)
    return f"{a}{op1}{b}={v1},{c}{op2}{d}={v2}"


def sample_trace(rng: random.Random, p: Problem, cfg: CountdownConfig) -> tuple[str, bool]:
    """(supervised response, solved): distinct random attempts until one reaches the target
    (`` ok``) or ``budget`` attempts failed (each `` no; ``)."""
    budget = rng.randint(cfg.min_attempts, cfg.max_attempts)
    tried: set[str] = set()
    parts: list[str] = []
    for _ in range(budget):
        attempt = sample_attempt(rng, p.numbers, cfg)
        for _retry in range(20):  # a search does not repeat itself
            if attempt not in tried:
                break
            attempt = sample_attempt(rng, p.numbers, cfg)
        tried.add(attempt)
        if int(attempt.rsplit("=", 1)[1]) == p.target:
            return "".join(parts) + attempt + OK_MARK, True
        parts.append(attempt + NO_MARK)
    return "".join(parts), False
