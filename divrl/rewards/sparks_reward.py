"""The sparks world's verifier: is the final answer the largest of the given numbers?

A response reads numbers back and answers (``3 8 1 5 = 8``), optionally followed by a
check, the world's spark move: `` wait `` + numbers read back + `` = `` + a final answer;
it may end with one closing character (:data:`CLOSERS`, ignored)::

    3 8 1 5 = 8                    (answer 8)
    3 8 1 5 = 8 wait 3 8 1 5 9 = 9 (answer 9: the check's answer wins)
    3 8 1 5 = 8;                   (answer 8)

A response must have this shape (anything else has no answer); its answer is the check's
final number when it checks, else the first one. The reward is correctness only: neither
the read-back nor a check earns anything by itself. The ground truth is
``numbers=3,8,1,5,9`` (:func:`format_ground_truth`).
"""

from __future__ import annotations

import re
from typing import Any

from divrl.rewards.registry import Verifier
from divrl.rewards.types import ScoreResult

#: the spark move's piece (one token of the sparks world's tokenizer)
SPARK_MARK = " wait "
#: separates a read-back from its answer (one token)
CHECK_EQUALS = " = "
#: harmless closing characters (one token each)
CLOSERS = ".,;:!?'~^|_`"
_GOLD = re.compile(r"^numbers=(\d+(?:,\d+)*)$")
_READ = r"(?:\d+ )*\d+ = (\d+)"
_SHAPE = re.compile(rf"^{_READ}(?: wait {_READ})?[{re.escape(CLOSERS)}]?$")


def format_ground_truth(numbers: list[int] | tuple[int, ...]) -> str:
    """``numbers=3,8,1,5,9``."""
    return "numbers=" + ",".join(str(n) for n in numbers)


def parse_ground_truth(ground_truth: str) -> list[int]:
    """The numbers of :func:`format_ground_truth`'s string; ``ValueError`` otherwise."""
    m = _GOLD.match(str(ground_truth).strip())
    if m is None:
        raise ValueError(f"sparks ground truth {ground_truth!r} is not 'numbers=a,b,...'")
    return [int(x) for x in m.group(1).split(",")]


def final_answer(text: str) -> str | None:
    """The answer of a response (see the module docstring), or None when it has none."""
    m = _SHAPE.match(text.strip())
    if m is None:
        return None
    return m.group(2) if m.group(2) is not None else m.group(1)


def has_spark(text: str) -> bool:
    """Whether a response takes the spark move (checks)."""
    return SPARK_MARK in text


class SparksVerifier(Verifier):
    """Binary reward: 1 when the final answer is the largest given number."""

    default_timeout = 2.0

    def extract(self, solution_str: str, extra_info: dict[str, Any]) -> str | None:
        return final_answer(solution_str)

    def check_inputs(self, ground_truth: str, extra_info: dict[str, Any]) -> None:
        parse_ground_truth(ground_truth)

    def quick(self, solution_str, ground_truth, extra_info):
        numbers = parse_ground_truth(ground_truth)
        answer = final_answer(solution_str)
        if answer is None:
            return ScoreResult(0.0, None, "no_answer")
        ok = int(answer) == max(numbers)
        return ScoreResult(1.0 if ok else 0.0, answer, "correct" if ok else "wrong")

    def verify(self, solution_str, ground_truth, extra_info, deadline):
        return self.quick(solution_str, ground_truth, extra_info)
