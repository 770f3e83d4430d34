"""Toy math: short arithmetic word problems with ``\\boxed{}`` answers and three methods.

Templates (``a``, ``b``, ``c`` are small integers)::

    mul_add  "4 bags of 9 nuts and 5 more. how many nuts?"       a*b+c
    mul_sub  "4 boxes of 9 cups, 5 broke. how many left?"        a*b-c
    sub_add  "had 40 pens, lost 15, got 8. how many now?"        a-b+c

Methods: ``steps`` writes each intermediate result (``4*9=36, 36+5=41. \\boxed{41}``),
``expr`` one equation (``4*9+5=41. \\boxed{41}``), ``direct`` only the answer. Like the
SQL styles they are used at fixed rates and slip at method-specific rates in the
supervised corpus (an intermediate or the final result off by a little), so the longer
method is the more reliable one.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

PROMPT_PREFIX = "Math: "
TEMPLATES = ("mul_add", "mul_sub", "sub_add")
METHODS = ("steps", "expr", "direct")
NOUNS = ("nuts", "pens", "eggs", "cups", "hats", "figs", "keys", "pins")
_SLIPS = (-10, -2, -1, 1, 2, 10)


@dataclass(frozen=True)
class MathProblem:
    template: str
    a: int
    b: int
    c: int
    noun: str

    @property
    def text(self) -> str:
        a, b, c, x = self.a, self.b, self.c, self.noun
        if self.template == "mul_add":
            return f"{a} bags of {b} {x} and {c} more. how many {x}?"
        if self.template == "mul_sub":
            return f"{a} boxes of {b} {x}, {c} broke. how many left?"
        if self.template == "sub_add":
            return f"had {a} {x}, lost {b}, got {c}. how many now?"
        raise ValueError(f"unknown template {self.template!r}; expected one of {TEMPLATES}")

    @property
    def first(self) -> tuple[str, int]:
        """The first operation and its result, e.g. ``("4*9", 36)``."""
        a, b = self.a, self.b
        return (f"{a}-{b}", a - b) if self.template == "sub_add" else (f"{a}*{b}", a * b)

    @property
    def second_op(self) -> str:
        """``+`` or ``-``: how ``c`` combines with the first result."""
        return "-" if self.template == "mul_sub" else "+"

    @property
    def answer(self) -> int:
        r1 = self.first[1]
        return r1 - self.c if self.second_op == "-" else r1 + self.c


@dataclass(frozen=True)
class ToyMathConfig:
    """How math problems are drawn and how the supervised corpus errs."""

    method_rates: tuple[float, float, float] = field(
        default=(0.6, 0.25, 0.15), metadata={"help": "rate of steps, expr, direct in SFT"}
    )
    random_errors: tuple[float, float, float] = field(
        default=(0.1, 0.25, 0.5),
        metadata={"help": "slip probability of steps, expr, direct in SFT"},
    )

    def __post_init__(self) -> None:
        if len(self.method_rates) != 3 or min(self.method_rates) <= 0:
            raise ValueError("method_rates needs 3 positive rates (steps, expr, direct)")
        if len(self.random_errors) != 3 or not all(0 <= p <= 1 for p in self.random_errors):
            raise ValueError("random_errors needs 3 probabilities (steps, expr, direct)")


def sample_problem(rng: random.Random) -> MathProblem:
    """A random problem: one-digit factors (the 2..9 times table) and a one-digit ``c``,
    so every step is in reach of a sub-million-parameter model."""
    template = rng.choice(TEMPLATES)
    noun = rng.choice(NOUNS)
    if template == "sub_add":
        a = rng.randint(10, 49)
        return MathProblem(template, a, rng.randint(1, 9), rng.randint(1, 9), noun)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    c = rng.randint(1, 9) if template == "mul_add" else rng.randint(1, min(9, a * b - 1))
    return MathProblem(template, a, b, c, noun)


def render(p: MathProblem, method: str, slip: int = 0, slip_first: bool = False) -> str:
    """A solution of ``p`` by ``method``; ``slip`` is added to the first intermediate
    (``slip_first``, ``steps`` only) or to the final result, and carried through."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    lhs1, r1 = p.first
    op2 = p.second_op
    if method == "steps":
        r1_said = r1 + slip if slip_first else r1
        r2 = r1_said - p.c if op2 == "-" else r1_said + p.c
        final = r2 if slip_first else r2 + slip
        return f"{lhs1}={r1_said}, {r1_said}{op2}{p.c}={final}. \\boxed{{{final}}}"
    final = p.answer + slip
    if method == "expr":
        return f"{lhs1}{op2}{p.c}={final}. \\boxed{{{final}}}"
    return f"\\boxed{{{final}}}"


def sample_response(
    p: MathProblem, rng: random.Random, cfg: ToyMathConfig
) -> tuple[str, str, bool]:
    """One SFT solution of ``p``: (text, method, whether it is correct)."""
    rank = rng.choices(range(3), weights=cfg.method_rates)[0]
    method = METHODS[rank]
    if rng.random() < cfg.random_errors[rank]:
        slip = rng.choice(_SLIPS)
        return render(p, method, slip, slip_first=rng.random() < 0.5), method, False
    return render(p, method), method, True


def prompt_text(p: MathProblem) -> str:
    return PROMPT_PREFIX + p.text


def math_style(solution: str) -> str:
    """``steps`` (several equations), ``expr`` (one), ``direct`` (none)."""
    n = len(re.findall(r"=", solution))
    return "steps" if n >= 2 else "expr" if n == 1 else "direct"
