"""Agreement of divrl's math profiles with their references.

``math_verify`` profile: math-verify itself (verl's ``math_verify`` call, in this process).
Training profiles (``math``, ``gsm8k``): the final answer as the MATH grader and verl's DAPO
scorer find it (the last box; else an answer tag, an answer phrase, ``####``, or a
completion that is only an answer), compared by math-verify, with hand labels for the
documented equivalences and for the new classes (``FINAL_ANSWER_CASES``).
"""

import logging
import math
import re

import pytest
from math_agreement_cases import (
    CASES,
    FINAL_ANSWER_CASES,
    FINAL_ANSWER_LABELS,
    TRUNCATED_CASES,
)

from divrl.rewards import MathVerifier, ScoreRequest, score_batch


def _mv_parse(text: str, gold: bool = False):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    configs = (
        [LatexExtractionConfig()] if gold else [ExprExtractionConfig(), LatexExtractionConfig()]
    )
    return parse(text, configs, parsing_timeout=None)


def math_verify_label(completion: str, gold: str) -> float:
    """The reference of the ``math_verify`` profile: verl's ``math_verify`` targets."""
    from math_verify import verify

    gold_parsed = _mv_parse(f"\\boxed{{{gold}}}", gold=True)
    if not gold_parsed:
        return 0.0
    return float(verify(gold_parsed, _mv_parse(completion), timeout_seconds=None))


def _reference_box(text: str) -> tuple[bool, str | None]:
    """(a box was found, its content): the MATH grader's last box, written from its logic."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return False, None
    rest = text[idx + len("\\fbox" if text.startswith("\\fbox", idx) else "\\boxed") :]
    body = rest.lstrip(" ")
    if body.startswith("{"):
        depth = 0
        for i, ch in enumerate(body):
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth == 0:
                return True, body[1:i]
        return True, None  # cut off
    if body is not rest and body:
        return True, re.split(r"[\s$]", body, maxsplit=1)[0]
    return False, None


def _reference_phrase(text: str) -> str | None:
    found = re.findall(r"(?i)(?:(?:final|the) answer\s*(?:is|:)|answer\s*:)[\s*]*([^\n]*)", text)
    if not found:
        return None
    answer = found[-1]
    if not answer.strip():
        tail = re.split(r"(?i)answer[^\n]*\n", text)[-1]
        answer = tail.strip().split("\n")[0]
    return re.sub(r"(?i)\.?\s*I hope it is correct\.?\s*$", "", answer)


def reference_final_answer(text: str) -> str | None:
    boxed, content = _reference_box(text)
    if boxed:
        return content
    tags = re.findall(r"(?is)<answer>(.*?)</answer>", text)
    if tags:
        return _reference_phrase(tags[-1]) or tags[-1]
    phrase = _reference_phrase(text)
    if phrase and phrase.strip():
        return phrase
    m = re.search(r"####\s*([^\n]+)\s*$", text)
    if m:
        return m.group(1)
    whole = text.strip().rstrip(".")
    if re.fullmatch(r"-?[\d,]+(?:\.\d+)?", whole) or re.fullmatch(r"\$\$?[^$]+\$\$?", whole):
        return whole
    return None


def final_answer_label(completion: str, gold: str) -> float:
    """The reference of the training profiles on ``CASES``."""
    from math_verify import verify

    if (completion, gold) in FINAL_ANSWER_LABELS:
        return FINAL_ANSWER_LABELS[completion, gold]
    answer = reference_final_answer(completion)
    if answer is None or not answer.strip().strip("$").strip():
        return 0.0
    answer = answer.strip().rstrip(".").strip().strip("$")
    gold_parsed = _mv_parse(f"\\boxed{{{gold}}}", gold=True)
    pred = _mv_parse(f"\\boxed{{{answer}}}")
    return float(bool(gold_parsed) and verify(gold_parsed, pred, timeout_seconds=None))


def training_cases() -> list[tuple[str, str, float]]:
    labelled = [(c, g, final_answer_label(c, g)) for c, g in CASES]
    return labelled + [(c, g, label) for c, g, label, _ in FINAL_ANSWER_CASES]


def _divrl_scores(cases, source="math"):
    batch = score_batch([ScoreRequest(source, c, g) for c, g, *_ in cases], timeout=30)
    return batch.results


def test_suite_is_large_and_labels_are_mixed():
    labels = [math_verify_label(c, g) for c, g in CASES]
    assert len(CASES) >= 200
    assert 0.3 < sum(labels) / len(labels) < 0.8  # both verdicts are well represented
    classes = {}
    for _, _, label, cls in FINAL_ANSWER_CASES:
        classes.setdefault(cls, set()).add(label)
    assert len(classes) >= 7 and all(labels == {0.0, 1.0} for labels in classes.values())


def test_math_verify_profile_agrees_with_math_verify():
    labels = [math_verify_label(c, g) for c, g in CASES]
    results = _divrl_scores(CASES, "math_verify")
    disagreements = [
        (c, g, label, r.score, r.reason)
        for (c, g), label, r in zip(CASES, labels, results, strict=True)
        if label != r.score
    ]
    assert len(disagreements) <= 0.01 * len(CASES), disagreements
    assert not [r for r in results if r.reason == "error"]


@pytest.mark.parametrize("source", ["math", "gsm8k"])
def test_training_profiles_agree_with_the_final_answer_rule(source):
    cases = training_cases()
    results = _divrl_scores(cases, source)
    disagreements = [
        (c, g, label, r.score, r.reason, r.extracted)
        for (c, g, label), r in zip(cases, results, strict=True)
        if label != r.score
    ]
    assert len(disagreements) <= 0.01 * len(cases), disagreements
    # the hand-labelled classes agree exactly
    hand = {(c, g) for c, g, _, _ in FINAL_ANSWER_CASES}
    assert not [d for d in disagreements if (d[0], d[1]) in hand], disagreements
    assert not [r for r in results if r.reason == "error"]


def test_hedges_score_zero_in_training_profiles_only():
    hedges = [("It is either 7 or 8.", "8"), ("Maybe 4 or 7", "7"), ("I get 5, or 6", "6")]
    for source in ("math", "gsm8k", "aime", "toy_math"):
        for r in _divrl_scores(hedges, source):
            assert (r.score, r.reason) == (0.0, "no_answer"), (source, r)
    # the math_verify profile keeps math-verify's last-number fallback
    assert [r.score for r in _divrl_scores(hedges, "math_verify")] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("source", ["math", "math_verify"])
def test_truncated_last_box_never_falls_back_to_an_earlier_box(source):
    labels = [math_verify_label(c, g) for c, g in TRUNCATED_CASES]
    assert labels[0] == 1.0  # math-verify itself would reward the earlier box
    for r in _divrl_scores(TRUNCATED_CASES, source):
        assert (r.score, r.reason) == (0.0, "no_answer")


@pytest.mark.parametrize(
    "completion, gold, training, math_verify",
    [
        ("$x \\geq 5$", "5", 0.0, 0.0),  # no last-number fallback
        ("x equals $\\frac{1}{2}$", "2", 0.0, 0.0),
        ("$14{,}916$", "916", 0.0, 0.0),
        ("\\boxed{(2,2)} and \\boxed{(6,2)}", "(2,2),(6,2)", 0.0, 1.0),  # last box / joined
        ("\\boxed{32, 349}", "32349", 0.0, 0.0),  # no quick path that reads it as 32349
        ("First \\boxed{2}, then correcting: \\boxed{3}", "3", 1.0, 0.0),
    ],
)
def test_profiles_on_known_misses(completion, gold, training, math_verify):
    assert _divrl_scores([(completion, gold)])[0].score == training
    assert _divrl_scores([(completion, gold)], "math_verify")[0].score == math_verify


def test_quick_path_agrees_where_it_decides():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    verifiers = {
        "math": (MathVerifier(), None),
        "math_verify": (MathVerifier(profile="math_verify"), math_verify_label),
    }

    def reference(name, completion, gold):
        verifier, label = verifiers[name]
        if label is not None:
            return label(completion, gold)
        return verifier.verify(completion, gold, {}, math.inf).score

    decided = 0
    for name, (verifier, _) in verifiers.items():
        for completion, gold in CASES:
            quick = verifier.quick(completion, gold, {})
            if quick is not None and completion.strip():
                decided += 1
                assert quick.score == reference(name, completion, gold), (name, completion)
    assert decided >= 40

    prefix = st.text(alphabet="abc xyz0123456789+-*=,.;:()#\n", max_size=40)

    @settings(max_examples=150, deadline=None)
    @given(prefix, st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6), st.booleans())
    def check(text, pred, gold, boxed):
        completion = f"{text}\\boxed{{{pred}}}." if boxed else f" {pred} "
        for name, (verifier, _) in verifiers.items():
            quick = verifier.quick(completion, str(gold), {})
            if quick is not None:
                assert quick.score == reference(name, completion, str(gold)), completion

    check()

    @settings(max_examples=200, deadline=None)
    @given(st.text(max_size=60), st.sampled_from(["7", "\\frac{1}{2}", "x"]))
    def check_any_text(text, gold):
        for name, (verifier, _) in verifiers.items():
            quick = verifier.quick(text, gold, {})
            if quick is not None and text.strip():
                assert quick.score == reference(name, text, gold), (name, text)

    check_any_text()
