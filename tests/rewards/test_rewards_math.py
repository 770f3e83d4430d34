import time

import pytest

from divrl.rewards import (
    MathVerifier,
    compute_score,
    compute_score_detailed,
    last_boxed,
    register_verifier,
)
from divrl.rewards.math_reward import last_answer_tag

LIMIT = 1.5
SLACK = 3.0  # scheduling on a loaded 2-core machine; a killed worker is re-forked in ms


@pytest.fixture(autouse=True, scope="module")
def warm_pool():
    """Start the worker pool first, so the timings below measure scoring, not start-up."""
    compute_score("math", "\\boxed{\\sqrt{4}}", "2")


register_verifier("test_math_unbounded")(MathVerifier(max_answer_chars=None))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("the answer is \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{2}}{2}"),
        ("\\boxed{{a}{b}}", "{a}{b}"),
        ("\\fbox{7}", "7"),
        ("so \\boxed 5$", "5"),
        ("\\boxed{3} and an unclosed \\boxed{4", "3"),
        ("no box here", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_last_boxed_deep_nesting_is_linear():
    text = "\\boxed{" + "{" * 100_000 + "x" + "}" * 100_000 + "}"
    start = time.monotonic()
    assert last_boxed(text) == "{" * 100_000 + "x" + "}" * 100_000
    assert time.monotonic() - start < 2.0


def test_answer_tag_and_pattern_and_last_number():
    assert last_answer_tag("<think>1</think><answer> 12 </answer>") == "12"
    assert last_answer_tag("<answer>so \\boxed{3}</answer>") == "3"
    v = MathVerifier()
    assert v.extract("<think>2+2</think> <answer>4</answer>", {}) == "4"
    assert v.extract("Q:37+48=30+40=70;7+8=15;70+15=85", {}) == "85"
    assert v.extract("It costs 1,250 dollars", {}) == "1,250"
    assert v.extract("#### 72", {"answer_pattern": r"####\s*(\S+)"}) == "72"
    assert v.extract("#### 72 and then 5", {"answer_pattern": r"####\s*(\S+)"}) == "72"
    assert v.extract("no hashes 5", {"answer_pattern": r"####\s*(\S+)"}) is None
    assert MathVerifier(fallback_last_number=False).extract("it is 5", {}) is None


@pytest.mark.parametrize(
    "solution, gold, score",
    [
        ("\\boxed{85}", "85", 1.0),
        ("\\boxed{84}", "85", 0.0),
        ("70+15=85", "85", 1.0),
        ("\\boxed{1,000}", "1000", 1.0),
        ("\\boxed{85.0}", "85", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{-\\frac{6}{8}}", "-3/4", 1.0),
    ],
)
def test_quick_path_decides_simple_numbers_in_process(solution, gold, score):
    result = MathVerifier().quick(solution, gold, {})
    assert result is not None and result.score == score


def test_unequal_decimals_go_to_math_verify():
    # math-verify tolerates rounding, so only it may call these wrong (or right)
    assert MathVerifier().quick("\\boxed{85.5}", "85", {}) is None
    assert compute_score("math", "\\boxed{85.5}", "85") == 0.0
    assert compute_score("math", "\\boxed{0.3333333}", "\\frac{1}{3}") == 1.0


@pytest.mark.parametrize(
    "solution, gold, score",
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\dfrac{5}{6}}", "\\frac{5}{6}", 1.0),
        ("\\boxed{\\frac{2}{5}}", "\\frac{5}{6}", 0.0),
        ("\\boxed{\\{3, 2\\}}", "\\{2, 3\\}", 1.0),
        ("\\boxed{\\{1, 6\\}}", "\\{2, 3\\}", 0.0),
        ("\\boxed{(-2,2)}", "(-2, 2)", 1.0),
        ("\\boxed{[-2, 2]}", "(-2, 2)", 0.0),
        ("\\boxed{2^{1/2}}", "\\sqrt{2}", 1.0),
        ("\\boxed{x = 6}", "6", 1.0),
    ],
)
def test_math_verify_equivalences(solution, gold, score):
    assert compute_score("math", solution, gold) == score


def test_no_answer_reason():
    r = compute_score_detailed("math", "I give up.", "3")
    assert (r.score, r.reason, r.extracted) == (0.0, "no_answer", None)
    assert compute_score_detailed("math", "\\boxed{ }", "3").reason == "no_answer"


def test_aliases_share_the_math_verifier():
    for source in ("gsm8k", "MATH500", "aime", "toy_math", "lighteval/MATH"):
        assert compute_score(source, "\\boxed{3}", "3") == 1.0


@pytest.mark.parametrize(
    "answer",
    ["9^{9^{9^{9}}}", "(10^{100000})!", "{" * 400 + "1" + "}" * 400],
    ids=["power-tower", "huge-factorial", "nested-braces"],
)
def test_pathological_answers_time_out(answer):
    start = time.monotonic()
    r = compute_score_detailed("math", f"\\boxed{{{answer}}}", "3", timeout=LIMIT)
    elapsed = time.monotonic() - start
    assert r.score == 0.0
    assert r.reason in ("timeout", "unparsable", "wrong")
    assert elapsed < LIMIT + SLACK


def test_power_tower_from_the_issue_scores_zero_in_time():
    start = time.monotonic()
    r = compute_score_detailed("math", "\\boxed{9^9^9^9}", "3", timeout=LIMIT)
    assert r.score == 0.0 and r.reason in ("timeout", "wrong")
    assert time.monotonic() - start < LIMIT + SLACK


def test_million_character_expression():
    expr = "1+" * 500_000 + "1"
    start = time.monotonic()
    r = compute_score_detailed("math", f"\\boxed{{{expr}}}", "3", timeout=LIMIT)
    # rejected by length before any worker is involved
    assert (r.score, r.reason) == (0.0, "too_long")
    assert time.monotonic() - start < 2.0
    # without the length guard the worker runs into the hard limit and is replaced
    start = time.monotonic()
    r = compute_score_detailed("test_math_unbounded", f"\\boxed{{{expr}}}", "3", timeout=LIMIT)
    assert (r.score, r.reason) == (0.0, "timeout")
    assert time.monotonic() - start < LIMIT + SLACK
    # and the pool still works afterwards
    assert compute_score_detailed("math", "\\boxed{\\sqrt{4}}", "2").reason == "correct"
