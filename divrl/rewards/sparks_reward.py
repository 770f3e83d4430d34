"""The sparks world's verifier: is the final answer the largest of the given numbers?

A response reads numbers back, writes their running maximum (a scratchpad) and answers
(``3 8 1 5 : 3 8 8 8 = 8``), optionally followed by a check, the world's spark move:
`` wait `` + every number read back + `` : `` + their running maximum + `` = `` + a final
answer; it may end with one closing character (:data:`CLOSERS`, ignored)::

    3 8 1 5 : 3 8 8 8 = 8                                 (answer 8)
    3 8 1 5 : 3 8 8 8 = 8 wait 3 8 1 5 9 : 3 8 8 8 9 = 9  (answer 9: the check's wins)
    3 8 1 5 : 3 8 8 8 = 8;                                (answer 8)

A response must have this shape (anything else has no answer, reason ``no_answer``), read
back faithfully (the first read-back is the first ``glance`` numbers, the check's every
number, in the prompt's order, and each scratchpad has one entry per number read back:
reason ``unfaithful`` otherwise; without this rule RL rewrote the first read-back to
include a skipped number) and answer only with numbers it read back (every answer, the
first and the check's, is one of the numbers of its own read-back: reason
``unjustified`` otherwise; without this rule RL learnt to name the skipped number after
reading four). So a problem whose largest number lies beyond the glance can only be
solved by the check. Each scratchpad must be the running maximum of its read-back (reason
``bad_scratchpad`` otherwise): copying it is a skill the habit and the check share. Its
answer is the check's final number when it checks, else the first one. The reward is
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
#: separates a read-back's scratchpad from its answer (one token)
CHECK_EQUALS = " = "
#: separates a read-back from its scratchpad, the running maximum (one token)
SCRATCH = " : "
#: harmless closing characters (one token each): 30, a heavy tail at the decision point
CLOSERS = ".,;!?'~^|_`\"#$%&()*+-/<>@[]{}"
_GOLD = re.compile(r"^numbers=(\d+(?:,\d+)*);glance=(\d+)$")
_READ = r"((?:\d+ )*\d+) : ((?:\d+ )*\d+) = (\d+)"
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


Part = tuple[list[int], list[int], str]


def parts(text: str) -> tuple[Part, Part | None] | None:
    """((read-back, scratchpad, answer) of the first answer, the same of the check or
    None) of a response of the module docstring's shape, or None."""
    m = _SHAPE.match(text.strip())
    if m is None:
        return None

    def part(i: int) -> Part:
        return (
            [int(x) for x in m.group(i).split()],
            [int(x) for x in m.group(i + 1).split()],
            m.group(i + 2),
        )

    return part(1), (None if m.group(4) is None else part(4))


def read_backs(text: str) -> tuple[list[int], list[int] | None, str] | None:
    """(first read-back, the check's read-back or None, the answer) of a response of the
    module docstring's shape, or None."""
    got = parts(text)
    if got is None:
        return None
    first, check = got
    if check is None:
        return first[0], None, first[2]
    return first[0], check[0], check[2]


def final_answer(text: str) -> str | None:
    """The answer of a response (see the module docstring), or None when it has none."""
    got = read_backs(text)
    return None if got is None else got[2]


def has_spark(text: str) -> bool:
    """Whether a response takes the spark move (checks)."""
    return SPARK_MARK in text


def running_max(numbers: list[int] | tuple[int, ...]) -> list[int]:
    """The scratchpad a read-back must carry: the largest number so far, after each number
    (``3 8 1 5`` -> ``3 8 8 8``)."""
    out, best = [], numbers[0]
    for n in numbers:
        best = max(best, n)
        out.append(best)
    return out


class SparksVerifier(Verifier):
    """Binary reward: 1 when the final answer is the largest given number."""

    default_timeout = 2.0

    def extract(self, solution_str: str, extra_info: dict[str, Any]) -> str | None:
        return final_answer(solution_str)

    def check_inputs(self, ground_truth: str, extra_info: dict[str, Any]) -> None:
        parse_ground_truth(ground_truth)

    def quick(self, solution_str, ground_truth, extra_info):
        numbers, glance = parse_ground_truth(ground_truth)
        got = parts(solution_str)
        if got is None:
            return ScoreResult(0.0, None, "no_answer")
        first, check = got
        answer = (check or first)[2]
        wanted = [(first, numbers[:glance])] + ([(check, numbers)] if check else [])
        if any(p[0] != want or len(p[1]) != len(p[0]) for p, want in wanted):
            return ScoreResult(0.0, answer, "unfaithful")
        if any(int(p[2]) not in p[0] for p, _ in wanted):
            return ScoreResult(0.0, answer, "unjustified")
        if any(p[1] != running_max(p[0]) for p, _ in wanted):
            return ScoreResult(0.0, answer, "bad_scratchpad")
        ok = int(answer) == max(numbers)
        return ScoreResult(1.0 if ok else 0.0, answer, "correct" if ok else "wrong")

    def verify(self, solution_str, ground_truth, extra_info, deadline):
        return self.quick(solution_str, ground_truth, extra_info)
