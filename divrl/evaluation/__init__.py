"""Evaluation: Pass@k, maj@k, bootstrap intervals, diversity, ``divrl eval`` and reports.

See docs/evaluation.md.
"""

from divrl.evaluation.equivalence import (
    AnswerEquivalence,
    ClusterRequest,
    cluster_answers,
    get_equivalence,
    register_equivalence,
)
from divrl.evaluation.pass_at_k import mean_pass_at_k, pass_at_k, pass_at_k_array
from divrl.evaluation.stats import (
    bootstrap_ci,
    cluster_correctness,
    default_ks,
    maj_at_k,
    maj_at_k_array,
    paired_ratio_ci,
    relative_pass_at_k,
)
from divrl.evaluation.styles import register_style, solution_style, sql_shape

__all__ = [
    "AnswerEquivalence",
    "ClusterRequest",
    "bootstrap_ci",
    "cluster_answers",
    "cluster_correctness",
    "default_ks",
    "get_equivalence",
    "maj_at_k",
    "maj_at_k_array",
    "mean_pass_at_k",
    "paired_ratio_ci",
    "pass_at_k",
    "pass_at_k_array",
    "register_equivalence",
    "register_style",
    "relative_pass_at_k",
    "solution_style",
    "sql_shape",
]
