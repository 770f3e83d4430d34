"""Cluster a prompt's extracted answers by equivalence, for majority voting (maj@k).

An :class:`AnswerEquivalence` maps the answers of one prompt to cluster ids; ``-1`` marks
an answer that cannot vote (none extracted, or an SQL query that fails to run). The one
used for a data source is its benchmark profile's ``equivalence``
(:mod:`divrl.profiles`; the built-in ones in :mod:`divrl.rewards.builtin_profiles`):

- math (:class:`MathEquivalence`; math, gsm8k, math_verify, toy math): two answers are
  equivalent when math-verify, through :func:`divrl.rewards.score_batch`, accepts one as the other
  (``1/2`` and ``0.5``); clusters are the connected components of that relation, so an
  answer joins a cluster when it is equivalent to any member.
- SQL (:class:`SqlResultEquivalence`; bird, spider, sql, toy SQL): two queries are
  equivalent when they return the same rows on the prompt's database, compared as multisets (row order ignored). Each
  distinct query runs once, read-only, through :func:`divrl.rewards.sql_reward.run_query`
  (the verifier's locked-down SQLite execution, with its time and row limits).
- a data source whose profile sets none (countdown, or a verifier registered without a
  profile): exact string equality after stripping whitespace.

Set one with :func:`register_equivalence` or a profile's ``equivalence``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from divrl.profiles import profile_hook, update_profile
from divrl.rewards import get_verifier, score_batch

__all__ = [
    "AnswerEquivalence",
    "ClusterRequest",
    "ExactEquivalence",
    "MathEquivalence",
    "SqlResultEquivalence",
    "cluster_answers",
    "get_equivalence",
    "register_equivalence",
]


@dataclass
class ClusterRequest:
    """The answers of one prompt and what is needed to compare them."""

    answers: list[str | None] = field(metadata={"help": "extracted answer per sample"})
    data_source: str = field(metadata={"help": "the prompt's data source (picks the relation)"})
    extra_info: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "the prompt's extra_info (db_path for SQL)"}
    )


class AnswerEquivalence:
    """Maps each prompt's answers to cluster ids (``-1`` = does not vote)."""

    def cluster(self, requests: Sequence[ClusterRequest]) -> list[list[int]]:
        """``[P][n]`` cluster ids, numbered from 0 within each prompt."""
        raise NotImplementedError


class ExactEquivalence(AnswerEquivalence):
    """Equal after stripping surrounding whitespace."""

    def cluster(self, requests: Sequence[ClusterRequest]) -> list[list[int]]:
        out = []
        for req in requests:
            ids: dict[str, int] = {}
            out.append(
                [-1 if a is None else ids.setdefault(a.strip(), len(ids)) for a in req.answers]
            )
        return out


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        self.parent[self.find(i)] = self.find(j)


def _renumber(keys: Sequence[Any | None]) -> list[int]:
    """Cluster ids 0, 1, ... in order of first appearance; ``None`` -> -1."""
    ids: dict[Any, int] = {}
    return [-1 if k is None else ids.setdefault(k, len(ids)) for k in keys]


class MathEquivalence(AnswerEquivalence):
    """math-verify equivalence, all pairs of a prompt's distinct answers in one batch.

    Args:
        max_distinct: at most this many distinct answer strings per prompt are compared
            pairwise (the most frequent ones); rarer ones each form their own cluster.
        timeout: seconds per comparison (math-verify runs in the reward worker pool).
    """

    def __init__(self, max_distinct: int = 64, timeout: float = 5.0) -> None:
        self.max_distinct = max_distinct
        self.timeout = timeout

    def cluster(self, requests: Sequence[ClusterRequest]) -> list[list[int]]:
        distinct: list[list[str]] = []
        items, where = [], []
        for p, req in enumerate(requests):
            counts = Counter(a.strip() for a in req.answers if a is not None and a.strip())
            names = [a for a, _ in counts.most_common()]
            distinct.append(names)
            compared = names[: self.max_distinct]
            for i in range(len(compared)):
                for j in range(i + 1, len(compared)):
                    items.append(
                        {
                            "data_source": "math",
                            "solution_str": f"\\boxed{{{compared[i]}}}",
                            "ground_truth": compared[j],
                            "extra_info": {},
                        }
                    )
                    where.append((p, i, j))
        scores = score_batch(items, timeout=self.timeout).scores if items else []
        finders = [_UnionFind(len(names)) for names in distinct]
        for (p, i, j), score in zip(where, scores, strict=True):
            if score >= 1.0:
                finders[p].union(i, j)
        out = []
        for req, names, uf in zip(requests, distinct, finders, strict=True):
            index = {a: i for i, a in enumerate(names)}
            roots = [
                None if a is None or not a.strip() else uf.find(index[a.strip()])
                for a in req.answers
            ]
            out.append(_renumber(roots))
        return out


class SqlResultEquivalence(AnswerEquivalence):
    """Equal result sets on ``extra_info["db_path"]`` (multisets of rows).

    Args:
        timeout: seconds per query.
        max_rows: a query returning more rows than this does not vote.
    """

    def __init__(self, timeout: float = 5.0, max_rows: int = 100_000) -> None:
        self.timeout = timeout
        self.max_rows = max_rows

    def cluster(self, requests: Sequence[ClusterRequest]) -> list[list[int]]:
        from divrl.rewards.sql_reward import QueryError, run_query

        out = []
        for req in requests:
            db_path = req.extra_info.get("db_path")
            if not db_path:
                raise ValueError("SQL answer clustering needs extra_info['db_path']")
            results: dict[str, frozenset | None] = {}
            for sql in {a.strip() for a in req.answers if a is not None and a.strip()}:
                try:
                    rows = run_query(
                        str(db_path), sql, time.monotonic() + self.timeout, self.max_rows
                    )
                    results[sql] = frozenset(Counter(rows).items())
                except QueryError:
                    results[sql] = None  # a failing query does not vote
            out.append(
                _renumber([None if a is None else results.get(a.strip()) for a in req.answers])
            )
        return out


def register_equivalence(data_source: str, factory: Callable[[], AnswerEquivalence]) -> None:
    """Use ``factory()`` to cluster ``data_source``'s answers: the ``equivalence`` hook of
    its benchmark profile (:mod:`divrl.profiles`), shared by the profile's aliases."""
    update_profile(data_source, equivalence=factory)


def get_equivalence(data_source: str) -> AnswerEquivalence:
    """The equivalence for ``data_source``: its benchmark profile's (:mod:`divrl.profiles`),
    else exact string equality. ``ValueError`` for a data source with no verifier."""
    factory = profile_hook(data_source, "equivalence")
    if factory is not None:
        return factory()
    get_verifier(data_source)  # an unknown data source is an error, not exact equality
    return ExactEquivalence()


def cluster_answers(requests: Sequence[ClusterRequest]) -> list[list[int]]:
    """Cluster ids for every request, each data source with its own equivalence (batched)."""
    by_source: dict[str, list[int]] = {}
    for i, req in enumerate(requests):
        by_source.setdefault(req.data_source, []).append(i)
    out: list[list[int]] = [[] for _ in requests]
    for source, indices in by_source.items():
        clustered = get_equivalence(source).cluster([requests[i] for i in indices])
        for i, ids in zip(indices, clustered, strict=True):
            out[i] = ids
    return out
