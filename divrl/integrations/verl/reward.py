"""divrl's verifiers as verl's custom reward function.

Point verl at this module by name (``reward.custom_reward_function.path=
pkg://divrl.integrations.verl.reward``: verl imports ``pkg://`` paths as modules) with
``name=compute_score`` for verl's ``naive`` reward
manager, or ``name=compute_score_batch`` with ``reward.reward_manager.name=batch``. Both
score through :func:`divrl.rewards.score_batch`: cheap decisions in the caller, the rest in
divrl's pool of verifier processes, each item under a hard time limit after which its
worker is killed (verl's own per-call timer only interrupts the caller's thread).

The signature is :func:`divrl.rewards.compute_score`'s, which is verl's: ``data_source``
picks the verifier (``math``, ``sql``, ``bird``, ``spider``, ``countdown`` and their
aliases); ``extra_info`` carries ``db_path`` for SQL. verl adds keys of its own to
``extra_info`` (``num_turns``, ``rollout_reward_scores``); they are ignored. The result is
a dict: ``score`` (the reward), ``acc`` (1.0 for full credit) and ``unscorable`` (1.0 when
the response got no verdict: a verifier timeout, a crashed worker, a verifier error), which
verl logs per sample (its validation metrics average them per data source).

An unscorable response scores ``unscorable_score``, NaN by default: divrl's ``divrl_grpo``
advantage estimator (:mod:`divrl.integrations.verl.advantages`) keeps it out of its group's
mean and std and gives it advantage 0. verl's own estimators do not skip NaN: with them,
pass ``unscorable_score=0.0`` in ``reward.custom_reward_function.reward_kwargs`` (the
response then counts as wrong, docs/verl.md).

This module imports neither torch nor verl, so verl can load it by path in any process.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from divrl.rewards import ScoreRequest, ScoreResult, is_correct, score_batch

#: extra_info keys verl writes that divrl's verifiers do not take
VERL_EXTRA_KEYS = ("num_turns", "rollout_reward_scores")


def _extra(extra_info: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if extra_info is None:
        return None
    return {k: v for k, v in dict(extra_info).items() if k not in VERL_EXTRA_KEYS}


def _result(result: ScoreResult, unscorable_score: float) -> dict[str, float]:
    if result.unscorable:
        return {"score": float(unscorable_score), "acc": 0.0, "unscorable": 1.0}
    return {"score": result.score, "acc": float(is_correct(result.score)), "unscorable": 0.0}


def _check_unscorable_score(value: Any) -> float:
    score = float(value)
    if not (math.isnan(score) or 0.0 <= score <= 1.0):
        raise ValueError(
            f"unscorable_score={value!r}: use NaN (divrl_grpo leaves the response out of its "
            "group) or a score in [0, 1] such as 0.0 (it counts as wrong)"
        )
    return score


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    max_workers: int | None = 1,
    unscorable_score: float = math.nan,
    **_: Any,
) -> dict[str, float]:
    """One completion's reward (verl's ``compute_score`` contract); ``timeout`` in seconds
    (default: the verifier's own limit); ``unscorable_score`` for a response that got no
    verdict (see the module's docstring)."""
    unscorable_score = _check_unscorable_score(unscorable_score)
    request = ScoreRequest(data_source, solution_str, str(ground_truth), _extra(extra_info))
    (result,) = score_batch([request], max_workers=max_workers, timeout=timeout).results
    return _result(result, unscorable_score)


def compute_score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[str],
    extra_infos: Sequence[Mapping[str, Any] | None] | None = None,
    timeout: float | None = None,
    max_workers: int | None = None,
    unscorable_score: float = math.nan,
    **_: Any,
) -> list[dict[str, float]]:
    """Many completions at once (verl's ``batch`` reward manager contract), scored in
    parallel by divrl's verifier pool."""
    unscorable_score = _check_unscorable_score(unscorable_score)
    n = len(solution_strs)
    extras = list(extra_infos) if extra_infos is not None else [None] * n
    if not len(data_sources) == len(ground_truths) == len(extras) == n:
        raise ValueError(
            f"compute_score_batch: {len(data_sources)} data sources, {n} solutions, "
            f"{len(ground_truths)} ground truths and {len(extras)} extra infos"
        )
    requests = [
        ScoreRequest(src, sol, str(gold), _extra(extra))
        for src, sol, gold, extra in zip(
            data_sources, solution_strs, ground_truths, extras, strict=True
        )
    ]
    batch = score_batch(requests, max_workers=max_workers, timeout=timeout)
    return [_result(r, unscorable_score) for r in batch.results]
