"""Evaluation: Pass@k, and (see the submodules) diversity and reports."""

from divrl.evaluation.pass_at_k import mean_pass_at_k, pass_at_k, pass_at_k_array

__all__ = ["mean_pass_at_k", "pass_at_k", "pass_at_k_array"]
