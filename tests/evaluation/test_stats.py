import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from divrl.evaluation import stats
from divrl.evaluation.stats import (
    bootstrap_ci,
    cluster_correctness,
    default_ks,
    maj_at_k,
    maj_at_k_array,
    paired_ratio_ci,
    relative_pass_at_k,
)


def brute_maj(clusters, ok, k):
    """maj@k by enumerating every k-subset, ties split evenly, no votes = wrong."""
    total = 0.0
    subsets = list(itertools.combinations(range(len(clusters)), k))
    for s in subsets:
        votes = {}
        for i in s:
            if clusters[i] >= 0:
                votes[clusters[i]] = votes.get(clusters[i], 0) + 1
        if not votes:
            continue
        top = max(votes.values())
        tied = [c for c, v in votes.items() if v == top]
        total += sum(ok[c] for c in tied) / len(tied)
    return total / len(subsets)


def test_default_ks():
    assert default_ks(16) == [1, 2, 4, 8, 16]
    assert default_ks(12) == [1, 2, 4, 8, 12]
    assert default_ks(1) == [1]
    with pytest.raises(ValueError):
        default_ks(0)


def test_maj_hand_cases():
    # three votes for the wrong answer beat two for the right one at k = n
    clusters, ok = [0, 0, 0, 1, 1], [False, True]
    assert maj_at_k(clusters, ok, 5) == 0.0
    # k = 1 is the share of correct samples
    assert maj_at_k(clusters, ok, 1) == pytest.approx(2 / 5)
    # a 1-1 tie counts half
    assert maj_at_k([0, 1], [True, False], 2) == 0.5
    # samples without an answer do not vote; with no vote at all the draw is wrong
    assert maj_at_k([-1, -1, 0], [True], 3) == 1.0
    assert maj_at_k([-1, -1, 0], [True], 1) == pytest.approx(1 / 3)
    assert maj_at_k([-1, -1], [], 2) == 0.0
    with pytest.raises(ValueError):
        maj_at_k([0, 1], [True, False], 3)
    with pytest.raises(ValueError):
        maj_at_k([0, 3], [True, False], 1)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 8).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(-1, 3), min_size=n, max_size=n),
            st.lists(st.booleans(), min_size=4, max_size=4),
            st.integers(1, n),
        )
    )
)
def test_maj_matches_enumeration(case):
    clusters, ok, k = case
    assert maj_at_k(clusters, ok, k) == pytest.approx(brute_maj(clusters, ok, k), abs=1e-12)


def test_maj_resampling_estimate_is_close_and_seeded(monkeypatch):
    rng = np.random.default_rng(3)
    clusters = rng.integers(-1, 4, size=20).tolist()
    ok = [True, False, False, True]
    exact = brute_maj(clusters, ok, 5)  # C(20, 5) = 15504 subsets
    monkeypatch.setattr(stats, "MAX_EXACT_SUBSETS", 100)
    est = maj_at_k(clusters, ok, 5, seed=1)
    assert est == maj_at_k(clusters, ok, 5, seed=1)
    assert abs(est - exact) < 0.05
    assert maj_at_k_array([clusters, clusters], [ok, ok], 5, seed=1)[0] == est


def test_cluster_correctness():
    assert cluster_correctness([0, 0, 1, -1, 2], [True, True, False, False, False]) == [
        True,
        False,
        False,
    ]
    assert cluster_correctness([-1], [False]) == []


def test_bootstrap_reproducible_with_seed():
    values = np.random.default_rng(0).random(50)
    a = bootstrap_ci(values, seed=7)
    assert a == bootstrap_ci(values, seed=7)
    assert a != bootstrap_ci(values, seed=8)
    low, high = a
    assert low < values.mean() < high
    # a constant has a zero-width interval
    assert bootstrap_ci(np.full(10, 0.3)) == pytest.approx((0.3, 0.3))
    assert all(math.isnan(x) for x in bootstrap_ci([]))


def test_bootstrap_interval_narrows_with_more_prompts():
    rng = np.random.default_rng(1)
    small = bootstrap_ci(rng.integers(0, 2, 20).astype(float))
    large = bootstrap_ci(rng.integers(0, 2, 2000).astype(float))
    assert large[1] - large[0] < small[1] - small[0]


def test_paired_ratio_and_relative_pass_at_k():
    base_c = np.array([4, 0, 2, 1])
    model_c = np.array([4, 0, 4, 0])
    rel = relative_pass_at_k(4, model_c, 4, base_c, 1)
    assert rel == pytest.approx((8 / 16) / (7 / 16))
    assert relative_pass_at_k(4, [0, 0], 4, [0, 0], 2) != relative_pass_at_k(
        4, [0, 0], 4, [0, 0], 2
    )
    low, high = paired_ratio_ci(model_c / 4, base_c / 4, seed=0)
    assert low <= rel <= high
    # identical arrays give a ratio of exactly 1 in every replicate
    assert paired_ratio_ci(base_c / 4, base_c / 4) == pytest.approx((1.0, 1.0))
    with pytest.raises(ValueError):
        paired_ratio_ci([1.0], [1.0, 2.0])
