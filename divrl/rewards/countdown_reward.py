"""Countdown arithmetic: reach a target from given numbers with + - *, checked step by step.

A response is a search trace of attempts; each attempt is a chain of steps written as
``a*b=v`` separated by ``,`` and closed by a verdict, `` no; `` (failed, try again) or
`` ok`` (the answer)::

    7+9=16,16*3=48 no; 9-3=6,6*7=42 ok

The answer is the first attempt that *claims* the target (its last written result is the
target) or says `` ok``, whichever comes first: a search that reaches the target has found
it even when its verdict missed it, and an `` ok`` on a wrong attempt is a wrong answer
(:func:`answer_attempt`). It is correct when every step
combines two values still available (a given number, each used at most once, or the
result of an earlier step, used once), every step's written result is the true result
(``-`` must not go below zero), the last step's result is the target, and the answer has
at least two steps (:data:`MIN_STEPS`; a problem is posed as "reach the target in two steps
from three of the numbers", and without the floor RL learns to answer ``a*b=target`` on
the prompts where one operation happens to hit it, reason ``too_short``). Numbers and
target travel in the ground truth as ``"numbers=3,7,9,5;target=42"``
(:func:`format_ground_truth`).

Two answers are the same solution when their expression trees are equal up to the order
of the operands of ``+`` and ``*`` (:func:`canonical_expression`); the answer's *style* is
its operator multiset, e.g. ``*+`` (:func:`operator_style`).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from divrl.rewards.registry import Verifier
from divrl.rewards.types import ScoreResult

OK_MARK = " ok"
NO_MARK = " no; "
OPERATORS = ("+", "-", "*")
#: fewest steps an answer may have (every problem is reachable in two; see the docstring)
MIN_STEPS = 2
_STEP = re.compile(r"^(\d{1,4})([-+*])(\d{1,4})=(\d{1,5})$")
_GOLD = re.compile(r"^numbers=([\d,]+);target=(\d+)$")
_MAX_ANSWER_CHARS = 200
_MAX_TEXT_CHARS = 4000
_LAST_RESULT = re.compile(r"=(\d{1,5})$")


def format_ground_truth(numbers: list[int] | tuple[int, ...], target: int) -> str:
    """The ground-truth string of a problem: ``numbers=3,7,9;target=42``."""
    return f"numbers={','.join(str(n) for n in numbers)};target={target}"


def parse_ground_truth(ground_truth: str) -> tuple[list[int], int]:
    """(numbers, target) from :func:`format_ground_truth`'s string; ``ValueError`` otherwise."""
    m = _GOLD.match(str(ground_truth).strip())
    if m is None:
        raise ValueError(
            f"countdown ground truth {ground_truth!r} is not 'numbers=a,b,..;target=t'"
        )
    return [int(x) for x in m.group(1).split(",") if x], int(m.group(2))


def apply(op: str, a: int, b: int) -> int:
    """``a op b`` for op in ``+ - *``."""
    return a + b if op == "+" else a - b if op == "-" else a * b


def split_attempts(text: str) -> list[tuple[str, bool]]:
    """[(attempt, said ok)] in order; the text after the first `` ok`` is dropped."""
    ok_at = text.find(OK_MARK)
    head = text if ok_at < 0 else text[:ok_at]
    parts = [a.strip() for a in head[:_MAX_TEXT_CHARS].split(NO_MARK.strip())]
    out = [(a[:_MAX_ANSWER_CHARS], False) for a in parts if a]
    if ok_at >= 0 and out and not head.rstrip().endswith(NO_MARK.strip()):
        out[-1] = (out[-1][0], True)
    return out


def answer_attempt(text: str, target: int | None = None) -> str | None:
    """The answer of a trace: the first attempt whose last written result is ``target`` or
    that says `` ok`` (only the latter when ``target`` is None); None when there is none."""
    for attempt, said_ok in split_attempts(text):
        if said_ok:
            return attempt
        if target is not None:
            m = _LAST_RESULT.search(attempt)
            if m is not None and int(m.group(1)) == target:
                return attempt
    return None


def parse_steps(attempt: str) -> list[tuple[int, str, int, int]] | None:
    """[(a, op, b, written result)] of an attempt ``a*b=v,v+c=w``; None if malformed."""
    steps = []
    for part in attempt.split(","):
        m = _STEP.match(part.strip())
        if m is None:
            return None
        steps.append((int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))))
    return steps or None


def check_attempt(attempt: str, numbers: list[int], target: int) -> tuple[bool, str]:
    """(correct, reason) of one attempt against the problem (see the module docstring)."""
    steps = parse_steps(attempt)
    if steps is None:
        return False, "unparsable"
    if len(steps) < MIN_STEPS:
        return False, "too_short"
    pool = Counter(numbers)
    for a, op, b, written in steps:
        for operand in (a, b):
            if pool[operand] <= 0:
                return False, "wrong"  # a number not available (or used twice)
            pool[operand] -= 1
        value = apply(op, a, b)
        if value < 0 or value != written:
            return False, "wrong"  # an arithmetic slip or a negative intermediate
        pool[value] += 1
    return steps[-1][3] == target, "correct" if steps[-1][3] == target else "wrong"


def canonical_expression(attempt: str) -> str | None:
    """The attempt's expression tree as a string, operands of ``+``/``*`` sorted, so that
    ``3*5=15,15+7=22`` and ``7+5*3`` style reorderings compare equal; None if malformed."""
    steps = parse_steps(attempt)
    if steps is None:
        return None
    trees: dict[int, list[str]] = {}  # value -> expressions producing it, most recent last

    def leaf(n: int) -> str:
        stack = trees.get(n)
        return stack.pop() if stack else str(n)

    expr = ""
    for a, op, b, written in steps:
        left, right = leaf(a), leaf(b)
        if op in "+*":
            left, right = sorted((left, right))
        expr = f"({left}{op}{right})"
        trees.setdefault(written, []).append(expr)
    return expr[1:-1] if expr.startswith("(") else expr


def operator_style(attempt: str | None) -> str | None:
    """The operator multiset of an attempt (``"*+"``: one ``*`` and one ``+``, in the fixed
    order ``+ - *``), or None when there is no parsable attempt."""
    steps = parse_steps(attempt) if attempt else None
    if steps is None:
        return None
    ops = Counter(op for _, op, _, _ in steps)
    return "".join(op * ops[op] for op in OPERATORS)


class CountdownVerifier(Verifier):
    """Binary reward for a countdown search trace (see the module docstring)."""

    default_timeout = 2.0

    def extract(self, solution_str: str, extra_info: dict[str, Any]) -> str | None:
        return answer_attempt(solution_str)

    def check_inputs(self, ground_truth: str, extra_info: dict[str, Any]) -> None:
        parse_ground_truth(ground_truth)

    def quick(self, solution_str, ground_truth, extra_info):
        numbers, target = parse_ground_truth(ground_truth)
        attempt = answer_attempt(solution_str, target)
        if attempt is None:
            return ScoreResult(0.0, None, "no_answer")
        ok, reason = check_attempt(attempt, numbers, target)
        return ScoreResult(1.0 if ok else 0.0, attempt, reason)

    def verify(self, solution_str, ground_truth, extra_info, deadline):
        return self.quick(solution_str, ground_truth, extra_info)
