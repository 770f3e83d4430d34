"""Agreement of divrl's math reward with math-verify itself (verl's math_verify rule)."""

import logging

import pytest
from math_agreement_cases import CASES, TRUNCATED_CASES

from divrl.rewards import ScoreRequest, score_batch


def math_verify_label(completion: str, gold: str) -> float:
    """The reference: verl's ``math_verify.compute_score`` targets, run in this process."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold_parsed = parse(f"\\boxed{{{gold}}}", [LatexExtractionConfig()], parsing_timeout=None)
    if not gold_parsed:
        return 0.0
    pred = parse(
        completion, [ExprExtractionConfig(), LatexExtractionConfig()], parsing_timeout=None
    )
    return float(verify(gold_parsed, pred, timeout_seconds=None))


def _divrl_scores(cases, source="math"):
    batch = score_batch([ScoreRequest(source, c, g) for c, g in cases], timeout=30)
    return batch.results


def test_suite_is_large_and_labels_are_mixed():
    labels = [math_verify_label(c, g) for c, g in CASES]
    assert len(CASES) >= 200
    assert 0.3 < sum(labels) / len(labels) < 0.8  # both verdicts are well represented


def test_divrl_agrees_with_math_verify():
    labels = [math_verify_label(c, g) for c, g in CASES]
    results = _divrl_scores(CASES)
    disagreements = [
        (c, g, label, r.score, r.reason)
        for (c, g), label, r in zip(CASES, labels, results, strict=True)
        if label != r.score
    ]
    assert len(disagreements) <= 0.01 * len(CASES), disagreements
    assert not [r for r in results if r.reason == "error"]


def test_truncated_last_box_never_falls_back_to_an_earlier_box():
    labels = [math_verify_label(c, g) for c, g in TRUNCATED_CASES]
    assert labels[0] == 1.0  # math-verify itself would reward the earlier box
    for r in _divrl_scores(TRUNCATED_CASES):
        assert (r.score, r.reason) == (0.0, "no_answer")


@pytest.mark.parametrize(
    "completion, gold, score",
    [
        ("$x \\geq 5$", "5", 0.0),  # no last-number fallback
        ("x equals $\\frac{1}{2}$", "2", 0.0),
        ("$14{,}916$", "916", 0.0),
        ("\\boxed{(2,2)} and \\boxed{(6,2)}", "(2,2),(6,2)", 1.0),  # boxes joined
        ("\\boxed{32, 349}", "32349", 0.0),  # no quick path that reads it as 32349
    ],
)
def test_issue_13_misses(completion, gold, score):
    assert _divrl_scores([(completion, gold)])[0].score == score


def test_quick_path_agrees_where_it_decides():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from divrl.rewards import MathVerifier

    verifier = MathVerifier()
    decided = 0
    for completion, gold in CASES:
        quick = verifier.quick(completion, gold, {})
        if quick is not None and completion.strip():
            decided += 1
            assert quick.score == math_verify_label(completion, gold), (completion, gold)
    assert decided >= 20

    prefix = st.text(alphabet="abc xyz0123456789+-*=,.;:()\n", max_size=40)

    @settings(max_examples=150, deadline=None)
    @given(prefix, st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6), st.booleans())
    def check(text, pred, gold, boxed):
        completion = f"{text}\\boxed{{{pred}}}." if boxed else f" {pred} "
        quick = verifier.quick(completion, str(gold), {})
        if quick is not None:
            assert quick.score == math_verify_label(completion, str(gold)), completion

    check()

    @settings(max_examples=200, deadline=None)
    @given(st.text(max_size=60), st.sampled_from(["7", "\\frac{1}{2}", "x"]))
    def check_any_text(text, gold):
        quick = verifier.quick(text, gold, {})
        if quick is not None and text.strip():
            assert quick.score == math_verify_label(text, gold), text

    check_any_text()
