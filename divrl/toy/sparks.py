"""Problems and supervised traces of the sparks world (a rare check that is sometimes needed).

A problem gives ``n_numbers`` digits (repeats allowed); the answer is the largest
(``SP: 3 8 1 5 0 2 6 1 4 9 4 2`` -> 9). The supervised response is a habit plus, rarely, a check:

- the *first answer*: the first ``glance`` numbers read back, `` : ``, their running
  maximum (a scratchpad), `` = `` and the largest of them (a glance that skips the last
  numbers), the second largest with probability ``fast_slip``;
- the scratchpad slips too: where the running maximum rises, the entry keeps the previous
  maximum with probability ``scratch_slip`` (the next entries are right again); the
  verifier rejects a scratchpad that is not the running maximum, so a slip costs the
  reward, and copying the running maximum is a skill the habit and the check share;
- then, at the *decision point* right after the first answer: with probability
  ``spark_rate`` whatever the problem and whatever the first answer (the *spark move*), a
  check: `` wait ``, every number read back, `` : ``, their running maximum (slipping as
  above), `` = `` and a final answer (the largest with probability ``1 - check_slip``,
  another given number otherwise); with probability ``closer_rate`` one of the
  :data:`CLOSERS` characters (harmless: the verifier ignores it; spread over many
  characters, each far below the min-p threshold, a heavy tail like a pre-trained model's
  next-token distribution); otherwise the end::

      3 8 1 5 0 2 6 1 4 : 3 8 8 8 8 8 8 8 8 = 8
      3 8 1 5 0 2 6 1 4 : 3 8 8 8 8 8 8 8 8 = 8 wait 3 8 1 5 0 2 6 1 4 9 4 2 : 3 8 8 8 8 8 8 8 8 9 9 9 = 9
      3 8 1 5 0 2 6 1 4 : 3 8 8 8 8 8 8 8 8 = 8;
      3 8 1 5 0 2 6 1 4 : 3 3 8 8 8 8 8 8 8 = 8      (a scratchpad slip: rejected)

On an *easy* problem (the largest number is among the first ``glance``) the first answer is
right unless it or its scratchpad slipped, and the check is worth much less than the habit
(its final answer slips far more often, and its longer scratchpad has more rises to slip
at). On a *hard* problem (the largest number comes later) the first answer is always
wrong and only the check can be right: the verifier (:mod:`divrl.rewards.sparks_reward`)
accepts an answer only when it is one of the numbers its own read-back names. It rewards
correctness only.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from divrl.rewards import sparks_reward
from divrl.rewards.sparks_reward import CHECK_EQUALS, CLOSERS, SCRATCH, SPARK_MARK

#: every prompt starts with this (a tokenizer piece)
PROMPT_PREFIX = "SP: "
#: tokenizer pieces of this world (besides the shared toy ones)
PIECES: tuple[str, ...] = (PROMPT_PREFIX, SPARK_MARK, SCRATCH, CHECK_EQUALS)


@dataclass(frozen=True)
class SparksConfig:
    """How sparks problems and their supervised traces are drawn."""

    n_numbers: int = field(
        default=12, metadata={"help": "numbers per problem (drawn with repetition)"}
    )
    min_number: int = field(default=0, metadata={"help": "smallest number"})
    max_number: int = field(default=9, metadata={"help": "largest number"})
    glance: int = field(
        default=9, metadata={"help": "leading numbers the habitual first answer looks at"}
    )
    hard_share: float = field(
        default=0.10,
        metadata={"help": "share of hard problems (the largest only beyond the glance) as drawn"},
    )
    fast_slip: float = field(
        default=0.15,
        metadata={"help": "probability that the first answer is the second largest glanced"},
    )
    scratch_slip: float = field(
        default=0.15,
        metadata={
            "help": "probability that a scratchpad entry where the running maximum rises "
            "keeps the previous maximum (a slip the verifier rejects)"
        },
    )
    spark_rate: float = field(
        default=0.06, metadata={"help": "probability that a supervised trace checks"}
    )
    check_slip: float = field(
        default=0.40,
        metadata={"help": "probability that the check's final answer is another number"},
    )
    closer_rate: float = field(
        default=0.20,
        metadata={"help": "probability of a (harmless) closing character after the answer"},
    )

    def __post_init__(self) -> None:
        if self.min_number < 0 or self.max_number <= self.min_number:
            raise ValueError("need 0 <= min_number < max_number")
        if not 2 <= self.glance < self.n_numbers:
            raise ValueError("glance must be in [2, n_numbers - 1] (some numbers are skipped)")
        for name in (
            "fast_slip",
            "scratch_slip",
            "spark_rate",
            "check_slip",
            "closer_rate",
            "hard_share",
        ):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1)")
        if self.spark_rate + self.closer_rate >= 1.0:
            raise ValueError("spark_rate + closer_rate must be below 1 (some traces just end)")


@dataclass(frozen=True)
class Problem:
    """The numbers, in prompt order."""

    numbers: tuple[int, ...]

    @property
    def answer(self) -> int:
        return max(self.numbers)


def _digits(numbers: tuple[int, ...]) -> str:
    return " ".join(str(n) for n in numbers)


def prompt_text(p: Problem) -> str:
    """``SP: 3 8 1 5 9`` (the answer marker is appended by the world)."""
    return PROMPT_PREFIX + _digits(p.numbers)


def is_hard(p: Problem, cfg: SparksConfig) -> bool:
    """Whether the largest number lies beyond the glance (only a check can be right)."""
    return max(p.numbers[: cfg.glance]) != p.answer


def sample_problem(rng: random.Random, cfg: SparksConfig, hard: bool | None = None) -> Problem:
    """Numbers drawn with repetition; ``hard`` True / False redraws until the problem is
    hard / easy (None: hard with probability ``cfg.hard_share``)."""
    if hard is None:
        hard = rng.random() < cfg.hard_share
    span = range(cfg.min_number, cfg.max_number + 1)
    while True:
        p = Problem(tuple(rng.choice(span) for _ in range(cfg.n_numbers)))
        if is_hard(p, cfg) == hard:
            return p


def running_max(numbers: tuple[int, ...]) -> tuple[int, ...]:
    """The scratchpad: the largest number so far, after each number (``3 8 1 5`` ->
    ``3 8 8 8``; the verifier's rule)."""
    return tuple(sparks_reward.running_max(numbers))


def read_back(numbers: tuple[int, ...]) -> str:
    """``3 8 1 5 : 3 8 8 8``: the numbers and their running maximum."""
    return f"{_digits(numbers)}{SCRATCH}{_digits(running_max(numbers))}"


def slipped_scratchpad(
    rng: random.Random, numbers: tuple[int, ...], cfg: SparksConfig
) -> tuple[int, ...]:
    """The running maximum, each entry where it rises kept at the previous maximum with
    probability ``cfg.scratch_slip`` (``3 8 1 5`` -> ``3 3 8 8`` on a slip at the 8)."""
    best = running_max(numbers)
    return tuple(
        best[i - 1] if i and best[i] > best[i - 1] and rng.random() < cfg.scratch_slip else b
        for i, b in enumerate(best)
    )


def traced_read_back(rng: random.Random, numbers: tuple[int, ...], cfg: SparksConfig) -> str:
    """:func:`read_back` with the supervised traces' scratchpad slips."""
    return f"{_digits(numbers)}{SCRATCH}{_digits(slipped_scratchpad(rng, numbers, cfg))}"


def first_answer(rng: random.Random, p: Problem, cfg: SparksConfig) -> str:
    """The habit: ``3 8 1 5 0 2 6 : 3 8 8 8 8 8 8 = 8``, the second largest glanced number
    on a slip."""
    glanced = p.numbers[: cfg.glance]
    ranked = sorted(set(glanced))
    slip = rng.random() < cfg.fast_slip and len(ranked) > 1
    answer = ranked[-2] if slip else ranked[-1]
    return f"{traced_read_back(rng, glanced, cfg)}{CHECK_EQUALS}{answer}"


def check_text(rng: random.Random, p: Problem, cfg: SparksConfig) -> str:
    """The spark move and what follows it: `` wait 3 8 1 5 0 2 6 9 4 : 3 8 8 8 8 8 8 9 9
    = 9``."""
    final = p.answer
    others = sorted({n for n in p.numbers if n != p.answer})
    if rng.random() < cfg.check_slip and others:
        final = rng.choice(others)
    pad = traced_read_back(rng, p.numbers, cfg)
    return f"{SPARK_MARK}{pad}{CHECK_EQUALS}{final}"


def sample_trace(rng: random.Random, p: Problem, cfg: SparksConfig) -> tuple[str, bool]:
    """(supervised response, whether it takes the spark move)."""
    text = first_answer(rng, p, cfg)
    u = rng.random()
    if u < cfg.spark_rate:
        return text + check_text(rng, p, cfg), True
    if u < cfg.spark_rate + cfg.closer_rate:
        return text + rng.choice(CLOSERS), False
    return text, False
