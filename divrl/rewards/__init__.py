"""Verifiable rewards: ``compute_score(data_source, solution_str, ground_truth, extra_info)``.

Built-in verifiers: ``math`` (the final answer, compared by math-verify), ``gsm8k``,
``math_verify`` (verl's math-verify rule), ``bird``/``spider``/``sql`` (execution match on
SQLite, as each benchmark's official evaluator judges) and ``countdown``, with aliases for
common dataset names. Add one with :func:`register_verifier`. See docs/rewards.md.
"""

from divrl.rewards import countdown_reward, math_reward, sql_reward  # noqa: F401  (built-ins)
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
