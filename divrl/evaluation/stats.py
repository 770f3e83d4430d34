"""Benchmark statistics over prompts: maj@k, bootstrap intervals, relative Pass@k.

Everything here is pure numpy on per-prompt arrays; nothing runs a model or a verifier.
Unbiased Pass@k itself lives in :mod:`divrl.evaluation.pass_at_k`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from divrl.evaluation.pass_at_k import pass_at_k_array

__all__ = [
    "bootstrap_ci",
    "cluster_correctness",
    "default_ks",
    "maj_at_k",
    "maj_at_k_array",
    "paired_ratio_ci",
    "relative_pass_at_k",
]

#: Above this many k-subsets maj@k is estimated from random subsets instead of enumerated.
MAX_EXACT_SUBSETS = 2000
#: Number of random k-subsets drawn per prompt when enumeration is too expensive.
N_RESAMPLES = 1000


def default_ks(n: int) -> list[int]:
    """``1, 2, 4, ...`` up to ``n``, with ``n`` itself always included."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ks = [2**i for i in range(int(math.log2(n)) + 1)]
    return ks if ks[-1] == n else [*ks, n]


def _subsets(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``[S, k]`` index subsets: all of them when few, else ``N_RESAMPLES`` random ones."""
    if math.comb(n, k) <= MAX_EXACT_SUBSETS:
        from itertools import combinations

        return np.array(list(combinations(range(n), k)), dtype=np.int64).reshape(-1, k)
    # k distinct indices per row: argsort of uniform noise is a uniform random permutation
    return np.argsort(rng.random((N_RESAMPLES, n)), axis=1)[:, :k]


def maj_at_k(
    clusters: Sequence[int], cluster_correct: Sequence[bool], k: int, seed: int = 0
) -> float:
    """maj@k of one prompt: the chance that a majority vote over k of its n samples is right.

    Args:
        clusters: ``[n]`` cluster id of each sample's answer (answers in one cluster are
            equivalent); ``-1`` for a sample without a usable answer, which does not vote.
        cluster_correct: ``[C]`` whether cluster ``c`` is a correct answer.
        k: votes per draw, ``1 <= k <= n``.
        seed: seed of the random subsets used when ``C(n, k) > MAX_EXACT_SUBSETS``.

    Returns:
        The mean over k-subsets of the samples (all of them when ``C(n, k) <=
        MAX_EXACT_SUBSETS``, else ``N_RESAMPLES`` uniformly random ones) of the vote's
        correctness. A tie between clusters counts as the share of tied clusters that are
        correct (a uniformly random tie-break, in expectation); a subset with no vote at all
        counts as wrong. ``k = n`` is the plain majority vote over all samples; ``k = 1`` is
        the share of correct samples.
    """
    cl = np.asarray(clusters, dtype=np.int64)
    ok = np.asarray(cluster_correct, dtype=bool)
    n = cl.size
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, n={n}]")
    if cl.size and cl.max(initial=-1) >= ok.size:
        raise ValueError(f"cluster id {cl.max()} has no entry in cluster_correct (size {ok.size})")
    if ok.size == 0 or (cl < 0).all():
        return 0.0
    onehot = np.zeros((n, ok.size), dtype=np.int64)
    voters = cl >= 0
    onehot[np.flatnonzero(voters), cl[voters]] = 1
    subsets = _subsets(n, k, np.random.default_rng(seed))
    votes = onehot[subsets].sum(axis=1)  # [S, C]
    top = votes.max(axis=1, keepdims=True)
    tied = (votes == top) & (top > 0)
    n_tied = tied.sum(axis=1)
    right = (tied & ok[None, :]).sum(axis=1)
    value = np.divide(right, n_tied, out=np.zeros(len(subsets)), where=n_tied > 0)
    return float(value.mean())


def maj_at_k_array(
    clusters: Sequence[Sequence[int]],
    cluster_correct: Sequence[Sequence[bool]],
    k: int,
    seed: int = 0,
) -> np.ndarray:
    """Per-prompt :func:`maj_at_k` (prompt ``i`` seeded with ``seed + i``); average it for the
    benchmark's maj@k."""
    if len(clusters) != len(cluster_correct):
        raise ValueError("clusters and cluster_correct need one entry per prompt")
    return np.array(
        [
            maj_at_k(c, ok, k, seed=seed + i)
            for i, (c, ok) in enumerate(zip(clusters, cluster_correct, strict=True))
        ]
    )


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    *,
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    statistic: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[float, float]:
    """Percentile bootstrap interval of a benchmark mean, resampling prompts.

    Args:
        values: ``[P]`` per-prompt values (e.g. per-prompt Pass@k), or ``[P, M]`` to resample
            the same prompts for M columns that ``statistic`` combines.
        n_boot: bootstrap replicates.
        confidence: interval coverage, in (0, 1).
        seed: the same seed and inputs give the same interval.
        statistic: maps a resampled ``[B, P, ...]`` array to ``[B]``; default the mean over
            prompts (which needs 1-D ``values``).

    Returns:
        ``(low, high)``; ``(nan, nan)`` for zero prompts.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape[0] == 0:
        return (math.nan, math.nan)
    if statistic is None:
        if arr.ndim != 1:
            raise ValueError("multi-column values need a statistic that reduces them")
        statistic = _mean_over_prompts
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.shape[0], size=(n_boot, arr.shape[0]))
    stats = np.asarray(statistic(arr[idx]), dtype=np.float64)
    if np.isnan(stats).all():  # e.g. a ratio whose denominator is 0 in every replicate
        return (math.nan, math.nan)
    tail = (1.0 - confidence) / 2.0
    low, high = np.nanquantile(stats, [tail, 1.0 - tail])
    return (float(low), float(high))


def _mean_over_prompts(resampled: np.ndarray) -> np.ndarray:
    return resampled.mean(axis=1)


def _ratio_of_means(resampled: np.ndarray) -> np.ndarray:
    num, den = resampled[..., 0].mean(axis=1), resampled[..., 1].mean(axis=1)
    return np.divide(num, den, out=np.full_like(num, np.nan), where=den > 0)


def paired_ratio_ci(
    model_values: Sequence[float] | np.ndarray,
    base_values: Sequence[float] | np.ndarray,
    *,
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Bootstrap interval of ``mean(model) / mean(base)`` resampling the *same* prompts for
    both (paired: both arrays are ``[P]`` over one prompt list, in one order)."""
    m = np.asarray(model_values, dtype=np.float64)
    b = np.asarray(base_values, dtype=np.float64)
    if m.shape != b.shape or m.ndim != 1:
        raise ValueError(f"paired values need equal 1-D shapes, got {m.shape} and {b.shape}")
    return bootstrap_ci(
        np.stack([m, b], axis=1),
        n_boot=n_boot,
        confidence=confidence,
        seed=seed,
        statistic=_ratio_of_means,
    )


def relative_pass_at_k(
    n_model: Sequence[int] | np.ndarray | int,
    c_model: Sequence[int] | np.ndarray,
    n_base: Sequence[int] | np.ndarray | int,
    c_base: Sequence[int] | np.ndarray,
    k: int,
) -> float:
    """Pass@k(model) / Pass@k(base) on the same prompts (the DPH paper's Figure 1).

    ``nan`` when the base model's Pass@k is 0 (the ratio is undefined).
    """
    model = pass_at_k_array(n_model, c_model, k).mean()
    base = pass_at_k_array(n_base, c_base, k).mean()
    return float(model / base) if base > 0 else math.nan


def cluster_correctness(clusters: Sequence[int], correct: Sequence[bool]) -> list[bool]:
    """``[C]`` correctness of each cluster: at least half of its members were scored correct.

    Members of one cluster are equivalent answers, so they normally all agree; the vote
    only matters when an equivalence is looser than the verifier.
    """
    cl = np.asarray(clusters, dtype=np.int64)
    ok = np.asarray(correct, dtype=bool)
    if cl.shape != ok.shape:
        raise ValueError("clusters and correct need one entry per sample")
    n_clusters = int(cl.max(initial=-1)) + 1
    voters = cl >= 0
    members = np.bincount(cl[voters], minlength=n_clusters)
    right = np.bincount(cl[voters], weights=ok[voters].astype(float), minlength=n_clusters)
    return [bool(2 * r >= m and m > 0) for r, m in zip(right, members, strict=True)]
