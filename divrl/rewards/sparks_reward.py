"""The sparks world's verifier: is the final answer the largest of the given numbers?

A response reads numbers back and answers (``3 8 1 5 = 8``), optionally followed by a
check, the world's spark move: `` wait `` + numbers read back + `` = `` + a final answer;
it may end with one closing character (:data:`CLOSERS`, ignored)::

    3 8 1 5 = 8                    (answer 8)
    3 8 1 5 = 8 wait 3 8 1 5 9 = 9 (answer 9: the check's answer wins)
    3 8 1 5 = 8;                   (answer 8)

A response must have this shape (anything else has no answer, reason ``no_answer``) and
read back faithfully: the first read-back is the first ``glance`` numbers, the check's is
every number, in the prompt's order (reason ``unfaithful`` otherwise: without this rule RL
rewrites the first read-back to include a skipped number, a shortcut around the check).
Its answer is the check's final number when it checks, else the first one. The reward is
correctness only: neither a read-back nor a check earns anything by itself. The ground
truth is ``numbers=3,8,1,5,9;glance=4`` (:func:`format_ground_truth`).
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
_GOLD = re.compile(r"^numbers=(\d+(?:,\d+)*);glance=(\d+)$")
_READ = r"((?:\d+ )*\d+) = (\d+)"
_SHAPE = re.compile(rf"^{_READ}(?: wait {_READ})?[{re.escape(CLOSERS)}]?$")


def format_ground_truth(numbers: list[int] | tuple[int, ...], glance: int) -> str:
    """``numbers=3,8,1,5,9;glance=4``."""
    return "numbers=" + ",".join(str(n) for n in numbers) + f";glance={glance}"


def parse_ground_truth(ground_truth: str) -> tuple[list[int], int]:
    """(numbers, glance) of :func:`format_ground_truth`'s string; ``ValueError`` otherwise."""
    m = _GOLD.match(str(ground_truth).strip())
    if m is None:
        raise ValueError(f"sparks ground truth {ground_truth!r} is not 'numbers=a,b,...;glance=k'")
    return [int(x) for x in m.group(1).split(",")], int(m.group(2))


def read_backs(text: str) -> tuple[list[int], list[int] | None, str] | None:
    """(first read-back, the check's read-back or None, the answer) of a response of the
    module docstring's shape, or None."""
    m = _SHAPE.match(text.strip())
    if m is None:
        return None
    first = [int(x) for x in m.group(1).split()]
    if m.group(3) is None:
        return first, None, m.group(2)
    return first, [int(x) for x in m.group(3).split()], m.group(4)


def final_answer(text: str) -> str | None:
    """The answer of a response (see the module docstring), or None when it has none."""
    parts = read_backs(text)
    return None if parts is None else parts[2]


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
        numbers, glance = parse_ground_truth(ground_truth)
        parts = read_backs(solution_str)
        if parts is None:
            return ScoreResult(0.0, None, "no_answer")
        first, check, answer = parts
        if first != numbers[:glance] or (check is not None and check != numbers):
            return ScoreResult(0.0, answer, "unfaithful")
        ok = int(answer) == max(numbers)
        return ScoreResult(1.0 if ok else 0.0, answer, "correct" if ok else "wrong")

    def verify(self, solution_str, ground_truth, extra_info, deadline):
        return self.quick(solution_str, ground_truth, extra_info)
