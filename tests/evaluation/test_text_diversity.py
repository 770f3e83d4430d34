import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from divrl.evaluation.runner import EvalConfig, score_samples
from divrl.evaluation.summary import summarise
from divrl.evaluation.text_diversity import (
    answer_entropy,
    distinct_n,
    math_trace_style,
    self_bleu,
    trace_clusters,
    trace_words,
)


def test_trace_words_fold_case_and_mask_numbers():
    assert trace_words("SELECT COUNT(*) FROM t WHERE kg<=74.5") == [
        *["select", "count", "(", "*", ")", "from", "t", "where", "kg", "<", "=", "0"]
    ]


def test_distinct_n_counts_repeats_across_samples():
    assert distinct_n(["a b c", "a b c"], 1) == 3 / 6
    assert distinct_n(["a b c", "d e f"], 2) == 1.0
    assert distinct_n(["a", "b"], 2) is None  # no bigram at all


def _bleu_brute_force(texts, max_n=4):
    """Self-BLEU with the reference counts clipped against every other text explicitly."""
    words = [trace_words(t) for t in texts]
    scores = []
    for i, hyp in enumerate(words):
        if not hyp:
            continue
        refs = [w for j, w in enumerate(words) if j != i]
        log_p = 0.0
        for n in range(1, max_n + 1):
            grams = Counter(tuple(hyp[k : k + n]) for k in range(len(hyp) - n + 1))
            ref_max: Counter = Counter()
            for ref in refs:
                ref_max |= Counter(tuple(ref[k : k + n]) for k in range(len(ref) - n + 1))
            matched = sum(min(c, ref_max[g]) for g, c in grams.items())
            smooth = 0 if n == 1 else 1
            if matched + smooth == 0:
                log_p = -math.inf
                break
            log_p += math.log((matched + smooth) / (sum(grams.values()) + smooth))
        ref_len = min((len(r) for r in refs), key=lambda r: (abs(r - len(hyp)), r))
        bp = 1.0 if len(hyp) > ref_len else math.exp(1 - ref_len / len(hyp))
        scores.append(bp * math.exp(log_p / max_n))
    return sum(scores) / len(scores) if scores else None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="ab 1(", max_size=14), min_size=2, max_size=5))
def test_self_bleu_equals_the_explicit_multi_reference_bleu(texts):
    got, want = self_bleu(texts), _bleu_brute_force(texts)
    assert (got is None) == (want is None)
    if got is not None:
        assert got == pytest.approx(want)


def test_self_bleu_is_one_for_identical_samples_and_falls_with_diversity():
    same = ["SELECT COUNT(*) FROM t WHERE a > 3"] * 4
    assert self_bleu(same) == pytest.approx(1.0)
    mixed = [*same[:2], "WITH s AS (SELECT a FROM t) SELECT SUM(a) FROM s", "SELECT MAX(b) FROM u"]
    assert self_bleu(mixed) < 0.7
    assert self_bleu(["only one"]) is None


def test_trace_clusters_group_one_route_with_other_numbers():
    texts = [
        "7*3=21, 21+3=24. \\boxed{24}",
        "8*4=32, 32+5=37. \\boxed{37}",  # same route, other numbers: masked
        "Let x be the hats: x = 7 * 3 + 3. \\boxed{24}",  # another route
        "SELECT COUNT(*) FROM tree WHERE kg<74",
    ]
    assert trace_clusters(texts) == [0, 0, 1, 2]
    assert trace_clusters(texts[:2], threshold=1.0) == [0, 0]
    assert trace_clusters([]) == []


def test_answer_entropy_over_answered_samples():
    assert answer_entropy([0, 0, 1, 1]) == (2, pytest.approx(1.0))
    assert answer_entropy([0, 0, 0, -1]) == (1, 0.0)
    assert answer_entropy([-1, -1]) == (0, None)
    assert answer_entropy([0, 1, 2, 3]) == (4, pytest.approx(2.0))


@pytest.mark.parametrize(
    ("text", "style"),
    [
        ("The answer is \\boxed{85}.", "direct"),
        ("37 + 48 = 85, so \\boxed{85}", "arithmetic"),
        ("Let x be the number. Then 2x + 3 = 11, x = 4. \\boxed{4}", "algebra"),
        ("Case 1: n is even ... Case 2: n is odd ... \\boxed{7}", "cases"),
        ("```python\nprint(37 + 48)\n```\n\\boxed{85}", "code"),
        ("Let $n$ be ... case 1: 2 * 3 = 6", "algebra+cases+arithmetic"),
    ],
)
def test_math_trace_style(text, style):
    assert math_trace_style(text) == style


def _records(data_source, ground_truth, texts, n_prompts=2):
    return [
        {
            "id": str(i),
            "data_source": data_source,
            "prompt": "p",
            "ground_truth": ground_truth,
            "extra_info": {},
            "samples": [{"text": t, "n_tokens": 3, "nll": 1.0, "truncated": False} for t in texts],
            "greedy": None,
        }
        for i in range(n_prompts)
    ]


def test_plain_math_summary_has_a_headline_diversity_labelled_trace_clusters():
    texts = [
        "Let x = 2. \\boxed{2}",
        "1 + 1 = 2. \\boxed{2}",
        "1 + 1 = 2. \\boxed{2}",
        "The answer is \\boxed{3}",
    ]
    cfg = EvalConfig(n=4, n_boot=20)
    d = summarise(score_samples(_records("math", "2", texts), cfg, progress=False), cfg)[
        "diversity"
    ]
    assert d["styles_measure"] == "trace clusters"
    assert d["mean_distinct_styles"] == d["mean_trace_clusters"] == 3.0
    assert d["share_one_style"] == 0.0 and d["share_3plus_styles"] == 1.0
    assert d["mean_answer_clusters"] == 2.0
    assert d["mean_answer_entropy_bits"] == pytest.approx(
        -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))
    )
    assert d["mean_math_trace_styles"] == 3.0  # algebra, arithmetic, direct
    assert d["math_trace_style_counts"] == {"arithmetic": 4, "algebra": 2, "direct": 2}
    assert 0 < d["self_bleu"] < 1 and 0 < d["distinct_2"] < 1


def test_sql_summary_keeps_the_style_classifier_and_adds_the_text_measures():
    from divrl.data import fixture_path, load_examples

    ex = load_examples(fixture_path("sql.jsonl"), limit=1)[0]
    texts = ["SELECT COUNT(*) FROM customers", "SELECT COUNT(id) FROM customers"]
    rec = _records(ex.data_source, ex.ground_truth, texts, n_prompts=1)[0]
    rec["extra_info"] = ex.extra_info
    cfg = EvalConfig(n=2, n_boot=20)
    d = summarise(score_samples([rec], cfg, progress=False), cfg)["diversity"]
    assert d["styles_measure"] == "solution styles"
    assert d["mean_distinct_styles"] == 2.0  # count(*) and count(col)
    assert "mean_math_trace_styles" not in d
    assert d["mean_trace_clusters"] >= 1.0
