"""Math answers: the final answer, compared with math-verify's equivalence.

Profiles (chosen by ``data_source``, see :data:`MATH_SOURCES`, :data:`GSM8K_SOURCES` and
:data:`MATH_VERIFY_SOURCES`):

``math`` (the training and evaluation default)
    The final answer, found by :func:`divrl.rewards.math_answer.final_answer`: the LAST
    box (a self-correction counts; a cut-off last box is no answer), else the last
    ``<answer>`` tag, an answer phrase, a ``####`` ending, or a completion that is only an
    answer. There is no last-number fallback: a hedge ("either 7 or 8") is no answer. The
    answer is cleaned (:func:`~divrl.rewards.math_answer.normalise_answer`), parsed by
    math-verify as ``\\boxed{answer}`` and compared with ``math_verify.verify`` against
    ``\\boxed{ground_truth}``, with two rules of our own: when either side ends in a
    percent, the percent is dropped on both sides and only the numbers are compared (as the
    MATH grader drops it: ``50\\%`` is 50, never 0.5), and, when math-verify says no, an
    inequality in one variable is read as its solution set (``x \\ge 5`` is
    ``[5, \\infty)``, both ways; two inequalities must name the same variable).
``gsm8k``
    GSM8K's own rule first: when the completion ends in ``#### <number>``, that number is
    compared exactly (thousands separators and a leading ``$`` removed) with the number after
    the gold's last ``####`` (or the whole gold). Otherwise the ``math`` profile decides.
``math_verify``
    verl's ``math_verify`` scorer: whatever ``math_verify.parse`` extracts from the *whole*
    completion with ``[ExprExtractionConfig(), LatexExtractionConfig()]`` ("final answer is"
    phrases and ``\\boxed{}`` first, several boxes joined into one set, then "answer: ...",
    finally the last LaTeX/plain expression: a last-number fallback), compared with
    ``math_verify.verify``; a cut-off last box is no answer (math-verify would fall back to
    an earlier box).

Each profile is a rule registered with :func:`register_math_rule` (:data:`MATH_RULES`);
a benchmark with its own rule registers one and names it in its verifier,
``MathVerifier(profile="<rule>")``, with no subclass.

``extra_info["answer_pattern"]`` (or the verifier's ``answer_pattern``): a regular
expression whose last match (group 1 if it has groups) replaces the extraction step; the
matched text is then parsed by math-verify. It is validated at load time
(:func:`check_answer_pattern`) and applied in the worker, under the time limit.

Everything above runs in a worker process with a hard time limit (math-verify's own
timeouts use ``signal.alarm`` and cannot interrupt C-level work such as ``9^9^9^9``, and a
10 MB completion takes seconds to scan). The caller only decides cases whose verdict is
provably the worker's (:meth:`MathVerifier.quick`): text with nothing any rule extracts,
and plain integers on both sides.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from divrl.rewards.math_answer import (
    alternatives_as_set,
    final_answer,
    hedge,
    last_box,
    last_boxed,
    normalise_answer,
    number_before_unit,
    without_percent,
)
from divrl.rewards.registry import Verifier
from divrl.rewards.types import ScoreResult

_MAX_QUICK_CHARS = 4096
# A plain integer as both math-verify's number regex and sympy read it: no sign other than
# "-", no leading zeros, no separators, short enough to stay an exact Integer.
_PLAIN_INT = r"-?(?:0|[1-9]\d{0,29})"
_QUICK_BOXED = re.compile(rf"([^$\\]*)\\boxed\{{({_PLAIN_INT})\}}[\s.]*")
_QUICK_BARE = re.compile(rf"\s*({_PLAIN_INT})\s*")
# Every extraction target of math-verify needs a digit (numbers, expressions) or a LaTeX
# delimiter ("$", "\(", "\[", "\boxed"): text without them has nothing to extract.
_ANSWER_MATERIAL = re.compile(r"[\d$\\]")
# the final-answer rules also read words after "answer" (a tag, a phrase) or "####"
_MARKER_MATERIAL = re.compile(r"(?i)answer|#")
_GSM8K_TAIL = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)\s*\.?\s*")
_GSM8K_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
_MAX_GSM8K_TAIL = 200

MATH_SOURCES = (
    "math",
    "math500",
    "huggingfaceh4/math-500",
    "lighteval/math",
    "digitallearninggmbh/math-lighteval",
    "aime",
    "aime24",
    "aime25",
    "amc",
    "amc23",
    "minerva",
    "olympiadbench",
    "deepscaler",
    "dapo_math",
)
GSM8K_SOURCES = ("gsm8k", "openai/gsm8k")
MATH_VERIFY_SOURCES = ("math_verify",)
_NO_FINAL_ANSWER = "no final answer: no \\boxed{}, <answer> tag, 'answer is' phrase or ####"


@dataclass(frozen=True)
class MathRule:
    """How a math profile reads a completion: ``score(solution_str, ground_truth) ->
    ScoreResult`` runs in the worker, under the time limit. ``quick``: the caller may
    decide plain integers on both sides (the rule agrees with an exact integer match
    there), except for a completion containing ``quick_unless``; ``reads_markers``: words
    after "answer" or "####" can be an answer (else text with no digit and no LaTeX is no
    answer at once)."""

    name: str
    score: Callable[[str, str], ScoreResult]
    quick: bool = True
    quick_unless: str | None = None
    reads_markers: bool = True


#: rule name -> rule; ``MathVerifier(profile=name)`` scores with it
MATH_RULES: dict[str, MathRule] = {}


def register_math_rule(
    name: str,
    *,
    quick: bool = True,
    quick_unless: str | None = None,
    reads_markers: bool = True,
    replace: bool = False,
) -> Callable[[Callable[[str, str], ScoreResult]], Callable[[str, str], ScoreResult]]:
    """Decorator: register ``score(solution_str, ground_truth) -> ScoreResult`` as the math
    rule ``name`` (:class:`MathRule`), so that ``MathVerifier(profile=name)`` is a verifier
    for a benchmark profile: a new rule is a registration, not a subclass. The function
    must be importable (module level): the verifier is pickled into the worker with it."""

    def decorator(score: Callable[[str, str], ScoreResult]) -> Callable[[str, str], ScoreResult]:
        if name in MATH_RULES and not replace:
            raise ValueError(f"math rule {name!r} is already registered: pick another name")
        MATH_RULES[name] = MathRule(name, score, quick, quick_unless, reads_markers)
        return score

    return decorator


def check_answer_pattern(pattern: Any) -> re.Pattern[str]:
    """Compile an ``answer_pattern``; ``ValueError`` saying what is wrong with it."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"answer_pattern must be a non-empty string, got {pattern!r:.80}")
    return _compile_answer_pattern(pattern)


@lru_cache(maxsize=1024)
def _compile_answer_pattern(pattern: str) -> re.Pattern[str]:
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"answer_pattern {pattern!r:.80} is not a valid regex: {e}") from None
    if compiled.groups > 1:
        raise ValueError(f"answer_pattern {pattern!r:.80} has {compiled.groups} groups; use 0 or 1")
    return compiled


def _quick_int(text: str, boxed: bool) -> int | None:
    """The completion's answer when math-verify provably extracts exactly this integer.

    Two shapes only, both checked against math-verify's extraction order (parser.py):
    the whole completion is a plain integer, or it is text without ``$`` or ``\\`` followed
    by a single ``\\boxed{<plain integer>}`` and nothing but spaces/periods. With no
    "final answer" phrase (the only patterns ranked before ``\\boxed``) and no LaTeX
    delimiters, math-verify's first match is that box (or that number).
    """
    if len(text) > _MAX_QUICK_CHARS:
        return None
    m = _QUICK_BOXED.fullmatch(text) if boxed else _QUICK_BARE.fullmatch(text)
    if m is None or (boxed and "final answer" in m.group(1).lower()):
        return None
    return int(m.group(m.lastindex))


def _gsm8k_number(text: str) -> str | None:
    """The number after the last ``####`` when the text ends with it, without separators."""
    pos = text.rfind("####")
    if pos < 0 or len(text) - pos > _MAX_GSM8K_TAIL:
        return None
    m = _GSM8K_TAIL.fullmatch(text, pos)
    if m is None or not _GSM8K_NUMBER.fullmatch(m.group(1)):
        return None
    return m.group(1).replace(",", "")


def _plain_number(text: str) -> str | None:
    """``text`` as a plain number without separators (``$1,250`` -> ``1250``), or None;
    ``1,2`` (not thousands) is no number."""
    text = text.strip().removeprefix("$")
    return text.replace(",", "") if _GSM8K_NUMBER.fullmatch(text) else None


def _same_number(a: str, b: str) -> bool:
    from fractions import Fraction

    return Fraction(a) == Fraction(b)


class MathVerifier(Verifier):
    """Final-answer equivalence with math-verify; see the module docstring."""

    default_timeout = 5.0

    def __init__(self, answer_pattern: str | None = None, profile: str = "math"):
        if profile not in MATH_RULES:
            raise ValueError(
                f"unknown math profile {profile!r}; use one of {sorted(MATH_RULES)} (or "
                "register a rule with register_math_rule)"
            )
        if answer_pattern is not None:
            check_answer_pattern(answer_pattern)
        self.answer_pattern = answer_pattern
        self.profile = profile
        self.rule = MATH_RULES[profile]  # pickled with the verifier, so workers have it

    def check_inputs(self, ground_truth: str, extra_info: dict[str, Any]) -> None:
        if "answer_pattern" in extra_info:
            check_answer_pattern(extra_info["answer_pattern"])

    def extract(self, solution_str: str, extra_info: dict[str, Any]) -> str | None:
        """A bounded preview of the answer, for reports about items that timed out."""
        pos = solution_str.rfind("\\boxed")
        if pos < 0:
            return None
        preview = solution_str[pos : pos + 300]
        boxed = last_boxed(preview)
        return boxed if boxed is not None else preview[:200]

    def quick(self, solution_str, ground_truth, extra_info):
        if not solution_str.strip():
            return ScoreResult(0.0, None, "no_answer")
        if extra_info.get("answer_pattern") or self.answer_pattern:
            return None
        if len(solution_str) > _MAX_QUICK_CHARS or not self.rule.quick:
            return None  # scanning megabytes is the worker's job, under the time limit
        if _ANSWER_MATERIAL.search(solution_str) is None and (
            not self.rule.reads_markers or not _MARKER_MATERIAL.search(solution_str)
        ):
            return ScoreResult(0.0, None, "no_answer", "no number and no LaTeX in the text")
        gold = _quick_int(ground_truth, boxed=False)
        if gold is None:
            return None
        if self.rule.quick_unless is not None and self.rule.quick_unless in solution_str:
            return None
        pred = _quick_int(solution_str, boxed=True)
        if pred is None:
            pred = _quick_int(solution_str, boxed=False)
        if pred is None:
            return None
        return ScoreResult(float(pred == gold), str(pred), "correct" if pred == gold else "wrong")

    def verify(self, solution_str, ground_truth, extra_info, deadline):
        pattern = extra_info.get("answer_pattern") or self.answer_pattern
        if pattern:
            matches = list(check_answer_pattern(pattern).finditer(solution_str))
            if not matches:
                return ScoreResult(0.0, None, "no_answer")
            m = matches[-1]
            answer = m.group(1) if m.re.groups else m.group(0)
            return math_verify_score(answer or "", ground_truth, boxed=True)
        return self.rule.score(solution_str, ground_truth)


@register_math_rule("math")
def final_answer_rule(solution_str: str, ground_truth: str) -> ScoreResult:
    """The ``math`` profile (module docstring): the final answer, math-verify's equivalence."""
    answer, how = final_answer(solution_str)
    if how == "cut_off_box":
        return ScoreResult(0.0, None, "no_answer", "the last \\boxed{ is not closed")
    if answer is None:
        return ScoreResult(0.0, None, "no_answer", _NO_FINAL_ANSWER)
    hedged = hedge(answer, ground_truth)
    if hedged is not None:
        return ScoreResult(0.0, answer[:1000], "wrong", hedged)
    number = number_before_unit(answer)
    gold = _plain_number(ground_truth)
    if number is not None and gold is not None:
        ok = _same_number(number, gold)  # "7 dollars": a number and its unit
        return ScoreResult(float(ok), number, "correct" if ok else "wrong")
    return compare_answer(alternatives_as_set(answer), ground_truth)


@register_math_rule("gsm8k", quick_unless="####")
def gsm8k_rule(solution_str: str, ground_truth: str) -> ScoreResult:
    """The ``gsm8k`` profile: a ``#### <number>`` ending first, else the ``math`` rule."""
    pred = _gsm8k_number(solution_str)
    gold = _gsm8k_number(ground_truth) if "####" in ground_truth else None
    gold = gold or _plain_number(ground_truth)
    if pred is not None and gold is not None:
        ok = _same_number(pred, gold)
        return ScoreResult(float(ok), pred, "correct" if ok else "wrong")
    if gold is not None:  # a GSM8K gold: its number, not the worked solution
        ground_truth = gold
    return final_answer_rule(solution_str, ground_truth)


@register_math_rule("math_verify", reads_markers=False)
def math_verify_rule(solution_str: str, ground_truth: str) -> ScoreResult:
    """The ``math_verify`` profile: verl's scorer on the whole completion."""
    if _last_box_unclosed(solution_str):
        # math-verify would fall back to an earlier box: a cut-off answer is no answer
        return ScoreResult(0.0, None, "no_answer", "the last \\boxed{ is not closed")
    return math_verify_score(solution_str, ground_truth)


def _last_box_unclosed(text: str) -> bool:
    """True when the last box has no closing brace (the completion was cut off)."""
    content, is_box = last_box(text)
    return is_box and content is None


@lru_cache(maxsize=4096)
def _parse_gold(ground_truth: str) -> list:
    """math-verify's parse of ``\\boxed{ground_truth}``, cached (many samples per prompt)."""
    from math_verify import LatexExtractionConfig, parse

    return parse(
        f"\\boxed{{{ground_truth}}}",
        extraction_config=[LatexExtractionConfig()],
        parsing_timeout=None,
    )


def math_verify_score(text: str, ground_truth: str, boxed: bool = False) -> ScoreResult:
    """verl's math_verify rule; ``boxed`` wraps ``text`` (an extracted answer) in a box."""
    # Imported lazily: workers preload it, the caller's process never needs it.
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold = _parse_gold(ground_truth)
    if not gold:
        return ScoreResult(0.0, None, "gold_error", f"math-verify cannot parse {ground_truth!r}")
    # timeouts disabled: they use signal.alarm; the worker is killed from outside instead
    pred = parse(
        f"\\boxed{{{text}}}" if boxed else text,
        extraction_config=[ExprExtractionConfig(), LatexExtractionConfig()],
        parsing_timeout=None,
    )
    if not pred:
        return ScoreResult(0.0, None, "no_answer")
    extracted = pred[-1] if isinstance(pred[-1], str) else str(pred[0])
    ok = verify(gold, pred, timeout_seconds=None)
    return ScoreResult(float(ok), extracted[:1000], "correct" if ok else "wrong")


def _parse_answer(answer: str) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    return parse(
        f"\\boxed{{{answer}}}",
        extraction_config=[ExprExtractionConfig(), LatexExtractionConfig()],
        parsing_timeout=None,
    )


def compare_answer(answer: str, ground_truth: str) -> ScoreResult:
    """An extracted final answer against the gold: math-verify, with a percent compared as
    the number written and an inequality as its solution set (module docstring)."""
    from math_verify import verify

    gold = _parse_gold(ground_truth)
    if not gold:
        return ScoreResult(0.0, None, "gold_error", f"math-verify cannot parse {ground_truth!r}")
    cleaned = normalise_answer(answer)
    if not cleaned:
        return ScoreResult(0.0, None, "no_answer", "the final answer is empty")
    pred = _parse_answer(cleaned)
    if not pred:
        return ScoreResult(0.0, cleaned[:1000], "unparsable", "math-verify reads nothing in it")
    bare_pred, bare_gold = without_percent(cleaned), without_percent(ground_truth)
    if bare_pred is not None or bare_gold is not None:
        # a percent is compared as the number written (the MATH grader drops the sign):
        # 50\% is 50, never 0.5
        gold = _parse_gold(bare_gold) if bare_gold is not None else gold
        pred = _parse_answer(bare_pred) if bare_pred is not None else pred
        ok = bool(gold and pred) and verify(gold, pred, timeout_seconds=None)
    else:
        ok = verify(gold, pred, timeout_seconds=None) or _same_solution_set(gold, pred)
    return ScoreResult(float(ok), cleaned[:1000], "correct" if ok else "wrong")


def _same_solution_set(gold: list, pred: list) -> bool:
    """Inequality = interval, the equivalence math-verify lacks: an inequality in one
    variable is its solution set (two inequalities must name the same variable)."""
    from math_verify import verify

    gold_set, pred_set = _solution_set(gold[0]), _solution_set(pred[0])
    if gold_set is None and pred_set is None:
        return False
    both = gold_set is not None and pred_set is not None
    if both and _free_symbols(gold[0]) != _free_symbols(pred[0]):
        return False  # y > 2 is not x > 2
    return bool(
        verify(
            [gold_set if gold_set is not None else gold[0]],
            [pred_set if pred_set is not None else pred[0]],
            timeout_seconds=None,
        )
    )


def _free_symbols(expr: Any) -> set:
    from sympy import FiniteSet

    args = expr.args if isinstance(expr, FiniteSet) else (expr,)
    return set().union(*(getattr(a, "free_symbols", set()) for a in args))


def _solution_set(expr: Any):
    """The set an inequality in one variable describes (``x \\ge 5`` -> ``[5, oo)``).

    Chains (``1 < x < 3``) and alternatives (``x < 2`` or ``x > 3``, which math-verify
    reads as a set of two inequalities) included; anything else gives None.
    """
    from sympy import And, FiniteSet, Or, Union
    from sympy.core.relational import Relational

    def inequality(e) -> bool:
        if isinstance(e, (And, Or)):
            return all(inequality(a) for a in e.args)
        return isinstance(e, Relational) and e.rel_op in ("<", "<=", ">", ">=")

    try:
        alternatives = isinstance(expr, FiniteSet) and expr.args
        if alternatives and all(inequality(e) for e in expr.args):
            if len(set().union(*(e.free_symbols for e in expr.args))) == 1:
                return Union(*(e.as_set() for e in expr.args))
            return None
        if inequality(expr) and len(expr.free_symbols) == 1:
            return expr.as_set()
    except Exception:  # sympy raises several types on what it cannot solve
        return None
    return None
