import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from divrl.evaluation import mean_pass_at_k, pass_at_k, pass_at_k_array


def brute_force(n: int, c: int, k: int) -> float:
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 10).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_pass_at_k_matches_enumeration(nck):
    n, c, k = nck
    expected = brute_force(n, c, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k_array([n], [c], k)[0] == pytest.approx(expected, abs=1e-12)


def test_known_values_and_edges():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 6, 5) == 1.0  # n - c < k
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(200, 10, 1) == pytest.approx(0.05)
    assert pass_at_k(100, 1, 10) == pytest.approx(1 - math.comb(99, 10) / math.comb(100, 10))
    assert mean_pass_at_k(16, np.array([0, 16, 8]), 1) == pytest.approx(0.5)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 5), (4, 5, 1), (4, -1, 1), (0, 0, 1), (4, 1, 0)])
def test_invalid_inputs_raise(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)
    with pytest.raises(ValueError):
        pass_at_k_array([n], [c], k)
