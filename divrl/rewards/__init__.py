"""Verifiable rewards: ``compute_score(data_source, solution_str, ground_truth, extra_info)``.

Built-in verifiers: ``math`` (the final answer, compared by math-verify), ``gsm8k``,
``math_verify`` (verl's math-verify rule), ``bird``/``spider``/``sql`` (execution match on
SQLite, as each benchmark's official evaluator judges) and ``countdown``, with aliases for
common dataset names, each registered as a benchmark profile in
:mod:`divrl.rewards.builtin_profiles`. Add one with :func:`register_verifier` (or a whole
benchmark with :func:`divrl.profiles.register_profile`). See docs/rewards.md.
"""

from divrl.rewards import profiles  # noqa: F401  (registers the built-in benchmarks)
from divrl.rewards.math_reward import MathVerifier, last_boxed
from divrl.rewards.pool import shutdown_pool
from divrl.rewards.registry import (
    FunctionVerifier,
    Verifier,
    get_verifier,
    register_verifier,
    registered_sources,
)
from divrl.rewards.scoring import compute_score, compute_score_detailed, score_batch
from divrl.rewards.sql_reward import SqlVerifier, extract_sql
from divrl.rewards.types import BatchScores, ScoreRequest, ScoreResult, is_correct

__all__ = [
    "BatchScores",
    "FunctionVerifier",
    "MathVerifier",
    "ScoreRequest",
    "ScoreResult",
    "SqlVerifier",
    "Verifier",
    "compute_score",
    "compute_score_detailed",
    "extract_sql",
    "get_verifier",
    "is_correct",
    "last_boxed",
    "register_verifier",
    "registered_sources",
    "score_batch",
    "shutdown_pool",
]
