"""Math answers: extract the final answer, compare with math-verify.

Extraction (first rule that finds something wins):

1. ``extra_info["answer_pattern"]`` or the verifier's ``answer_pattern``: a regular
   expression; its last match is the answer (group 1 if the pattern has groups);
2. the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces handled);
3. the last ``<answer>...</answer>`` (the R1 template's answer tags);
4. if ``fallback_last_number`` is on (the default), the last number in the text, so that
   short answers such as ``85`` or ``70+15=85`` (the toy task) are scored too.

Integers and exactly equal strings are decided in the caller's process; everything else
(fractions, decimals, LaTeX, sets, intervals) goes to math-verify in a worker process
with a hard time limit, because math-verify's own timeouts rely on ``signal.alarm`` (main
thread only) and cannot interrupt C-level work such as ``9^9^9^9``.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from divrl.rewards.registry import Verifier, register_verifier
from divrl.rewards.types import ScoreResult

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_MAX_BOX_TRIES = 5  # bounded look-back over unclosed boxes keeps extraction linear
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_INT = re.compile(r"[-+]?\d+")
_MAX_QUICK_LEN = 64


def _balanced_from(text: str, start: int) -> str | None:
    """Content of the brace group opening at ``text[start] == '{'``, or None if unclosed."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\boxed x``, ``\\fbox{...}``) in ``text``."""
    positions = []
    for cmd in _BOX_COMMANDS:
        end = len(text)
        for _ in range(_MAX_BOX_TRIES):
            pos = text.rfind(cmd, 0, end)
            if pos < 0:
                break
            positions.append((pos, cmd))
            end = pos
    for pos, cmd in sorted(positions, reverse=True)[:_MAX_BOX_TRIES]:
        rest = pos + len(cmd)
        if rest < len(text) and text[rest] == " ":
            # "\boxed 5": the answer runs to the next whitespace or "$"
            m = re.match(r" ([^\s$]+)", text[rest : rest + 1000])
            if m:
                return m.group(1)
            continue
        brace = rest
        while brace < len(text) and text[brace] in " \t":
            brace += 1
        if brace < len(text) and text[brace] == "{":
            content = _balanced_from(text, brace)
            if content is not None:
                return content
    return None


def last_answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` (a ``\\boxed{}`` inside wins)."""
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    if start < 0:
        return None
    inner = text[start + len("<answer>") : end]
    boxed = last_boxed(inner)
    return boxed if boxed is not None else inner.strip()


def _normalize(ans: str) -> str:
    ans = ans.strip().strip("$").strip()
    ans = ans.removeprefix("\\(").removesuffix("\\)").strip()
    ans = ans.rstrip(".").replace("\\!", "").replace("\\,", "").replace(" ", "")
    return ans


_FRAC = re.compile(r"-?\\d?frac\{(-?\d+)\}\{(\d+)\}")
_SLASH = re.compile(r"(-?\d+)/(\d+)")
_DECIMAL = re.compile(r"-?\d+(?:\.\d+)?")


def _as_rational(ans: str) -> Fraction | None:
    """A plain integer, decimal, ``a/b`` or ``\\frac{a}{b}`` as an exact fraction."""
    if len(ans) > _MAX_QUICK_LEN:
        return None
    s = ans.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", ans) else ans
    if _DECIMAL.fullmatch(s):
        return Fraction(s)
    m = _SLASH.fullmatch(s) or _FRAC.fullmatch(s)
    if m and int(m.group(2)) != 0:
        sign = -1 if s.startswith("-") and not m.group(1).startswith("-") else 1
        return sign * Fraction(int(m.group(1)), int(m.group(2)))
    return None


def _as_int(ans: str) -> int | None:
    s = ans.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+", ans) else ans
    if len(s) <= _MAX_QUICK_LEN and _INT.fullmatch(s):
        return int(s)
    return None


class MathVerifier(Verifier):
    """Final-answer equivalence with math-verify; see the module docstring."""

    default_timeout = 5.0

    def __init__(
        self,
        answer_pattern: str | None = None,
        fallback_last_number: bool = True,
        max_answer_chars: int | None = 10_000,
    ):
        self.answer_pattern = answer_pattern
        self.fallback_last_number = fallback_last_number
        # Real final answers are short; a longer one is rejected without burning a worker.
        self.max_answer_chars = max_answer_chars

    def extract(self, solution_str: str, extra_info: dict[str, Any]) -> str | None:
        pattern = extra_info.get("answer_pattern") or self.answer_pattern
        if pattern:
            matches = list(re.finditer(pattern, solution_str))
            if not matches:
                return None
            m = matches[-1]
            return m.group(1) if m.re.groups else m.group(0)
        boxed = last_boxed(solution_str)
        if boxed is not None:
            return boxed
        tag = last_answer_tag(solution_str)
        if tag is not None:
            return tag
        if self.fallback_last_number:
            last = None
            for last in _NUMBER.finditer(solution_str):  # noqa: B007 (want the last one)
                pass
            if last is not None:
                return last.group(0).rstrip(",")
        return None

    def quick(self, solution_str, ground_truth, extra_info):
        extracted = self.extract(solution_str, extra_info)
        if extracted is None or not extracted.strip():
            return ScoreResult(0.0, extracted, "no_answer")
        if self.max_answer_chars is not None and len(extracted) > self.max_answer_chars:
            return ScoreResult(
                0.0, extracted[:200], "too_long", f"{len(extracted)} characters of answer"
            )
        pred, gold = _normalize(extracted), _normalize(str(ground_truth))
        if pred == gold and pred:
            return ScoreResult(1.0, extracted, "correct")
        p, g = _as_int(pred), _as_int(gold)
        if p is not None and g is not None:
            return ScoreResult(float(p == g), extracted, "correct" if p == g else "wrong")
        p, g = _as_rational(pred), _as_rational(gold)
        if p is not None and g is not None:
            if p == g:
                return ScoreResult(1.0, extracted, "correct")
            if p.denominator == 1 and g.denominator == 1:
                return ScoreResult(0.0, extracted, "wrong")
        # unequal decimals go to math-verify, which tolerates rounding (0.333333 vs 1/3)
        return None

    def verify(self, solution_str, ground_truth, extra_info, deadline):
        early = self.quick(solution_str, ground_truth, extra_info)
        if early is not None and early.reason in ("no_answer", "too_long"):
            return early
        extracted = self.extract(solution_str, extra_info)
        return _math_verify(extracted, str(ground_truth))


_GOLD_CACHE: dict[str, list] = {}
_GOLD_CACHE_SIZE = 4096


def _parse_gold(ground_truth: str) -> list:
    """math-verify's parse of a ground truth, cached (RL scores many samples per prompt)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    if ground_truth not in _GOLD_CACHE:
        if len(_GOLD_CACHE) >= _GOLD_CACHE_SIZE:
            _GOLD_CACHE.pop(next(iter(_GOLD_CACHE)))
        text = ground_truth if "\\boxed" in ground_truth else f"\\boxed{{{ground_truth}}}"
        configs = [LatexExtractionConfig(), ExprExtractionConfig()]
        _GOLD_CACHE[ground_truth] = parse(text, extraction_config=configs, parsing_timeout=None)
    return _GOLD_CACHE[ground_truth]


def _math_verify(extracted: str, ground_truth: str) -> ScoreResult:
    # Imported lazily: workers preload it, the caller's process never needs it.
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    # timeouts disabled: they use signal.alarm; the worker is killed from outside instead
    gold = _parse_gold(ground_truth)
    if not gold:
        return ScoreResult(
            0.0, extracted, "gold_error", f"math-verify cannot parse {ground_truth!r}"
        )
    pred = parse(f"\\boxed{{{extracted}}}", extraction_config=configs, parsing_timeout=None)
    if not pred:
        return ScoreResult(0.0, extracted, "unparsable")
    ok = verify(gold, pred, timeout_seconds=None)
    return ScoreResult(float(ok), extracted, "correct" if ok else "wrong")


register_verifier(
    "math",
    "gsm8k",
    "openai/gsm8k",
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
    "toy_math",
)(MathVerifier)
