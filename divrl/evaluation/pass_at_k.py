"""Unbiased Pass@k (Chen et al., 2021), per problem and vectorised over problems."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _check(n: int, c: int, k: int) -> None:
    if n < 1:
        raise ValueError(f"n (samples per problem) must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c (correct samples) must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}] (Pass@k needs at least k samples), got {k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k of one problem with ``n`` samples of which ``c`` are correct.

    ``1 - C(n - c, k) / C(n, k)``, computed as ``1 - prod_{i = n-c+1..n} (1 - k / i)`` (no
    big binomials); exactly 1 when ``n - c < k``.

    Raises:
        ValueError: ``k > n``, ``c > n``, or a negative/zero count.
    """
    _check(int(n), int(c), int(k))
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_array(
    n: Sequence[int] | np.ndarray | int, c: Sequence[int] | np.ndarray, k: int
) -> np.ndarray:
    """Vectorised :func:`pass_at_k`: per-problem values for arrays ``n`` (or one ``n``) and
    ``c``. Average the result for the benchmark's Pass@k.

    Uses ``C(n-c, k) / C(n, k) = prod_{j=0..k-1} (n-c-j) / (n-j)``, one vector product of
    length ``k``.
    """
    c_arr = np.asarray(c, dtype=np.int64)
    n_arr = np.broadcast_to(np.asarray(n, dtype=np.int64), c_arr.shape)
    if c_arr.size == 0:
        return np.zeros(0)
    if (n_arr < 1).any():
        raise ValueError("every n must be >= 1")
    if ((c_arr < 0) | (c_arr > n_arr)).any():
        raise ValueError("every c must be in [0, n]")
    if k < 1 or (k > n_arr).any():
        raise ValueError(f"k={k} must be in [1, n] for every problem (min n = {n_arr.min()})")
    j = np.arange(k)
    wrong = (n_arr - c_arr)[..., None].astype(np.float64)
    factors = np.clip(wrong - j, 0.0, None) / (n_arr[..., None] - j)
    return 1.0 - np.prod(factors, axis=-1)


def mean_pass_at_k(
    n: Sequence[int] | np.ndarray | int, c: Sequence[int] | np.ndarray, k: int
) -> float:
    """Benchmark Pass@k: the mean of :func:`pass_at_k_array` over problems."""
    values = pass_at_k_array(n, c, k)
    return float(values.mean()) if values.size else 0.0
